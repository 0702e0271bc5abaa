"""`pulumi up` for real (issue 21 #3 to #5): trainstack's own program, an onprem-like platform stack
and a team stack, under the Pulumi CLI and Kubernetes provider built from Go modules, against
the e2e control plane.

The cluster is an existing one whose owners installed the add-ons (`addons.<key>.preInstalled`):
Volcano runs as the harness's processes, recorded in the cluster as its chart installs it (the
scheduler Deployment of Volcano's own rendered chart, at zero replicas since the processes
run outside, and the scheduler ConfigMap with the values `trainstack preview` writes);
prometheus-operator's CRDs are the harness's; the DCGM exporter and the device plugin are
DaemonSets as their charts name them, in the owners' namespace. The scenario, in order:
a pre-installed add-on of another version fails the preview with the platform's message;
preview; up of the platform; up of the team stack (a StackReference to the platform stack in
the same file backend); a second up of each changes nothing; a team's quota and a job spec
change and go through; the real analyzer runs the CrossGuard pack on a team stack with a
violation and reports what `trainstack preview` reports; the resources the engine registered
equal the offline plan's (type, name, parent) with equal Kubernetes inputs; destroy of both
leaves no trainstack object. What `make e2e` summarises is recorded as user properties.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e import policy_cli
from tests.e2e.pulumi_engine import Engine, EngineError, sdk_plugin_version
from tests.volcano_chart import volcano_source
from trainstack.builders import labels
from trainstack.builders.scheduling import scheduler_config
from trainstack.config import PlatformConfig
from trainstack.config.project import Project
from trainstack.kube import Kube, quantity, wait_for
from trainstack.preview import policy_config
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import _urn_ref as urn_ref
from trainstack.sandbox import deploy, nodes
from trainstack.sandbox.cluster import ControlPlane

PROJECT = "trainstack"
PLATFORM, TEAM = "onprem-e2e", "speech"
OWNERS_NS = "gpu-system"  # where the cluster's owners installed the GPU add-ons
JOB = "asr-train"
PACK = ROOT / "policies"


def platform_doc(kubeconfig: Path, gpus: int = 16) -> dict[str, Any]:
    return {
        "cloud": "existing",
        "environment": "development",
        "clusterName": "e2e-onprem",
        "kubernetesVersion": "1.33",
        "existing": {"kubeconfig": str(kubeconfig), "context": "e2e"},
        "storage": {
            "existingLustre": {
                "csiDriver": "lustre.csi.hpe.com",
                "volumeHandle": "mgs.lab.internal@tcp:/trainfs{path}",
                "volumeAttributes": {"mgsAddress": "mgs.lab.internal@tcp", "fsName": "trainfs"},
                "capacityGiB": 51200,
            }
        },
        "gpuPools": [
            {
                "name": "a100",
                "fabric": "tcp",
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                "gpusPerNode": 8,
                "nodes": 2,
                "cpusPerNode": 96,
                "memoryGiBPerNode": 1000,
            }
        ],
        "registry": {
            "teams": [
                {
                    "name": TEAM,
                    "owners": ["speech-lead@example.com"],
                    "quota": {"gpus": gpus},
                    "access": {"groups": ["oidc:speech-team"]},
                }
            ]
        },
        "policy": {"allowedRegistries": ["registry.example.com/"]},
        "addons": {
            "volcano": {"preInstalled": True},
            "kube-prometheus-stack": {"preInstalled": {"namespace": "monitoring"}},
            "dcgm-exporter": {"preInstalled": {"namespace": OWNERS_NS}},
            "nvidia-device-plugin": {"preInstalled": {"namespace": OWNERS_NS}},
        },
    }


def job_spec(
    replicas: int = 2, image: str = "registry.example.com/speech/asr:2026.11.1"
) -> dict[str, Any]:
    return {
        "apiVersion": "trainstack.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": JOB, "team": TEAM},
        "spec": {
            "image": image,
            "command": ["python", "-m", "asr.train"],
            "pool": "a100",
            "workers": {"replicas": replicas, "gpus": 8, "cpu": "32", "memory": "256Gi"},
            "checkpoint": {"intervalSeconds": 600},
            "maxDurationHours": 12,
        },
    }


class Project_:
    """The temp project: Pulumi.yaml, trainstack's __main__.py, stacks/, job_specs/."""

    def __init__(self, engine: Engine, root: Path, kubeconfig: Path) -> None:
        self.engine, self.root, self.kubeconfig = engine, root, kubeconfig
        (root / "stacks").mkdir(parents=True)
        (root / "job_specs" / TEAM).mkdir(parents=True)
        shutil.copy(ROOT / "__main__.py", root / "__main__.py")
        project = {
            "name": PROJECT,
            "runtime": {"name": "python"},
            "backend": {"url": engine.backend_url},
            "stackConfigDir": "stacks",
        }
        (root / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
        for stack in (PLATFORM, TEAM):
            engine.pulumi("stack", "init", stack, cwd=root)

    def stack_file(self, stack: str) -> Path:
        return self.root / "stacks" / f"Pulumi.{stack}.yaml"

    def set_config(self, stack: str, key: str, value: dict[str, Any]) -> None:
        """Structured config, kept beside the salt `stack init` wrote."""
        path = self.stack_file(stack)
        doc = yaml.safe_load(path.read_text()) if path.exists() else {}
        doc = doc or {}
        doc["config"] = {key: value}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def write_job(self, spec: dict[str, Any]) -> None:
        (self.root / "job_specs" / TEAM / f"{JOB}.yaml").write_text(yaml.safe_dump(spec))

    def previewer(self) -> Previewer:
        return Previewer(Project.find(self.root))


def _daemonset(name: str, container: str, image: str, chart: str) -> dict[str, Any]:
    """A DaemonSet as its chart installs it (release = chart name), never scheduled here."""
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": OWNERS_NS,
            "labels": {**selector, "app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": chart},
        },
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    # No node carries this: the record of an installation, with no pods.
                    "nodeSelector": {"e2e.trainstack.io/never": "true"},
                    "containers": [{"name": container, "image": image}],
                },
            },
        },
    }


