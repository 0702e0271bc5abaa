"""GPU pools as data: fabric profile, node labels and taint, node bootstrap, plugin values."""

from __future__ import annotations

import json
from typing import Any

from trainstack.builders import labels
from trainstack.builders.fabric import (
    FabricProfile,
    efa_profile,
    rdma_profile,
    tcp_profile,
)
from trainstack.catalog import InstanceType, lookup
from trainstack.config.model import SYSTEM_NAMESPACE, GpuPool, PlatformConfig

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# The NVIDIA device plugin chart's default affinity honours this label.
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_MODEL = f"{labels.PREFIX}/gpu-model"
PLACEMENT_GROUP = f"{labels.PREFIX}/placement-group"
CAPACITY = f"{labels.PREFIX}/capacity"
INSTANCE_STORE_MOUNT = "/mnt/k8s-disks/0"  # where nodeadm mounts the RAID0 array

# Upstream charts, pinned. Versions: ../shared/reference/aws-gpu-platform-facts.md §6.
CHARTS: dict[str, dict[str, str]] = {
    "nvidia-device-plugin": {
        "chart": "nvidia-device-plugin",
        "version": "0.18.2",
        "repo": "https://nvidia.github.io/k8s-device-plugin",
    },
    "gpu-operator": {
        "chart": "gpu-operator",
        "version": "v26.3.0",
        "repo": "https://helm.ngc.nvidia.com/nvidia",
    },
    "aws-efa-k8s-device-plugin": {
        "chart": "aws-efa-k8s-device-plugin",
        "version": "v0.5.30",
        "repo": "https://aws.github.io/eks-charts",
    },
    "network-operator": {
        "chart": "network-operator",
        "version": "25.7.0",
        "repo": "https://helm.ngc.nvidia.com/nvidia",
    },
}
RDMA_PLUGIN_IMAGE = {
    "image": "k8s-rdma-shared-dev-plugin",
    "repository": "nvcr.io/nvidia/mellanox",
    "version": "network-operator-v25.7.0",
}


def instance_of(pool: GpuPool) -> InstanceType:
    assert pool.aws is not None, "only AWS pools have an instance type"
    return lookup(pool.aws.instance_type)


def gpus_per_node(pool: GpuPool) -> int:
    if pool.aws is not None:
        return instance_of(pool).gpus
    assert pool.existing is not None
    return pool.existing.gpus_per_node


def max_nodes(pool: GpuPool) -> int:
    if pool.aws is not None:
        return pool.aws.size.max
    assert pool.existing is not None
    return pool.existing.nodes


def fabric_profile(pool: GpuPool) -> FabricProfile:
    """What a job on this pool requests and which env it gets (the pool→job contract)."""
    if pool.fabric == "efa":
        return efa_profile(instance_of(pool))
    if pool.existing is not None and pool.existing.rdma is not None and pool.fabric != "tcp":
        rdma = pool.existing.rdma
        return rdma_profile(
            pool.fabric,
            gpus_per_node=pool.existing.gpus_per_node,
            resource=rdma.resource,
            hcas=rdma.hcas,
            socket_ifname=pool.existing.socket_ifname,
            gid_index=rdma.gid_index,
        )
    ifname = pool.existing.socket_ifname if pool.existing is not None else "^lo,docker0"
    return tcp_profile(gpus_per_node(pool), ifname)


def placement_group_name(cluster_name: str, pool: GpuPool) -> str:
    return f"{cluster_name}-{pool.name}"


def node_labels(cfg: PlatformConfig, pool: GpuPool) -> dict[str, str]:
    """Labels every node of an AWS pool carries (set by the managed node group)."""
    assert pool.aws is not None
    instance = instance_of(pool)
    result = {
        labels.POOL: pool.name,
        labels.FABRIC: pool.fabric,
        GPU_MODEL: instance.gpu_model,
        GPU_PRESENT_LABEL: "true",
        CAPACITY: pool.aws.capacity.type,
    }
    if pool.aws.placement_group:
        result[PLACEMENT_GROUP] = placement_group_name(cfg.cluster_name, pool)
    return result


def pool_selector(cfg: PlatformConfig, pool: GpuPool) -> dict[str, str]:
    """Node labels that select this pool's nodes, for jobs and topology."""
    if pool.existing is not None:
        return dict(pool.existing.node_selector)
    del cfg
    return {labels.POOL: pool.name}


def hugepages_2mi(pool: GpuPool) -> int:
    """2 MiB pages to preallocate on each node (EFA's libfabric uses them)."""
    return fabric_profile(pool).hugepages_mi_per_node // 2


