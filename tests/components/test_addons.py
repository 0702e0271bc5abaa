"""Add-on sources (issue 21 #2): the public repository, a mirror, an OCI registry, a local chart
directory, or pre-installed on an existing cluster, read and checked instead of installed.

The pre-installed checks are run against Volcano's own rendered chart (the scheduler
Deployment of `installer/volcano-development.yaml` at v1.15.1, from the Go module cache) so a
wrong expectation of what upstream installs fails here, not on a cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml

from tests.conftest import Recorded
from tests.volcano_chart import CHART_DIR, volcano_source
from trainstack.builders import addons as a
from trainstack.builders import scheduling
from trainstack.components.platform import Platform
from trainstack.components.scheduling import Volcano, VolcanoArgs
from trainstack.config import ConfigError, PlatformConfig, parse_stack_config
from trainstack.config.loader import read_stack_file
from trainstack.config.schema import load_schema

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "kubernetes:helm.sh/v3:Release"
CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"


def onprem(addons: dict[str, Any] | None = None, **changes: Any) -> PlatformConfig:
    doc = copy.deepcopy(read_stack_file(ROOT / "stacks" / "Pulumi.onprem.yaml"))
    platform = doc["trainstack:platform"]
    platform.update(changes)
    if addons is not None:
        platform["addons"] = addons
    cfg = parse_stack_config(doc, stack="onprem", source="Pulumi.onprem.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def volcano(run_program: Callable[..., Recorded], cfg: PlatformConfig) -> Recorded:
    def program() -> None:
        Volcano("v", VolcanoArgs(cfg, k8s.Provider("k8s")))

    return run_program(program)


# -- where a chart comes from -------------------------------------------------------------


def test_a_mirror_repository_serves_the_pinned_chart(
    run_program: Callable[..., Recorded],
) -> None:
    mirror = "https://charts.internal.example/volcano"
    release = volcano(run_program, onprem({"volcano": {"repository": mirror}})).one(RELEASE)
    assert release.inputs["repositoryOpts"] == {"repo": mirror}
    assert (release.inputs["chart"], release.inputs["version"]) == ("volcano", "1.15.1")


def test_an_oci_registry_takes_the_chart_by_reference(
    run_program: Callable[..., Recorded],
) -> None:
    registry = "oci://registry.internal.example/charts/"
    release = volcano(run_program, onprem({"volcano": {"repository": registry}})).one(RELEASE)
    # Helm pulls OCI charts by reference (`helm install x oci://host/path/chart --version v`);
    # a repository URL would make it look the chart up in an index.yaml that OCI has not.
    assert release.inputs["chart"] == "oci://registry.internal.example/charts/volcano"
    assert release.inputs["version"] == "1.15.1"
    assert "repositoryOpts" not in release.inputs


def test_a_local_chart_directory_is_used_as_it_is(run_program: Callable[..., Recorded]) -> None:
    chart = volcano_source() / CHART_DIR  # Volcano's own chart, v1.15.1
    release = volcano(run_program, onprem({"volcano": {"path": str(chart)}})).one(RELEASE)
    assert release.inputs["chart"] == str(chart)
    assert "repositoryOpts" not in release.inputs
    assert "version" not in release.inputs  # Helm ignores it for a path; checked here instead


@pytest.mark.parametrize(
    ("chart_yaml", "message"),
    [
        (
            None,
            "addons.volcano.path: {dir} has no Chart.yaml; give the directory of chart volcano "
            "1.15.1 (e.g. what `helm pull volcano --version 1.15.1 --untar` makes)",
        ),
        (
            {"name": "volcano", "version": "1.14.0"},
            "addons.volcano.path: {dir}/Chart.yaml is chart volcano 1.14.0; the platform pins "
            "volcano 1.15.1: point path at that chart",
        ),
    ],
)
def test_a_local_chart_of_another_version_is_refused(
    run_program: Callable[..., Recorded],
    tmp_path: Path,
    chart_yaml: dict[str, str] | None,
    message: str,
) -> None:
    if chart_yaml is not None:
        (tmp_path / "Chart.yaml").write_text(yaml.safe_dump(chart_yaml))
    with pytest.raises(pulumi.RunError) as refused:
        volcano(run_program, onprem({"volcano": {"path": str(tmp_path)}}))
    assert str(refused.value) == (
        "stack onprem: trainstack:platform." + message.format(dir=tmp_path)
    )


def test_a_relative_chart_path_is_relative_to_the_project(tmp_path: Path) -> None:
    (tmp_path / "charts" / "volcano").mkdir(parents=True)
    (tmp_path / "charts" / "volcano" / "Chart.yaml").write_text("name: volcano\nversion: 1.15.1\n")
    cfg = onprem({"volcano": {"path": "charts/volcano"}})
    assert a.release_args(cfg, "volcano", tmp_path) == {"chart": str(tmp_path / "charts/volcano")}


# -- pre-installed ------------------------------------------------------------------------


def test_a_pre_installed_volcano_is_read_not_installed(
    run_program: Callable[..., Recorded],
) -> None:
    rec = volcano(run_program, onprem({"volcano": {"preInstalled": True}}))
    assert rec.of_type(RELEASE) == []
    check = rec.one("trainstack:k8s:PreInstalledAddon", "v-chart")
    reads = {r.type.rsplit(":", 1)[-1] + " " + r.resource_id: r for r in rec.children_of(check)}
    assert sorted(reads) == [
        "ConfigMap volcano-system/volcano-scheduler-configmap",
        "CustomResourceDefinition commands.bus.volcano.sh",
        "CustomResourceDefinition hypernodes.topology.volcano.sh",
        "CustomResourceDefinition jobs.batch.volcano.sh",
        "CustomResourceDefinition podgroups.scheduling.volcano.sh",
        "CustomResourceDefinition queues.scheduling.volcano.sh",
        "Deployment volcano-system/volcano-scheduler",
    ]
    for read in reads.values():
        assert read.extra.get("read") is True
        assert rec.provider_name(read) == "k8s"
    # Queues are created only after their CRD was read (and the add-on checked).
    queue_crd = reads["CustomResourceDefinition queues.scheduling.volcano.sh"]
    for queue in rec.of_type("kubernetes:scheduling.volcano.sh/v1beta1:Queue"):
        assert queue_crd.urn in queue.dependencies, queue.name


def test_a_pre_installed_release_elsewhere_is_read_where_it_is(
    run_program: Callable[..., Recorded],
) -> None:
    where = {"namespace": "batch-system", "release": "vc"}
    rec = volcano(run_program, onprem({"volcano": {"preInstalled": where}}))
    ids = sorted(r.resource_id for r in rec.of_type("kubernetes:apps/v1:Deployment"))
    assert ids == ["batch-system/vc-scheduler"]
    assert [r.resource_id for r in rec.of_type("kubernetes:core/v1:ConfigMap")] == [
        "batch-system/vc-scheduler-configmap"
    ]


def test_every_add_on_of_a_platform_can_be_pre_installed(
    run_program: Callable[..., Recorded],
) -> None:
    keys = ["volcano", "kube-prometheus-stack", "dcgm-exporter", "nvidia-device-plugin"]
    keys += ["network-operator", "log-collector"]
    cfg = onprem({k: {"preInstalled": True} for k in keys})
    rec = run_program(lambda: Platform(cfg.cluster_name, cfg))
    assert rec.of_type(RELEASE) == []
    checks = sorted(r.name for r in rec.of_type("trainstack:k8s:PreInstalledAddon"))
    assert checks == sorted(
        [
            "dgx-onprem-volcano-chart",
            "dgx-onprem-monitoring-kube-prometheus-stack",
            "dgx-onprem-monitoring-dcgm-exporter",
            "dgx-onprem-gpu-plugins-nvidia-device-plugin",
            "dgx-onprem-gpu-plugins-network-operator",
            "dgx-onprem-logs-release",
        ]
    )
    nic = "nicclusterpolicies.mellanox.com"
    nic_crd = next(r for r in rec.of_type(CRD) if r.resource_id == nic)
    policy = rec.one("kubernetes:mellanox.com/v1alpha1:NicClusterPolicy")
    assert nic_crd.urn in policy.dependencies


def test_pre_installed_workloads_are_read_by_their_charts_names(
    run_program: Callable[..., Recorded],
) -> None:
    """Names from each chart's templates at the pinned version (builders/addons.py cites them):
    Helm's fullname is the release when it contains the chart name."""
    keys = ["dcgm-exporter", "nvidia-device-plugin", "network-operator"]
    keys += ["volcano", "log-collector"]
    sources: dict[str, Any] = {k: {"preInstalled": True} for k in keys}
    sources["dcgm-exporter"] = {"preInstalled": {"namespace": "gpu-monitoring", "release": "dcgm"}}
    cfg = onprem(sources)
    rec = run_program(lambda: Platform(cfg.cluster_name, cfg))
    reads = {
        r.type.rsplit(":", 1)[-1] + " " + r.resource_id
        for r in rec.records
        if r.extra.get("read") and r.type.startswith("kubernetes:apps/v1:")
    }
    assert reads == {
        "DaemonSet gpu-monitoring/dcgm-dcgm-exporter",
        "DaemonSet trainstack-system/nvidia-device-plugin",
        "Deployment trainstack-system/network-operator",
        "Deployment volcano-system/volcano-scheduler",
        "DaemonSet trainstack-system/log-collector-opentelemetry-collector-agent",
    }


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"operator.prometheus.io/version": "0.89.0"}, None),
        ({"operator.prometheus.io/version": "0.93.0"}, None),  # ../shared/reference's CRDs
        ({"operator.prometheus.io/version": "v1.0.0"}, None),
        (
            {"operator.prometheus.io/version": "0.79.2"},
            "addons.kube-prometheus-stack: CRD servicemonitors.monitoring.coreos.com is "
            "prometheus-operator 0.79.2; the platform's monitors and rules need 0.89.0 or newer "
            "(chart kube-prometheus-stack 82.16.0): upgrade the CRDs",
        ),
        (
            {},
            "addons.kube-prometheus-stack: CRD servicemonitors.monitoring.coreos.com is "
            "prometheus-operator (no operator.prometheus.io/version annotation); the platform's "
            "monitors and rules need 0.89.0 or newer (chart kube-prometheus-stack 82.16.0): "
            "upgrade the CRDs",
        ),
    ],
)
def test_the_prometheus_operator_crds_are_new_enough(
    annotations: dict[str, str], message: str | None
) -> None:
    cfg = onprem({"kube-prometheus-stack": {"preInstalled": True}})
    probe = next(
        p
        for p in a.probes(cfg, "kube-prometheus-stack")
        if p.name == "servicemonitors.monitoring.coreos.com"
    )
    crd = {"metadata": {"name": probe.name, "annotations": annotations}}
    assert probe.problem(crd) == message


