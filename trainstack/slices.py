"""Fractional GPUs as data: MIG profiles per GPU (data/mig.yaml) and time-slicing.

A slice is what one replica of a job asks for instead of a whole GPU: a MIG instance, with its
own memory and compute (hardware isolation), or a time-shared replica of a whole GPU (no
isolation of memory or faults: NVIDIA/k8s-device-plugin v0.18.2 README, "With CUDA
Time-Slicing"). docs/gpu-sharing.md explains when to use which.

Resource names are the NVIDIA device plugin's (v0.18.2 internal/rm/rm.go
AddDefaultResourcesToConfig): with the `mixed` MIG strategy each profile is its own extended
resource, `nvidia.com/mig-<profile>`; time-sliced GPUs renamed by `renameByDefault: true`
are `nvidia.com/gpu.shared` (api/config/v1/consts.go DefaultSharedResourceNameSuffix).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from importlib import resources
from typing import Any

import yaml

MIG_FILE = "mig.yaml"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
COMPUTE_SLICES = 7  # a MIG GPU's compute in slices (MIG User Guide)
MEMORY_SLICES = 8  # and its memory
BALANCED = "all-balanced"
# The time-slicing replicas a GPU may be cut into: beyond 16 processes share too little time
# and memory to train anything (a policy bound, docs/gpu-sharing.md).
MAX_TIME_SLICES = 16


@dataclass(frozen=True)
class MigProfile:
    name: str  # e.g. 1g.10gb
    compute: int  # compute slices of 7
    memory_slices: int  # memory slices of 8
    max_per_gpu: int

    @property
    def memory_gb(self) -> int:
        """The memory in the profile's name (decimal GB): below the instance's real size
        (e.g. 1g.10gb is 9.75 GiB, 10.5 GB, on H100), so a request that fits it fits."""
        return int(self.name.split(".")[1].removesuffix("gb"))

    @property
    def resource(self) -> str:
        return MIG_RESOURCE_PREFIX + self.name


@dataclass(frozen=True)
class MigGpu:
    """A MIG-capable GPU: its profiles and the layouts the GPU operator's MIG manager makes."""

    name: str  # e.g. H100-80GB
    gpu_model: str
    gpu_memory_gib: int
    profiles: tuple[MigProfile, ...]
    balanced: tuple[tuple[str, int], ...]
    source: str

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def layouts(self) -> dict[str, tuple[tuple[MigProfile, int], ...]]:
        """Layout name (the node label nvidia.com/mig.config) -> (profile, count per GPU):
        `all-<profile>` at its maximum, and `all-balanced` (mig-parted v0.14.0
        pkg/mig/builder/builder.go)."""
        out: dict[str, tuple[tuple[MigProfile, int], ...]] = {
            f"all-{p.name}": ((p, p.max_per_gpu),) for p in self.profiles
        }
        balanced = []
        for name, count in self.balanced:
            profile = self.profile(name)
            assert profile is not None, "mig_catalog checks balanced names"
            balanced.append((profile, count))
        out[BALANCED] = tuple(balanced)
        return out