def node_user_data(pool: GpuPool) -> str:
    """AL2023 MIME user data: nodeadm NodeConfig (RAID0 instance store) + hugepages.

    Shell parts run after nodeadm's config phase and before kubelet starts, so kubelet
    sees the hugepages as allocatable.
    """
    assert pool.aws is not None
    boundary = "TRAINSTACK-BOUNDARY"
    parts: list[tuple[str, str]] = []
    if pool.aws.instance_store_raid0:
        node_config = {
            "apiVersion": "node.eks.aws/v1alpha1",
            "kind": "NodeConfig",
            "spec": {"instance": {"localStorage": {"strategy": "RAID0"}}},
        }
        parts.append(("application/node.eks.aws", json.dumps(node_config, indent=2)))
    pages = hugepages_2mi(pool)
    if pages:
        script = "\n".join(
            [
                "#!/bin/bash",
                "set -euo pipefail",
                f"echo 'vm.nr_hugepages = {pages}' > /etc/sysctl.d/90-trainstack-hugepages.conf",
                f"sysctl -w vm.nr_hugepages={pages}",
            ]
        )
        parts.append(("text/x-shellscript", script))
    if not parts:
        return ""
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{boundary}"', ""]
    for content_type, body in parts:
        lines += [f"--{boundary}", f"Content-Type: {content_type}", "", body, ""]
    lines.append(f"--{boundary}--")
    return "\n".join(lines) + "\n"


def nvidia_device_plugin_values() -> dict[str, Any]:
    """Runs only on nodes labelled nvidia.com/gpu.present=true (set on every GPU pool)."""
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": GPU_PRESENT_LABEL, "operator": "In", "values": ["true"]}
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": [GPU_TOLERATION],
        "priorityClassName": "system-node-critical",
    }


def gpu_operator_values() -> dict[str, Any]:
    """The EKS accelerated AMI ships the driver and container toolkit: do not reinstall."""
    return {
        "driver": {"enabled": False},
        "toolkit": {"enabled": False},
        "daemonsets": {"tolerations": [GPU_TOLERATION]},
    }


def efa_device_plugin_values(cfg: PlatformConfig) -> dict[str, Any]:
    """Only on EFA pools: elsewhere the plugin crash-loops on 'No valid EFA devices'."""
    efa_types = sorted(
        {p.aws.instance_type for p in cfg.gpu_pools if p.aws is not None and p.fabric == "efa"}
    )
    return {
        "nodeSelector": {labels.FABRIC: "efa"},
        "tolerations": [GPU_TOLERATION],
        "supportedInstanceLabels": {
            "keys": ["node.kubernetes.io/instance-type"],
            "values": efa_types,
        },
    }


def network_operator_values() -> dict[str, Any]:
    return {"nfd": {"enabled": True}, "sriovNetworkOperator": {"enabled": False}}


def nic_cluster_policy(cfg: PlatformConfig) -> dict[str, Any]:
    """The Network Operator's singleton policy: one RDMA shared device per RDMA pool."""
    rdma_pools = [p for p in cfg.gpu_pools if p.existing is not None and p.existing.rdma]
    config_list = []
    terms = []
    for pool in rdma_pools:
        assert pool.existing is not None
        assert pool.existing.rdma is not None
        rdma = pool.existing.rdma
        config_list.append(
            {
                "resourceName": rdma.resource_name,
                "rdmaHcaMax": 63,
                "selectors": {"ifNames": list(rdma.interfaces)},
            }
        )
        terms.append(
            {
                "matchExpressions": [
                    {"key": key, "operator": "In", "values": [value]}
                    for key, value in pool.existing.node_selector
                ]
            }
        )
    return {
        "apiVersion": "mellanox.com/v1alpha1",
        "kind": "NicClusterPolicy",
        "metadata": {"name": "nic-cluster-policy", "labels": labels.base_labels(cfg.stack)},
        "spec": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            },
            "tolerations": [GPU_TOLERATION],
            "rdmaSharedDevicePlugin": {
                **RDMA_PLUGIN_IMAGE,
                "config": json.dumps({"configList": config_list}, sort_keys=True),
            },
        },
    }


def pool_output(cfg: PlatformConfig, pool: GpuPool) -> dict[str, Any]:
    """A pool as exported for team stacks and the job layer."""
    doc: dict[str, Any] = {
        "name": pool.name,
        "fabric": pool.fabric,
        "gpusPerNode": gpus_per_node(pool),
        "maxNodes": max_nodes(pool),
        "nodeSelector": pool_selector(cfg, pool),
        "taint": GPU_TAINT if pool.aws is not None else None,
        "profile": fabric_profile(pool).to_json(),
    }
    if pool.aws is not None:
        instance = instance_of(pool)
        doc |= {
            "instanceType": instance.name,
            "gpuModel": instance.gpu_model,
            "availabilityZone": pool.aws.availability_zone,
            "capacityType": pool.aws.capacity.type,
            "instanceStorePath": INSTANCE_STORE_MOUNT if pool.aws.instance_store_raid0 else None,
        }
    return doc


PLUGIN_NAMESPACE = SYSTEM_NAMESPACE
