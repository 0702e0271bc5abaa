"""Monitoring constants shared by the chart values, scrape objects and rules: charts, names,
label keys, the accounting interval, and object metadata."""

from __future__ import annotations

from typing import Any, Final

from trainstack.builders import labels
from trainstack.builders.platform import namespace
from trainstack.builders.pools import CAPACITY, GPU_PRESENT_LABEL
from trainstack.config.model import PlatformConfig
from trainstack.config.monitoring import MONITORING_NAMESPACE

NAMESPACE: Final = MONITORING_NAMESPACE
# Upstream charts, pinned (../shared/reference/aws-gpu-platform-facts.md §6).
CHARTS: Final[dict[str, dict[str, str]]] = {
    "kube-prometheus-stack": {
        "chart": "kube-prometheus-stack",
        "version": "82.16.0",
        "repo": "https://prometheus-community.github.io/helm-charts",
    },
    "dcgm-exporter": {
        "chart": "dcgm-exporter",
        "version": "4.8.2",
        "repo": "https://nvidia.github.io/dcgm-exporter/helm-charts",
    },
}
KPS_RELEASE: Final = "kube-prometheus-stack"
DCGM_RELEASE: Final = "dcgm-exporter"
DCGM_CONFIGMAP: Final = "trainstack-dcgm-counters"
DCGM_CSV_PATH: Final = "/etc/dcgm-exporter/trainstack-counters.csv"
# The chart's default `service.port` and listen address (":9400"), on the node's network.
DCGM_PORT: Final = 9400
DASHBOARD_LABEL: Final = ("grafana_dashboard", "1")  # the Grafana sidecar's label
RUNTIME_PORT: Final = 8080  # trainstack.contracts.runtime.HEALTH_PORT_DEFAULT

# Job annotations the job layer sets; kube-state-metrics exports them as gauges.
MAX_DURATION_ANNOTATION: Final = f"{labels.PREFIX}/max-duration-seconds"
CHECKPOINT_INTERVAL_ANNOTATION: Final = f"{labels.PREFIX}/checkpoint-interval-seconds"
QUEUE_POD_LABEL: Final = "volcano.sh/queue-name"
INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"

# Pod / node label keys kube-state-metrics exports (as label_<sanitised key>).
KSM_LABELS_ALLOWLIST: Final = (
    f"pods=[{labels.TEAM},{labels.JOB},{labels.POOL},volcano.sh/job-name,{QUEUE_POD_LABEL}]",
    f"nodes=[{labels.POOL},{CAPACITY},{INSTANCE_TYPE_LABEL},{GPU_PRESENT_LABEL}]",
)

# XIDs after which the GPU or node needs draining (NVIDIA XID catalogue): double-bit ECC
# (48), row-remap events/failure (63, 64), NVLink (74), fallen off the bus (79), ECC
# contained/uncontained (94, 95), GSP errors (119, 120).
CRITICAL_XIDS: Final = (48, 63, 64, 74, 79, 94, 95, 119, 120)

ACCOUNTING_INTERVAL_S: Final = 60  # per-interval GPU-hours assume exactly this interval
JOB_KEYS: Final = "namespace, team, queue, job_name"
LEVELS: Final[dict[str, str]] = {
    "team": "team",
    "queue": "team, queue",
    "training_job": JOB_KEYS,
}
RUNNING_PODS: Final = 'max by (namespace, pod) (kube_pod_status_phase{phase="Running"} == 1)'
GPU_REQUESTS: Final = 'kube_pod_container_resource_requests{resource="nvidia_com_gpu"}'


def object_meta(cfg: PlatformConfig, name: str, ns: str) -> dict[str, Any]:
    return {"name": name, "namespace": ns, "labels": labels.base_labels(cfg.stack)}


def alert_rule(  # noqa: PLR0917 - one positional row per alert reads like a table
    runbook: str,
    name: str,
    expr: str,
    minutes: float,
    severity: str,
    summary: str,
    description: str,
) -> dict[str, Any]:
    """An alerting rule whose runbook is the section `### <name>` of the runbook page."""
    return {
        "alert": name,
        "expr": expr,
        "for": f"{int(minutes)}m",
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{runbook}#{name.lower()}",
        },
    }


def monitoring_namespace(cfg: PlatformConfig) -> dict[str, Any]:
    # node-exporter (host network/PID) and dcgm-exporter (SYS_ADMIN) need privileged pods.
    return namespace(
        NAMESPACE,
        {
            **labels.base_labels(cfg.stack),
            labels.ROLE: "system",
            "pod-security.kubernetes.io/enforce": "privileged",
        },
    )


def constant_vector(rows: list[tuple[dict[str, str], str]]) -> str:
    """Config facts as a PromQL vector, one sample per row (labels, value as PromQL writes
    it): how a price table, a pool's needed node count or a team's queue reach the rules."""
    parts = []
    for row_labels, value in rows:
        expr = f"vector({value})"
        for key, label_value in row_labels.items():
            expr = f'label_replace({expr}, "{key}", "{label_value}", "", "")'
        parts.append(expr)
    return " or ".join(parts)
