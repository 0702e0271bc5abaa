"""Image pre-pull (issue 48, docs/prepull.md): which images each pool's DaemonSet holds, and
the DaemonSet's shape where users rely on it.

The expected image lists are computed here from the files themselves (the stack files' raw
YAML and the job specs' `spec.image` / `spec.pool`), not through jobs/prepull.py, so a mistake
there shows up as a difference."""

from __future__ import annotations

import dataclasses
import shutil
import tomllib
from email import message_from_string
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import EXAMPLE_STACKS, ROOT
from trainstack.builders import pools, prepull
from trainstack.builders.pools import GPU_TOLERATION, HEALTH_TOLERATION
from trainstack.config import PlatformConfig, load_stack_file
from trainstack.config import model as m
from trainstack.config.project import Project
from trainstack.config.schema import load_schema
from trainstack.jobs.prepull import TeamImages, team_job_images
from trainstack.preview.plan import Plan

STACKS = ROOT / "stacks"


def _raw(stack: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((STACKS / f"Pulumi.{stack}.yaml").read_text())
    return doc["config"]


def _expected(stack: str) -> dict[str, set[str]]:
    """Per pool: the configured images meant for it and the images of the jobs of the team
    stacks that name this platform, read straight from the files."""
    section = _raw(stack)["trainstack:platform"]
    settings = section.get("prePull", {})
    if not settings.get("enabled"):
        return {}
    names = [p["name"] for p in section.get("gpuPools", [])]
    want: dict[str, set[str]] = {name: set() for name in names}
    for item in settings.get("images", []):
        for name in item.get("pools", names):
            want[name].add(item["image"])
    if settings.get("teamJobs", True):
        for other in EXAMPLE_STACKS:
            team = _raw(other).get("trainstack:team")
            if not team or team["platformStack"].rsplit("/", 1)[-1] != stack:
                continue
            for pattern in team["jobs"]:
                for path in ROOT.glob(pattern):
                    spec = yaml.safe_load(path.read_text())["spec"]
                    want[spec["pool"]].add(spec["image"])
    return want


def _held(plan: Plan) -> dict[str, set[str]]:
    """Per pool, the images its pre-pull DaemonSet's containers hold."""
    found: dict[str, set[str]] = {}
    for _, obj in plan.kubernetes_objects():
        if obj["kind"] == "DaemonSet" and obj["metadata"]["name"].startswith(prepull.NAME_PREFIX):
            pool = obj["metadata"]["labels"][prepull.POOL_LABEL]
            pod = obj["spec"]["template"]["spec"]
            found[pool] = {
                c["image"] for c in pod["containers"] if c["name"] != prepull.HOLDER_ONLY
            }
    return found


@pytest.mark.parametrize("stack", [s for s in EXAMPLE_STACKS if "trainstack:platform" in _raw(s)])
def test_each_pool_holds_exactly_its_jobs_and_configured_images(
    example_plans: dict[str, Plan], stack: str
) -> None:
    assert _held(example_plans[stack]) == _expected(stack)


def test_prod_pre_pulls_its_team_jobs_images(example_plans: dict[str, Plan]) -> None:
    """prod is the example with pre-pull on: the vision team's jobs are held on their pools
    (so the table above compares something), the framework image on every pool."""
    held = _held(example_plans["prod"])
    framework = _raw("prod")["trainstack:platform"]["prePull"]["images"][0]["image"]
    assert all(framework in images for images in held.values())
    assert any(len(images) > 1 for images in held.values())
    demo = yaml.safe_load((ROOT / "job_specs/vision/demo-train.yaml").read_text())["spec"]
    assert demo["image"] in held[demo["pool"]]
    assert all(demo["image"] not in images for pool, images in held.items() if pool != demo["pool"])


def _prod_of(root: Path) -> PlatformConfig:
    cfg = load_stack_file(root / "stacks/Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def _project_copy(tmp_path: Path) -> Path:
    for name in ("Pulumi.yaml",):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(STACKS, tmp_path / "stacks")
    shutil.copytree(ROOT / "job_specs", tmp_path / "job_specs")
    return tmp_path


def _images(root: Path, platform: PlatformConfig | None = None) -> TeamImages:
    """team_job_images of the project at `root` for its prod (or `platform`)."""
    return team_job_images(Project.find(root), platform or _prod_of(root))


def _write_job(root: Path, path: str, metadata: dict[str, str] | None = None, **spec: str) -> str:
    """The seed example (vision's demo-train) with `metadata` and `spec` fields replaced,
    written to `path` in the project; returns its image."""
    doc = yaml.safe_load((root / "job_specs/vision/demo-train.yaml").read_text())
    doc["metadata"] = metadata or doc["metadata"]
    doc["spec"].update(spec)
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(yaml.safe_dump(doc))
    return str(doc["spec"]["image"])


def test_a_team_adding_a_job_adds_its_image_and_removing_it_releases_it(tmp_path: Path) -> None:
    root = _project_copy(tmp_path)
    before = _images(root).by_pool
    new = _write_job(
        root,
        "job_specs/vision/new-model.yaml",
        {"name": "new-model", "team": "vision"},
        image="registry.example.com/vision/new-model:1.0@sha256:" + "ab" * 32,
        pool="h200-burst",
    )
    after = _images(root).by_pool
    assert new in after["h200-burst"]
    assert {k: set(v) - {new} for k, v in after.items()} == {k: set(v) for k, v in before.items()}
    cfg = _prod_of(root)
    assert new in prepull.pool_images(cfg, after)["h200-burst"]
    (root / "job_specs/vision/new-model.yaml").unlink()
    assert new not in prepull.pool_images(cfg, _images(root).by_pool)["h200-burst"]


def test_a_team_stack_with_problems_is_left_out_and_named(tmp_path: Path) -> None:
    """Its own preview refuses it, so it deploys nothing: the platform pulls nothing for it,
    says why, and still holds the other stacks' images."""
    root = _project_copy(tmp_path)
    (root / "stacks/Pulumi.broken.yaml").write_text(
        "config:\n  trainstack:team:\n    team: vision\n"
        "    platformStack: organization/trainstack/prod\n    jobs: [job_specs/none/*.yaml]\n"
    )
    found = _images(root)
    assert found.skipped == (
        ("broken", "trainstack:team.jobs: 'job_specs/none/*.yaml' matches no file"),
    )
    assert found.by_pool  # vision's jobs are still there


def test_other_platforms_team_stacks_are_not_read(tmp_path: Path) -> None:
    root = _project_copy(tmp_path)
    dev = load_stack_file(root / "stacks/Pulumi.dev.yaml")
    assert isinstance(dev, PlatformConfig)
    assert _images(root, dev).by_pool == {}


def test_a_job_on_a_pool_its_team_may_not_use_pulls_nothing_there(tmp_path: Path) -> None:
    """A hostile recsys member (prod confines recsys to h200-burst) writes a job spec for
    nlp's h100-reserved: its own preview and admission refuse the job, and its image must not
    reach h100-reserved's nodes either (it could fill another team's disks by writing a file).
    The whole stack is left out, since it deploys nothing."""
    root = _project_copy(tmp_path)
    fill = {"name": "fill-disks", "team": "recsys"}
    huge = "registry.example.com/recsys/huge@sha256:" + "f" * 64
    _write_job(root, "job_specs/recsys/fill.yaml", fill, image=huge, pool="h100-reserved")
    (root / "stacks/Pulumi.recsys.yaml").write_text(
        "config:\n  trainstack:team:\n    team: recsys\n"
        "    platformStack: organization/trainstack/prod\n    jobs: [job_specs/recsys/*.yaml]\n"
    )
    found = _images(root)
    assert found.skipped == (
        ("recsys", "job fill-disks: pool 'h100-reserved' is not one of team 'recsys''s pools"),
    )
    assert all(huge not in images for images in found.by_pool.values())
    # on its own pool the same image is held
    _write_job(root, "job_specs/recsys/fill.yaml", fill, image=huge, pool="h200-burst")
    found = _images(root)
    assert found.skipped == ()
    assert huge in found.by_pool["h200-burst"]


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("attacker.example.net/x@sha256:" + "a" * 64, "is not from an allowed registry"),
        ("registry.example.com/vision/x:v1", "is not pinned as this platform requires"),
    ],
)
def test_an_image_the_rules_refuse_is_pulled_nowhere(tmp_path: Path, image: str, why: str) -> None:
    """prod allows two registries and, in production, digests only (pinned-images)."""
    root = _project_copy(tmp_path)
    _write_job(root, "job_specs/vision/demo-train.yaml", image=image)
    found = _images(root)
    assert found.skipped == (("vision", f"job demo-train: image {image!r} {why}"),)
    assert found.by_pool == {}