def volcano_scheduler(image: str | None = None) -> dict[str, Any]:
    """The volcano-scheduler Deployment of Volcano's rendered chart, at zero replicas (the
    harness runs the scheduler as a process); `image` replaces its image."""
    rendered = (volcano_source() / "installer" / "volcano-development.yaml").read_text()
    scheduler: dict[str, Any] = next(
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "volcano-scheduler"
    )
    scheduler["spec"]["replicas"] = 0
    if image is not None:
        scheduler["spec"]["template"]["spec"]["containers"][0]["image"] = image
    return scheduler


def pre_install(plane: ControlPlane, cfg: PlatformConfig) -> None:
    """What the cluster's owners installed, as their charts install it."""
    kube = plane.kube
    for namespace in ("volcano-system", OWNERS_NS):
        if kube.get_or_none("v1", "Namespace", namespace) is None:
            kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kube.apply(volcano_scheduler())
    # What the chart makes of custom.scheduler_config_override (templates/scheduler.yaml).
    conf = scheduler_config(cfg)
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "volcano-scheduler-configmap", "namespace": "volcano-system"},
            "data": {"volcano-scheduler.conf": yaml.safe_dump(conf, sort_keys=False)},
        }
    )
    plane.restart_scheduler(conf)
    # dcgm-exporter 4.8.2 (deployment/templates/daemonset.yaml, values.yaml image.tag) and
    # nvidia-device-plugin 0.18.2 (deployments/helm/.../daemonset-device-plugin.yml).
    kube.apply(
        _daemonset(
            "dcgm-exporter",
            "exporter",
            "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless",
            "dcgm-exporter-4.8.2",
        )
    )
    kube.apply(
        _daemonset(
            "nvidia-device-plugin",
            "nvidia-device-plugin-ctr",
            "nvcr.io/nvidia/k8s-device-plugin:v0.18.2",
            "nvidia-device-plugin-0.18.2",
        )
    )


def uninstall(kube: Kube) -> None:
    for namespace in ("volcano-system", OWNERS_NS):
        kube.delete("v1", "Namespace", namespace)
    wait_for(
        "the owners' namespaces gone",
        lambda: all(kube.get_or_none("v1", "Namespace", n) is None for n in ("volcano-system",)),
        timeout=120,
    )


