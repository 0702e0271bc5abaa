"""The GPU instance catalog: pinned data (data/instances.yaml), validated on load."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

CATALOG_FILE = "instances.yaml"


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    gpu_model: str
    gpu_memory_gib: int
    vcpu: int
    memory_gib: int
    nvme_gb: int
    network_gbps: int
    network_cards: int
    efa_cards: tuple[int, ...]

    @property
    def efa_devices(self) -> int:
        """Allocatable vpc.amazonaws.com/efa on one node: one EFA per listed card."""
        return len(self.efa_cards)

    @property
    def supports_efa(self) -> bool:
        return bool(self.efa_cards)

    @property
    def has_instance_store(self) -> bool:
        return self.nvme_gb > 0


class UnknownInstanceTypeError(ValueError):
    """An instance type the catalog does not know; the message lists the known ones."""


@cache
def catalog() -> dict[str, InstanceType]:
    # Imported here, not at the top: trainstack.config's __init__ loads the loader, which
    # loads config modules that import this one and builders that import it too, so a
    # top-level import made "import trainstack.builders.fabric" (or components.platform)
    # fail when it came first (tests/test_imports.py).
    from trainstack.config.errors import ConfigError, ConfigIssue  # noqa: PLC0415
    from trainstack.config.schema import schema_issues  # noqa: PLC0415

    text = resources.files("trainstack.data").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    issues = schema_issues("instances.schema.json", document, "instances.yaml")
    entries = document.get("instances", {}) if isinstance(document, dict) else {}
    for name, entry in entries.items() if isinstance(entries, dict) else ():
        cards = entry.get("efaCards", []) if isinstance(entry, dict) else []
        limit = entry.get("networkCards", 0) if isinstance(entry, dict) else 0
        issues += [
            ConfigIssue(
                f"instances.yaml.instances.{name}.efaCards", f"card {c} >= networkCards {limit}"
            )
            for c in cards
            if isinstance(c, int) and isinstance(limit, int) and c >= limit
        ]
    if issues:
        raise ConfigError("trainstack/data/instances.yaml", issues)
    return {
        name: InstanceType(
            name=name,
            gpus=e["gpus"],
            gpu_model=e["gpuModel"],
            gpu_memory_gib=e["gpuMemoryGiB"],
            vcpu=e["vcpu"],
            memory_gib=e["memoryGiB"],
            nvme_gb=e["nvmeGB"],
            network_gbps=e["networkGbps"],
            network_cards=e["networkCards"],
            efa_cards=tuple(e["efaCards"]),
        )
        for name, e in sorted(entries.items())
    }


def lookup(name: str) -> InstanceType:
    """The catalog entry for `name`, or an error naming the closest and all known types."""
    from trainstack.config.errors import did_you_mean  # noqa: PLC0415 (see catalog())

    known = catalog()
    if name not in known:
        raise UnknownInstanceTypeError(
            f"unknown instance type {name!r}{did_you_mean(name, known)}; "
            f"supported: {', '.join(known)}"
        )
    return known[name]
