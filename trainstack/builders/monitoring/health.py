"""Monitoring of the node health gate (docs/health.md): the agent's and the repair controller's
PodMonitors, and the health alerts: a failed node, a node that registered without the startup
taint, a pool with fewer healthy nodes than its queues' guarantees need, failing repairs, and a
straggler rank named by its node.

The metric and label names are the health contract's (trainstack/contracts/health.py); the
settings are the platform config's `health` section (`cfg.health`). The straggler alert needs
only the training runtime's metrics, so it is there whether the gate is enabled or not (the
repair controller follows its firings up only when the gate runs).
"""

from __future__ import annotations

import math
from typing import Any, Final

from trainstack.builders import labels
from trainstack.builders.monitoring.common import (
    JOB_KEYS,
    NAMESPACE,
    alert_rule,
    constant_vector,
    object_meta,
)
from trainstack.config.capacity import claims, envelopes, promises, shortfalls, supplies
from trainstack.config.model import PlatformConfig
from trainstack.contracts import health as contract

AGENT_APP: Final = "trainstack-health-agent"
REPAIR_APP: Final = "trainstack-health-repair"
APP_NAME_LABEL: Final = labels.APP_NAME  # builders/health.py pod_labels: what we select

PASSED: Final = "trainstack_node_health_passed"
LAST_CHECK: Final = "trainstack_node_health_last_check_timestamp_seconds"
UNGATED: Final = "trainstack_node_health_ungated_total"
REPAIR_ERRORS: Final = "trainstack_node_repair_errors_total"

FAILED_ALERT: Final = "TrainstackNodeHealthCheckFailed"
UNGATED_ALERT: Final = "TrainstackNodeRegisteredUngated"
POOL_ALERT: Final = "TrainstackPoolBelowGuarantee"
REPAIR_ALERT: Final = "TrainstackNodeRepairErrors"
# The repair controller counts this alert's firings per `node`: the name is the contract's.
STRAGGLER_ALERT: Final = contract.STRAGGLER_ALERT

# How long a failed check must stand before the alert (the agent reports once per check, so
# this only rides out a scrape or two), and how long a pool may be short (a node being
# replaced or re-checked comes back within it).
FAILED_MINUTES: Final = 5
POOL_SHORT_MINUTES: Final = 10
# Counters that count rare events (an ungated registration, a failed repair) alert for this
# long after each event.
EVENT_WINDOW: Final = "1h"
REPAIR_WINDOW: Final = "15m"
# The window each rank's mean step time is taken over (the other step-time alerts' too);
# `health.stragglerMinutes` is how long a rank must stay slow.
STRAGGLER_RATE_WINDOW: Final = "10m"


# -- scrape objects --------------------------------------------------------------------------


def _pod_monitor(cfg: PlatformConfig, app: str) -> dict[str, Any]:
    # honorLabels: the agent's series carry the node it checked and its pool, the repair
    # controller's the pool it repaired; Prometheus would rename a scraped label that collides
    # with a target label to exported_<name> (prometheus-operator v0.93.0 PodMonitor CRD,
    # podMetricsEndpoints[].honorLabels: "preserves the metric's labels when they collide with
    # the target's labels"), and the rules join on `node` and `pool` as the programs wrote them.
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": object_meta(cfg, app, NAMESPACE),
        "spec": {
            "namespaceSelector": {"matchNames": [contract.SYSTEM_NAMESPACE]},
            "selector": {"matchLabels": {APP_NAME_LABEL: app}},
            "podMetricsEndpoints": [
                {"port": "metrics", "path": "/metrics", "interval": "30s", "honorLabels": True}
            ],
        },
    }


