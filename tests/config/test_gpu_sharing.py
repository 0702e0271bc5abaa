"""Fractional GPUs (issue 47): the MIG catalog per GPU model, pool settings and their errors,
and the slice a job gets, as tables.

Profiles and counts: NVIDIA MIG User Guide, "Supported MIG Profiles", and gpu-operator v26.3.0
assets/state-mig-manager/0400_configmap.yaml (the all-<profile> and all-balanced layouts),
as trainstack/data/mig.yaml cites them line by line.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import pytest

from tests.components.test_gpu import existing_pool
from tests.config.test_capacity import platform, team
from trainstack.builders import device_plugins, pools, scheduling
from trainstack.catalog import catalog
from trainstack.config import ConfigError
from trainstack.config.loader import parse_stack_config
from trainstack.config.model import PlatformConfig
from trainstack.slices import (
    Slice,
    is_gpu_resource,
    mig_catalog,
    mig_gpu,
    mig_slices,
    smallest_fit,
    time_slices,
)

# GPU -> {profile: (compute slices of 7, max per GPU)}; memory is the name's.
# A100-80GB and H100-80GB share one profile set (0400_configmap.yaml lines 112-183).
EIGHTY_GB = {
    "1g.10gb": (1, 7), "1g.20gb": (1, 4), "2g.20gb": (2, 3), "3g.40gb": (3, 2),
    "4g.40gb": (4, 1), "7g.80gb": (7, 1),
}  # fmt: skip
PROFILES: dict[str, dict[str, tuple[int, int]]] = {
    "A100-40GB": {
        "1g.5gb": (1, 7), "1g.10gb": (1, 4), "2g.10gb": (2, 3), "3g.20gb": (3, 2),
        "4g.20gb": (4, 1), "7g.40gb": (7, 1),
    },
    "A100-80GB": EIGHTY_GB,
    "H100-80GB": EIGHTY_GB,
    "H200-141GB": {
        "1g.18gb": (1, 7), "1g.35gb": (1, 4), "2g.35gb": (2, 3), "3g.71gb": (3, 2),
        "4g.71gb": (4, 1), "7g.141gb": (7, 1),
    },
    "B200-180GB": {
        "1g.23gb": (1, 7), "1g.45gb": (1, 4), "2g.45gb": (2, 3), "3g.90gb": (3, 2),
        "4g.90gb": (4, 1), "7g.180gb": (7, 1),
    },
}  # fmt: skip
INSTANCES = {
    "p4d.24xlarge": "A100-40GB",
    "p4de.24xlarge": "A100-80GB",
    "p5.4xlarge": "H100-80GB",
    "p5.48xlarge": "H100-80GB",
    "p5e.48xlarge": "H200-141GB",
    "p5en.48xlarge": "H200-141GB",
    "p6-b200.48xlarge": "B200-180GB",
}
GIB = 2**30


def test_each_gpu_models_profiles() -> None:
    assert {
        name: {p.name: (p.compute, p.max_per_gpu) for p in gpu.profiles}
        for name, gpu in mig_catalog().items()
    } == PROFILES


@pytest.mark.parametrize(("instance_type", "gpu"), sorted(INSTANCES.items()))
def test_instance_types_find_their_mig_gpu(instance_type: str, gpu: str) -> None:
    t = catalog()[instance_type]
    found = mig_gpu(t.gpu_model, t.gpu_memory_gib)
    assert found is not None
    assert found.name == gpu


def test_gpus_without_mig_have_none() -> None:
    no_mig = {n for n, t in catalog().items() if mig_gpu(t.gpu_model, t.gpu_memory_gib) is None}
    assert no_mig == set(catalog()) - set(INSTANCES)
    assert {catalog()[n].gpu_model for n in no_mig} == {"A10G", "L40S"}


@pytest.mark.parametrize("gpu", sorted(PROFILES))
def test_every_layout_fits_one_gpu(gpu: str) -> None:
    """7 compute and 8 memory slices (MIG User Guide); all-<profile> at its maximum."""
    layouts = mig_catalog()[gpu].layouts()
    assert set(layouts) == {f"all-{p}" for p in PROFILES[gpu]} | {"all-balanced"}
    for layout, parts in layouts.items():
        assert sum(p.compute * n for p, n in parts) <= 7, layout
        assert sum(p.memory_slices * n for p, n in parts) <= 8, layout
        if layout != "all-balanced":
            [(profile, count)] = parts
            assert count == PROFILES[gpu][profile.name][1]


# (GPU, layout, gpuMemory of a replica, the slice it gets or None)
FITS = [
    ("H100-80GB", "all-1g.10gb", "8Gi", "1g.10gb"),
    ("H100-80GB", "all-1g.10gb", "10Gi", None),  # 10 GiB is 10.7 GB: over the name's 10 GB
    ("H100-80GB", "all-balanced", "8Gi", "1g.10gb"),
    ("H100-80GB", "all-balanced", "12Gi", "2g.20gb"),
    ("H100-80GB", "all-balanced", "37Gi", "3g.40gb"),
    ("H100-80GB", "all-balanced", "38Gi", None),
    ("H100-80GB", "all-7g.80gb", "74Gi", "7g.80gb"),
    ("A100-40GB", "all-1g.5gb", "4Gi", "1g.5gb"),
    ("A100-40GB", "all-balanced", "6Gi", "2g.10gb"),
    ("A100-80GB", "all-1g.20gb", "18Gi", "1g.20gb"),
    ("H200-141GB", "all-1g.18gb", "16Gi", "1g.18gb"),
    ("H200-141GB", "all-balanced", "20Gi", "2g.35gb"),
    ("B200-180GB", "all-1g.23gb", "21Gi", "1g.23gb"),
    ("B200-180GB", "all-balanced", "80Gi", "3g.90gb"),
    ("B200-180GB", "all-balanced", "90Gi", None),
]


@pytest.mark.parametrize(("gpu", "layout", "memory", "expected"), FITS)
def test_the_smallest_slice_that_holds_the_memory(
    gpu: str, layout: str, memory: str, expected: str | None
) -> None:
    wanted = int(memory.removesuffix("Gi")) * GIB
    found = smallest_fit(mig_slices(mig_catalog()[gpu], layout), wanted)
    assert (found.profile if found else None) == expected


def test_a_time_shared_gpu_is_a_turn_on_the_whole_gpu() -> None:
    [s] = time_slices(4, 85.9)
    assert (s.resource, s.per_gpu, s.compute_share, s.isolated) == (
        "nvidia.com/gpu.shared",
        4,
        Fraction(1, 4),
        False,
    )
    assert smallest_fit((s,), 80 * GIB) == s
    assert smallest_fit((s,), 81 * GIB) is None


# -- pool settings ---------------------------------------------------------------------------


def sliced_pool(
    name: str, sharing: dict[str, Any], instance: str = "p5.48xlarge"
) -> dict[str, Any]:
    return {
        "name": name,
        "instanceType": instance,
        "fabric": "tcp",
        "size": {"max": 2},
        "gpuSharing": sharing,
    }


def load(doc: dict[str, Any]) -> PlatformConfig:
    cfg = parse_stack_config(doc, stack="t", source="t.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


OPERATOR = {"gpu": {"devicePlugin": "gpu-operator"}}
MIG_1G = {"mig": {"layout": "all-1g.10gb"}}
ERRORS = [
    (
        "MIG on a GPU without it",
        [sliced_pool("s", {"mig": {"layout": "all-1g.10gb"}}, "g5.12xlarge")],
        [team("a", 0)],
        OPERATOR,
        "gpuPools[0].gpuSharing.mig: g5.12xlarge's A10G GPUs have no MIG; use timeSlicing, or "
        "a MIG-capable type: p4d.24xlarge",
    ),
    (
        "a layout the GPU has not",
        [sliced_pool("s", {"mig": {"layout": "all-1g.5gb"}})],
        [team("a", 0)],
        OPERATOR,
        "gpuPools[0].gpuSharing.mig.layout: H100-80GB has no MIG layout 'all-1g.5gb'",
    ),
    (
        "MIG without the GPU operator",
        [sliced_pool("s", MIG_1G)],
        [team("a", 0)],
        {},
        "gpuPools[0].gpuSharing.mig: MIG layouts are made on the nodes by the GPU operator's "
        "MIG manager; set gpu.devicePlugin: gpu-operator",
    ),
    (
        "the GPU named on AWS",
        [sliced_pool("s", {"mig": {"layout": "all-1g.10gb", "gpu": "H100-80GB"}})],
        [team("a", 0)],
        OPERATOR,
        "gpuPools[0].gpuSharing.mig.gpu: not used with cloud: aws",
    ),
    (
        "a time-shared pool two teams may use",
        [sliced_pool("s", {"timeSlicing": {"replicas": 4}})],
        [team("a", 0), team("b", 0, ["s"])],
        {},
        "gpuPools[0].gpuSharing.timeSlicing: time-shared GPUs give no memory or fault "
        "isolation, so one team only may use pool s, but a, b may; teams without a pools list "
        "may use every pool: give a one",
    ),
    (
        "time-shared pools with different replicas",
        [
            sliced_pool("s", {"timeSlicing": {"replicas": 4}}),
            sliced_pool("t", {"timeSlicing": {"replicas": 2}}),
        ],
        [team("a", 0, ["s", "t"])],
        {},
        "gpuPools[1].gpuSharing.timeSlicing.replicas: 2, but pool s shares its GPUs 4 ways",
    ),
    (
        "both kinds at once",
        [sliced_pool("s", {"timeSlicing": {"replicas": 4}, **MIG_1G})],
        [team("a", 0)],
        OPERATOR,
        "gpuPools[0].gpuSharing",
    ),
]


@pytest.mark.parametrize(
    ("case", "pools_", "teams", "extra", "message"), ERRORS, ids=[e[0] for e in ERRORS]
)
def test_invalid_sharing_is_refused_with_the_fix(
    case: str,
    pools_: list[dict[str, Any]],
    teams: list[dict[str, Any]],
    extra: dict[str, Any],
    message: str,
) -> None:
    del case
    with pytest.raises(ConfigError) as error:
        load(platform(pools_, teams, **extra))
    assert message in str(error.value)


def existing_doc(sharing: dict[str, Any]) -> dict[str, Any]:
    pool = existing_pool({"example.com/gpu": "h100"}, gpuSharing=sharing)
    doc = {
        "cloud": "existing",
        "kubernetesVersion": "1.33",
        "existing": {"context": "lab"},
        "gpu": {"devicePlugin": "gpu-operator"},
        "gpuPools": [pool],
        "registry": {"teams": [team("vision", 0)]},
    }
    return {"trainstack:platform": doc}


def test_existing_mig_pools_name_their_gpu() -> None:
    with pytest.raises(ConfigError, match=r"mig.gpu: required on existing nodes"):
        load(existing_doc(MIG_1G))
    typo = {"mig": {"layout": "all-1g.10gb", "gpu": "H100-80G"}}
    with pytest.raises(ConfigError, match=r"did you mean 'H100-80GB'"):
        load(existing_doc(typo))
    cfg = load(existing_doc({"mig": {"layout": "all-1g.10gb", "gpu": "H100-80GB"}}))
    assert pools.gpu_resources_per_node(cfg.gpu_pools[0]) == {"nvidia.com/mig-1g.10gb": 56}


# -- what the platform builds from them ------------------------------------------------------


def test_a_mig_pool_labels_its_nodes_and_names_its_slices_in_quotas() -> None:
    cfg = load(
        platform(
            [sliced_pool("s", MIG_1G)], [team("a", 0, ["s"], deserved=1, borrowLimit=1)], **OPERATOR
        )
    )
    pool = cfg.gpu_pools[0]
    assert pools.node_labels(cfg, pool)["nvidia.com/mig.config"] == "all-1g.10gb"
    assert pools.gpu_resources_per_node(pool) == {"nvidia.com/mig-1g.10gb": 56}
    operator = device_plugins.gpu_operator_values(cfg)
    assert operator["mig"] == {"strategy": "mixed"}
    assert operator["migManager"] == {"enabled": True}
    # Capability 2 GPUs: 2 GPUs' worth of each slice; guarantees and shares in whole GPUs.
    quotas = scheduling.team_quotas(cfg, cfg.registry.teams[0])
    assert quotas["capability"]["nvidia.com/mig-1g.10gb"] == "14"
    assert "nvidia.com/mig-1g.10gb" not in quotas["deserved"]


def test_a_time_shared_pool_gets_its_device_plugin_config() -> None:
    cfg = load(
        platform([sliced_pool("s", {"timeSlicing": {"replicas": 4}})], [team("a", 0, ["s"])])
    )
    pool = cfg.gpu_pools[0]
    label = pools.node_labels(cfg, pool)["nvidia.com/device-plugin.config"]
    values = device_plugins.nvidia_device_plugin_values(cfg)
    assert values["config"]["default"] == "default"
    config = values["config"]["map"][label]
    assert '"renameByDefault": true' in config
    assert '"failRequestsGreaterThanOne": true' in config
    assert '"replicas": 4' in config
    assert pools.gpu_resources_per_node(pool) == {"nvidia.com/gpu.shared": 32}
    # The plugin's config does not change the whole-GPU pools' default.
    plain = dataclasses.replace(cfg, gpu_pools=(dataclasses.replace(pool, sharing=None),))
    assert "config" not in device_plugins.nvidia_device_plugin_values(plain)


@pytest.mark.parametrize("gpu", sorted(PROFILES))
def test_slices_carry_their_share_and_survive_the_stack_output(gpu: str) -> None:
    """What a pool exports to team stacks (Slice.to_json, builders/pools.pool_output) reads
    back as the same slice (jobs/fractional.py), and each MIG slice's compute share is its
    profile's slices of 7."""
    mig = mig_catalog()[gpu]
    assert mig.profile("no-such-profile") is None
    for layout in mig.layouts():
        for s in mig_slices(mig, layout):
            assert s.compute_share == Fraction(PROFILES[gpu][s.profile][0], 7)
            assert s.resource == f"nvidia.com/mig-{s.profile}"
            assert s.isolated
            doc = s.to_json()
            assert set(doc) == {
                "resource",
                "profile",
                "perGpu",
                "computeShare",
                "memoryGB",
                "isolated",
            }
            assert Slice.from_json(doc) == s
    shared = time_slices(4, None)[0]
    assert Slice.from_json(shared.to_json()) == shared


def test_a_request_of_exactly_the_slices_memory_fits() -> None:
    """The name's size in decimal GB is what a replica may count on, inclusive."""
    [one] = mig_slices(mig_catalog()["H100-80GB"], "all-1g.10gb")
    assert smallest_fit((one,), 10 * 10**9) == one
    assert smallest_fit((one,), 10 * 10**9 + 1) is None


@pytest.mark.parametrize(
    ("name", "is_gpu"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("nvidia.com/mig-3g.40gb", True),
        ("vpc.amazonaws.com/efa", False),
        ("hugepages-2Mi", False),
        ("nvidia.com/gpus", False),
        ("cpu", False),
    ],
)
def test_what_counts_as_a_gpu(name: str, is_gpu: bool) -> None:
    assert is_gpu_resource(name) is is_gpu
