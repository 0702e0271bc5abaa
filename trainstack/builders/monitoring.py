"""Monitoring as data: kube-prometheus-stack and dcgm-exporter values, scrape objects,
alert and accounting rules, the Alertmanager config. No Pulumi import.

Canonical labels every training series carries after relabeling (and every rule keeps):
`namespace`, `team`, `queue`, `job_name`, `pool`; node series: `node`, `pool`, `capacity`,
`instance_type`. docs/monitoring.md explains each alert and the runbook.
"""

from __future__ import annotations

from typing import Any, Final

from trainstack.builders import labels
from trainstack.builders.metric_sources import dcgm_counters_csv
from trainstack.builders.platform import GP3_STORAGE_CLASS, namespace
from trainstack.builders.pools import CAPACITY, GPU_PRESENT_LABEL, GPU_TOLERATION
from trainstack.builders.scheduling import VOLCANO_NAMESPACE
from trainstack.config.model import SYSTEM_NAMESPACE, AlertReceiver, PlatformConfig
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
DASHBOARD_LABEL: Final = ("grafana_dashboard", "1")  # the Grafana sidecar's label
RUNTIME_PORT: Final = 8080  # trainstack_runtime.contract.HEALTH_PORT_DEFAULT

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


def _meta(cfg: PlatformConfig, name: str, ns: str) -> dict[str, Any]:
    return {"name": name, "namespace": ns, "labels": labels.base_labels(cfg.stack)}


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


# -- Helm values ------------------------------------------------------------------------


def _volume_claim(cfg: PlatformConfig, gib: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{gib}Gi"}},
    }
    storage_class = cfg.monitoring.storage_class or (
        GP3_STORAGE_CLASS if cfg.cloud == "aws" else None
    )
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"volumeClaimTemplate": {"spec": spec}}


def gpu_node_affinity(cfg: PlatformConfig) -> dict[str, Any]:
    """GPU nodes only: labelled nvidia.com/gpu.present (AWS pools), or a pool's selector."""
    terms = [
        {"matchExpressions": [{"key": GPU_PRESENT_LABEL, "operator": "In", "values": ["true"]}]}
    ]
    for pool in cfg.gpu_pools:
        if pool.existing is not None:
            terms.append(
                {
                    "matchExpressions": [
                        {"key": key, "operator": "In", "values": [value]}
                        for key, value in pool.existing.node_selector
                    ]
                }
            )
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


def secret_names(cfg: PlatformConfig) -> list[str]:
    """Secrets mounted into Alertmanager under /etc/alertmanager/secrets/<name>/."""
    names: set[str] = set()
    for r in cfg.monitoring.receivers:
        for ref in (r.slack_webhook, r.webhook_url_secret, r.pagerduty_routing_key):
            if ref is not None:
                names.add(ref.name)
    return sorted(names)


def _secret_file(name: str, key: str) -> str:
    return f"/etc/alertmanager/secrets/{name}/{key}"


def _receiver(r: AlertReceiver) -> dict[str, Any]:
    out: dict[str, Any] = {"name": r.name}
    if r.slack_webhook is not None:
        out["slack_configs"] = [
            {
                "channel": r.slack_channel,
                "api_url_file": _secret_file(r.slack_webhook.name, r.slack_webhook.key),
                "send_resolved": True,
                "title": '{{ template "slack.default.title" . }}',
                "text": "{{ range .Alerts }}{{ .Annotations.summary }}\n"
                "{{ .Annotations.runbook_url }}\n{{ end }}",
            }
        ]
    if r.webhook_url is not None or r.webhook_url_secret is not None:
        hook: dict[str, Any] = {"send_resolved": True}
        if r.webhook_url_secret is not None:
            hook["url_file"] = _secret_file(r.webhook_url_secret.name, r.webhook_url_secret.key)
        else:
            hook["url"] = r.webhook_url
        out["webhook_configs"] = [hook]
    if r.pagerduty_routing_key is not None:
        key = r.pagerduty_routing_key
        out["pagerduty_configs"] = [
            {"routing_key_file": _secret_file(key.name, key.key), "send_resolved": True}
        ]
    return out


