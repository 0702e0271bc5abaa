"""Upstream add-ons as data: the chart each one is, where it comes from (the public repository,
a mirror, a local chart directory) and, for one the cluster's owners installed, what the
platform reads to check it is there at the version it was built for.

Air-gapped clusters cannot reach the public chart repositories, and on many existing clusters
the scheduler or the monitoring stack belong to another team. `addons.<key>` in the stack
(config/addons.py) says which; README, "Air-gapped clusters and pre-installed add-ons".

A pre-installed add-on is not installed: the platform reads, through the Kubernetes provider,
the CRDs it creates objects of and the objects that show the add-on's version and settings
(`probes`), and each read's `problem` names what is wrong and how to fix it. A read of an
object that does not exist fails the preview itself ("resource ... does not exist").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainstack.builders import autoscaler, logs, monitoring, pools, scheduling, topology
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig

CRD_API = "apiextensions.k8s.io/v1"


@dataclass(frozen=True)
class Workload:
    """The add-on's main workload as its chart names it for a release (`{release}`): the
    version the platform checks is the tag of `container`'s image."""

    kind: str  # Deployment or DaemonSet
    name: str  # a template of {release}
    container: str  # a template of {release}
    tag: str  # the image tag the pinned chart deploys by default


@dataclass(frozen=True)
class Addon:
    key: str  # the release name trainstack installs it as, and the key under `addons`
    chart: Mapping[str, str]  # chart, version, repo
    namespace: str  # where trainstack installs it
    crds: tuple[str, ...] = ()  # the CRDs the platform creates objects of
    workload: Workload | None = None


# The Volcano chart names every object after the release (templates/scheduler.yaml at chart
# v1.15.1: Deployment `{{ .Release.Name }}-scheduler`, container of the same name, image tag
# `basic.image_tag_version` = "v1.15.1" in values.yaml; Chart.yaml version = appVersion 1.15.1).
_VOLCANO = Addon(
    "volcano",
    scheduling.VOLCANO_CHART,
    scheduling.VOLCANO_NAMESPACE,
    crds=(
        "jobs.batch.volcano.sh",
        "commands.bus.volcano.sh",
        "podgroups.scheduling.volcano.sh",
        "queues.scheduling.volcano.sh",
        "hypernodes.topology.volcano.sh",
    ),
    workload=Workload(
        "Deployment",
        "{release}-scheduler",
        "{release}-scheduler",
        "v1.15.1",
    ),
)
# Every other chart names its workload by Helm's usual fullname (`<chart>.fullname` in each
# chart's _helpers.tpl): the release name when it contains the chart name, else
# `<release>-<chart>`. Facts at the pinned versions, with their sources:
# - dcgm-exporter 4.8.2 (NVIDIA/dcgm-exporter tag 4.5.3-4.8.2, deployment/): DaemonSet, container
#   `exporter`, image tag 4.5.3-4.8.2-distroless (values.yaml sets it; it is not appVersion).
# - nvidia-device-plugin 0.18.2 (NVIDIA/k8s-device-plugin v0.18.2, deployments/helm/): DaemonSet,
#   container `nvidia-device-plugin-ctr`, image tag v0.18.2.
# - network-operator 25.7.0 (Mellanox/network-operator v25.7.0, deployment/network-operator/):
#   Deployment, container `network-operator`, image tag v25.7.0; CRD nicclusterpolicies.
# - gpu-operator v26.3.0 (NVIDIA/gpu-operator v26.3.0, deployments/gpu-operator/): Deployment
#   named `gpu-operator` whatever the release, container `gpu-operator`, image tag v26.3.0.
# kube-prometheus-stack's version is read from its CRDs instead (below); the EFA device plugin
# and Cluster Autoscaler are installed only on the EKS clusters the platform creates.
_FULLNAME = "{fullname}"