def test_the_reference_prometheus_operator_crds_pass(reference: Path) -> None:
    cfg = onprem({"kube-prometheus-stack": {"preInstalled": True}})
    for probe in a.probes(cfg, "kube-prometheus-stack"):
        kind = probe.name.split(".")[0]
        path = reference / "prometheus-operator" / f"monitoring.coreos.com_{kind}.yaml"
        assert probe.problem(yaml.safe_load(path.read_text())) is None, path


def _rendered_scheduler() -> dict[str, Any]:
    """The volcano-scheduler Deployment of Volcano's own rendered chart (release `volcano`)."""
    text = (volcano_source() / "installer" / "volcano-development.yaml").read_text()
    return next(
        d
        for d in yaml.safe_load_all(text)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "volcano-scheduler"
    )


def _probe(cfg: PlatformConfig, kind: str) -> a.Probe:
    return next(p for p in a.probes(cfg, "volcano") if p.kind == kind)


def test_the_upstream_volcano_scheduler_passes_the_version_check() -> None:
    cfg = onprem({"volcano": {"preInstalled": True}})
    assert _probe(cfg, "Deployment").problem(_rendered_scheduler()) is None


def test_another_volcano_version_is_named_with_the_fix() -> None:
    cfg = onprem({"volcano": {"preInstalled": True}})
    deployment = _rendered_scheduler()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "mirror.internal:5000/volcanosh/vc-scheduler:v1.14.0@sha256:" + "0" * 64
    assert _probe(cfg, "Deployment").problem(deployment) == (
        "addons.volcano: Deployment volcano-system/volcano-scheduler runs "
        f"{container['image']}, not v1.15.1: the platform is built for chart volcano 1.15.1 "
        "(image tag v1.15.1); upgrade it, or drop preInstalled to let the platform install it"
    )


