"""Monitoring as data: kube-prometheus-stack and dcgm-exporter values, scrape objects,
alert and accounting rules, the Alertmanager config. No Pulumi import.

Canonical labels every training series carries after relabeling (and every rule keeps):
`namespace`, `team`, `queue`, `job_name`, `pool`; node series: `node`, `pool`, `capacity`,
`instance_type`. docs/monitoring.md explains each alert and the runbook.

Modules: `common` (charts, names, label keys), `values` (Helm values), `scrape`
(ServiceMonitors, PodMonitors), `rules` (recording and alerting rules), `fairness` (per
team and queue history of Volcano's shares: docs/reports.md). Callers import
everything from here.
"""

from __future__ import annotations

from typing import Any

from trainstack.builders.monitoring.common import (
    ACCOUNTING_INTERVAL_S,
    CHARTS,
    CHECKPOINT_INTERVAL_ANNOTATION,
    CRITICAL_XIDS,
    DASHBOARD_LABEL,
    DCGM_CONFIGMAP,
    DCGM_CSV_PATH,
    DCGM_PORT,
    DCGM_RELEASE,
    GPU_REQUESTS,
    INSTANCE_TYPE_LABEL,
    JOB_KEYS,
    KPS_RELEASE,
    KSM_LABELS_ALLOWLIST,
    LEVELS,
    MAX_DURATION_ANNOTATION,
    NAMESPACE,
    QUEUE_POD_LABEL,
    RUNNING_PODS,
    RUNTIME_PORT,
    monitoring_namespace,
)
from trainstack.builders.monitoring.fairness import fairness_rules
from trainstack.builders.monitoring.rules import (
    accounting_rules,
    alert_rules,
    label_rules,
    price_expr,
    prometheus_rules,
    rule_groups,
)
from trainstack.builders.monitoring.scrape import pod_monitors, service_monitors
from trainstack.builders.monitoring.values import (
    alertmanager_config,
    dcgm_configmap,
    dcgm_enabled_here,
    dcgm_values,
    gpu_node_affinity,
    kps_values,
    ksm_custom_resources,
    secret_names,
)
from trainstack.config.model import PlatformConfig

__all__ = [
    "ACCOUNTING_INTERVAL_S",
    "CHARTS",
    "CHECKPOINT_INTERVAL_ANNOTATION",
    "CRITICAL_XIDS",
    "DASHBOARD_LABEL",
    "DCGM_CONFIGMAP",
    "DCGM_CSV_PATH",
    "DCGM_PORT",
    "DCGM_RELEASE",
    "GPU_REQUESTS",
    "INSTANCE_TYPE_LABEL",
    "JOB_KEYS",
    "KPS_RELEASE",
    "KSM_LABELS_ALLOWLIST",
    "LEVELS",
    "MAX_DURATION_ANNOTATION",
    "NAMESPACE",
    "QUEUE_POD_LABEL",
    "RUNNING_PODS",
    "RUNTIME_PORT",
    "accounting_rules",
    "alert_rules",
    "alertmanager_config",
    "dcgm_configmap",
    "dcgm_enabled_here",
    "dcgm_values",
    "fairness_rules",
    "gpu_node_affinity",
    "kps_values",
    "ksm_custom_resources",
    "label_rules",
    "monitoring_namespace",
    "monitoring_output",
    "pod_monitors",
    "price_expr",
    "prometheus_rules",
    "rule_groups",
    "secret_names",
    "service_monitors",
]


def monitoring_output(cfg: PlatformConfig) -> dict[str, Any]:
    """What team stacks and people need to find the monitoring stack."""
    return {
        "namespace": NAMESPACE,
        "charts": {k: v["version"] for k, v in CHARTS.items()},
        "dcgmExporter": "trainstack" if dcgm_enabled_here(cfg) else None,
        "alerts": sorted(r["alert"] for r in alert_rules(cfg)),
        "receivers": [r.name for r in cfg.monitoring.receivers],
        "jobAnnotations": [MAX_DURATION_ANNOTATION, CHECKPOINT_INTERVAL_ANNOTATION],
        "runtimePort": RUNTIME_PORT,
        # The node's dcgm-exporter on the host network: jobs read GPU evidence there. Absent
        # when the GPU operator runs its own exporter (its network is not trainstack's).
        **({"gpuEvidencePort": DCGM_PORT} if dcgm_enabled_here(cfg) else {}),
    }
