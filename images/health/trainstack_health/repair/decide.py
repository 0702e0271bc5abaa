"""What the repair controller does to a node, as pure functions of what it read.

Progress is recorded on the Node itself, so a restarted controller (or a second replica
during a rollout) picks up where the last one stopped and never acts twice:

- `contract.REPAIR_LABEL` absent: nothing done yet. A failed node is drained: its training
  pods are evicted, the label becomes `drained` and `DRAINED_AT_ANNOTATION` records when.
- `drained` (or `hook-failed`): pods left over (a PodDisruptionBudget refused an eviction,
  429) are evicted again each pass. Once no training pod is left on the node and the node has
  stayed failed for `repair.delaySeconds` since the drain, the repair is requested
  (mode "none": the node stays `drained`, for its owner to repair by hand).
- `requested`: done; the Auto Scaling group (or the hook's owner) has the node now.
- A node the agent marks `passed` again (a re-check cleared a transient failure, or the node
  was repaired in place) loses the label and the annotation; a node that is `checking` is
  left alone until the agent has an answer.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainstack_health.contract import (
    DRAINED_AT_ANNOTATION,
    POOL_LABEL,
    REASON_LABEL,
    RECHECK_LABEL,
    REPAIR_LABEL,
    STATE_FAILED,
    STATE_LABEL,
    STATE_PASSED,
    SYSTEM_NAMESPACE,
    TEAM_LABEL,
)
from trainstack_health.contract import STRAGGLER_ALERT as CONTRACT_STRAGGLER_ALERT
from trainstack_health.errors import SetupError

# The label's values (contract: "drained | requested | hook-failed").
DRAINED = "drained"
REQUESTED = "requested"
HOOK_FAILED = "hook-failed"
# contract.DRAINED_AT_ANNOTATION holds when the drain happened, in Unix seconds (as text).

MODES = ("replace", "hook", "none")
DEFAULT_STRAGGLER_ALERTS = 3
# Namespaces whose pods a drain never touches, whatever their labels.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", SYSTEM_NAMESPACE})
# A static pod's API object: the kubelet owns it, an eviction cannot remove it (k8s
# pkg/kubelet/types/pod_update.go ConfigMirrorAnnotationKey).
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# node.spec.providerID of an EC2 instance: aws:///<zone>/<instance id> (the AWS cloud
# provider's form; older nodes: aws://<zone>/<id>). EC2 instance ids are i- and 8 or 17 hex.
_PROVIDER_ID = re.compile(r"^aws://(?:/)?[^/]*/(i-[0-9a-f]{8}(?:[0-9a-f]{9})?)$")


@dataclass(frozen=True)
class Settings:
    """The `repair` object of expectations.json (contract.EXPECTATIONS_PATH)."""

    mode: str
    hook_url: str | None
    delay_s: float
    region: str | None
    cluster_name: str
    prometheus_url: str | None = None
    straggler_alerts: int = DEFAULT_STRAGGLER_ALERTS


def _url(value: object, schemes: tuple[str, ...]) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in schemes and bool(parts.hostname) and not parts.username


def parse_settings(doc: object, where: str = "expectations.json") -> Settings:
    repair = doc.get("repair") if isinstance(doc, dict) else None
    if not isinstance(repair, dict):
        raise SetupError(f"{where}: no 'repair' object; is this the platform's expectations?")
    mode = repair.get("mode")
    if mode not in MODES:
        raise SetupError(f"{where}: repair.mode must be one of {', '.join(MODES)}, got {mode!r}")
    hook_url = repair.get("hookUrl")
    # https only: the payload names the cluster's nodes, and whoever answers it decides which
    # machines are rebuilt. No exception for plain http, not even for tests.
    if mode == "hook" and not _url(hook_url, ("https",)):
        raise SetupError(
            f"{where}: repair.mode 'hook' needs an https:// repair.hookUrl (with a host and "
            f"no credentials in it), got {hook_url!r}"
        )
    delay = repair.get("delaySeconds", 0)
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay < math.inf:
        raise SetupError(f"{where}: repair.delaySeconds must be a number >= 0, got {delay!r}")
    region = repair.get("region")
    if mode == "replace" and not (isinstance(region, str) and region):
        raise SetupError(f"{where}: repair.mode 'replace' needs repair.region")
    cluster = repair.get("clusterName")
    if not isinstance(cluster, str) or not cluster:
        raise SetupError(f"{where}: repair.clusterName is missing")
    prometheus = repair.get("prometheusUrl")
    # In-cluster Prometheus usually serves plain http on its Service; both are accepted.
    if prometheus is not None and not _url(prometheus, ("http", "https")):
        raise SetupError(
            f"{where}: repair.prometheusUrl must be an http(s):// URL or null, got {prometheus!r}"
        )
    stragglers = repair.get("stragglerAlerts", DEFAULT_STRAGGLER_ALERTS)
    if isinstance(stragglers, bool) or not isinstance(stragglers, int) or stragglers < 1:
        raise SetupError(
            f"{where}: repair.stragglerAlerts must be an integer >= 1, got {stragglers!r}"
        )
    return Settings(
        mode=str(mode),
        hook_url=hook_url if isinstance(hook_url, str) else None,
        delay_s=float(delay),
        region=region if isinstance(region, str) else None,
        cluster_name=cluster,
        prometheus_url=prometheus,
        straggler_alerts=stragglers,
    )


def read_settings(path: Path) -> Settings:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SetupError(
            f"{path}: no expectations; mount the trainstack-health ConfigMap's "
            "expectations.json there or pass --expectations"
        ) from None
    except (OSError, ValueError) as err:
        raise SetupError(f"{path}: cannot read the expectations: {err}") from None
    return parse_settings(doc, str(path))


def format_time(t: float) -> str:
    """RFC 3339, UTC, for Events and logs."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def drained_at_text(t: float) -> str:
    """The DRAINED_AT_ANNOTATION value: whole Unix seconds (contract)."""
    return str(int(t))


