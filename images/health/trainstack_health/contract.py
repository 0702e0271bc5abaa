"""What the node health agent, its repair controller and the platform agree on.

The platform's builders (trainstack/builders/health.py) and monitoring rules import these, as
they import the other images' contracts, so the DaemonSet, the admission policy, the alerts and
the programs name exactly the same taint, labels, files and metrics. One module, two
byte-identical copies: trainstack/contracts/health.py (the platform's) and
images/health/trainstack_health/contract.py (the image's); standard library only, and
tests/test_contracts.py holds the copies identical. docs/health.md explains each name.
"""

from __future__ import annotations

from typing import Final

PROG: Final = "trainstack-health"

# --- the gate -------------------------------------------------------------------------------
# GPU nodes register with this taint (AWS: the pools' node configuration; existing clusters:
# the cluster owner's kubelet flags). Only the agent tolerates it; a pass removes it.
TAINT_KEY: Final = "trainstack.io/health"
TAINT_EFFECT: Final = "NoSchedule"
TAINT_PENDING: Final = "pending"  # registered, not yet checked
TAINT_CHECKING: Final = "checking"  # an idle node the agent is re-checking
TAINT_FAILED: Final = "failed"  # the last check failed: the node takes no new work

# Node labels the agent (and only it, with the repair controller for REPAIR_LABEL) writes.
STATE_LABEL: Final = "trainstack.io/health"
STATE_PASSED: Final = "passed"
STATE_FAILED: Final = "failed"
STATE_CHECKING: Final = "checking"
REASON_LABEL: Final = "trainstack.io/health-reason"  # the first failed check, e.g. "xid"
REPAIR_LABEL: Final = "trainstack.io/health-repair"  # drained | requested | hook-failed
# When the repair controller drained the node (Unix seconds): the repair delay counts from it.
DRAINED_AT_ANNOTATION: Final = "trainstack.io/health-drained-at"
# Set by the repair controller on a node whose ranks keep straggling (value: "straggler"): the
# agent re-checks the node at its next idle moment and then removes the label.
RECHECK_LABEL: Final = "trainstack.io/health-recheck"
RECHECK_STRAGGLER: Final = "straggler"
# The platform's alert on a straggling rank (builders/monitoring/health.py defines it; the
# repair controller counts its firings per node in Prometheus to set RECHECK_LABEL).
STRAGGLER_ALERT: Final = "TrainstackGpuRankStraggler"
# Every label key the agent may set or remove (the admission policy allows only these).
AGENT_LABELS: Final = (STATE_LABEL, REASON_LABEL, RECHECK_LABEL)
# ... and the repair controller.
REPAIR_LABELS: Final = (REPAIR_LABEL, RECHECK_LABEL)

# Checks, in the order they run; a failure names the first that failed (REASON_LABEL).
CHECK_GPU_COUNT: Final = "gpu-count"
CHECK_GPU_MODEL: Final = "gpu-model"
CHECK_ECC: Final = "ecc"
CHECK_XID: Final = "xid"
CHECK_DCGM: Final = "dcgm"
CHECK_EFA: Final = "efa"
CHECK_IB: Final = "ib"
CHECK_NCCL: Final = "nccl"
CHECKS: Final = (
    CHECK_GPU_COUNT,
    CHECK_GPU_MODEL,
    CHECK_ECC,
    CHECK_XID,
    CHECK_DCGM,
    CHECK_EFA,
    CHECK_IB,
    CHECK_NCCL,
)

# Events on the Node (namespace "default", as the kubelet's own node events).
EVENT_PASSED: Final = "HealthCheckPassed"
EVENT_FAILED: Final = "HealthCheckFailed"
EVENT_DRAINED: Final = "HealthDrained"
EVENT_REPAIR: Final = "HealthRepairRequested"
# The agent found its node schedulable before any check had passed: the node registered
# without the startup taint (an existing cluster's kubelet flags lack it). The agent taints it.
EVENT_UNGATED: Final = "HealthGateMissing"
EVENT_NAMESPACE: Final = "default"

