"""The node agent: one DaemonSet pod per GPU node checks its own node and keeps the health gate.

`plan` decides from the Node, its pods and the time alone (pure, table-tested); `Agent.step`
does the I/O: read the Node and its pods, maybe taint, run the probes, write the verdict.

- A node with the health taint `pending` (registered, never checked) or `failed` gets a full
  check (active: DCGM and NCCL load the GPUs, which the taint keeps free of work); a failed
  node again only every recheckSeconds, or at once when RECHECK_LABEL asks.
- A node with neither the taint nor `trainstack.io/health=passed` registered without the
  startup taint (an existing cluster's kubelet flags): the agent taints it `pending` first,
  counts trainstack_node_health_ungated_total and says so in a Warning Event, then checks.
- A passed node gets the passive checks every interval, training pods or not (a failure taints
  it `failed`); a full re-check when the last one is older than recheckSeconds or
  RECHECK_LABEL is set, only while no training pod (label TEAM_LABEL) runs there: taint
  `checking`, list the pods again (one may have bound between the read and the taint: then
  untaint and wait), run, write the verdict.
- With image pre-pull on (the pool's prePullGateSeconds), a `pending` node's first check waits
  until the pool's pre-pull pod on the node is Ready, its images then on the node, or the gate's
  time has passed since the agent first saw it waiting (a broken image must not keep a pool's
  new nodes out of service; the platform's alert names it). Only `pending`: a failed node's
  re-check, and a passed node, never wait for images.

The agent changes nothing on the Node but the health taint (contract.TAINT_KEY) and
contract.AGENT_LABELS, with JSON patches that test metadata.resourceVersion first (a refused
patch is re-read and retried): the admission policy refuses anything else.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from trainstack_health import contract
from trainstack_health.checks import Report, run_checks
from trainstack_health.expectations import Expectations, PoolExpectation
from trainstack_health.kube import ApiError
from trainstack_health.metrics import Metrics
from trainstack_health.probes import Probes

COMPONENT = "trainstack-health-agent"
PATCH_ATTEMPTS = 5
MESSAGE_LIMIT = 1024  # an Event's message is for people; the full report is in the log
FINISHED = frozenset({"Succeeded", "Failed"})

Kind = Literal["gate", "check", "recheck", "passive", "wait"]


class AgentApi(Protocol):
    """The agent's Kubernetes calls (kube.Kube implements them)."""

    def get_node(self, name: str) -> dict[str, Any]: ...
    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]: ...
    def patch_node_json(self, name: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]: ...
    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class Action:
    kind: Kind
    why: str

    @property
    def active(self) -> bool:
        return self.kind in ("gate", "check", "recheck")


# --- reading a Node ----------------------------------------------------------------------------


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def health_taint(node: Mapping[str, Any]) -> str | None:
    """The value of the node's health taint, or None without one."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") == contract.TAINT_KEY:
            return str(taint.get("value") or "")
    return None


def training_pods(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Training pods (TEAM_LABEL) that have not finished: what a full check must not disturb."""
    return [
        f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
        for p in pods
        if contract.TEAM_LABEL in labels_of(p)
        and (p.get("status") or {}).get("phase") not in FINISHED
    ]