ADDONS: dict[str, Addon] = {
    a.key: a
    for a in (
        _VOLCANO,
        Addon(
            "kube-prometheus-stack",
            monitoring.CHARTS["kube-prometheus-stack"],
            monitoring.NAMESPACE,
            crds=(
                "podmonitors.monitoring.coreos.com",
                "prometheusrules.monitoring.coreos.com",
                "servicemonitors.monitoring.coreos.com",
            ),
        ),
        Addon(
            "dcgm-exporter",
            monitoring.CHARTS["dcgm-exporter"],
            monitoring.NAMESPACE,
            workload=Workload("DaemonSet", _FULLNAME, "exporter", "4.5.3-4.8.2-distroless"),
        ),
        Addon(
            "nvidia-device-plugin",
            pools.CHARTS["nvidia-device-plugin"],
            pools.PLUGIN_NAMESPACE,
            workload=Workload("DaemonSet", _FULLNAME, "nvidia-device-plugin-ctr", "v0.18.2"),
        ),
        Addon(
            "gpu-operator",
            pools.CHARTS["gpu-operator"],
            pools.PLUGIN_NAMESPACE,
            workload=Workload("Deployment", "gpu-operator", "gpu-operator", "v26.3.0"),
        ),
        Addon(
            "aws-efa-k8s-device-plugin",
            pools.CHARTS["aws-efa-k8s-device-plugin"],
            pools.PLUGIN_NAMESPACE,
        ),
        Addon(
            "network-operator",
            pools.CHARTS["network-operator"],
            pools.PLUGIN_NAMESPACE,
            crds=("nicclusterpolicies.mellanox.com",),
            workload=Workload("Deployment", _FULLNAME, "network-operator", "v25.7.0"),
        ),
        Addon(autoscaler.RELEASE, autoscaler.CHART, autoscaler.NAMESPACE),
        # opentelemetry-collector 0.170.0: templates/daemonset.yaml names it
        # `{{ fullname }}-agent`, its container the lower-cased chart name (_pod.tpl); our
        # values set the image tag to the release the chart's appVersion is.
        Addon(
            logs.RELEASE,
            logs.CHART,
            SYSTEM_NAMESPACE,
            workload=Workload(
                "DaemonSet", f"{_FULLNAME}-agent", "opentelemetry-collector", logs.COLLECTOR_RELEASE
            ),
        ),
    )
}


def helm_fullname(release: str, chart: str) -> str:
    """Helm's usual `<chart>.fullname` (the `helm create` template most charts keep)."""
    name = release if chart in release else f"{release}-{chart}"
    return name[:63].rstrip("-")


# The prometheus-operator version of the pinned kube-prometheus-stack (82.16.0: Chart.yaml
# appVersion v0.89.0; its CRDs carry `operator.prometheus.io/version: 0.89.0`, charts/crds/
# crds/crd-*.yaml line 8, tag kube-prometheus-stack-82.16.0). monitoring.coreos.com/v1 only
# grows, so a newer operator serves every field the platform's monitors and rules use; an
# older one may not.
MIN_PROMETHEUS_OPERATOR = (0, 89, 0)
OPERATOR_VERSION = "operator.prometheus.io/version"


class AddonSourceError(ValueError):
    """A source the platform cannot use (a local chart that is missing or another version)."""


def release_args(cfg: PlatformConfig, key: str, base: Path) -> dict[str, Any]:
    """The Helm Release's chart, version and repository for add-on `key`'s source.

    Public repository or mirror: `repositoryOpts.repo` and the chart's name. OCI registry:
    the chart reference `oci://…/<chart>` (Helm takes OCI charts by reference, with no
    repository). Local directory: its path, checked here to hold the pinned chart, since
    Helm installs a local chart whatever its version (helm pkg/action LocateChart returns a
    path that exists as it is).
    """
    addon = ADDONS[key]
    chart, version = addon.chart["chart"], addon.chart["version"]
    source = cfg.addon_source(key)
    if source.path is not None:
        directory = Path(source.path).expanduser()
        directory = directory if directory.is_absolute() else base / directory
        return {"chart": str(_local_chart(directory, chart, version, key))}
    repository = source.repository or addon.chart["repo"]
    if repository.startswith("oci://"):
        return {"chart": f"{repository.rstrip('/')}/{chart}", "version": version}
    return {"chart": chart, "version": version, "repository_opts": {"repo": repository}}


def _local_chart(directory: Path, chart: str, version: str, key: str) -> Path:
    field = f"addons.{key}.path"
    meta = directory / "Chart.yaml"
    try:
        found = yaml.safe_load(meta.read_text(encoding="utf-8")) or {}
    except OSError:
        raise AddonSourceError(
            f"{field}: {directory} has no Chart.yaml; give the directory of chart {chart} "
            f"{version} (e.g. what `helm pull {chart} --version {version} --untar` makes)"
        ) from None
    except yaml.YAMLError as err:
        raise AddonSourceError(f"{field}: {meta} is not YAML: {err}") from None
    got = (found.get("name"), str(found.get("version"))) if isinstance(found, dict) else None
    if got != (chart, version):
        raise AddonSourceError(
            f"{field}: {meta} is chart {got[0] if got else None} {got[1] if got else None}; "
            f"the platform pins {chart} {version}: point path at that chart"
        )
    return directory


# -- pre-installed add-ons ----------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One object the platform reads instead of installing an add-on, and what must hold."""

    api_version: str
    kind: str
    name: str
    namespace: str | None
    # The object as read -> what is wrong with it, or None. Absence fails the read itself.
    problem: Callable[[Mapping[str, Any]], str | None]

    @property
    def id(self) -> str:
        """The provider's id of the object: `namespace/name`, or `name` when cluster-scoped."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def fields(self) -> tuple[str, ...]:
        """The parts of the object its check reads (a ConfigMap has data, not spec)."""
        return ("metadata", "data") if self.kind == "ConfigMap" else ("metadata", "spec")

    @property
    def role(self) -> str:
        """The read's part in the resource name (kind and object, which are unique here)."""
        return f"{self.kind.lower()}-{self.name}"