def alertmanager_config(cfg: PlatformConfig) -> dict[str, Any]:
    """Routes by severity (and team); secrets only as file paths of mounted Secrets."""
    routes: list[dict[str, Any]] = [
        {"receiver": "null", "matchers": ['alertname=~"Watchdog|InfoInhibitor"']}
    ]
    for r in cfg.monitoring.receivers:
        matchers = [f'severity=~"{"|".join(r.severities)}"']
        if r.teams:
            matchers.append(f'team=~"{"|".join(r.teams)}"')
        routes.append({"receiver": r.name, "matchers": matchers, "continue": True})
    return {
        "route": {
            "receiver": "null",
            "group_by": ["alertname", "namespace", "job_name", "node"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": routes,
        },
        "receivers": [{"name": "null"}, *(_receiver(r) for r in cfg.monitoring.receivers)],
        "inhibit_rules": [
            {  # a critical alert silences the warning of the same name and object
                "source_matchers": ['severity="critical"'],
                "target_matchers": ['severity="warning"'],
                "equal": ["alertname", "namespace", "job_name", "node"],
            },
            {  # a job past its maximum duration need not also warn that it is close
                "source_matchers": ['alertname="TrainstackJobOverMaxDuration"'],
                "target_matchers": ['alertname="TrainstackJobNearMaxDuration"'],
                "equal": ["namespace", "job_name"],
            },
        ],
        "templates": ["/etc/alertmanager/config/*.tmpl"],
    }


def ksm_custom_resources() -> dict[str, Any]:
    """kube-state-metrics custom-resource state: Volcano Job annotations, PodGroup phases."""
    job_labels = {
        "namespace": ["metadata", "namespace"],
        "job_name": ["metadata", "name"],
        "team": ["metadata", "labels", labels.TEAM],
        "queue": ["spec", "queue"],
    }
    return {
        "kind": "CustomResourceStateMetrics",
        "spec": {
            "resources": [
                {
                    "groupVersionKind": {
                        "group": "batch.volcano.sh",
                        "version": "v1alpha1",
                        "kind": "Job",
                    },
                    "metricNamePrefix": "trainstack_volcano_job",
                    "labelsFromPath": job_labels,
                    "metrics": [
                        {
                            "name": "max_duration_seconds",
                            "help": f"The job's {MAX_DURATION_ANNOTATION} annotation",
                            "each": {
                                "type": "Gauge",
                                "gauge": {
                                    "path": ["metadata", "annotations", MAX_DURATION_ANNOTATION]
                                },
                            },
                        },
                        {
                            "name": "checkpoint_interval_seconds",
                            "help": f"The job's {CHECKPOINT_INTERVAL_ANNOTATION} annotation",
                            "each": {
                                "type": "Gauge",
                                "gauge": {
                                    "path": [
                                        "metadata",
                                        "annotations",
                                        CHECKPOINT_INTERVAL_ANNOTATION,
                                    ]
                                },
                            },
                        },
                    ],
                },
                {
                    "groupVersionKind": {
                        "group": "scheduling.volcano.sh",
                        "version": "v1beta1",
                        "kind": "PodGroup",
                    },
                    "metricNamePrefix": "trainstack_volcano_podgroup",
                    "labelsFromPath": {
                        "namespace": ["metadata", "namespace"],
                        "podgroup": ["metadata", "name"],
                        "team": ["metadata", "labels", labels.TEAM],
                        "job_name": ["metadata", "labels", labels.JOB],
                        "queue": ["spec", "queue"],
                    },
                    "metrics": [
                        {
                            "name": "status_phase",
                            "help": "PodGroup phase (1 for the current one)",
                            "each": {
                                "type": "StateSet",
                                "stateSet": {
                                    "labelName": "phase",
                                    "path": ["status", "phase"],
                                    "list": [
                                        "Pending",
                                        "Inqueue",
                                        "Running",
                                        "Unknown",
                                        "Completed",
                                    ],
                                },
                            },
                        }
                    ],
                },
            ]
        },
    }


def kps_values(cfg: PlatformConfig) -> dict[str, Any]:
    """kube-prometheus-stack: Alertmanager on, retention and volumes, dashboards sidecar."""
    mon = cfg.monitoring
    production = cfg.environment == "production"
    grafana: dict[str, Any] = {
        "enabled": True,
        "defaultDashboardsTimezone": "utc",
        "sidecar": {
            "dashboards": {
                "enabled": True,
                "label": DASHBOARD_LABEL[0],
                "labelValue": DASHBOARD_LABEL[1],
                "folderAnnotation": "grafana_folder",
                "provider": {"foldersFromFilesStructure": True},
            }
        },
    }
    if mon.grafana_admin_secret:
        grafana["admin"] = {
            "existingSecret": mon.grafana_admin_secret,
            "userKey": "admin-user",
            "passwordKey": "admin-password",
        }
    else:
        # The stack's default is a well-known password; empty makes Grafana's chart
        # generate a random one (read it from the grafana Secret).
        grafana["adminPassword"] = ""
    return {
        "alertmanager": {
            "enabled": True,
            "config": alertmanager_config(cfg),
            "alertmanagerSpec": {
                "replicas": 2 if production else 1,
                "secrets": secret_names(cfg),
                "retention": "120h",
                "storage": _volume_claim(cfg, 10),
            },
        },
        "prometheus": {
            "prometheusSpec": {
                "retention": mon.retention,
                "retentionSize": f"{int(mon.storage_gib * 0.85)}GB",
                "storageSpec": _volume_claim(cfg, mon.storage_gib),
                # Select trainstack's rules and monitors without the chart's release label.
                "ruleSelectorNilUsesHelmValues": False,
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "podMonitorSelectorNilUsesHelmValues": False,
                "probeSelectorNilUsesHelmValues": False,
            }
        },
        "grafana": grafana,
        "kube-state-metrics": {
            "metricLabelsAllowlist": list(KSM_LABELS_ALLOWLIST),
            "customResourceState": {"enabled": True, "config": ksm_custom_resources()},
            "rbac": {
                "extraRules": [
                    {
                        "apiGroups": ["batch.volcano.sh"],
                        "resources": ["jobs"],
                        "verbs": ["list", "watch"],
                    },
                    {
                        "apiGroups": ["scheduling.volcano.sh"],
                        "resources": ["podgroups"],
                        "verbs": ["list", "watch"],
                    },
                ]
            },
        },
        # Node metrics (and InfiniBand/RoCE counters) from GPU nodes too, despite their taint.
        "prometheus-node-exporter": {"tolerations": [{"operator": "Exists"}]},
    }


def dcgm_enabled_here(cfg: PlatformConfig) -> bool:
    """trainstack installs dcgm-exporter unless the GPU operator already runs its own."""
    return bool(cfg.gpu_pools) and cfg.gpu_device_plugin != "gpu-operator"


def dcgm_values(cfg: PlatformConfig) -> dict[str, Any]:
    return {
        "arguments": ["-f", DCGM_CSV_PATH],
        "extraConfigMapVolumes": [
            {
                "name": "trainstack-counters",
                "configMap": {
                    "name": DCGM_CONFIGMAP,
                    "items": [{"key": "counters.csv", "path": "trainstack-counters.csv"}],
                },
            }
        ],
        "extraVolumeMounts": [
            {
                "name": "trainstack-counters",
                "mountPath": DCGM_CSV_PATH,
                "subPath": "trainstack-counters.csv",
                "readOnly": True,
            }
        ],
        "serviceMonitor": {"enabled": False},  # trainstack's own, with honorLabels (below)
        "tolerations": [GPU_TOLERATION],
        "affinity": gpu_node_affinity(cfg),
    }


def dcgm_configmap(cfg: PlatformConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cfg, DCGM_CONFIGMAP, NAMESPACE),
        "data": {"counters.csv": dcgm_counters_csv()},
    }


