"""Simulated GPU nodes from a platform stack: one Node per pool node, as the cloud would make it.

Built from the same catalog and pool config the platform uses (`trainstack.builders.pools`),
so a job that the preview accepts meets the labels, taints and allocatable resources of the
nodes it would really land on. kwok (trainstack/sandbox/kwok-stages.yaml) then keeps them Ready.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from trainstack.builders.fabric import GPU_RESOURCE, HUGEPAGES_RESOURCE
from trainstack.builders.pools import (
    GPU_TAINT,
    MIG_STATE_LABEL,
    fabric_profile,
    gpu_resources_per_node,
    gpus_per_node,
    instance_of,
    max_nodes,
    node_labels,
    sharing_node_labels,
)
from trainstack.config.model import GpuPool, MigSharing, NewVpc, PlatformConfig
from trainstack.config.topology import EC2_TOPOLOGY_LAYERS, EKS_LAYER_LABELS
from trainstack.sandbox.cluster import KWOK_ANNOTATION

MAX_PODS = 110  # the kubelet's default; nodeadm derives it per instance type (ENI limits)
EVICTION_HARD_MI = 100  # kubelet default evictionHard memory.available


def kube_reserved_cpu_millis(vcpu: int) -> int:
    """EKS AMI / nodeadm's kubeReserved CPU: 6% of the first core, 1% of the second, 0.5% of
    cores 3-4 and 0.25% of the rest (amazon-eks-ami nodeadm/internal/kubelet/config.go,
    getCPUMillicoresToReserve; the same table GKE documents)."""
    steps = [(1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025)]
    remaining, reserved = float(vcpu), 0.0
    for cores, share in steps:
        take = min(remaining, cores)
        reserved += take * 1000 * share
        remaining -= take
        if remaining <= 0:
            break
    return math.ceil(reserved)


def kube_reserved_memory_mi(max_pods: int) -> int:
    """nodeadm's kubeReserved memory: 11 MiB per pod plus 255 MiB (getMemoryMebibytesToReserve)."""
    return 11 * max_pods + 255


def _aws_node(cfg: PlatformConfig, pool: GpuPool, index: int) -> dict[str, Any]:
    assert pool.aws is not None
    instance = instance_of(pool)
    profile = fabric_profile(pool)
    hugepages_mi = profile.hugepages_mi_per_node
    memory_mi = instance.memory_gib * 1024
    capacity = {
        "cpu": str(instance.vcpu),
        "memory": f"{memory_mi}Mi",
        "pods": str(MAX_PODS),
        "ephemeral-storage": "500Gi",
        **{name: str(count) for name, count in gpu_resources_per_node(pool).items()},
        **{name: str(count) for name, count in profile.devices_per_node.items()},
    }
    if hugepages_mi:
        capacity[HUGEPAGES_RESOURCE] = f"{hugepages_mi}Mi"
    allocatable = dict(capacity)
    allocatable["cpu"] = f"{instance.vcpu * 1000 - kube_reserved_cpu_millis(instance.vcpu)}m"
    # Pre-allocated huge pages leave the memory pods can use (the kubelet subtracts them).
    usable_mi = memory_mi - kube_reserved_memory_mi(MAX_PODS) - EVICTION_HARD_MI - hugepages_mi
    allocatable["memory"] = f"{usable_mi}Mi"
    zones = _zones(cfg)
    zone = pool.aws.availability_zone or zones[index % len(zones)]
    name = f"{pool.name}-{index}"
    return _node(
        name,
        {
            **node_labels(cfg, pool),
            **_mig_state(pool),
            "node.kubernetes.io/instance-type": instance.name,
            "topology.kubernetes.io/zone": zone,
            **network_labels(instance.name, zone, pool.name),
        },
        [GPU_TAINT],
        capacity,
        allocatable,
    )


def network_labels(instance_type: str, zone: str, pool: str) -> dict[str, str]:
    """The network topology labels EKS puts on a node of `instance_type`, one per layer its
    type has (config/topology.py), none for a type without an EC2 topology. Simulated: one
    network node per layer and zone, and the bottom one per pool and zone, so a pool's nodes in
    a zone share their nearest network node, as its placement group or Capacity Block would
    keep them at best; tests/e2e/test_topology.py lays out a wider fabric. Values look like
    EC2's (`nn-` and 17 hex digits)."""
    layers = EC2_TOPOLOGY_LAYERS.get(instance_type, 0)
    result = {}
    for layer in range(1, layers + 1):
        scope = f"{zone}/{pool}" if layer == layers else zone
        digest = hashlib.sha256(f"layer-{layer}/{scope}".encode()).hexdigest()[:17]
        result[EKS_LAYER_LABELS[layer - 1]] = f"nn-{digest}"
    return result