def pre_installed(cfg: PlatformConfig, key: str) -> bool:
    return cfg.addon_source(key).pre_installed is not None


def probes(cfg: PlatformConfig, key: str) -> list[Probe]:
    """What the platform reads to check pre-installed add-on `key`."""
    addon = ADDONS[key]
    where = cfg.addon_source(key).pre_installed
    assert where is not None, f"{key} is not pre-installed"
    namespace = where.namespace or addon.namespace
    release = where.release or addon.key
    crd_problem = _operator_problem if key == "kube-prometheus-stack" else _no_problem
    result = [
        Probe(CRD_API, "CustomResourceDefinition", crd, None, crd_problem) for crd in addon.crds
    ]
    if addon.workload is not None:
        work = addon.workload
        fullname = helm_fullname(release, addon.chart["chart"])
        name = work.name.format(release=release, fullname=fullname)
        container = work.container.format(release=release)
        at = f"{work.kind} {namespace}/{name}"
        result.append(
            Probe(
                "apps/v1",
                work.kind,
                name,
                namespace,
                lambda obj: _tag_problem(obj, key, at, container, work.tag),
            )
        )
    if key == "volcano":
        result.append(_volcano_conf_probe(cfg, namespace, release))
        if topology.discovers(cfg):
            name = topology.controller_configmap_name(release)
            problem = topology.controller_conf_problem(cfg, namespace, name)
            result.append(Probe("v1", "ConfigMap", name, namespace, problem))
    return result


def _no_problem(obj: Mapping[str, Any]) -> str | None:
    del obj  # that it exists is the check (a missing object fails the read)
    return None


def _operator_problem(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") or {}
    found = str((meta.get("annotations") or {}).get(OPERATOR_VERSION, ""))
    parts = found.removeprefix("v").split(".")
    version = tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None
    if version is not None and version >= MIN_PROMETHEUS_OPERATOR:
        return None
    least = ".".join(map(str, MIN_PROMETHEUS_OPERATOR))
    return (
        f"addons.kube-prometheus-stack: CRD {meta.get('name')} is prometheus-operator "
        f"{found or '(no ' + OPERATOR_VERSION + ' annotation)'}; the platform's monitors and "
        f"rules need {least} or newer (chart kube-prometheus-stack "
        f"{ADDONS['kube-prometheus-stack'].chart['version']}): upgrade the CRDs"
    )


def image_tag(image: str) -> str | None:
    """The tag of an image reference (`registry:5000/a/b:v1@sha256:…` -> v1), None if none."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else None


def _tag_problem(
    obj: Mapping[str, Any], key: str, where: str, container: str, tag: str
) -> str | None:
    containers = ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "containers"
    ) or []
    image = next((c.get("image") for c in containers if c.get("name") == container), None)
    if image is None:
        names = ", ".join(str(c.get("name")) for c in containers) or "none"
        return (
            f"addons.{key}: {where} has no container {container!r} (it has: {names}); is it "
            f"release {key} of chart {ADDONS[key].chart['chart']}? Set preInstalled.release "
            "and preInstalled.namespace to where it is installed"
        )
    found = image_tag(str(image))
    if found != tag:
        chart = ADDONS[key].chart
        return (
            f"addons.{key}: {where} runs {image}, not {tag}: the platform is built for chart "
            f"{chart['chart']} {chart['version']} (image tag {tag}); upgrade it, or drop "
            "preInstalled to let the platform install it"
        )
    return None


def _volcano_conf_probe(cfg: PlatformConfig, namespace: str, release: str) -> Probe:
    """Queues, gangs and preemption behave as docs/scheduling.md says only with the
    platform's scheduler configuration: the chart keeps it in ConfigMap
    `{{ .Release.Name }}-scheduler-configmap`, key volcano-scheduler.conf (templates/
    scheduler.yaml at v1.15.1), which `custom.scheduler_config_override` fills."""
    wanted = scheduling.scheduler_config(cfg)
    name = f"{release}-scheduler-configmap"

    def problem(obj: Mapping[str, Any]) -> str | None:
        text = (obj.get("data") or {}).get("volcano-scheduler.conf")
        try:
            found = yaml.safe_load(text) if isinstance(text, str) else None
        except yaml.YAMLError:
            found = None
        if found == wanted:
            return None
        return (
            f"addons.volcano: ConfigMap {namespace}/{name} (volcano-scheduler.conf) is not the "
            "platform's scheduler configuration, so queues, gangs and preemption would not "
            "behave as docs/scheduling.md says: install Volcano with the values "
            f"`trainstack preview {cfg.stack}` writes to build/{cfg.stack}/helm/volcano.yaml"
        )

    return Probe("v1", "ConfigMap", name, namespace, problem)