# -- scrape objects -----------------------------------------------------------------------

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
        operator = cfg.gpu_device_plugin == "gpu-operator"
        # honorLabels: dcgm-exporter's own namespace/pod/container labels name the pod
        # that uses the GPU, not the exporter; accounting joins on them.
        monitors.append(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "ServiceMonitor",
                "metadata": _meta(cfg, "trainstack-dcgm-exporter", NAMESPACE),
                "spec": {
                    "namespaceSelector": {
                        "matchNames": [SYSTEM_NAMESPACE if operator else NAMESPACE]
                    },
                    "selector": {
                        "matchLabels": {"app": "nvidia-dcgm-exporter"}
                        if operator
                        else {"app.kubernetes.io/name": "dcgm-exporter"}
                    },
                    "endpoints": [
                        {
                            "port": "gpu-metrics" if operator else "metrics",
                            "path": "/metrics",
                            "interval": "15s",
                            "honorLabels": True,
                            "relabelings": [node],
                        }
                    ],
                },
            }
        )
    monitors.append(
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": _meta(cfg, "trainstack-volcano-scheduler", NAMESPACE),
            "spec": {
                "namespaceSelector": {"matchNames": [VOLCANO_NAMESPACE]},
                "selector": {"matchLabels": {"app": "volcano-scheduler"}},
                "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
            },
        }
    )
    return monitors


