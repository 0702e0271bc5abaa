"""Monitoring component: what it registers, with which parents, providers and ordering."""

from __future__ import annotations

from collections.abc import Callable

import pulumi_kubernetes as k8s

from tests.conftest import Recorded
from tests.monitoring.conftest import platform, platform_doc
from trainstack.builders import device_plugins
from trainstack.components.monitoring import Monitoring, MonitoringArgs


def run(run_program: Callable[..., Recorded], plugin: str = "nvidia-device-plugin") -> Recorded:
    doc = platform_doc()
    doc["gpu"] = {"devicePlugin": plugin}
    cfg = platform(doc)

    def program() -> None:
        Monitoring("m", MonitoringArgs(cfg, k8s.Provider("k8s"), depends_on=[]))

    return run_program(program)


def test_charts_monitors_rules_and_dashboards(run_program: Callable[..., Recorded]) -> None:
    rec = run(run_program)
    component = rec.one("trainstack:k8s:Monitoring", "m")
    stack = rec.one("kubernetes:helm.sh/v3:Release", "m-kube-prometheus-stack")
    assert stack.inputs["version"] == "82.16.0"
    assert stack.inputs["namespace"] == "trainstack-monitoring"
    assert stack.inputs["values"]["alertmanager"]["enabled"] is True
    dcgm = rec.one("kubernetes:helm.sh/v3:Release", "m-dcgm-exporter")
    assert dcgm.inputs["version"] == "4.8.2"
    assert dcgm.inputs["repositoryOpts"] == {
        "repo": "https://nvidia.github.io/dcgm-exporter/helm-charts"
    }
    for resource in rec.children_of(component):
        assert rec.provider_name(resource) == "k8s", resource.name
    crs = [
        *rec.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule"),
        *rec.of_type("kubernetes:monitoring.coreos.com/v1:ServiceMonitor"),
        *rec.of_type("kubernetes:monitoring.coreos.com/v1:PodMonitor"),
    ]
    # rules; dcgm + volcano; volcano controllers + 2 teams + the deadline enforcer
    assert len(crs) == 2 + 2 + 4
    for cr in crs:
        assert stack.urn in cr.dependencies  # CRDs come with the chart
    training = [
        cr.inputs["metadata"]["namespace"]
        for cr in crs
        if cr.inputs["metadata"]["name"] == "trainstack-training"
    ]
    assert sorted(training) == ["nlp", "vision"]
    dashboards = [
        r for r in rec.of_type("kubernetes:core/v1:ConfigMap") if r.name.startswith("m-dashboard")
    ]
    assert len(dashboards) == 4  # cluster, team, job, fairness


def test_gpu_operator_leaves_the_exporter_to_trainstack(
    run_program: Callable[..., Recorded],
) -> None:
    """Issue 47: one dcgm-exporter whatever the device plugin, trainstack's: its counters hold
    DCGM_FI_PROF_GR_ENGINE_ACTIVE, which MIG utilisation needs, and it runs on the node's
    network for the runtime's evidence; the operator's own is turned off."""
    rec = run(run_program, "gpu-operator")
    releases = [r.name for r in rec.of_type("kubernetes:helm.sh/v3:Release")]
    assert releases == ["m-kube-prometheus-stack", "m-dcgm-exporter"]
    monitor = rec.one(
        "kubernetes:monitoring.coreos.com/v1:ServiceMonitor", "m-sm-trainstack-dcgm-exporter"
    )
    assert monitor.inputs["spec"]["selector"] == {
        "matchLabels": {"app.kubernetes.io/name": "dcgm-exporter"}
    }
    doc = platform_doc()
    doc["gpu"] = {"devicePlugin": "gpu-operator"}
    assert device_plugins.gpu_operator_values(platform(doc))["dcgmExporter"] == {"enabled": False}