def _zones(cfg: PlatformConfig) -> list[str]:
    """The zones a multi-zone managed node group spreads its nodes over (the VPC's)."""
    assert cfg.aws is not None
    network = cfg.aws.network
    if isinstance(network, NewVpc):
        return list(network.availability_zones)
    return sorted({s.availability_zone for s in network.private_subnets})


def _existing_node(pool: GpuPool, index: int) -> dict[str, Any]:
    assert pool.existing is not None
    existing = pool.existing
    profile = fabric_profile(pool)
    capacity = {
        "cpu": str(existing.cpus_per_node),
        "memory": f"{existing.memory_gib_per_node}Gi",
        "pods": str(MAX_PODS),
        "ephemeral-storage": "500Gi",
        **{name: str(count) for name, count in gpu_resources_per_node(pool).items()},
    }
    if existing.rdma is not None:
        # The RDMA shared device plugin advertises rdmaHcaMax devices per node
        # (builders/device_plugins.nic_cluster_policy sets 63).
        capacity[existing.rdma.resource] = "63"
    capacity |= {name: str(count) for name, count in profile.devices_per_node.items()}
    # On existing nodes the owners set the sharing labels (docs/gpu-sharing.md).
    node_labels_ = {**dict(existing.node_selector), **sharing_node_labels(pool), **_mig_state(pool)}
    return _node(f"{pool.name}-{index}", node_labels_, [], capacity, dict(capacity))


def _mig_state(pool: GpuPool) -> dict[str, str]:
    """What the MIG manager reports once it has applied the layout (mig-parted v0.14.0
    deployments/container/reconfigure-mig.sh): the sandbox's nodes are born partitioned."""
    return {MIG_STATE_LABEL: "success"} if isinstance(pool.sharing, MigSharing) else {}


def _node(
    name: str,
    node_labels_: dict[str, str],
    taints: list[dict[str, str]],
    capacity: dict[str, str],
    allocatable: dict[str, str],
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                **node_labels_,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": allocatable},
    }


def pool_nodes(
    cfg: PlatformConfig, pool: GpuPool, count: int | None = None
) -> list[dict[str, Any]]:
    """`count` nodes of `pool` (default: its maximum size)."""
    count = max_nodes(pool) if count is None else count
    if pool.aws is not None:
        return [_aws_node(cfg, pool, i) for i in range(count)]
    return [_existing_node(pool, i) for i in range(count)]


def stack_nodes(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Every GPU node every pool of the stack can have."""
    return [node for pool in cfg.gpu_pools for node in pool_nodes(cfg, pool)]


def csi_nodes(nodes: list[dict[str, Any]], drivers: set[str]) -> list[dict[str, Any]]:
    """The CSINode the kubelet publishes once a CSI driver's node plugin registers on a node.

    Volcano's scheduler reads them: each driver becomes an `attachable-volumes-csi-<driver>`
    resource on the node (SchedulerCache.setCSIResourceOnNode), which pods using that driver's
    volumes request. Without them a pod with a CSI volume exceeds every queue's capability in
    that dimension. Drivers that set no attach limit (the FSx and EFS drivers) publish no
    allocatable count.
    """
    return [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {
                "name": node["metadata"]["name"],
                "labels": {"e2e.trainstack.io/simulated": "true"},
            },
            "spec": {
                "drivers": [
                    {"name": driver, "nodeID": node["metadata"]["name"], "topologyKeys": None}
                    for driver in sorted(drivers)
                ]
            },
        }
        for node in nodes
    ]


def csi_drivers(objects: list[dict[str, Any]]) -> set[str]:
    """CSI drivers the platform's PersistentVolumes use, and the drivers it declares (the
    node cache agent's), whose node plugins run everywhere."""
    return {
        o["spec"]["csi"]["driver"]
        for o in objects
        if o["kind"] == "PersistentVolume" and "csi" in o.get("spec", {})
    } | {o["metadata"]["name"] for o in objects if o["kind"] == "CSIDriver"}


def gpus(nodes: list[dict[str, Any]]) -> int:
    return sum(int(n["status"]["capacity"].get(GPU_RESOURCE, 0)) for n in nodes)


__all__ = ["gpus", "gpus_per_node", "pool_nodes", "stack_nodes"]