def pod_monitors(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The agent's and the repair controller's /metrics (container port `metrics`, contract
    METRICS_PORT), when the gate is enabled. Their pods carry `app.kubernetes.io/name` =
    AGENT_APP / REPAIR_APP (the builder of the DaemonSet and Deployment must set it)."""
    if not cfg.health.enabled or not cfg.gpu_pools:
        return []
    return [_pod_monitor(cfg, AGENT_APP), _pod_monitor(cfg, REPAIR_APP)]


# -- what the guarantees need ----------------------------------------------------------------


def _uncarried(cfg: PlatformConfig, capacity: dict[str, int]) -> int:
    found = shortfalls(claims(promises(cfg), envelopes(cfg), "guarantee"), capacity)
    return sum(s.need - s.available for s in found)


def needed_nodes(cfg: PlatformConfig) -> dict[str, int]:
    """Pool -> the healthy nodes the queues' guarantees need on it, from the capacity
    arithmetic the loader checks (config/capacity.py): the guaranteed GPUs that no other pool's
    firm capacity can carry (the total claimed less the maximum flow with this pool at zero,
    less what does not fit even with it), in whole nodes. A team on one pool needs its whole
    guarantee there; a team that may use several needs on each only what the others cannot
    take. Pools that need none are left out.

    Firm capacity is taken at render time, as the loader's check and the queues' builder take
    it: a capacity block counts inside its window only, so a platform deployed inside it
    expects the block's nodes, and the alert then rightly says when the block ends that the
    guarantees resting on it cannot be kept."""
    pools = supplies(cfg)
    firm = {name: s.firm for name, s in pools.items()}
    baseline = _uncarried(cfg, firm)
    result: dict[str, int] = {}
    for name, supply in sorted(pools.items()):
        must = _uncarried(cfg, {**firm, name: 0}) - baseline
        if must > 0:
            result[name] = math.ceil(must / supply.gpus_per_node)
    return result


def needed_expr(needed: dict[str, int]) -> str:
    """The needed node counts as a PromQL vector: one sample per pool, labelled `pool` and
    `needed` (so the alert can say the number)."""
    return constant_vector(
        [({"pool": pool, "needed": str(n)}, str(n)) for pool, n in sorted(needed.items())]
    )


# -- expressions -----------------------------------------------------------------------------


def per_node(metric: str) -> str:
    """One series per node: the agent's target labels (pod, instance, container) dropped, so
    an agent pod replaced on its node does not split or duplicate the node's state."""
    return f"max by (node, pool) ({metric})"


def counted(metric: str, by: str, window: str) -> str:
    """Series of counter `metric`, summed by `by`, that counted an event within `window`.

    `increase()` needs two samples of a series, so it misses the event that creates one: a
    labelled counter that a program creates and increments at once first appears at 1, and a
    Prometheus without created-timestamp ingestion cannot tell that from a counter scraped for
    the first time (prometheus.io/docs/practices/instrumentation/#avoid-missing-metrics;
    robustperception.io/existential-issues-with-metrics). The second term catches those: a
    series present now with a value above 0 that did not exist `window` ago. (The repair
    controller creates each `operation` series at its first error: images/health
    trainstack_health/repair/metrics.py `Metrics.inc`.)"""
    grown = f"sum by ({by}) (increase({metric}[{window}])) > 0"
    born = f"sum by ({by}) ({metric} unless {metric} offset {window}) > 0"
    return f"({grown}) or ({born})"


def rank_busy_seconds(window: str) -> str:
    """Each rank's mean step time outside exposed communication over `window`, with the
    rank's node (the runtime's PodMonitor relabels the pod's node into `node`).

    Exposed communication is taken out because in synchronous training the ranks wait for
    the slowest inside the collective: every rank's wall step time is then the straggler's,
    and only the time outside the wait tells them apart. Where the job does not measure it
    (no `Session.watch_comm`), the counter stays 0 and this is the wall step time."""
    keys = f"{JOB_KEYS}, pool, node, pod, rank"
    step = f"sum by ({keys}) (rate(trainstack_step_seconds_total[{window}]))"
    comm = f"sum by ({keys}) (rate(trainstack_comm_seconds_total[{window}]))"
    steps = f"sum by ({keys}) (rate(trainstack_steps_total[{window}]))"
    return f"(({step} - ({comm} or {step} * 0)) / {steps})"


# -- alerts ----------------------------------------------------------------------------------


def straggler_alert(cfg: PlatformConfig) -> dict[str, Any]:
    """A rank slower than `health.stragglerRatio` x its job's median rank for
    `health.stragglerMinutes`, labelled with its node."""
    h = cfg.health
    busy = rank_busy_seconds(STRAGGLER_RATE_WINDOW)
    job = "{{ $labels.namespace }}/{{ $labels.job_name }}"
    return alert_rule(
        cfg.monitoring.runbook_url,
        STRAGGLER_ALERT,
        f"{busy} > on ({JOB_KEYS}) group_left () "
        f"({h.straggler_ratio:g} * quantile by ({JOB_KEYS}) (0.5, {busy}))",
        h.straggler_minutes,
        "warning",
        f"Rank {{{{ $labels.rank }}}} of {job} is a straggler on node {{{{ $labels.node }}}}",
        f"Rank {{{{ $labels.rank }}}} (pod {{{{ $labels.pod }}}}) takes "
        f"{{{{ $value | humanizeDuration }}}} per step outside communication, more than "
        f"{h.straggler_ratio:g}x its job's median rank, for {h.straggler_minutes}m: check node "
        "{{ $labels.node }} (`trainstack healthcheck`); with the health gate on, a node named "
        f"{h.straggler_alerts} times a day is re-checked by the agent.",
    )


def _gate_alerts(cfg: PlatformConfig) -> list[dict[str, Any]]:
    runbook = cfg.monitoring.runbook_url
    alerts = [
        alert_rule(
            runbook,
            FAILED_ALERT,
            # LAST_CHECK > 0: a check has finished (passed is 0 before the first one too).
            f"{per_node(PASSED)} == 0 and on (node, pool) ({per_node(LAST_CHECK)} > 0)",
            FAILED_MINUTES,
            "critical",
            "GPU node {{ $labels.node }} (pool {{ $labels.pool }}) failed its health check",
            "The node keeps the health taint and takes no new work; its "
            f"{contract.REASON_LABEL} label and its {contract.EVENT_FAILED} Event name the "
            "check that failed.",
        ),
        alert_rule(
            runbook,
            UNGATED_ALERT,
            counted(UNGATED, "node, pool", EVENT_WINDOW),
            0,
            "warning",
            "GPU node {{ $labels.node }} (pool {{ $labels.pool }}) registered without the "
            "health taint",
            "The agent found the node schedulable before any check passed and tainted it: "
            "work may have landed on it unchecked. The pool's nodes register without "
            f"{contract.TAINT_KEY}={contract.TAINT_PENDING}:{contract.TAINT_EFFECT} (on an "
            f"existing cluster: the kubelet's --register-with-taints); its "
            f"{contract.EVENT_UNGATED} Event is on the node.",
        ),
    ]
    needed = needed_nodes(cfg)
    if needed:
        vector = needed_expr(needed)
        alerts.append(
            alert_rule(
                runbook,
                POOL_ALERT,
                # `or`: a pool none of whose nodes reports counts as 0 healthy nodes.
                f"(sum by (pool) ({per_node(PASSED)}) or on (pool) ({vector}) * 0) "
                f"< on (pool) group_left (needed) ({vector})",
                POOL_SHORT_MINUTES,
                "critical",
                "Pool {{ $labels.pool }} has fewer healthy nodes than its guarantees need",
                "{{ $value }} healthy nodes in pool {{ $labels.pool }}; the queues' "
                "guarantees on it need {{ $labels.needed }}: guaranteed jobs may not start.",
            )
        )
    alerts.append(
        alert_rule(
            runbook,
            REPAIR_ALERT,
            counted(REPAIR_ERRORS, "operation", REPAIR_WINDOW),
            0,
            "warning",
            "Node repairs fail: {{ $labels.operation }}",
            f"trainstack-health-repair's {{{{ $labels.operation }}}} operations failed in the "
            f"last {REPAIR_WINDOW}: failed nodes are not drained or repaired.",
        )
    )
    return alerts


def health_alerts(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The gate's alerts (when it is enabled on a platform with GPU pools) and the straggler
    alert (always)."""
    gate = _gate_alerts(cfg) if cfg.health.enabled and cfg.gpu_pools else []
    return [*gate, straggler_alert(cfg)]