def new_engine(home: Path, tools: Mapping[str, Path]) -> Engine:
    """The Pulumi CLI with its home and file backend under `home` and the Kubernetes provider
    plugin built by toolchain.py installed."""
    engine = Engine.create(home, tools)
    engine.install_plugin(
        "resource", "kubernetes", sdk_plugin_version(), tools["pulumi-resource-kubernetes"]
    )
    return engine


@contextmanager
def owners_cluster(plane: ControlPlane, project: Project_) -> Iterator[None]:
    """`plane` as the existing cluster `project`'s platform stack targets, for as long as the
    block runs: what the owners installed (`pre_install`), the stack's nodes, and
    kube-scheduler (the provider waits for the platform's own Deployment, the deadline
    enforcer, to be available, as on any cluster; the rest of the suite schedules only through
    Volcano). Begins with `deploy.reset` (a stack the plane held is removed) and ends with it
    and `uninstall`: the stacks' objects, the add-ons and the nodes gone, kube-scheduler
    stopped unless it ran before, Volcano's scheduler back on the configuration it ran
    before (`pre_install` restarts it on the stack's)."""
    cfg, _ = project.previewer().load(PLATFORM)
    assert isinstance(cfg, PlatformConfig)
    kube = plane.kube
    scheduler_conf = yaml.safe_load(plane.scheduler_conf.read_text(encoding="utf-8"))
    deploy.reset(kube)
    started = False
    try:
        pre_install(plane, cfg)
        deploy.create_nodes(kube, nodes.stack_nodes(cfg))
        started = plane.start_default_scheduler()
        yield
    finally:
        if started:
            plane.stop_default_scheduler()
        deploy.reset(kube)
        uninstall(kube)
        plane.restart_scheduler(scheduler_conf)


