"""One pass of the repair controller: read the failed nodes and their pods, decide
(`decide.plan`), act, and record the progress on each Node. A failure on one node (an API
error, a refused replacement, a hook that did not answer) is logged and counted and the pass
goes on with the next; the next pass retries, since the state on the Node did not move."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainstack_health.contract import (
    DRAINED_AT_ANNOTATION,
    EVENT_DRAINED,
    EVENT_NAMESPACE,
    EVENT_REPAIR,
    POOL_LABEL,
    RECHECK_LABEL,
    RECHECK_STRAGGLER,
    REPAIR_LABEL,
    STATE_FAILED,
    STATE_LABEL,
)
from trainstack_health.kube import ApiError, KubeApi
from trainstack_health.repair import decide
from trainstack_health.repair.decide import Node, Settings, Step
from trainstack_health.repair.http import HttpError
from trainstack_health.repair.metrics import ERRORS, REPAIRS, Metrics

COMPONENT = "trainstack-health-repair"
STRAGGLER_INTERVAL_S = 300.0


class Replace(Protocol):
    def replace(self, instance_id: str) -> str: ...


Log = Callable[..., None]


def json_log(event: str, **fields: Any) -> None:
    """One JSON line on stderr per thing done or refused."""
    line = {"time": decide.format_time(time.time()), "event": event, **fields}
    print(json.dumps(line, sort_keys=True, default=str), file=sys.stderr, flush=True)


@dataclass
class Deps:
    kube: KubeApi
    settings: Settings
    metrics: Metrics
    replacer: Replace | None = None  # mode "replace"
    post_hook: Callable[[str, Mapping[str, Any]], None] | None = None  # mode "hook"
    query: Callable[[str, str], Any] | None = None  # prometheusUrl set
    log: Log = json_log
    # When Prometheus was last asked (the query spans a day at 1m steps: every 5 minutes is
    # plenty, every 30 s pass would be load for nothing).
    stragglers_asked_at: float | None = None


@dataclass
class PassResult:
    """What a pass did, by node (tests and the --once summary)."""

    steps: dict[str, str] = field(default_factory=dict)
    evicted: list[str] = field(default_factory=list)
    rechecks: list[str] = field(default_factory=list)
    errors: int = 0


def node_event(node: Node, reason: str, message: str, kind: str, now: float) -> dict[str, Any]:
    """A core/v1 Event about the Node, in the namespace the kubelet uses for node events. With
    no eventTime it is validated as a legacy Event: an involvedObject without a namespace (a
    Node) needs the Event in "default" (k8s v1.37.2 pkg/apis/core/validation/events.go
    legacyValidateEvent)."""
    stamp = decide.format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node.name}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid},
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class Pass:
    def __init__(self, deps: Deps, now: float) -> None:
        self.d = deps
        self.now = now
        self.result = PassResult()

    def error(self, operation: str, node: str | None, err: object) -> None:
        self.d.metrics.inc(ERRORS, operation=operation)
        self.result.errors += 1
        self.d.log("error", operation=operation, node=node, error=str(err))

    def event(self, node: Node, reason: str, message: str, kind: str) -> None:
        try:
            self.d.kube.create_event(
                EVENT_NAMESPACE, node_event(node, reason, message, kind, self.now)
            )
        except ApiError as err:  # the state is on the Node; the Event only tells people
            self.error("event", node.name, err)

    def label(self, node: Node, labels: Mapping[str, str | None],
              annotations: Mapping[str, str | None]) -> None:  # fmt: skip
        self.d.kube.patch_node_metadata(node.name, labels, annotations)

    def evict(self, node: Node, pods: list[dict[str, Any]]) -> int:
        """Evict the node's training pods; how many evictions the API server accepted."""
        accepted = 0
        for ref in decide.to_evict(pods):
            try:
                self.d.kube.evict(ref.namespace, ref.name)
            except ApiError as err:
                if err.status == 404:  # gone already: that is what we wanted
                    continue
                if err.status == 429:  # a PodDisruptionBudget says not now: next pass
                    self.d.log("eviction-refused", node=node.name, pod=ref.key, why=err.message)
                    continue
                self.error("evict", node.name, err)
                continue
            accepted += 1
            self.result.evicted.append(ref.key)
            self.d.log("evicted", node=node.name, pod=ref.key)
        return accepted

    # --- steps ----------------------------------------------------------------------------

    def drain(self, node: Node, pods: list[dict[str, Any]]) -> None:
        # The label first: a controller that stops between here and the evictions finds a
        # drained node with pods left, and evicts them (step EVICT), never drains twice.
        stamp = decide.drained_at_text(self.now)
        self.label(node, {REPAIR_LABEL: decide.DRAINED}, {DRAINED_AT_ANNOTATION: stamp})
        count = self.evict(node, pods)
        self.d.metrics.inc(REPAIRS, pool=node.pool, action="drain")
        s = self.d.settings
        then = (
            "repair.mode is none: the node stays drained for its owner"
            if s.mode == "none"
            else f"repair ({s.mode}) {s.delay_s:.0f}s after the drain, once none is left"
        )
        failed = f"health check failed ({node.reason or 'unknown'})"
        self.event(node, EVENT_DRAINED, f"{failed}: evicted {count} training pod(s); {then}",
                   "Warning")  # fmt: skip

    def evict_rest(self, node: Node, pods: list[dict[str, Any]]) -> None:
        if node.drained_at is None:
            self.label(node, {}, {DRAINED_AT_ANNOTATION: decide.drained_at_text(self.now)})
        self.evict(node, pods)

    def clear(self, node: Node) -> None:
        self.label(node, {REPAIR_LABEL: None}, {DRAINED_AT_ANNOTATION: None})
        self.d.log("cleared", node=node.name)

    def repair(self, node: Node) -> None:
        # Read the node again: the agent may have passed it since the list, and what follows
        # cannot be undone.
        fresh = decide.parse_node(self.d.kube.get_node(node.name))
        if fresh.state != STATE_FAILED or fresh.progress == decide.REQUESTED:
            self.d.log("repair-skipped", node=node.name, state=fresh.state)
            return
        mode = self.d.settings.mode
        if mode == "replace":
            action = "replace"
            instance = decide.instance_id(fresh.provider_id)
            if instance is None or self.d.replacer is None:
                self.error("replace", node.name,
                           f"providerID {fresh.provider_id!r} names no EC2 instance")  # fmt: skip
                return
            try:
                group = self.d.replacer.replace(instance)
            except Exception as err:  # refusals and any AWS error alike: counted, retried
                self.error("replace", node.name, err)
                return
            done = f"instance {instance} of Auto Scaling group {group} marked Unhealthy"
        else:
            action = "hook"
            url = self.d.settings.hook_url
            try:
                if self.d.post_hook is None or url is None:
                    raise HttpError("no hook configured")
                self.d.post_hook(url, decide.hook_payload(fresh, self.d.settings))
            except HttpError as err:
                self.error("hook", node.name, err)
                if fresh.progress != decide.HOOK_FAILED:
                    self.label(fresh, {REPAIR_LABEL: decide.HOOK_FAILED}, {})
                return
            done = f"repair hook {url} accepted the request"
        self.label(fresh, {REPAIR_LABEL: decide.REQUESTED}, {})
        self.d.metrics.inc(REPAIRS, pool=fresh.pool, action=action)
        self.d.log("repair-requested", node=fresh.name, action=action, detail=done)
        self.event(fresh, EVENT_REPAIR, f"repair requested: {done}", "Normal")

    # --- the pass -------------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        """Failed nodes, and nodes that carry repair progress (to clear it once passed)."""
        found: dict[str, Node] = {}
        for selector in (f"{STATE_LABEL}={STATE_FAILED}", REPAIR_LABEL):
            for obj in self.d.kube.list_nodes(selector):
                node = decide.parse_node(obj)
                found[node.name] = node
        return [found[name] for name in sorted(found)]

    def one(self, node: Node) -> None:
        pods: list[dict[str, Any]] = []
        if node.state == STATE_FAILED and node.progress != decide.REQUESTED:
            pods = self.d.kube.list_pods_on_node(node.name)
        step = decide.plan(
            node, now=self.now, settings=self.d.settings, left=len(decide.remaining(pods))
        )
        self.result.steps[node.name] = step.step.value
        if step.step is not Step.NOTHING:
            self.d.log("step", node=node.name, step=step.step.value, why=step.why)
        if step.step is Step.DRAIN:
            self.drain(node, pods)
        elif step.step is Step.EVICT:
            self.evict_rest(node, pods)
        elif step.step is Step.CLEAR:
            self.clear(node)
        elif step.step is Step.REPAIR:
            self.repair(node)

    def stragglers(self) -> None:
        url, query = self.d.settings.prometheus_url, self.d.query
        if url is None or query is None:
            return
        last = self.d.stragglers_asked_at
        if last is not None and self.now - last < STRAGGLER_INTERVAL_S:
            return
        self.d.stragglers_asked_at = self.now
        try:
            counts = decide.parse_vector(query(url, decide.straggler_query()))
        except (HttpError, ValueError) as err:
            self.error("prometheus", None, err)
            return
        try:
            pool_nodes = [decide.parse_node(o) for o in self.d.kube.list_nodes(POOL_LABEL)]
        except ApiError as err:
            self.error("recheck", None, err)
            return
        targets = decide.recheck_targets(
            counts, pool_nodes, threshold=self.d.settings.straggler_alerts
        )
        by_name = {n.name: n for n in pool_nodes}
        for name in targets:
            try:
                self.label(by_name[name], {RECHECK_LABEL: RECHECK_STRAGGLER}, {})
            except ApiError as err:
                self.error("recheck", name, err)
                continue
            self.result.rechecks.append(name)
            self.d.metrics.inc(REPAIRS, pool=by_name[name].pool, action="recheck")
            self.d.log("recheck-requested", node=name, firings=counts.get(name))

    def run(self) -> PassResult:
        for node in self.nodes():
            try:
                self.one(node)
            except ApiError as err:
                self.error("kube", node.name, err)
        self.stragglers()
        return self.result


def run_once(deps: Deps, now: float | None = None) -> PassResult:
    """One pass. Listing the nodes failing (the API server unreachable, RBAC) raises ApiError:
    nothing was done, and the caller retries after its interval."""
    return Pass(deps, time.time() if now is None else now).run()