def test_a_job_of_another_team_in_a_team_stack_pulls_nothing(tmp_path: Path) -> None:
    root = _project_copy(tmp_path)
    path = root / "job_specs/vision/demo-train.yaml"
    path.write_text(path.read_text().replace("team: vision", "team: nlp"))
    found = _images(root)
    assert found.skipped == (
        ("vision", "job demo-train: metadata.team 'nlp' is not the stack's team 'vision'"),
    )
    assert found.by_pool == {}


@pytest.fixture(scope="module")
def prod() -> PlatformConfig:
    cfg = load_stack_file(STACKS / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def _daemonset(cfg: PlatformConfig, images: tuple[str, ...]) -> dict[str, Any]:
    return prepull.daemonset(cfg, cfg.gpu_pools[0], images)


IMAGES = (
    "registry.example.com/vision/a@sha256:" + "1" * 64,
    "registry.example.com/vision/b@sha256:" + "2" * 64,
)


def test_no_image_entrypoint_ever_runs(prod: PlatformConfig) -> None:
    """Every container of the pod, the init container included, runs the copied static busybox
    (command replaces the image's ENTRYPOINT, an empty args its CMD): a team's image is pulled,
    never run, in the system namespace."""
    pod = _daemonset(prod, IMAGES)["spec"]["template"]["spec"]
    for container in pod["containers"]:
        assert container["command"] == [prepull.HOLDER, "sleep", prepull.SLEEP_S]
        assert container["args"] == []
    [init] = pod["initContainers"]
    assert init["image"] == prod.pre_pull.holder_image
    assert init["command"] == [prepull.BUSYBOX, "cp", prepull.BUSYBOX, prepull.HOLDER]


def test_the_pods_are_restricted_and_have_no_token_and_no_network(prod: PlatformConfig) -> None:
    pod = _daemonset(prod, IMAGES)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == prepull.USER
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        assert container["resources"] == prepull.RESOURCES
    assert all(mount["readOnly"] for c in pod["containers"] for mount in c["volumeMounts"]), (
        "a held image's container cannot change the binary the others run"
    )
    policy = prepull.network_policy(prod)
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "trainstack-prepull"}
    }
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert set(policy["spec"]) == {"podSelector", "policyTypes"}  # no rule: nothing allowed