@pytest.fixture(scope="module")
def engine(tools: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return new_engine(tmp_path_factory.mktemp("pulumi-stacks"), tools)


@pytest.fixture(scope="module")
def project(
    engine: Engine, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Project_]:
    project = Project_(engine, tmp_path_factory.mktemp("project") / "p", control_plane.kubeconfig())
    kubeconfig = control_plane.kubeconfig()
    project.set_config(PLATFORM, "trainstack:platform", platform_doc(kubeconfig))
    project.set_config(
        TEAM,
        "trainstack:team",
        {
            "team": TEAM,
            "platformStack": f"organization/{PROJECT}/{PLATFORM}",
            "jobs": [f"job_specs/{TEAM}/*.yaml"],
        },
    )
    project.write_job(job_spec())
    with owners_cluster(control_plane, project):
        yield project


def _engine_resources(
    engine: Engine, project: Project_, stack: str
) -> dict[tuple[str, str, str], Any]:
    state = json.loads(engine.pulumi("stack", "export", "--stack", stack, cwd=project.root))
    resources = state["deployment"]["resources"]

    def key(r: dict[str, Any]) -> tuple[str, str, str]:
        parent = urn_ref(r.get("parent", ""))
        # The plan names no parent for the stack's own children (the mocks never see the root).
        parent = "" if parent.startswith("pulumi:pulumi:Stack::") else parent
        return (r["type"], r["urn"].rsplit("::", 1)[-1], parent)

    # The engine's own: the stack, and the default provider of the `pulumi` package that
    # serves StackReference reads. A default provider of any other package would mean a
    # resource without trainstack's explicit provider: that one is reported.
    own = ("pulumi:pulumi:Stack", "pulumi:providers:pulumi")
    return {key(r): r for r in resources if r["type"] not in own}


def _offline_resources(project: Project_, stack: str) -> dict[tuple[str, str, str], Any]:
    plan = project.previewer().preview(stack)
    stack_type = "pulumi:pulumi:Stack"
    return {(r.type, r.name, r.parent): r for r in plan.resources if r.type != stack_type}


def _differences(engine: Engine, project: Project_, stack: str) -> list[str]:
    """What differs between the engine's state and the offline plan of `stack`."""
    live = _engine_resources(engine, project, stack)
    offline = _offline_resources(project, stack)
    diffs = [f"{stack}: only the engine registered {k}" for k in sorted(set(live) - set(offline))]
    diffs += [f"{stack}: only the offline plan has {k}" for k in sorted(set(offline) - set(live))]
    for k in sorted(set(live) & set(offline)):
        if not k[0].startswith("kubernetes:") or k[0].startswith("kubernetes:helm"):
            continue
        if live[k].get("external"):  # a read: its inputs are the cluster's object
            continue
        sent = {f: v for f, v in live[k].get("inputs", {}).items() if not f.startswith("__")}
        for where in _unlike(sent, offline[k].inputs):
            diffs.append(f"{stack}: {k} inputs differ at {where}")
    return diffs


def _unlike(checked: Any, planned: Any, path: str = "") -> list[str]:
    """Where the engine's inputs differ from the plan's, beyond the provider's normalisation.

    The state holds the inputs as the provider's Check returned them: for built-in kinds a
    round trip through the typed Go structs (pulumi-kubernetes provider.go normalizeInputs ->
    clients.Normalize), which writes quantities canonically (51200Gi -> 50Ti) and drops zero
    values of omitempty fields (globalDefault: false, a PV's storageClassName: "").
    """
    if isinstance(checked, dict) and isinstance(planned, dict):
        found = []
        for key in sorted(set(checked) | set(planned)):
            here = f"{path}.{key}" if path else key
            if key not in checked and planned[key] in (False, "", 0, None, [], {}):
                continue  # dropped by the typed round trip
            if key not in checked or key not in planned:
                found.append(f"{here} (only in {'the plan' if key in planned else 'the engine'})")
            else:
                found += _unlike(checked[key], planned[key], here)
        return found
    if isinstance(checked, list) and isinstance(planned, list) and len(checked) == len(planned):
        return [
            d
            for i, (c, p) in enumerate(zip(checked, planned, strict=True))
            for d in _unlike(c, p, f"{path}[{i}]")
        ]
    if checked == planned or _same_quantity(checked, planned):
        return []
    return [f"{path}: engine {checked!r}, plan {planned!r}"]


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return isinstance(a, str) and isinstance(b, str) and quantity(a) == quantity(b)
    except ValueError:
        return False


def test_platform_and_team_stacks_under_the_real_engine(
    engine: Engine,
    project: Project_,
    control_plane: ControlPlane,
    kube: Kube,
    record_property: Any,
) -> None:
    root = project.root
    # 1. The platform checks what the owners installed: another Volcano fails the preview.
    kube.apply(volcano_scheduler("volcanosh/vc-scheduler:v1.14.0"))
    with pytest.raises(EngineError) as refused:
        engine.run(root, PLATFORM, "preview")
    assert (
        "addons.volcano: Deployment volcano-system/volcano-scheduler runs "
        "volcanosh/vc-scheduler:v1.14.0, not v1.15.1"
    ) in str(refused.value)
    # The CLI prints it as one clean diagnostic (a RunError: no program traceback).
    assert f"error: stack {PLATFORM}: trainstack:platform.addons.volcano: " in str(refused.value)
    cli = str(refused.value).split("Traceback", 1)[0]  # the driver's own exception follows
    assert "File " not in cli
    kube.apply(volcano_scheduler())

    # 2. Preview, up, and a second up of the platform.
    preview = engine.run(root, PLATFORM, "preview")
    assert set(preview["changes"]) == {"create", "read"} or set(preview["changes"]) == {"create"}
    up = engine.run(root, PLATFORM, "up", timeout=600)
    assert up["changes"].get("create"), up
    queue = kube.get("scheduling.volcano.sh/v1beta1", "Queue", TEAM)
    assert queue["spec"]["capability"]["nvidia.com/gpu"] in ("16", 16)
    assert kube.get("v1", "Namespace", TEAM)["metadata"]["labels"][labels.TEAM] == TEAM
    # The owners' objects are read, not adopted or changed.
    owners = kube.get("v1", "Namespace", "volcano-system")["metadata"].get("labels", {})
    assert owners.get(labels.MANAGED_BY) != labels.MANAGER

    # 3. The team stack, through a StackReference to the platform stack.
    # A team reaches an existing cluster with its own kubeconfig (the platform exports only
    # the context: outputs.KUBE_CONTEXT), here the control plane's.
    own = {"KUBECONFIG": str(control_plane.kubeconfig())}
    team_up = engine.run(root, TEAM, "up", timeout=600, env=own)
    assert team_up["changes"].get("create"), team_up
    job = kube.get("batch.volcano.sh/v1alpha1", "Job", JOB, TEAM)
    assert job["spec"]["queue"] == TEAM

    # 4. Second ups change nothing.
    second = 0
    for stack in (PLATFORM, TEAM):
        again = engine.run(root, stack, "up", expect_no_changes=True, timeout=600, env=own)
        second += sum(n for op, n in again["changes"].items() if op not in ("same", "read"))
    assert second == 0

    # 5. Offline plan == engine (before the changes, while both describe the same config).
    differences = _differences(engine, project, PLATFORM) + _differences(engine, project, TEAM)
    for line in differences:
        print(line)

    # 6. A team's quota and a job spec change and go through.
    _set_platform(project, control_plane, gpus=8)
    quota_up = engine.run(root, PLATFORM, "up", timeout=600)
    assert quota_up["changes"].get("update"), quota_up
    queue = kube.get("scheduling.volcano.sh/v1beta1", "Queue", TEAM)
    assert queue["spec"]["capability"]["nvidia.com/gpu"] in ("8", 8)
    project.write_job(job_spec(replicas=1))
    job_up = engine.run(root, TEAM, "up", timeout=600, env=own)
    assert set(job_up["changes"]) - {"same", "read"}, job_up
    job = kube.get("batch.volcano.sh/v1alpha1", "Job", JOB, TEAM)
    assert sum(t["replicas"] for t in job["spec"]["tasks"]) == 1

    # 7. The real analyzer on a team stack with a violation: the preview's report.
    project.write_job(job_spec(replicas=1, image="docker.io/library/python:3.12"))
    plan = project.previewer().preview(TEAM)
    reported = sorted((v["rule"], v["resource"], v["level"]) for v in plan.violations)
    assert any(level == "mandatory" for *_, level in reported), reported
    config = root / "policy-config.json"
    config.write_text(policy_config.generate(project.previewer(), TEAM))
    launcher = policy_cli.launcher(root / "pack", PACK)
    result = policy_cli.preview(engine, root, TEAM, launcher, config, timeout=600, env=own)
    found = sorted(
        (e["policy"], e["urn"].rsplit("::", 1)[-1], e["level"]) for e in result["policy"]
    )
    assert found == reported, Path(result["log"]).read_text()[-4000:]
    project.write_job(job_spec(replicas=1))

    # 8. Destroy both: no trainstack object is left.
    for stack in (TEAM, PLATFORM):
        engine.run(root, stack, "destroy", timeout=600, env=own)
    left = _trainstack_objects(kube)
    assert left == [], left

    record_property("pulumi_up", [PLATFORM, TEAM])
    record_property("second_up_changes", second)
    record_property("destroy_clean", not left)
    record_property("offline_matches_engine", not differences)
    record_property("offline_engine_differences", differences)
    assert differences == [], "\n".join(differences)


def _set_platform(project: Project_, plane: ControlPlane, gpus: int) -> None:
    project.set_config(PLATFORM, "trainstack:platform", platform_doc(plane.kubeconfig(), gpus))


def _trainstack_objects(kube: Kube) -> list[str]:
    selector = deploy.MANAGED
    kinds = [
        ("v1", "Namespace"),
        ("scheduling.volcano.sh/v1beta1", "Queue"),
        ("scheduling.k8s.io/v1", "PriorityClass"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("topology.volcano.sh/v1alpha1", "HyperNode"),
        ("v1", "PersistentVolume"),
        ("storage.k8s.io/v1", "StorageClass"),
    ]
    left = []
    for api_version, kind in kinds:
        for obj in kube.list(api_version, kind, labels=selector):
            left.append(f"{kind} {obj['metadata']['name']}")
    left += [f"Job {j['metadata']['name']}" for j in kube.list("batch.volcano.sh/v1alpha1", "Job")]
    return left
