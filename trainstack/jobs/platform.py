"""What the job layer needs from the platform stack: a typed view of its outputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainstack import outputs as out
from trainstack.builders.fabric import FabricProfile


@dataclass(frozen=True)
class PlatformView:
    """The platform stack's outputs, as a team stack's StackReference sees them."""

    outputs: Mapping[str, Any]

    def pool(self, name: str) -> Mapping[str, Any] | None:
        return next((p for p in self.outputs.get(out.GPU_POOLS, []) if p["name"] == name), None)

    def pool_names(self) -> list[str]:
        return [p["name"] for p in self.outputs.get(out.GPU_POOLS, [])]

    def team(self, name: str) -> Mapping[str, Any] | None:
        return out.team_slice(self.outputs, name)

    def scheduling(self, team: str) -> Mapping[str, Any]:
        result: Mapping[str, Any] = (self.team(team) or {}).get("scheduling", {})
        return result

    def storage(self, team: str) -> Mapping[str, Any]:
        result: Mapping[str, Any] = (self.team(team) or {}).get("storage", {})
        return result

    def cache_sources(self) -> list[str]:
        """Prefixes the node cache agent fetches from (a job's cacheFrom must be under one)."""
        cache = self.outputs.get(out.STORAGE, {}).get("cache", {})
        return [str(s) for s in cache.get("sources", [])]

    def dataset_repository(self) -> str | None:
        repo: str | None = self.outputs.get(out.STORAGE, {}).get("datasetRepository")
        return repo


def profile(pool: Mapping[str, Any]) -> FabricProfile:
    raw = pool["profile"]
    return FabricProfile(
        fabric=raw["fabric"],
        gpus_per_node=int(raw["gpusPerNode"]),
        devices_per_node={k: int(v) for k, v in raw["devicesPerNode"].items()},
        hugepages_mi_per_node=int(raw["hugepagesMiPerNode"]),
        env=dict(raw["env"]),
        shared_devices=tuple(raw.get("sharedDevices", ())),
        # `capabilities` (IPC_LOCK) in outputs of older platform stacks is ignored: a non-root
        # trainer never gets an added capability (builders/fabric.py).
        secondary_network=raw.get("secondaryNetwork"),
    )
