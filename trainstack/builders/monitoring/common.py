"""Monitoring constants shared by the chart values, scrape objects and rules: charts, names,
label keys, the accounting interval, and object metadata."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Final

from trainstack.builders import labels
from trainstack.builders.platform import namespace
from trainstack.builders.pools import CAPACITY, GPU_PRESENT_LABEL, pool_slices
from trainstack.config.model import PlatformConfig
from trainstack.config.monitoring import MONITORING_NAMESPACE
from trainstack.slices import Slice

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


def ksm_resource(name: str) -> str:
    """A resource name as kube-state-metrics writes it in its `resource` label: every
    character outside [a-zA-Z0-9_] as `_` (SanitizeLabelName; nvidia.com/gpu is nvidia_com_gpu,
    nvidia.com/mig-1g.10gb nvidia_com_mig_1g_10gb)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def gpu_equivalents(metric: str, cfg: PlatformConfig) -> str:
    """`metric` (a kube-state-metrics series by resource) in GPUs: whole GPUs, and each slice
    the pools offer weighted by its share of a GPU's compute (a 1g MIG instance 1/7, a
    time-shared replica 1/replicas), so GPU-hours, cost and idle GPUs count slices as the
    part of a GPU they are (docs/gpu-sharing.md)."""
    # One weight per resource: the loader holds time-shared pools to one replica count
    # (config/sharing.py), and a MIG profile is the same share everywhere.
    weights = {s.resource: s.compute_share for s in _offered(cfg)}
    terms = [f'{metric}{{resource="nvidia_com_gpu"}}']
    terms += [
        f'{metric}{{resource="{ksm_resource(name)}"}}{_times(w)}'
        for name, w in sorted(weights.items())
    ]
    return terms[0] if len(terms) == 1 else "(" + " or ".join(terms) + ")"


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


def gpu_utilisation(cfg: PlatformConfig, *, in_gpus: bool, assigned: bool = True) -> str:
    """Per pod and device, how busy its GPUs are: in percent of the device (in_gpus False),
    or in GPUs used (True: a slice's activity times its share of the GPU).

    dcgm-exporter labels a MIG instance's series with GPU_I_PROFILE and GPU_I_ID (4.5.3-4.8.2
    internal/pkg/rendermetrics/render_metrics.go), and DCGM_FI_DEV_GPU_UTIL is not reported
    for MIG instances ("not supported for MIG configurations. ... Use
    DCGM_FI_PROF_GR_ENGINE_ACTIVE", NVIDIA/dcgm-exporter#430, #50): a MIG instance's activity
    is its graphics engine's, a ratio of its own time. A whole GPU's series has no
    GPU_I_PROFILE (matched by =""). `assigned`: only devices a pod holds (pod!="")."""
    pod = 'pod!="",' if assigned else ""
    whole = f'DCGM_FI_DEV_GPU_UTIL{{{pod}GPU_I_PROFILE=""}}'
    whole = f"{whole} / 100" if in_gpus else whole
    profiles = sorted({(s.profile, s.compute_share) for s in _offered(cfg) if s.isolated})
    if not profiles:
        return whole
    terms = [
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{pod}GPU_I_PROFILE="{profile}"}}'
        f"{_times(share if in_gpus else Fraction(100))}"
        for profile, share in profiles
    ]
    return "(" + " or ".join([whole, *terms]) + ")"


def _offered(cfg: PlatformConfig) -> set[Slice]:
    """Every kind of GPU slice the platform's pools offer."""
    return {s for pool in cfg.gpu_pools for s in pool_slices(pool)}


def _times(w: Fraction) -> str:
    """`* n / d`, exactly as PromQL's float division gives it (no rounded decimal)."""
    return (f" * {w.numerator}" if w.numerator != 1 else "") + (
        f" / {w.denominator}" if w.denominator != 1 else ""
    )
