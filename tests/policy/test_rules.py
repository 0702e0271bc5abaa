"""The policy rules, one behaviour at a time, on a small hand-built Volcano Job.

test_equivalence.py holds each rule and its CEL twin to the same verdict on the example job;
these state what a rule must decide and why, on the cases the examples do not have (issue 25:
init containers, the stack-wide duration limit, a zero checkpoint interval, CPU-only tasks,
quantities at a bound and in mixed units).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainstack.builders.pools import GPU_TOLERATION
from trainstack.jobs.render import RESTRICTED_CONTAINER, RESTRICTED_POD
from trainstack.policy.objects import Config, quantity
from trainstack.policy.pack import CONFIG_SCHEMA
from trainstack.policy.rules import K8S_RULES, MAX_DURATION_ANNOTATION

RULES = {r.name: r for r in K8S_RULES}
CONFIG = Config(allowed_registries=("registry.example.com/",))
IMAGE = "registry.example.com/vision/train:2025.06.1"


def container(name: str = "trainer", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "resources": {
            "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
            "limits": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "1"},
        },
        "env": [{"name": "TRAINSTACK_CHECKPOINT_INTERVAL_S", "value": "600"}],
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "checkpoints", "mountPath": "/checkpoints", "subPath": "checkpoints/vision/j"},
        ],
        "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
        **extra,
    }


def job(hours: float = 24, namespace: str = "vision") -> dict[str, Any]:
    """A job every Kubernetes rule admits under CONFIG (test_a_conforming_job_passes)."""
    pod = {
        "automountServiceAccountToken": False,
        "securityContext": copy.deepcopy(RESTRICTED_POD),
        "containers": [container()],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "lustre"}},
        ],
        "tolerations": [dict(GPU_TOLERATION)],
        "nodeSelector": {"trainstack.io/pool": "h100"},
    }
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {
            "name": "j",
            "namespace": namespace,
            "annotations": {MAX_DURATION_ANNOTATION: str(round(hours * 3600))},
        },
        "spec": {"queue": namespace, "tasks": [{"name": "master", "template": {"spec": pod}}]},
    }


def pod(j: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = j["spec"]["tasks"][0]["template"]["spec"]
    return spec


def findings(j: dict[str, Any], cfg: Config = CONFIG) -> dict[str, list[str]]:
    return {name: found for name, rule in RULES.items() if (found := rule.check(j, cfg))}


def test_a_conforming_job_passes() -> None:
    assert findings(job()) == {}


# -- init containers ---------------------------------------------------------------------------


def init_container(**extra: Any) -> dict[str, Any]:
    """A setup container as the job layer renders one (no GPU, small limits)."""
    c = container("setup")
    c["resources"] = {
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"cpu": "100m", "memory": "64Mi"},
    }
    del c["env"], c["volumeMounts"]
    return c | extra


@pytest.mark.parametrize(
    ("rule", "init"),
    [
        (
            "no-privileged",
            init_container(securityContext={**RESTRICTED_CONTAINER, "privileged": True}),
        ),
        ("pinned-images", init_container(image="registry.example.com/vision/train:latest")),
        ("pinned-images", init_container(image="docker.io/library/busybox:1.36")),
        ("limits-set", init_container(resources={"requests": {"cpu": "1", "memory": "1Gi"}})),
        (
            "request-limit-ratio",
            init_container(
                resources={
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "4", "memory": "64Mi"},
                }
            ),
        ),
        (
            "devices-requests-equal-limits",
            init_container(
                resources={
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                }
            ),
        ),
    ],
    ids=["privileged", "latest", "other-registry", "no-limits", "cpu-ratio", "device-limit"],
)
def test_init_containers_are_judged_like_containers(rule: str, init: dict[str, Any]) -> None:
    """An init container runs on the node before the trainer, with the pod's volumes and
    devices: privileged it owns the node, unpinned it runs code nobody reviewed. A rule that
    walked only `containers` would let either through."""
    j = job()
    pod(j)["initContainers"] = [init]
    found = findings(j)
    assert rule in found, found
    assert any("setup" in message or "latest" in message or "busybox" in message
               for message in found[rule]), found[rule]  # fmt: skip
    assert set(found) == {rule}, "only the broken rule reports"


def test_a_conforming_init_container_passes() -> None:
    j = job()
    pod(j)["initContainers"] = [init_container()]
    assert findings(j) == {}


# -- the stack's settings ----------------------------------------------------------------------


def test_the_stacks_max_duration_bounds_teams_without_their_own() -> None:
    """`maxDurationHours` (the pack config's key, CONFIG_SCHEMA) is the limit of every team the
    stack names no limit for; read under another key it would silently fall back to 168 h."""
    cfg = Config.from_mapping({"maxDurationHours": 2, "teamMaxDurationHours": {"nlp": 48}})
    assert cfg.max_duration_hours == 2
    assert RULES["max-duration"].check(job(hours=2), cfg) == []
    assert RULES["max-duration"].check(job(hours=3), cfg) == [
        "maximum duration 3h is outside (0, 2h] for team vision"
    ]
    # a team's own limit wins over the stack's, both ways
    assert RULES["max-duration"].check(job(hours=48, namespace="nlp"), cfg) == []
    assert RULES["max-duration"].check(job(hours=49, namespace="nlp"), cfg) != []


def test_every_pack_setting_is_read_under_its_schema_key() -> None:
    """Each key the pack's config schema declares changes the Config: a setting read under a
    misspelt key would be ignored without a word (the CLI passes the file through as is)."""
    values: dict[str, Any] = {
        "maxCpuLimitRequestRatio": 3,
        "maxMemoryLimitRequestRatio": 1.5,
        "maxDurationHours": 12,
        "teamMaxDurationHours": {"vision": 6},
        "allowedRegistries": ["r.example/"],
        "poolSelectors": [{"trainstack.io/pool": "h100"}],
        "production": True,
        "teamPriorityClasses": {"vision": ["trainstack-normal"]},
        "poolsByName": {"h100": {"trainstack.io/pool": "h100"}},
        "teamPools": {"vision": ["h100"]},
        "platformStack": "prod",
    }
    assert set(values) == set(CONFIG_SCHEMA.properties)
    default = Config.from_mapping({})
    assert default == Config()
    for key, value in values.items():
        assert Config.from_mapping({key: value}) != default, key


@pytest.mark.parametrize(
    ("config", "fix"),
    [
        ({}, "use image:<build tag> or image@sha256:…"),
        ({"production": True}, "use image@sha256:…"),
        (
            {"allowedRegistries": ["a.example/", "b.example/"]},
            "use image:<build tag> or image@sha256:… from a.example/ or b.example/ (set in "
            "trainstack:platform.policy.allowedRegistries of the platform stack)",
        ),
        (
            {"allowedRegistries": ["a.example/"], "production": True, "platformStack": "prod"},
            "use image@sha256:… from a.example/ (set in trainstack:platform.policy."
            "allowedRegistries of platform stack prod)",
        ),
    ],
)
def test_the_pinned_images_fix_is_the_stacks_own(config: dict[str, Any], fix: str) -> None:
    """Issue 41 #5: the fix named "an allowed registry" on stacks that allow any."""
    assert RULES["pinned-images"].remediation_for(Config.from_mapping(config)) == fix


# -- checkpoints -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "ok"),
    [
        ({"TRAINSTACK_CHECKPOINT_INTERVAL_S": "600"}, True),
        ({"TRAINSTACK_CHECKPOINT_EVERY": "100"}, True),
        ({"TRAINSTACK_CHECKPOINT_INTERVAL_S": "0"}, False),
        ({"TRAINSTACK_CHECKPOINT_INTERVAL_S": "0", "TRAINSTACK_CHECKPOINT_EVERY": "0"}, False),
        ({"TRAINSTACK_CHECKPOINT_INTERVAL_S": "-5"}, False),
        ({"TRAINSTACK_CHECKPOINT_INTERVAL_S": "soon"}, False),
        ({}, False),
    ],
    ids=["seconds", "steps", "zero", "both-zero", "negative", "not-a-number", "none"],
)
def test_a_checkpoint_interval_must_be_a_positive_number(env: dict[str, str], ok: bool) -> None:
    """An interval of 0 is no interval: the runtime would never checkpoint on time, so a
    preempted or expired job loses everything since its start."""
    j = job()
    pod(j)["containers"][0]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    found = RULES["checkpoint-volume"].check(j, CONFIG)
    assert (found == []) is ok, found