def test_a_scheduler_config_other_than_the_platforms_is_refused() -> None:
    cfg = onprem({"volcano": {"preInstalled": True}})
    probe = _probe(cfg, "ConfigMap")
    conf = yaml.safe_dump(scheduling.scheduler_config(cfg))
    assert probe.problem({"data": {"volcano-scheduler.conf": conf}}) is None
    # Volcano's own default configuration (the chart without trainstack's values).
    default = (volcano_source() / CHART_DIR / "config" / "volcano-scheduler.conf").read_text()
    assert probe.problem({"data": {"volcano-scheduler.conf": default}}) == (
        "addons.volcano: ConfigMap volcano-system/volcano-scheduler-configmap "
        "(volcano-scheduler.conf) is not the platform's scheduler configuration, so queues, "
        "gangs and preemption would not behave as docs/scheduling.md says: install Volcano "
        "with the values `trainstack preview onprem` writes to build/onprem/helm/volcano.yaml"
    )


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("docker.io/volcanosh/vc-scheduler:v1.15.1", "v1.15.1"),
        ("registry:5000/volcanosh/vc-scheduler:v1.15.1", "v1.15.1"),
        ("registry:5000/vc-scheduler@sha256:" + "a" * 64, None),
        ("vc-scheduler", None),
        ("host/a/b:1.2@sha256:" + "b" * 64, "1.2"),
    ],
)
def test_image_tags(image: str, tag: str | None) -> None:
    assert a.image_tag(image) == tag


