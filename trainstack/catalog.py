"""The GPU instance catalog: pinned data (data/instances.yaml), validated on load."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

CATALOG_FILE = "instances.yaml"
# The share of a type's published all-reduce bus bandwidth a healthy node must reach. Bus
# bandwidth is the figure nccl-tests meant to be held against the hardware's peak,
# independently of the number of ranks (NVIDIA/nccl-tests v2.19.6 doc/PERFORMANCE.md, "Bus
# bandwidth"), so one figure per type serves every node of it. A published figure is a good
# run (tuned NCCL, the largest sizes): the 20 % margin leaves room for a different NCCL or
# driver version and the agent's shorter run, while a lost NVLink or a GPU on a narrower
# link costs far more than that. A policy choice, stated in docs/health.md; tighten it with
# your own measurements.
FLOOR_FRACTION = 0.8


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
    max_pods: int
    # The intra-node NCCL all-reduce (issue 42): the published bus bandwidth one node reached
    # (GB/s; None: no published figure) and its source, or why there is none.
    busbw_published_gbps: float | None = None
    busbw_source: str = ""

    @property
    def busbw_floor_gbps(self) -> float | None:
        """What the health agent holds a node's intra-node all-reduce bus bandwidth to:
        FLOOR_FRACTION of the published figure (None: no figure, no floor)."""
        if self.busbw_published_gbps is None:
            return None
        return round(self.busbw_published_gbps * FLOOR_FRACTION, 1)

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


# What the EKS AL2023 AMI keeps from pods (awslabs/amazon-eks-ami nodeadm/internal/kubelet/
# config.go): kubeReserved CPU, 6 % of the first core, 1 % of the second, 0.5 % of the third
# and fourth, 0.25 % of the rest (getCPUMillicoresToReserve); kubeReserved memory,
# 11 MiB x maxPods + 255 MiB (getMemoryMebibytesToReserve); evictionHard memory.available
# 100Mi (defaultKubeletSubConfig); no systemReserved. The kubelet's allocatable is capacity
# minus kube and system reserved and the hard eviction thresholds (k8s.io/kubernetes v1.37.2
# pkg/kubelet/cm/node_container_manager_linux.go, GetNodeAllocatableReservation), and the
# memory of pre-allocated hugepages besides (pkg/kubelet/nodestatus/setters.go, MachineInfo:
# "for every huge page reservation, we need to remove it from allocatable memory").
CPU_RESERVE_RANGES = ((0, 1000, 600), (1000, 2000, 100), (2000, 4000, 50), (4000, None, 25))
EVICTION_HARD_MEMORY_MI = 100
# A VM's memory capacity (MemTotal) is below its nominal size by what the firmware and kernel
# keep; Karpenter estimates it as 7.5 % (settings, vmMemoryOverheadPercent, default 0.075).
VM_MEMORY_OVERHEAD = 0.075


@dataclass(frozen=True)
class Allocatable:
    """What a node of an instance type offers pods, as the kubelet on the EKS AMI computes it.

    ``cpu_millis`` is exact: capacity is the vCPU count. Memory capacity is MemTotal, which
    the catalog does not know: ``memory_bytes_at_most`` takes the nominal size (an upper bound:
    nothing above it can ever fit), ``memory_bytes_estimate`` Karpenter's overhead estimate
    (what to request to be safe)."""

    cpu_millis: int
    memory_bytes_at_most: int
    memory_bytes_estimate: int
    reserved_cpu_millis: int
    reserved_memory_mi: int  # kubeReserved + evictionHard + hugepages


def kube_reserved_cpu_millis(vcpu: int) -> int:
    total = vcpu * 1000
    reserved = 0
    for start, end, per_10000 in CPU_RESERVE_RANGES:
        if total > start:
            reserved += (min(total, end or total) - start) * per_10000 // 10000
    return reserved


def allocatable(instance: InstanceType, hugepages_mi: int = 0) -> Allocatable:
    cpu_reserved = kube_reserved_cpu_millis(instance.vcpu)
    memory_reserved_mi = 11 * instance.max_pods + 255 + EVICTION_HARD_MEMORY_MI + hugepages_mi
    nominal = instance.memory_gib * 2**30
    reserved = memory_reserved_mi * 2**20
    return Allocatable(
        cpu_millis=instance.vcpu * 1000 - cpu_reserved,
        memory_bytes_at_most=nominal - reserved,
        memory_bytes_estimate=int(nominal * (1 - VM_MEMORY_OVERHEAD)) - reserved,
        reserved_cpu_millis=cpu_reserved,
        reserved_memory_mi=memory_reserved_mi,
    )


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
    reduce = document.get("allReduce", {}) if isinstance(document, dict) else {}
    reduce = reduce if isinstance(reduce, dict) else {}
    for name in entries if isinstance(entries, dict) else ():
        if name not in reduce:
            issues.append(
                ConfigIssue(
                    f"instances.yaml.allReduce.{name}",
                    "missing: give busbwGBps with its source, or the reason there is none",
                )
            )
    issues += [
        ConfigIssue(f"instances.yaml.allReduce.{name}", "not an instance type of the catalog")
        for name in reduce
        if isinstance(entries, dict) and name not in entries
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
            max_pods=e["maxPods"],
            busbw_published_gbps=reduce[name].get("busbwGBps"),
            busbw_source=reduce[name].get("source") or reduce[name]["reason"],
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
