"""Monitoring component: what it registers, with which parents, providers and ordering."""

from __future__ import annotations

from collections.abc import Callable

import pulumi_kubernetes as k8s

from tests.conftest import Recorded
from tests.monitoring.conftest import platform, platform_doc
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


def test_gpu_operator_brings_its_own_exporter(run_program: Callable[..., Recorded]) -> None:
    rec = run(run_program, "gpu-operator")
    releases = [r.name for r in rec.of_type("kubernetes:helm.sh/v3:Release")]
    assert releases == ["m-kube-prometheus-stack"]
    monitor = rec.one(
        "kubernetes:monitoring.coreos.com/v1:ServiceMonitor", "m-sm-trainstack-dcgm-exporter"
    )
    assert monitor.inputs["spec"]["namespaceSelector"] == {"matchNames": ["trainstack-system"]}