@dataclass(frozen=True)
class Slice:
    """One kind of slice a pool's GPUs are cut into, and how many of it per GPU."""

    resource: str  # the extended resource a replica requests, one per replica
    per_gpu: int
    compute_share: Fraction  # of one GPU's compute, for accounting (slice-hours)
    # What a replica may count on (a time-shared GPU: all of it, shared with the others; None
    # where the catalog does not know the GPU, on existing nodes).
    memory_gb: float | None
    profile: str  # the MIG profile, or `shared` for a time-sliced GPU
    isolated: bool  # MIG: its own memory and faults; time-slicing: neither

    def to_json(self) -> dict[str, Any]:
        """As the platform stack exports it to team stacks (builders/pools.pool_output)."""
        return {
            "resource": self.resource,
            "profile": self.profile,
            "perGpu": self.per_gpu,
            "computeShare": [self.compute_share.numerator, self.compute_share.denominator],
            "memoryGB": self.memory_gb,
            "isolated": self.isolated,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Slice:
        memory = doc.get("memoryGB")
        return cls(
            resource=str(doc["resource"]),
            per_gpu=int(doc["perGpu"]),
            compute_share=Fraction(int(doc["computeShare"][0]), int(doc["computeShare"][1])),
            memory_gb=None if memory is None else float(memory),
            profile=str(doc["profile"]),
            isolated=bool(doc["isolated"]),
        )


def mig_slices(gpu: MigGpu, layout: str) -> tuple[Slice, ...]:
    """The slices a MIG layout gives each GPU."""
    return tuple(
        Slice(
            resource=profile.resource,
            per_gpu=count,
            compute_share=Fraction(profile.compute, COMPUTE_SLICES),
            memory_gb=profile.memory_gb,
            profile=profile.name,
            isolated=True,
        )
        for profile, count in gpu.layouts()[layout]
    )


def time_slices(replicas: int, gpu_memory_gb: float | None) -> tuple[Slice, ...]:
    """A time-shared GPU: `replicas` processes take turns on the whole GPU and its memory."""
    return (
        Slice(
            resource=SHARED_RESOURCE,
            per_gpu=replicas,
            compute_share=Fraction(1, replicas),
            memory_gb=gpu_memory_gb,
            profile="shared",
            isolated=False,
        ),
    )


def smallest_fit(slices: tuple[Slice, ...], memory_bytes: int | None) -> Slice | None:
    """The smallest slice (memory, then compute) whose memory holds `memory_bytes` (None:
    the smallest slice)."""
    fits = [
        s
        for s in slices
        if memory_bytes is None or s.memory_gb is None or s.memory_gb * 1e9 >= memory_bytes
    ]
    return min(fits, key=lambda s: (s.memory_gb or 0.0, s.compute_share, s.resource), default=None)


def is_gpu_resource(name: str) -> bool:
    """Whole GPUs, MIG instances and time-shared GPUs: every resource that puts a pod on a
    GPU (what the placement and device rules count)."""
    return name in (WHOLE_GPU_RESOURCE, SHARED_RESOURCE) or name.startswith(MIG_RESOURCE_PREFIX)


class MigCatalogError(ValueError):
    pass


@cache
def mig_catalog() -> dict[str, MigGpu]:
    """The MIG-capable GPUs, validated against schemas/mig.schema.json and for consistency."""
    from trainstack.config.errors import ConfigError, ConfigIssue  # noqa: PLC0415 (catalog.py)
    from trainstack.config.schema import schema_issues  # noqa: PLC0415

    text = resources.files("trainstack.data").joinpath(MIG_FILE).read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    issues = schema_issues("mig.schema.json", document, "mig.yaml")
    if issues:
        raise ConfigError("trainstack/data/mig.yaml", issues)
    gpus: dict[str, MigGpu] = {}
    for name, entry in document["gpus"].items():
        profiles = tuple(
            MigProfile(p, v["compute"], v["memorySlices"], v["maxPerGpu"])
            for p, v in entry["profiles"].items()
        )
        where = f"mig.yaml.gpus.{name}"
        for p in profiles:
            if not p.name.startswith(f"{p.compute}g."):
                issues.append(ConfigIssue(f"{where}.profiles.{p.name}", "compute != its name"))
            if p.max_per_gpu * p.compute > COMPUTE_SLICES:
                issues.append(ConfigIssue(f"{where}.profiles.{p.name}", "over 7 compute slices"))
            if p.max_per_gpu * p.memory_slices > MEMORY_SLICES:
                issues.append(ConfigIssue(f"{where}.profiles.{p.name}", "over 8 memory slices"))
        known = {p.name: p for p in profiles}
        balanced = tuple(entry["balanced"].items())
        for p, _ in balanced:
            if p not in known:
                issues.append(ConfigIssue(f"{where}.balanced.{p}", "not a profile of this GPU"))
        used = [(known[p], c) for p, c in balanced if p in known]
        if sum(p.compute * c for p, c in used) > COMPUTE_SLICES or (
            sum(p.memory_slices * c for p, c in used) > MEMORY_SLICES
        ):
            issues.append(ConfigIssue(f"{where}.balanced", "does not fit one GPU"))
        gpus[name] = MigGpu(
            name=name,
            gpu_model=entry["match"]["gpuModel"],
            gpu_memory_gib=entry["match"]["gpuMemoryGiB"],
            profiles=profiles,
            balanced=balanced,
            source=entry["source"],
        )
    if issues:
        raise ConfigError("trainstack/data/mig.yaml", issues)
    return gpus


def mig_gpu(gpu_model: str, gpu_memory_gib: int) -> MigGpu | None:
    """The MIG entry for a GPU by the instance catalog's model and memory (None: no MIG)."""
    return next(
        (
            g
            for g in mig_catalog().values()
            if g.gpu_model == gpu_model and g.gpu_memory_gib == gpu_memory_gib
        ),
        None,
    )