def prepull_ready(pods: Sequence[Mapping[str, Any]]) -> bool | None:
    """Whether the node's image pre-pull pod is Ready (None: there is none on the node yet)."""
    for p in pods:
        if labels_of(p).get(contract.APP_LABEL) != contract.PREPULL_APP:
            continue
        if (p.get("metadata") or {}).get("deletionTimestamp"):
            continue  # the old pod of a rollout: its successor holds the new list
        conditions = (p.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return None


def images_wait(
    node: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    expect: PoolExpectation,
    waiting_since: float | None,
    now: float,
) -> tuple[Action | None, float | None]:
    """Whether a `pending` node's check waits for its pre-pulled images: (the wait, or None to
    go on; when the wait started, for the next step)."""
    gate = expect.prepull_gate_seconds
    if not gate or health_taint(node) != contract.TAINT_PENDING:
        return None, None
    ready = prepull_ready(pods)
    if ready:
        return None, None
    since = now if waiting_since is None else waiting_since
    left = gate - (now - since)
    if left <= 0:
        return None, since
    state = "no pre-pull pod yet" if ready is None else "pre-pull pod not Ready"
    return Action("wait", f"images not on the node ({state}): check in at most {left:.0f}s"), since


def plan(
    node: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    expectation: Expectations,
    last_full: float | None,
    now: float,
) -> Action:
    """What this step does. `last_full`: when the agent's last full check ended (None: none
    since the agent started)."""
    taint = health_taint(node)
    labels = labels_of(node)
    asked = contract.RECHECK_LABEL in labels
    due = last_full is None or now - last_full >= expectation.recheck_seconds or asked
    if taint == contract.TAINT_FAILED:
        why = "failed node: re-check" + (" (asked)" if asked else "")
        return Action("check", why) if due else Action("wait", "failed node: re-check later")
    if taint is not None:  # pending, checking (a restart mid-check), or an unknown value
        return Action("check", f"health taint {taint!r}: full check")
    if labels.get(contract.STATE_LABEL) != contract.STATE_PASSED:
        return Action("gate", "schedulable without a passed check: no startup taint")
    busy = training_pods(pods)
    if due and not busy:
        return Action("recheck", "idle passed node: full re-check" + (" (asked)" if asked else ""))
    why = f"re-check due, {len(busy)} training pods run" if due else "passed node"
    return Action("passive", why)


# --- writing a Node ----------------------------------------------------------------------------


def _pointer(key: str) -> str:
    """A JSON pointer token (RFC 6901): "~" as "~0", "/" as "~1"."""
    return key.replace("~", "~0").replace("/", "~1")


def _taint_ops(node: Mapping[str, Any], taint: str | None) -> list[dict[str, Any]]:
    spec = node.get("spec") or {}
    old = list(spec.get("taints") or [])
    mine = {"key": contract.TAINT_KEY, "value": taint, "effect": contract.TAINT_EFFECT}
    new: list[dict[str, Any]] = []
    placed = False
    for t in old:
        if t.get("key") != contract.TAINT_KEY:
            new.append(t)
        elif taint is not None and not placed:
            same = t.get("value") == taint and t.get("effect") == contract.TAINT_EFFECT
            new.append(t if same else mine)
            placed = True
    if taint is not None and not placed:
        new.append(mine)
    if new == old:
        return []
    if "taints" in spec:
        return [{"op": "replace", "path": "/spec/taints", "value": new}]
    if "spec" in node:
        return [{"op": "add", "path": "/spec/taints", "value": new}]
    return [{"op": "add", "path": "/spec", "value": {"taints": new}}]


def health_ops(
    node: Mapping[str, Any], taint: str | None, labels: Mapping[str, str | None]
) -> list[dict[str, Any]]:
    """A JSON patch setting the health taint to `taint` (None: removed) and the given labels
    (None: removed), touching nothing else; [] when the node already is so. The other taints
    are kept as they are, in their order; the health taint keeps its place."""
    meta = node.get("metadata") or {}
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}
    ]
    ops += _taint_ops(node, taint)
    current = meta.get("labels")
    wanted = {k: v for k, v in labels.items() if (current or {}).get(k) != v}
    if current is None and any(v is not None for v in wanted.values()):
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
        current = {}
    for key, value in sorted(wanted.items()):
        path = f"/metadata/labels/{_pointer(key)}"
        if value is None:
            if key in (current or {}):
                ops.append({"op": "remove", "path": path})
        else:
            ops.append({"op": "add", "path": path, "value": value})
    return ops if len(ops) > 1 else []


def verdict_labels(report: Report, *, full: bool) -> dict[str, str | None]:
    """The labels a report writes. A full check answers a RECHECK_LABEL request: removed."""
    labels: dict[str, str | None] = (
        {contract.STATE_LABEL: contract.STATE_PASSED, contract.REASON_LABEL: None}
        if report.passed
        else {
            contract.STATE_LABEL: contract.STATE_FAILED,
            contract.REASON_LABEL: report.failed_check,
        }
    )
    if full:
        labels[contract.RECHECK_LABEL] = None
    return labels