def test_the_pods_land_on_their_pool_through_both_taints(prod: PlatformConfig) -> None:
    """On the pool's nodes only, tolerating the GPU taint and, with the gate on, the gate's
    (a new node pulls while it is checked: the agent waits for this pod)."""
    pool = prod.gpu_pools[0]
    pod = _daemonset(prod, IMAGES)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == pools.pool_selector(prod, pool)
    assert pod["tolerations"] == [GPU_TOLERATION, HEALTH_TOLERATION]
    off = dataclasses.replace(prod, health=m.HealthConfig())
    assert _daemonset(off, IMAGES)["spec"]["template"]["spec"]["tolerations"] == [GPU_TOLERATION]


def test_a_changed_list_rolls_out_within_the_bound(prod: PlatformConfig) -> None:
    cfg = dataclasses.replace(
        prod, pre_pull=dataclasses.replace(prod.pre_pull, max_parallel_pulls=3)
    )
    strategy = _daemonset(cfg, IMAGES)["spec"]["updateStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 3},
    }


def test_a_pool_no_job_uses_yet_has_its_daemonset_holding_nothing_but_the_holder(
    prod: PlatformConfig,
) -> None:
    """So that its first image is a bounded rollout, not a creation on every node at once."""
    [container] = _daemonset(prod, ())["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "holder-only"
    assert container["image"] == prod.pre_pull.holder_image


def test_an_images_container_keeps_its_name_when_others_come_and_go(prod: PlatformConfig) -> None:
    names = {
        c["image"]: c["name"]
        for c in _daemonset(prod, IMAGES)["spec"]["template"]["spec"]["containers"]
    }
    fewer = _daemonset(prod, IMAGES[1:])["spec"]["template"]["spec"]["containers"]
    assert fewer[0]["name"] == names[IMAGES[1]]
    assert len(set(names.values())) == 2


def test_configured_images_go_to_their_pools_only(prod: PlatformConfig) -> None:
    a, b = (p.name for p in prod.gpu_pools[:2])
    cfg = dataclasses.replace(
        prod,
        pre_pull=dataclasses.replace(
            prod.pre_pull,
            team_jobs=False,
            images=(m.PrePullImage(IMAGES[0], (a,)), m.PrePullImage(IMAGES[1])),
        ),
    )
    held = prepull.pool_images(cfg, {a: ("ignored-with-teamJobs-false",)})
    assert held[a] == IMAGES
    assert held[b] == (IMAGES[1],)


def test_pre_pull_off_makes_nothing(prod: PlatformConfig) -> None:
    off = dataclasses.replace(prod, pre_pull=m.PrePull())
    assert prepull.pools_of(off) == ()
    assert prepull.pool_images(off, {"h100-block": IMAGES}) == {}


def test_the_model_defaults_are_the_schemas() -> None:
    props = load_schema("platform.schema.json")["properties"]["prePull"]["properties"]
    d = m.PrePull()
    assert (
        d.enabled,
        d.team_jobs,
        d.max_parallel_pulls,
        d.gate_minutes,
        d.holder_image,
        d.soci,
    ) == (
        props["enabled"]["default"],
        props["teamJobs"]["default"],
        props["maxParallelPulls"]["default"],
        props["gateMinutes"]["default"],
        props["holderImage"]["default"],
        props["soci"]["default"],
    )


# --- the nodes' pulls on AWS (nodeadm NodeConfig) -----------------------------------------------


def _node_config(pool: m.GpuPool, pre_pull: m.PrePull) -> dict[str, Any] | None:
    data = pools.node_user_data(pool, pre_pull=pre_pull)
    message = message_from_string(data)
    for part in message.walk():
        if part.get_content_type() == "application/node.eks.aws":
            return yaml.safe_load(part.get_payload())  # type: ignore[no-any-return]
    return None


def test_containerd_downloads_are_set_on_the_transfer_service(prod: PlatformConfig) -> None:
    """The AMI's containerd 2.2 pulls for the CRI through its transfer service; the CRI
    plugin's own setting would switch it back to the old local pull (containerd v2.2
    internal/cri/config/config.go)."""
    config = _node_config(prod.gpu_pools[0], m.PrePull(max_concurrent_downloads=8))
    assert config is not None
    toml = tomllib.loads(config["spec"]["containerd"]["config"])
    assert toml == {"plugins": {"io.containerd.transfer.v1.local": {"max_concurrent_downloads": 8}}}
    assert "featureGates" not in config["spec"]


def test_soci_parallel_pull_is_nodeadms_fast_image_pull(prod: PlatformConfig) -> None:
    pool = next(p for p in prod.gpu_pools if p.aws and p.aws.instance_store_raid0)
    config = _node_config(pool, m.PrePull(soci="parallel-pull-unpack"))
    assert config is not None
    assert config["spec"]["featureGates"] == {"FastImagePull": True}
    # the RAID0 instance store stays in the same NodeConfig
    assert config["spec"]["instance"] == {"localStorage": {"strategy": "RAID0"}}


def test_without_pull_settings_the_user_data_is_unchanged(prod: PlatformConfig) -> None:
    for pool in prod.gpu_pools:
        assert pools.node_user_data(pool, pre_pull=m.PrePull()) == pools.node_user_data(pool)