def parse_drained_at(text: object) -> float | None:
    """The drain time, or None if absent or unreadable (then the controller records it again
    from now: a damaged annotation never makes the delay shorter)."""
    if not isinstance(text, str) or not text.isdecimal():
        return None
    return float(text)


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    state: str | None  # STATE_LABEL
    reason: str | None  # REASON_LABEL
    progress: str | None  # REPAIR_LABEL
    drained_at: float | None
    provider_id: str | None
    resource_version: str
    uid: str = ""
    recheck: str | None = None  # RECHECK_LABEL
    labels: Mapping[str, str] = field(default_factory=dict)


def parse_node(obj: Mapping[str, Any]) -> Node:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return Node(
        name=str(meta.get("name", "")),
        pool=str(labels.get(POOL_LABEL, "")),
        state=labels.get(STATE_LABEL),
        reason=labels.get(REASON_LABEL),
        progress=labels.get(REPAIR_LABEL),
        drained_at=parse_drained_at(annotations.get(DRAINED_AT_ANNOTATION)),
        provider_id=(obj.get("spec") or {}).get("providerID"),
        resource_version=str(meta.get("resourceVersion", "")),
        uid=str(meta.get("uid", "")),
        recheck=labels.get(RECHECK_LABEL),
        labels={str(k): str(v) for k, v in labels.items()},
    )


def instance_id(provider_id: str | None) -> str | None:
    """The EC2 instance id of a node, or None if it is not an EC2 instance."""
    match = _PROVIDER_ID.match(provider_id or "")
    return match.group(1) if match else None


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def is_training_pod(pod: Mapping[str, Any]) -> bool:
    """A pod a drain moves: a team's workload (TEAM_LABEL, which the job layer puts on every
    training pod), never a DaemonSet's pod (it would come straight back, and the node's
    agents must keep running), a static pod, or a pod of the system namespaces."""
    meta = pod.get("metadata") or {}
    if TEAM_LABEL not in (meta.get("labels") or {}):
        return False
    if meta.get("namespace") in SYSTEM_NAMESPACES:
        return False
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return False
    owners = meta.get("ownerReferences") or []
    return not any(o.get("kind") == "DaemonSet" for o in owners)


def _ref(pod: Mapping[str, Any]) -> PodRef:
    meta = pod.get("metadata") or {}
    return PodRef(str(meta.get("namespace", "")), str(meta.get("name", "")))


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def to_evict(pods: Iterable[Mapping[str, Any]]) -> list[PodRef]:
    """Training pods still running or pending on the node and not already being deleted.
    Finished pods hold no GPU and their job has seen their end: they stay for their logs."""
    return sorted(
        (
            _ref(p)
            for p in pods
            if is_training_pod(p)
            and not _finished(p)
            and not (p.get("metadata") or {}).get("deletionTimestamp")
        ),
        key=lambda r: r.key,
    )


def remaining(pods: Iterable[Mapping[str, Any]]) -> list[PodRef]:
    """Training pods not finished, terminating ones included: while one is still in its
    termination grace period (writing its checkpoint), the instance must not go away."""
    return sorted((_ref(p) for p in pods if is_training_pod(p) and not _finished(p)),
                  key=lambda r: r.key)  # fmt: skip


class Step(Enum):
    NOTHING = "nothing"
    CLEAR = "clear"  # passed again: remove the repair label and annotation
    DRAIN = "drain"  # first sight of the failure: evict, label drained, Event
    EVICT = "evict"  # drained already: evict what is left (and restore a lost drain time)
    REPAIR = "repair"  # drained, empty and failed for long enough: replace or call the hook


@dataclass(frozen=True)
class Plan:
    step: Step
    why: str