# -- GPU placement -----------------------------------------------------------------------------


def cpu_only(j: dict[str, Any]) -> dict[str, Any]:
    for c in pod(j)["containers"]:
        for key in ("requests", "limits"):
            c["resources"][key].pop("nvidia.com/gpu")
    return j


def test_a_cpu_only_task_needs_no_gpu_placement() -> None:
    """GPU placement is asked of GPU pods only: a CPU task that neither tolerates the GPU
    taint nor pins a GPU pool runs on CPU nodes, as it should."""
    j = cpu_only(job())
    del pod(j)["tolerations"], pod(j)["nodeSelector"]
    assert RULES["gpu-placement"].check(j, CONFIG) == []


def test_a_cpu_task_beside_gpu_tasks_may_share_their_nodes() -> None:
    """A parameter server without GPUs, in a job with GPU workers, tolerates the taint to run
    on the workers' fabric; without a pool selector it is still not a GPU pod to place."""
    j = job()
    ps = copy.deepcopy(j["spec"]["tasks"][0])
    ps["name"] = "ps"
    del ps["template"]["spec"]["nodeSelector"]
    for key in ("requests", "limits"):
        ps["template"]["spec"]["containers"][0]["resources"][key].pop("nvidia.com/gpu")
    j["spec"]["tasks"].append(ps)
    assert RULES["gpu-placement"].check(j, CONFIG) == []
    # the same CPU task alone would hold GPU nodes
    alone = copy.deepcopy(j)
    alone["spec"]["tasks"] = [ps]
    assert RULES["gpu-placement"].check(alone, CONFIG) == [
        "task ps: requests no GPUs but tolerates the nvidia.com/gpu taint, in a job without "
        "GPU tasks (a CPU job would hold GPU nodes)"
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("tolerations", "does not tolerate the nvidia.com/gpu taint"),
        ("nodeSelector", "does not pin one of its team's GPU pools by its labels"),
    ],
)
def test_a_gpu_task_tolerates_the_taint_and_pins_a_pool(change: str, message: str) -> None:
    j = job()
    del pod(j)[change]
    found = RULES["gpu-placement"].check(j, CONFIG)
    assert len(found) == 1
    assert message in found[0]