def event(
    node: Mapping[str, Any], reason: str, message: str, *, warning: bool, now: float
) -> dict[str, Any]:
    """A core/v1 Event on the Node, in "default" as the kubelet's node events are."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # The name is the client's to choose; kubectl and client-go use <object>.<unique>.
        "metadata": {
            "name": f"{name}.{uuid.uuid4().hex[:16]}",
            "namespace": contract.EVENT_NAMESPACE,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT, "host": name},
        "reportingComponent": COMPONENT,
        "reportingInstance": name,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


# --- the loop's step ---------------------------------------------------------------------------


Log = Callable[..., None]


def _quiet(event: str, **fields: object) -> None:
    del event, fields


@dataclass
class Agent:
    kube: AgentApi
    node_name: str
    expectations: Expectations
    probes: Probes
    metrics: Metrics
    log: Log = _quiet
    clock: Callable[[], float] = time.monotonic
    last_full: float | None = None
    last_report: Report | None = field(default=None, repr=False)
    images_since: float | None = None  # when a pending node began to wait for its images

    def step(self, now: float) -> Action:
        node = self.kube.get_node(self.node_name)
        pool = labels_of(node).get(contract.POOL_LABEL)
        expect = self.expectations.for_pool(pool, source="expectations")
        if self.last_full is None and labels_of(node).get(contract.STATE_LABEL) == (
            contract.STATE_PASSED
        ):
            # A restarted agent on a passed node: the re-check clock starts now, not at once.
            self.last_full = now
        pods = self.kube.list_pods_on_node(self.node_name)
        action = plan(node, pods, self.expectations, self.last_full, now)
        if action.kind == "check":
            wait, self.images_since = images_wait(node, pods, expect, self.images_since, now)
            if wait is None and self.images_since is not None:
                self.log("images_gate_expired", node=self.node_name, pool=expect.pool,
                         seconds=expect.prepull_gate_seconds)  # fmt: skip
                self.images_since = None
            action = wait or action
        self.log("plan", node=self.node_name, action=action.kind, why=action.why)
        if action.kind == "wait":
            return action
        if action.kind == "gate":
            node = self._patch(lambda n: health_ops(n, contract.TAINT_PENDING, {}))
            self.metrics.inc("trainstack_node_health_ungated_total", node=self.node_name,
                             pool=expect.pool)  # fmt: skip
            self._event(node, contract.EVENT_UNGATED, now, warning=True,
                        message=f"node {self.node_name} was schedulable before any health check "
                        f"passed (it registered without the {contract.TAINT_KEY} taint): "
                        f"tainted {contract.TAINT_PENDING} until the check passes")  # fmt: skip
        if action.kind == "recheck":
            node = self._patch(lambda n: health_ops(n, contract.TAINT_CHECKING, {}))
            busy = training_pods(self.kube.list_pods_on_node(self.node_name))
            if busy:  # bound between our read and the taint: leave it be
                self._patch(self._undo_checking)
                self.log("recheck_skipped", node=self.node_name, pods=busy)
                return Action("passive", f"training pod bound while tainting: {busy[0]}")
        report = run_checks(self.probes, expect, active=action.active, clock=self.clock)
        self.last_report = report
        self._record(expect, report, now)
        self.log("report", node=self.node_name, **report.to_json())
        if action.active:
            self.last_full = now
            self._verdict(report, now, full=True)
        elif not report.passed:  # a passed node failed its passive checks
            self._verdict(report, now, full=False)
        return action

    def _undo_checking(self, node: Mapping[str, Any]) -> list[dict[str, Any]]:
        if health_taint(node) != contract.TAINT_CHECKING:
            return []  # someone (a re-check elsewhere, the operator) changed it since
        return health_ops(node, None, {})

    def _verdict(self, report: Report, now: float, *, full: bool) -> None:
        taint = None if report.passed else contract.TAINT_FAILED
        labels = verdict_labels(report, full=full)
        node = self._patch(lambda n: health_ops(n, taint, labels))
        if report.passed:
            self._event(node, contract.EVENT_PASSED, now, warning=False, message=report.message)
        else:
            self._event(node, contract.EVENT_FAILED, now, warning=True,
                        message=f"{report.failed_check}: {report.message}")  # fmt: skip

    def _patch(self, build: Callable[[Mapping[str, Any]], list[dict[str, Any]]]) -> dict[str, Any]:
        """Apply build(node) to the freshly read node; on a refused test (422) or a conflict
        (409) read again and rebuild. Returns the node as written (or as read, when there was
        nothing to change)."""
        for attempt in range(PATCH_ATTEMPTS):
            node = self.kube.get_node(self.node_name)
            ops = build(node)
            if not ops:
                return node
            try:
                return self.kube.patch_node_json(self.node_name, ops)
            except ApiError as err:
                if err.status not in (409, 422) or attempt == PATCH_ATTEMPTS - 1:
                    raise
                self.log("patch_retry", node=self.node_name, status=err.status,
                         message=err.message)  # fmt: skip
        raise AssertionError("unreachable")  # pragma: no cover

    def _event(
        self, node: Mapping[str, Any], reason: str, now: float, *, warning: bool, message: str
    ) -> None:
        try:
            self.kube.create_event(
                contract.EVENT_NAMESPACE, event(node, reason, message, warning=warning, now=now)
            )
        except ApiError as err:  # the verdict is on the Node already; an Event is a courtesy
            self.log("event_error", node=self.node_name, reason=reason, message=str(err))

    def _record(self, expect: PoolExpectation, report: Report, now: float) -> None:
        ids = {"node": self.node_name, "pool": expect.pool}
        m = self.metrics
        m.set("trainstack_node_health_passed", 1.0 if report.passed else 0.0, **ids)
        m.inc("trainstack_node_health_checks_total", **ids)
        m.set("trainstack_node_health_last_check_timestamp_seconds", now, **ids)
        m.replace("trainstack_node_health_check_duration_seconds", {
            tuple(sorted({**ids, "check": r.check}.items())): r.seconds for r in report.results
        })  # fmt: skip
        for r in report.results:
            if not r.passed:
                m.inc("trainstack_node_health_check_failures_total", check=r.check, **ids)
        if report.busbw_gbps is not None:
            m.set("trainstack_node_health_busbw_gbps", report.busbw_gbps, **ids)