# -- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addons", "changes", "message"),
    [
        (
            {"volcano": {"repository": "https://m.example/c", "preInstalled": True}},
            {},
            "trainstack:platform.addons.volcano: gives repository and preInstalled; an add-on "
            "comes from one place: keep one of repository (a mirror), path (a local chart) or "
            "preInstalled",
        ),
        (
            {"volcano": {"repository": "charts.example/volcano"}},
            {},
            "trainstack:platform.addons.volcano.repository",
        ),
        (
            {"volcanoo": {"preInstalled": True}},
            {},
            "did you mean 'volcano'",
        ),
        ({"volcano": {}}, {}, "trainstack:platform.addons.volcano"),
    ],
)
def test_addon_config_errors(addons: dict[str, Any], changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as failed:
        onprem(addons, **changes)
    assert message in str(failed.value)


def test_pre_installed_is_for_existing_clusters_only() -> None:
    doc = copy.deepcopy(read_stack_file(ROOT / "stacks" / "Pulumi.dev.yaml"))
    doc["trainstack:platform"]["addons"] = {"volcano": {"preInstalled": True}}
    with pytest.raises(ConfigError) as failed:
        parse_stack_config(doc, stack="dev", source="Pulumi.dev.yaml")
    assert (
        "trainstack:platform.addons.volcano.preInstalled: only for cloud: existing; on the EKS "
        "cluster it creates the platform installs volcano itself: give repository (a mirror) "
        "or path (a local chart) if the public repository is out of reach"
    ) in str(failed.value)


def test_the_schema_lists_exactly_the_add_ons_the_builders_know() -> None:
    listed = load_schema("platform.schema.json")["properties"]["addons"]["properties"]
    assert sorted(listed) == sorted(a.ADDONS)