# -- quantities --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [("2", "2000m"), ("500m", "0.5"), ("1Ti", "1024Gi"), ("1Gi", "1024Mi"), ("1G", "1000M")],
)
def test_quantities_in_mixed_units_are_equal(a: str, b: str) -> None:
    assert quantity(a) == quantity(b)


@pytest.mark.parametrize(
    ("rule", "resource", "wanted", "limit", "ok"),
    [
        # maxCpuLimitRequestRatio (2) is an upper bound, reached included, as LimitRange's
        # maxLimitRequestRatio, whatever the units
        ("request-limit-ratio", "cpu", "4", "8", True),
        ("request-limit-ratio", "cpu", "4", "8001m", False),
        ("request-limit-ratio", "cpu", "2000m", "4", True),
        ("request-limit-ratio", "cpu", "4000m", "8", True),
        # memory is not compressible: a ratio of 1 (the default) means the limit is the
        # request, which 1Ti and 1024Gi both say
        ("request-limit-ratio", "memory", "16Gi", "16Gi", True),
        ("request-limit-ratio", "memory", "1Ti", "1024Gi", True),
        ("request-limit-ratio", "memory", "16Gi", "17Gi", False),
        # a device is requested exactly as limited (Kubernetes refuses anything else)
        ("devices-requests-equal-limits", "nvidia.com/gpu", "1", "1", True),
        ("devices-requests-equal-limits", "nvidia.com/gpu", "1", "1000m", True),
        ("devices-requests-equal-limits", "nvidia.com/gpu", "1", "2", False),
    ],
)
def test_limits_against_requests_at_the_bound_and_in_any_unit(
    rule: str, resource: str, wanted: str, limit: str, ok: bool
) -> None:
    j = job()
    resources = pod(j)["containers"][0]["resources"]
    resources["requests"][resource], resources["limits"][resource] = wanted, limit
    found = RULES[rule].check(j, CONFIG)
    assert (found == []) is ok, found