def pod_monitors(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Volcano's controllers, and the training runtime's /metrics in every team namespace."""
    monitors: list[dict[str, Any]] = [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": _meta(cfg, "trainstack-volcano-controllers", NAMESPACE),
            "spec": {
                "namespaceSelector": {"matchNames": [VOLCANO_NAMESPACE]},
                "selector": {"matchLabels": {"app": "volcano-controller"}},
                "podMetricsEndpoints": [
                    {"portNumber": 8081, "path": "/metrics", "interval": "30s"}
                ],
            },
        }
    ]
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
                "metadata": _meta(cfg, "trainstack-training", team.namespace),
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


# -- rules ------------------------------------------------------------------------------


def _label_join(series: str, mapping: list[tuple[str, str]]) -> str:
    expr = series
    for target, source in mapping:
        expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.*)")'
    return expr


def label_rules() -> list[dict[str, Any]]:
    """Join tables: trainstack labels of pods and nodes, GPU requests and allocatable."""
    pod_labels = _label_join(
        'kube_pod_labels{label_trainstack_io_job!=""}',
        [
            ("team", "label_trainstack_io_team"),
            ("queue", "label_volcano_sh_queue_name"),
            ("job_name", "label_trainstack_io_job"),
            ("pool", "label_trainstack_io_pool"),
        ],
    )
    node_labels = _label_join(
        "kube_node_labels",
        [
            ("pool", "label_trainstack_io_pool"),
            ("capacity", "label_trainstack_io_capacity"),
            ("instance_type", "label_node_kubernetes_io_instance_type"),
        ],
    )
    # Nodes without a capacity label (existing clusters) are priced as on-demand.
    node_labels = f'label_replace({node_labels}, "capacity", "onDemand", "capacity", "")'
    return [
        {
            "record": "namespace_pod:trainstack_job_labels:info",
            "expr": f"max by (namespace, pod, team, queue, job_name, pool) ({pod_labels})",
        },
        {
            "record": "node:trainstack_node_labels:info",
            "expr": f"max by (node, pool, capacity, instance_type) ({node_labels})",
        },
        {
            "record": "node:trainstack_gpus_allocatable:max",
            "expr": 'max by (node) (kube_node_status_allocatable{resource="nvidia_com_gpu"})',
        },
        {
            "record": "node:trainstack_gpus_allocated:sum",
            "expr": f"sum by (node) ({GPU_REQUESTS} * on (namespace, pod) group_left () "
            f"{RUNNING_PODS})",
        },
    ]


def price_expr(cfg: PlatformConfig) -> str | None:
    """The price table as a PromQL vector: one sample per (instance_type, capacity)."""
    parts = [
        f'label_replace(label_replace(vector({p.usd_per_gpu_hour:.6g}), "instance_type", '
        f'"{p.instance_type}", "", ""), "capacity", "{p.capacity}", "", "")'
        for p in cfg.monitoring.prices
    ]
    return " or ".join(parts) if parts else None


def accounting_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """GPUs allocated and used (utilisation-weighted) per pod, team, queue and job; GPU-hours
    per evaluation interval; cost from the price table."""
    per_hour = 3600 // ACCOUNTING_INTERVAL_S
    rules: list[dict[str, Any]] = [
        {
            "record": "namespace_pod:trainstack_gpus_allocated:sum",
            "expr": f"(sum by (namespace, pod, node) ({GPU_REQUESTS}) * on (namespace, pod) "
            f"group_left () {RUNNING_PODS}) * on (namespace, pod) group_left (team, queue, "
            "job_name, pool) namespace_pod:trainstack_job_labels:info",
        },
        {
            "record": "namespace_pod:trainstack_gpus_used:sum",
            "expr": '(sum by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""}) / 100) '
            "* on (namespace, pod) group_left (node, team, queue, job_name, pool) "
            "(namespace_pod:trainstack_gpus_allocated:sum > bool 0)",
        },
    ]
    prices = price_expr(cfg)
    if prices is not None:
        rules += [
            {"record": "trainstack:gpu_price_usd_per_gpu_hour", "expr": prices},
            {
                "record": "node:trainstack_gpu_price_usd_per_gpu_hour:max",
                "expr": "max by (node, capacity, instance_type) (node:trainstack_node_labels:info "
                "* on (instance_type, capacity) group_left () "
                "trainstack:gpu_price_usd_per_gpu_hour)",
            },
            {
                "record": "namespace_pod:trainstack_cost_usd_per_hour:sum",
                "expr": "namespace_pod:trainstack_gpus_allocated:sum * on (node) group_left "
                "(capacity, instance_type) node:trainstack_gpu_price_usd_per_gpu_hour:max",
            },
            {
                "record": "namespace_pod:trainstack_idle_cost_usd_per_hour:sum",
                "expr": "(namespace_pod:trainstack_gpus_allocated:sum - "
                "(namespace_pod:trainstack_gpus_used:sum or "
                "namespace_pod:trainstack_gpus_allocated:sum * 0)) * on (node) group_left "
                "(capacity, instance_type) node:trainstack_gpu_price_usd_per_gpu_hour:max",
            },
        ]
    measures = ["gpus_allocated", "gpus_used"]
    if prices is not None:
        measures += ["cost_usd_per_hour", "idle_cost_usd_per_hour"]
    for level, keys in LEVELS.items():
        for measure in measures:
            rules.append(
                {
                    "record": f"{level}:trainstack_{measure}:sum",
                    "expr": f"sum by ({keys}) (namespace_pod:trainstack_{measure}:sum)",
                }
            )
        # One sample per interval, so sum_over_time over any window gives GPU-hours / USD.
        for measure, out in (
            ("gpus_allocated", "gpu_hours_allocated"),
            ("gpus_used", "gpu_hours_used"),
            *((("cost_usd_per_hour", "cost_usd"),) if prices is not None else ()),
        ):
            rules.append(
                {
                    "record": f"{level}:trainstack_{out}:increase1m",
                    "expr": f"{level}:trainstack_{measure}:sum / {per_hour}",
                }
            )
    return rules


def _alert(  # noqa: PLR0917 - one positional row per alert reads like a table
    runbook: str,
    name: str,
    expr: str,
    minutes: float,
    severity: str,
    summary: str,
    description: str,
) -> dict[str, Any]:
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


def _job_elapsed() -> str:
    return (
        "(time() - min by (namespace, team, job_name) (kube_pod_start_time * on (namespace, pod) "
        "group_left (team, job_name) namespace_pod:trainstack_job_labels:info))"
    )


def _xid_critical() -> str:
    return " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in CRITICAL_XIDS)


def alert_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    t = cfg.monitoring.thresholds
    runbook = cfg.monitoring.runbook_url
    job = "{{ $labels.namespace }}/{{ $labels.job_name }}"
    max_duration = "max by (namespace, job_name) (trainstack_volcano_job_max_duration_seconds)"
    step_mean = "rate(trainstack_step_seconds_total[{w}]{o}) / rate(trainstack_steps_total[{w}]{o})"
    running_jobs = "max by (namespace, job_name) (trainstack_up == 1)"
    last_ckpt_or_start = (
        "(max by (namespace, team, job_name) (trainstack_last_checkpoint_timestamp_seconds > 0) "
        "or min by (namespace, team, job_name) (kube_pod_start_time * on (namespace, pod) "
        "group_left (team, job_name) namespace_pod:trainstack_job_labels:info))"
    )
    interval = (
        f"(max by (namespace, job_name) (trainstack_volcano_job_checkpoint_interval_seconds) or "
        f"{running_jobs} * {t.checkpoint_interval_minutes * 60})"
    )
    return [
        _alert(
            runbook,
            "TrainstackGpuAllocatedIdle",
            f'avg by ({JOB_KEYS}) (DCGM_FI_DEV_GPU_UTIL{{pod!=""}} * on (namespace, pod) '
            "group_left (team, queue, job_name) namespace_pod:trainstack_job_labels:info) "
            f"< {t.gpu_idle_utilization_percent:g}",
            t.gpu_idle_minutes,
            "warning",
            f"GPUs of {job} are allocated but idle",
            f"Average GPU utilisation of {job} (team {{{{ $labels.team }}}}) is "
            f"{{{{ $value | humanize }}}}%, below {t.gpu_idle_utilization_percent:g}% for "
            f"{t.gpu_idle_minutes}m.",
        ),
        _alert(
            runbook,
            "TrainstackReservedCapacityIdle",
            "sum by (pool, capacity, instance_type) ((node:trainstack_gpus_allocatable:max - "
            "(node:trainstack_gpus_allocated:sum or node:trainstack_gpus_allocatable:max * 0)) "
            "* on (node) group_left (pool, capacity, instance_type) "
            'node:trainstack_node_labels:info{capacity=~"reservation|capacityBlock"}) > 0',
            t.reserved_idle_minutes,
            "warning",
            "Reserved GPUs in pool {{ $labels.pool }} are unallocated",
            "{{ $value }} GPUs of pool {{ $labels.pool }} ({{ $labels.capacity }}, paid whether "
            f"used or not) have had no pod for {t.reserved_idle_minutes}m.",
        ),
        _alert(
            runbook,
            "TrainstackGpuXidCritical",
            _xid_critical(),
            0,
            "critical",
            "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $value }}",
            "XID {{ $value }} means the GPU (or its node) needs draining and a reset or "
            "replacement; jobs on it will fail or hang.",
        ),
        _alert(
            runbook,
            "TrainstackGpuXidError",
            f"DCGM_FI_DEV_XID_ERRORS > 0 unless ({_xid_critical()})",
            0,
            "warning",
            "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $value }}",
            "A non-fatal XID: often an application fault (13, 31, 43) or a driver event.",
        ),
        _alert(
            runbook,
            "TrainstackGpuEccUncorrectable",
            "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0 or "
            "increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[10m]) > 0 or "
            "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
            0,
            "critical",
            "Uncorrectable memory errors on GPU {{ $labels.gpu }} of {{ $labels.node }}",
            "Double-bit ECC errors or row remapping on this GPU: drain the node; a row-remap "
            "failure means the GPU must be replaced.",
        ),
        _alert(
            runbook,
            "TrainstackTrainingStalled",
            f"(time() - max by ({JOB_KEYS}) (trainstack_last_step_timestamp_seconds > 0)) "
            f"> {t.stall_minutes * 60}",
            2,
            "critical",
            f"Training {job} has made no step for {t.stall_minutes}m",
            f"No rank of {job} completed a step for {{{{ $value | humanizeDuration }}}}: "
            "the signature of a hung collective (NCCL), a dead peer or a stuck input pipeline.",
        ),
        _alert(
            runbook,
            "TrainstackCheckpointStale",
            f"((time() - {last_ckpt_or_start}) > on (namespace, job_name) group_left () "
            f"(2 * {interval})) and on (namespace, job_name) {running_jobs}",
            5,
            "warning",
            f"{job} has not checkpointed for over twice its interval",
            f"The last checkpoint of {job} (or its start) is {{{{ $value | humanizeDuration }}}} "
            "old; a failure now loses that much work.",
        ),
        _alert(
            runbook,
            "TrainstackJobNearMaxDuration",
            f"({_job_elapsed()} / on (namespace, job_name) group_left () {max_duration}) "
            f"> {t.max_duration_warn_ratio:g} and ({_job_elapsed()} / on (namespace, job_name) "
            f"group_left () {max_duration}) <= 1",
            0,
            "warning",
            f"{job} is close to its maximum duration",
            f"{job} has used {{{{ $value | humanizePercentage }}}} of its maximum duration "
            f"({MAX_DURATION_ANNOTATION}).",
        ),
        _alert(
            runbook,
            "TrainstackJobOverMaxDuration",
            f"({_job_elapsed()} / on (namespace, job_name) group_left () {max_duration}) > 1",
            0,
            "critical",
            f"{job} ran past its maximum duration",
            f"{job} has run {{{{ $value | humanizePercentage }}}} of its maximum duration.",
        ),
        _alert(
            runbook,
            "TrainstackJobPendingTooLong",
            f"max by ({JOB_KEYS}) "
            '(trainstack_volcano_podgroup_status_phase{phase=~"Pending|Inqueue"}) == 1',
            t.pending_minutes,
            "warning",
            f"{job} has waited in queue {{{{ $labels.queue }}}} for over {t.pending_minutes}m",
            "The job's PodGroup is still Pending or Inqueue: the queue lacks quota, the pool "
            "lacks capacity, or the gang cannot be placed whole.",
        ),
        _alert(
            runbook,
            "TrainstackStepTimeRegression",
            f"(max by ({JOB_KEYS}) ({step_mean.format(w='15m', o='')}) / max by ({JOB_KEYS}) "
            f"({step_mean.format(w='1h', o=' offset 15m')})) > {t.step_time_regression_ratio:g}",
            15,
            "warning",
            f"Steps of {job} are {{{{ $value | humanize }}}}x slower than an hour ago",
            "Mean step time over 15m compared with the hour before (slowest rank).",
        ),
        _alert(
            runbook,
            "TrainstackStepTimeJitter",
            f"max by ({JOB_KEYS}) (stddev_over_time(trainstack_step_time_seconds[15m]) / "
            f"avg_over_time(trainstack_step_time_seconds[15m])) > {t.step_time_jitter_ratio:g}",
            15,
            "warning",
            f"Step times of {job} vary widely",
            "Coefficient of variation of step time over 15m is {{ $value | humanize }} "
            "(a straggler, a noisy neighbour or an unsteady input pipeline).",
        ),
        _alert(
            runbook,
            "TrainstackDataLoadingBound",
            f"sum by ({JOB_KEYS}) (rate(trainstack_data_wait_seconds_total[10m])) / "
            f"sum by ({JOB_KEYS}) (rate(trainstack_step_seconds_total[10m])) > "
            f"{t.data_wait_ratio:g}",
            t.data_wait_minutes,
            "warning",
            f"{job} spends {{{{ $value | humanizePercentage }}}} of its step time waiting on data",
            f"Input wait above {t.data_wait_ratio:.0%} of step time for {t.data_wait_minutes}m: "
            "the GPUs are starved by the input pipeline.",
        ),
        _alert(
            runbook,
            "TrainstackGpuNodeNotReady",
            '(max by (node) (kube_node_status_condition{condition="Ready", status="true"}) == 0 '
            'and on (node) max by (node) (kube_node_status_capacity{resource="nvidia_com_gpu"}) '
            "> 0) * on (node) group_left (pool, capacity, instance_type) "
            "node:trainstack_node_labels:info",
            t.node_not_ready_minutes,
            "critical",
            "GPU node {{ $labels.node }} (pool {{ $labels.pool }}) is NotReady",
            f"The node has not been Ready for {t.node_not_ready_minutes}m; gang jobs on it are "
            "stuck or failing.",
        ),
    ]


def rule_groups(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Plain Prometheus rule groups (what `promtool check rules` reads)."""
    interval = f"{ACCOUNTING_INTERVAL_S}s"
    return [
        {"name": "trainstack-labels", "interval": interval, "rules": label_rules()},
        {"name": "trainstack-accounting", "interval": interval, "rules": accounting_rules(cfg)},
        {"name": "trainstack-alerts", "rules": alert_rules(cfg)},
    ]


def prometheus_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    groups = rule_groups(cfg)
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": _meta(cfg, "trainstack-accounting", NAMESPACE),
            "spec": {"groups": groups[:2]},
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": _meta(cfg, "trainstack-alerts", NAMESPACE),
            "spec": {"groups": groups[2:]},
        },
    ]


def monitoring_output(cfg: PlatformConfig) -> dict[str, Any]:
    """What team stacks and people need to find the monitoring stack."""
    return {
        "namespace": NAMESPACE,
        "charts": {k: v["version"] for k, v in CHARTS.items()},
        "dcgmExporter": "trainstack" if dcgm_enabled_here(cfg) else "gpu-operator",
        "alerts": sorted(r["alert"] for r in alert_rules(cfg)),
        "receivers": [r.name for r in cfg.monitoring.receivers],
        "jobAnnotations": [MAX_DURATION_ANNOTATION, CHECKPOINT_INTERVAL_ANNOTATION],
        "runtimePort": RUNTIME_PORT,
    }
