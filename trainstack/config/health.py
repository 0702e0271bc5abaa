"""The `health` section (the GPU node health gate, docs/health.md): cross-field checks on the
raw document and the typed model.

The schema (`platform.schema.json`, `properties.health`) holds every default it can; what
depends on the cloud (the repair mode) or on the rest of the platform (the Prometheus the
repair controller asks) is filled here, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from trainstack.config import model as m
from trainstack.config.errors import ConfigIssue, join_path
from trainstack.config.monitoring import MONITORING_NAMESPACE

# The platform's own Prometheus: kube-prometheus-stack, released as `kube-prometheus-stack`
# (builders/monitoring/common.py KPS_RELEASE) in the monitoring namespace. The chart names the
# Service `<fullname>-prometheus`, where fullname is the release name when that contains the
# chart's name, on the chart's default port 9090 (prometheus-community/helm-charts
# kube-prometheus-stack templates/prometheus/service.yaml, _helpers.tpl
# "kube-prometheus-stack.fullname", values.yaml prometheus.service.port).
PLATFORM_PROMETHEUS_URL: Final = (
    f"http://kube-prometheus-stack-prometheus.{MONITORING_NAMESPACE}.svc:9090"
)

# The agent's least privilege rests on the node name the API server writes into a bound
# service-account token and so into request.userInfo.extra (contracts.health.NODE_NAME_EXTRA):
# feature ServiceAccountTokenPodNodeInfo, beta and on by default from 1.30, GA and locked on
# from 1.32 (k8s.io/kubernetes v1.37.2 pkg/features/versioned_kube_features.go). Below 1.32 a
# cluster may have it off, and the admission policy would then refuse every agent write.
MIN_KUBERNETES_MINOR: Final = 32


def _minor(version: object) -> int | None:
    if not isinstance(version, str) or not version.startswith("1."):
        return None
    tail = version.removeprefix("1.")
    return int(tail) if tail.isdigit() else None


def health_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    """What the schema cannot say about `health`; tolerant of wrongly shaped values."""
    section = doc.get("health")
    if not isinstance(section, Mapping):
        return []
    path = join_path(root, "health")
    issues: list[ConfigIssue] = []
    enabled = section.get("enabled") is True
    minor = _minor(doc.get("kubernetesVersion"))
    if enabled and minor is not None and minor < MIN_KUBERNETES_MINOR:
        issues.append(
            ConfigIssue(
                join_path(path, "enabled"),
                f"the health gate needs Kubernetes 1.{MIN_KUBERNETES_MINOR} or later (the "
                "node name in service-account tokens that confines the agent to its own node "
                f"is GA there); kubernetesVersion is {doc.get('kubernetesVersion')}",
            )
        )
    repair = section.get("repair")
    if not isinstance(repair, Mapping):
        return issues
    rpath = join_path(path, "repair")
    mode = repair.get("mode")
    if mode == "replace" and doc.get("cloud") == "existing":
        issues.append(
            ConfigIssue(
                join_path(rpath, "mode"),
                "replace needs an Auto Scaling group, so it is for cloud: aws only; on an "
                "existing cluster use hook (with hookUrl) or none",
            )
        )
    if mode == "hook" and "hookUrl" not in repair:
        issues.append(
            ConfigIssue(rpath, "mode hook needs hookUrl: where to POST a failed node (https://…)")
        )
    if "hookUrl" in repair and mode != "hook":
        issues.append(
            ConfigIssue(
                join_path(rpath, "hookUrl"),
                f"only used with mode: hook, but mode is {mode or _default_mode(doc)}; "
                "remove it or set mode: hook",
            )
        )
    return issues


def _default_mode(doc: Mapping[str, Any]) -> m.RepairMode:
    """replace on AWS (the pools are Auto Scaling groups); none on an existing cluster, whose
    nodes trainstack cannot replace and whose owners' repair process it does not know."""
    return "replace" if doc.get("cloud") == "aws" else "none"


def build_health(doc: dict[str, Any]) -> m.HealthConfig:
    """The typed section from a platform document whose schema defaults are filled in."""
    h = doc["health"]
    r = h["repair"]
    return m.HealthConfig(
        enabled=h["enabled"],
        image=h["image"],
        dcgm_level=h["dcgmLevel"],
        recheck_minutes=h["recheckMinutes"],
        straggler_ratio=float(h["stragglerRatio"]),
        straggler_minutes=h["stragglerMinutes"],
        straggler_alerts=h["stragglerAlerts"],
        repair=m.RepairConfig(
            mode=r.get("mode", _default_mode(doc)),
            hook_url=r.get("hookUrl"),
            delay_minutes=r["delayMinutes"],
            # Monitoring is part of every platform (components/platform.py), so its Prometheus
            # is always there to ask.
            prometheus_url=r.get("prometheusUrl", PLATFORM_PROMETHEUS_URL),
        ),
    )
