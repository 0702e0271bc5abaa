"""Scrape objects: ServiceMonitors for dcgm-exporter and Volcano, PodMonitors for the
training runtime."""

from __future__ import annotations

from typing import Any

from trainstack.builders import deadlines, labels
from trainstack.builders.monitoring.common import (
    NAMESPACE,
    QUEUE_POD_LABEL,
    RUNTIME_PORT,
    object_meta,
)
from trainstack.builders.monitoring.health import pod_monitors as health_pod_monitors
from trainstack.builders.scheduling import VOLCANO_NAMESPACE
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig

# Volcano's metrics Services (chart v1.15.1 templates/scheduler.yaml and controllers.yaml:
# `<release>-scheduler-service` and `<release>-controllers-service`, labelled `app: <app>`,
# port `metrics` -> 8080 and 8081). The controller container declares no ports, so a PodMonitor
# `portNumber: 8081` never matches a target (prometheus-operator PodMonitor CRD: "cannot be
# used to enable scraping of an undeclared port"); the Service's numeric targetPort reaches it.
VOLCANO_METRICS_SERVICES = (
    ("scheduler", "volcano-scheduler"),
    ("controllers", "volcano-controller"),
)

_TRAINING_RELABEL = (
    (labels.TEAM, "team"),
    (labels.JOB, "job_name"),
    (QUEUE_POD_LABEL, "queue"),
    (labels.POOL, "pool"),
)


def _pod_label_meta(key: str) -> str:
    clean = "".join(c if c.isalnum() else "_" for c in key)
    return f"__meta_kubernetes_pod_label_{clean}"


def service_monitors(cfg: PlatformConfig) -> list[dict[str, Any]]:
    node = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    monitors: list[dict[str, Any]] = []
    if cfg.gpu_pools:
        # honorLabels: dcgm-exporter's own namespace/pod/container labels name the pod
        # that uses the GPU, not the exporter; accounting joins on them.
        monitors.append(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "ServiceMonitor",
                "metadata": object_meta(cfg, "trainstack-dcgm-exporter", NAMESPACE),
                "spec": {
                    "namespaceSelector": {
                        "matchNames": [cfg.addon_namespace("dcgm-exporter", NAMESPACE)]
                    },
                    "selector": {"matchLabels": {"app.kubernetes.io/name": "dcgm-exporter"}},
                    "endpoints": [
                        {
                            "port": "metrics",
                            "path": "/metrics",
                            "interval": "15s",
                            "honorLabels": True,
                            "relabelings": [node],
                        }
                    ],
                },
            }
        )
    monitors += [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": object_meta(cfg, f"trainstack-volcano-{component}", NAMESPACE),
            "spec": {
                "namespaceSelector": {
                    "matchNames": [cfg.addon_namespace("volcano", VOLCANO_NAMESPACE)]
                },
                "selector": {"matchLabels": {"app": app}},
                "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
            },
        }
        for component, app in VOLCANO_METRICS_SERVICES
    ]
    return monitors


def pod_monitors(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The training runtime's /metrics in every team namespace (its pods declare the port),
    the maximum-duration enforcer's in the system namespace (its container declares
    `metrics`), and the node health agent's and repair controller's when the gate is enabled."""
    monitors: list[dict[str, Any]] = [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": object_meta(cfg, deadlines.NAME, NAMESPACE),
            "spec": {
                "namespaceSelector": {"matchNames": [SYSTEM_NAMESPACE]},
                "selector": {"matchLabels": deadlines.pod_labels()},
                "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
            },
        },
        *health_pod_monitors(cfg),
    ]
    # The pod's node as `node` on every runtime series: the straggler alert names the node a
    # slow rank runs on (builders/monitoring/health.py).
    relabelings: list[dict[str, Any]] = [
        {"sourceLabels": [_pod_label_meta(key)], "targetLabel": target}
        for key, target in _TRAINING_RELABEL
    ]
    relabelings.append({"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"})
    for team in cfg.registry.teams:
        monitors.append(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "PodMonitor",
                "metadata": object_meta(cfg, "trainstack-training", team.namespace),
                "spec": {
                    "selector": {"matchExpressions": [{"key": labels.JOB, "operator": "Exists"}]},
                    "podMetricsEndpoints": [
                        {
                            "portNumber": RUNTIME_PORT,
                            "path": "/metrics",
                            "interval": "30s",
                            "relabelings": relabelings,
                        }
                    ],
                },
            }
        )
    return monitors
