"""What every rule reads: resource types, quantities, the thresholds (Config) and the walk
over a Volcano Job's pods.

Functions read `props` through the Mapping/Sequence protocols only and treat numbers as
floats, so the same code runs on plain dicts (offline preview, tests) and on the proxies
the CrossGuard analyzer hands a policy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Level = Literal["advisory", "mandatory", "disabled"]
VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
ADDON = "aws:eks/addon:Addon"
# Whole, MIG and time-shared GPUs (trainstack/slices.py), EFA, hugepages and RDMA devices.
DEVICE_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "vpc.amazonaws.com/efa",
    "hugepages-2Mi",
)
DEVICE_PREFIXES = ("rdma/", "nvidia.com/mig-")


@dataclass(frozen=True)
class Violation:
    """One finding of a rule: in the preview's report, a plan's `policy`, and the diff."""

    rule: str
    resource: str
    message: str
    level: str

    def to_json(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "resource": self.resource,
            "message": self.message,
            "level": self.level,
        }


_UNITS = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
}  # fmt: skip


def quantity(value: object) -> float:
    """A Kubernetes quantity (`500m`, `16Gi`, `8`) as a number."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"not a quantity: {value!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def is_device(name: str) -> bool:
    return name in DEVICE_RESOURCES or name.startswith(DEVICE_PREFIXES)


@dataclass(frozen=True)
class Config:
    """Thresholds; per stack through `--policy-pack-config` (schema in the pack)."""

    max_cpu_limit_request_ratio: float = 2.0
    max_memory_limit_request_ratio: float = 1.0
    max_duration_hours: float = 168.0
    team_max_duration_hours: Mapping[str, float] = field(default_factory=dict)
    allowed_registries: Sequence[str] = ()
    # Node labels selecting each GPU pool (builders/pools.pool_selector); empty: any value
    # of POOL_LABEL, the label of the pools trainstack creates.
    pool_selectors: Sequence[Mapping[str, str]] = ()
    production: bool = False
    # Per team namespace: the PriorityClass names its jobs may use (the registry's
    # priorityClasses); a namespace not listed is not checked (the CEL twin reads the
    # namespace's trainstack.io/priority-classes annotation, the same list).
    team_priority_classes: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # Each pool's node labels by its name, and per team namespace the pools it may use (the
    # registry's `pools`): a GPU pod pins one of its team's (the CEL twin reads the
    # namespace's trainstack.io/pools annotation, the same list). A namespace not listed, or
    # no pools by name: any of the platform's pools (pool_selectors).
    pools: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    team_pools: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # The platform stack these settings come from: a message names where a limit is set
    # (issue 41: a refused registry names the list and the stack that holds it).
    platform_stack: str = ""

    def setting(self, key: str) -> str:
        """Where a platform setting lives, for messages: `policy.allowedRegistries of
        platform stack prod`."""
        if not self.platform_stack:
            return f"trainstack:platform.{key} of the platform stack"
        return f"trainstack:platform.{key} of platform stack {self.platform_stack}"

    def team_pool_selectors(self, namespace: str) -> Sequence[Mapping[str, str]]:
        names = self.team_pools.get(namespace)
        if names is None or not self.pools:
            return self.pool_selectors
        return [self.pools[n] for n in names if n in self.pools]

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Config:
        return cls(
            max_cpu_limit_request_ratio=float(raw.get("maxCpuLimitRequestRatio", 2.0)),
            max_memory_limit_request_ratio=float(raw.get("maxMemoryLimitRequestRatio", 1.0)),
            max_duration_hours=float(raw.get("maxDurationHours", 168.0)),
            team_max_duration_hours={
                str(k): float(v) for k, v in dict(raw.get("teamMaxDurationHours", {})).items()
            },
            allowed_registries=tuple(raw.get("allowedRegistries", ())),
            pool_selectors=tuple(
                {str(k): str(v) for k, v in as_map(sel).items()}
                for sel in as_seq(raw.get("poolSelectors", ()))
            ),
            production=bool(raw.get("production", False)),
            team_priority_classes={
                str(k): tuple(str(c) for c in as_seq(v))
                for k, v in as_map(raw.get("teamPriorityClasses", {})).items()
            },
            pools={
                str(name): {str(k): str(v) for k, v in as_map(sel).items()}
                for name, sel in as_map(raw.get("poolsByName", {})).items()
            },
            team_pools={
                str(k): tuple(str(p) for p in as_seq(v))
                for k, v in as_map(raw.get("teamPools", {})).items()
            },
            platform_stack=str(raw.get("platformStack", "")),
        )


# -- a rule --------------------------------------------------------------------------------

Check = Callable[[Mapping[str, Any], Config], list[str]]


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    remediation: str
    resource_types: tuple[str, ...]
    check: Check
    level: Level = "mandatory"
    # The fix in the stack's own terms, where it depends on the settings (issue 41: a fix
    # that sends a user to "an allowed registry" on a stack that configures none misleads).
    fix: Callable[[Config], str] | None = None

    def remediation_for(self, cfg: Config) -> str:
        return self.fix(cfg) if self.fix is not None else self.remediation


# -- walking a Volcano Job ------------------------------------------------------------------


# Plain lists and dicts first: the ABC checks (for the analyzer's proxies) are slow, and
# rules walk every pod of every job several times.
def as_seq(value: object) -> Sequence[Any]:
    if type(value) is list:
        return value
    return value if isinstance(value, Sequence) and not isinstance(value, str) else ()


def as_map(value: object) -> Mapping[str, Any]:
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else {}


def pods(job: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(task name, pod spec) for every task of a Volcano Job."""
    for task in as_seq(as_map(job.get("spec")).get("tasks")):
        yield (
            str(as_map(task).get("name", "?")),
            as_map(as_map(as_map(task).get("template")).get("spec")),
        )


def containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers"):
        for container in as_seq(pod.get(key)):
            yield as_map(container)