def plan(node: Node, *, now: float, settings: Settings, left: int) -> Plan:  # noqa: PLR0911
    """The step for one node. `left`: training pods not finished on it (`remaining`).
    A decision table, read top to bottom: each early return is one row."""
    if node.state == STATE_PASSED:
        if node.progress is not None or node.drained_at is not None:
            return Plan(Step.CLEAR, "passed again")
        return Plan(Step.NOTHING, "passed")
    if node.state != STATE_FAILED:
        return Plan(Step.NOTHING, f"state {node.state!r}: waiting for the agent")
    if node.progress == REQUESTED:
        return Plan(Step.NOTHING, "repair already requested")
    if node.progress is None:
        return Plan(Step.DRAIN, "failed")
    if left:
        return Plan(Step.EVICT, f"{left} training pod(s) still on the node")
    if node.drained_at is None:  # annotation lost: start the delay again (never shorter)
        return Plan(Step.EVICT, "no drain time recorded")
    if settings.mode == "none":
        return Plan(Step.NOTHING, "drained; repair.mode is none")
    waited = now - node.drained_at
    if waited < settings.delay_s:
        return Plan(Step.NOTHING, f"failed for {waited:.0f}s of {settings.delay_s:.0f}s")
    return Plan(Step.REPAIR, f"failed for {waited:.0f}s since the drain")


def hook_payload(node: Node, settings: Settings) -> dict[str, Any]:
    """What the hook receives (docs/health.md): the same request may come twice (a
    controller restarted between the call and the label), so receivers key it by node."""
    return {
        "cluster": settings.cluster_name,
        "node": node.name,
        "providerID": node.provider_id,
        "pool": node.pool,
        "reason": node.reason,
        "labels": dict(sorted(node.labels.items())),
    }


# --- stragglers (issue 42 #4) ---------------------------------------------------------------
# The alert trainstack's monitoring rules define (trainstack/builders/monitoring/health.py); its
# series carry the straggling rank's `node` label. Its name is the contract's.
STRAGGLER_ALERT = CONTRACT_STRAGGLER_ALERT
# The agent's gauge: when the node's last health check ended (contract.METRICS).
LAST_CHECK = "trainstack_node_health_last_check_timestamp_seconds"
STRAGGLER_WINDOW_S = 24 * 3600
_STEP = "1m"


def straggler_query(window_s: int = STRAGGLER_WINDOW_S) -> str:
    """Per node, the firings of the straggler alert within the window that began after the
    node's last health check.

    Episodes, not samples: Prometheus writes `ALERTS{alertname, alertstate="firing", <alert
    labels>}` = 1 at every rule evaluation while the alert fires and marks the series stale
    when it stops (prometheus/prometheus docs/configuration/alerting_rules.md, "Inspecting
    alerts during runtime"), so `count_over_time(ALERTS[24h])` would weigh one long episode as
    many short ones. At each 1m step of the subquery, a firing series that did not fire one
    minute earlier (`unless ... offset 1m`: absent there, its stale marker ended it) starts an
    episode: each counts once whatever the evaluation interval (up to the 5m lookback), and
    two less than a minute apart count as one. The ranks of one node are separate series, so
    several slow ranks on a node count several times: stronger evidence, not weaker. Pending
    episodes never count.

    Since the last check: an episode counts only at steps later than the node's last health
    check as known now (`@ end()`: the query's own evaluation time, prometheus docs/querying/
    basics.md, "@ modifier"). Once the agent has re-checked a node (passed: the label goes,
    LAST_CHECK moves on), the firings that asked for it no longer count, so a node is not
    asked again for the same evidence, and nothing needs remembering between passes or
    restarts. A node whose agent has no recent LAST_CHECK sample (no check finished, or not
    scraped within the lookback) has nothing counted."""
    firing = f'ALERTS{{alertname="{STRAGGLER_ALERT}",alertstate="firing"}}'
    checked = f"max by (node) ({LAST_CHECK} @ end())"
    hours = window_s // 3600
    window = f"{hours}h" if hours * 3600 == window_s else f"{window_s}s"
    edges = f"({firing} unless {firing} offset {_STEP})"
    return (
        f"sum by (node) (count_over_time(({edges} and on (node) (time() > {checked}))"
        f"[{window}:{_STEP}]))"
    )


def parse_vector(doc: object) -> dict[str, float]:
    """The `node` -> value pairs of an instant query's answer (prometheus docs/querying/api.md,
    "Instant queries": {"status": "success", "data": {"resultType": "vector", "result":
    [{"metric": {...}, "value": [<unix time>, "<value as text>"]}]}}). Raises ValueError
    on anything else, with what was wrong."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, dict) else None
        raise ValueError(f"query failed: {error or doc!r}"[:300])
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise ValueError(f"expected a vector result, got {data!r}"[:300])
    counts: dict[str, float] = {}
    for item in data.get("result") or []:
        metric = item.get("metric") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        node = metric.get("node") if isinstance(metric, dict) else None
        if not isinstance(node, str) or not isinstance(value, list) or len(value) != 2:
            continue  # a series without a node names nobody to re-check
        try:
            counts[node] = counts.get(node, 0.0) + float(value[1])
        except (TypeError, ValueError):
            continue
    return counts


def recheck_targets(
    counts: Mapping[str, float], nodes: Iterable[Node], *, threshold: int
) -> list[str]:
    """GPU-pool nodes whose straggler firings since their last check reached the threshold,
    and that the agent can re-check: not already labelled for a re-check, and not failed (a
    failed node is being drained and repaired)."""
    return sorted(
        node.name
        for node in nodes
        if node.pool
        and counts.get(node.name, 0.0) >= threshold
        and node.recheck is None
        and node.state != STATE_FAILED
    )