# --- what the platform gives the programs -------------------------------------------------
SYSTEM_NAMESPACE: Final = "trainstack-system"
AGENT_SERVICE_ACCOUNT: Final = "trainstack-health-agent"
REPAIR_SERVICE_ACCOUNT: Final = "trainstack-health-repair"
CONFIGMAP: Final = "trainstack-health"
# ConfigMap key "expectations.json", mounted here: {"pools": {<pool label value>: {
#   "instanceType": str | null, "gpus": int, "gpuModel": str | null, "efaDevices": int,
#   "ibPorts": int, "ibRateGbps": int | null, "busbwFloorGBps": float | null,
#   "dcgmLevel": int, "prePullGateSeconds": int | null}}, "recheckSeconds": int,
#  "repair": {"mode": "replace" | "hook" | "none", "hookUrl": str | null,
#             "delaySeconds": int, "region": str | null, "clusterName": str,
#             "prometheusUrl": str | null, "stragglerAlerts": int}}
# (stragglerAlerts: straggler alerts naming a node within a day before the repair controller
# sets RECHECK_LABEL on it; prometheusUrl null: stragglers are not followed up.
# prePullGateSeconds: how long a pending node's check waits for the pool's image pre-pull pod
# to be Ready, its images then on the node; null or absent: it does not wait.)
# Image pre-pull's pods (trainstack/builders/prepull.py) carry this app.kubernetes.io/name.
APP_LABEL: Final = "app.kubernetes.io/name"
PREPULL_APP: Final = "trainstack-prepull"
EXPECTATIONS_PATH: Final = "/etc/trainstack-health/expectations.json"
NODE_NAME_ENV: Final = "NODE_NAME"  # the downward API's spec.nodeName
# A bound service-account token's node name, as the API server puts it in userInfo.extra
# (the admission policy compares it with the Node being changed).
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
POOL_LABEL: Final = "trainstack.io/pool"
TEAM_LABEL: Final = "trainstack.io/team"  # on training pods: what a drain evicts
METRICS_PORT: Final = 8080

DEFAULT_RECHECK_S: Final = 3600
DEFAULT_DCGM_LEVEL: Final = 2

# name -> (Prometheus type, help). Agent: one series set per node; repair: per pool.
METRICS: Final[dict[str, tuple[str, str]]] = {
    "trainstack_node_health_passed": (
        "gauge",
        "1 if the node's last health check passed, 0 if it failed or none has finished",
    ),
    "trainstack_node_health_check_duration_seconds": (
        "gauge",
        "Wall time of each check in the node's last health check",
    ),
    "trainstack_node_health_check_failures_total": (
        "counter",
        "Health checks that failed, by check",
    ),
    "trainstack_node_health_checks_total": ("counter", "Health checks run on the node"),
    "trainstack_node_health_last_check_timestamp_seconds": (
        "gauge",
        "When the node's last health check ended (Unix time)",
    ),
    "trainstack_node_health_busbw_gbps": (
        "gauge",
        "Bus bandwidth of the node's last intra-node NCCL all-reduce (GB/s)",
    ),
    "trainstack_node_health_ungated_total": (
        "counter",
        "Times the agent found its node schedulable with no check passed (no startup taint)",
    ),
    "trainstack_node_repairs_total": (
        "counter",
        "Repairs of failed nodes, by action (drain, replace, hook, recheck)",
    ),
    "trainstack_node_repair_errors_total": (
        "counter",
        "Failed repair operations, by operation",
    ),
}
METRIC_LABELS: Final[dict[str, tuple[str, ...]]] = {
    "trainstack_node_health_passed": ("node", "pool"),
    "trainstack_node_health_check_duration_seconds": ("node", "pool", "check"),
    "trainstack_node_health_check_failures_total": ("node", "pool", "check"),
    "trainstack_node_health_checks_total": ("node", "pool"),
    "trainstack_node_health_last_check_timestamp_seconds": ("node", "pool"),
    "trainstack_node_health_busbw_gbps": ("node", "pool"),
    "trainstack_node_health_ungated_total": ("node", "pool"),
    "trainstack_node_repairs_total": ("pool", "action"),
    "trainstack_node_repair_errors_total": ("operation",),
}
