"""Helm values: kube-prometheus-stack (Alertmanager config, kube-state-metrics custom
resources) and dcgm-exporter with its counters ConfigMap."""

from __future__ import annotations

from typing import Any

from trainstack.builders import labels
from trainstack.builders.metric_sources import dcgm_counters_csv
from trainstack.builders.monitoring.common import (
    CHECKPOINT_INTERVAL_ANNOTATION,
    DASHBOARD_LABEL,
    DCGM_CONFIGMAP,
    DCGM_CSV_PATH,
    KSM_LABELS_ALLOWLIST,
    MAX_DURATION_ANNOTATION,
    NAMESPACE,
    object_meta,
)
from trainstack.builders.platform import GP3_STORAGE_CLASS
from trainstack.builders.pools import GPU_PRESENT_LABEL, GPU_TOLERATION
from trainstack.config.model import AlertReceiver, PlatformConfig


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
    """trainstack installs dcgm-exporter wherever there are GPU pools, with the GPU operator
    too (whose own exporter it turns off, builders/device_plugins.gpu_operator_values): one
    exporter, with trainstack's counters (the MIG rules need DCGM_FI_PROF_GR_ENGINE_ACTIVE)
    and on the node's network for the runtime's hardware evidence (issue 22)."""
    return bool(cfg.gpu_pools)


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
        # On the node's network, so that a training pod reads its own node's GPU evidence
        # (Xid, ECC) at http://<status.hostIP>:9400/metrics (the runtime's
        # TRAINSTACK_GPU_EVIDENCE; jobs/render.py). The chart's `hostNetwork` value
        # (NVIDIA/dcgm-exporter deployment/templates/daemonset.yaml) also sets
        # dnsPolicy ClusterFirstWithHostNet; the namespace is privileged already (hostPath).
        "hostNetwork": True,
        "tolerations": [GPU_TOLERATION],
        "affinity": gpu_node_affinity(cfg),
    }


def dcgm_configmap(cfg: PlatformConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(cfg, DCGM_CONFIGMAP, NAMESPACE),
        "data": {"counters.csv": dcgm_counters_csv()},
    }
