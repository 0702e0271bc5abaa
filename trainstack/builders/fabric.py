"""RDMA fabrics: the EFA interface layout of a launch template, and the fabric profile.

The fabric profile is the contract between node pools and the job layer: which device
resources a node offers and which NCCL environment a job on it needs, so that a job's
author never has to know the fabric.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from trainstack.catalog import InstanceType

Fabric = Literal["efa", "infiniband", "roce", "tcp"]

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
HUGEPAGES_RESOURCE = "hugepages-2Mi"
# Per GPU; awsome-distributed-training requests 5120Mi for an 8-GPU p5 pod.
EFA_HUGEPAGES_MI_PER_GPU = 640
AWS_OFI_NCCL_TUNER = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-ofi-tuner.so"
# Settings the aws-ofi-nccl EFA cheatsheet calls obsolete or harmful; never emitted.
OBSOLETE_EFA_ENV = frozenset(
    {
        "FI_EFA_FORK_SAFE",
        "FI_EFA_ENABLE_SHM_TRANSFER",
        "FI_PROVIDER",
        "NCCL_PROTO",
        "RDMAV_FORK_SAFE",
        "FI_EFA_USE_DEVICE_RDMA",
        "NCCL_MIN_CHANNELS",
        "NCCL_BUFFSIZE",
    }
)
# Both sides of a torch job benefit from these whatever the fabric: a flight-recorder dump
# when the watchdog times out (the runtime writes it to the checkpoint volume). Never
# TORCH_NCCL_ASYNC_ERROR_HANDLING: 1 makes the watchdog abort the communicators, an abort
# known to hang, which is why torch's default is 3, tear down without it (pytorch/pytorch
# #110723; torch 2.13 include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp
# ErrorHandlingMode). The runtime's supervisor passes 3 to its workers unless a job sets it.
TORCH_NCCL_ENV = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
# Verbs memory registration pins pages, which the kernel refuses beyond RLIMIT_MEMLOCK unless
# the process has CAP_IPC_LOCK (torvalds/linux drivers/infiniband/core/umem.c ib_umem_get).
# The NVIDIA Network Operator's examples add IPC_LOCK to root pods; trainstack's trainers run
# as the images' non-root user, for whom an added capability never takes effect: the kernel
# clears the permitted set on execve for a non-root user without ambient capabilities, and
# containerd's CRI sets none (containerd v1.7.29 pkg/cri/server/container_create_linux.go
# WithoutAmbientCaps; kubernetes/kubernetes#56374). So the pods add nothing, and RDMA rests on
# the limit the container inherits from the runtime (containerd's CRI drops default rlimits,
# pkg/cri/opts/spec_opts.go WithoutDefaultSecuritySettings): the node's containerd needs
# LimitMEMLOCK=infinity (docs/fabrics.md), and the runtime checks it before training.
# Multus attaches the pod to the NetworkAttachmentDefinitions this annotation names
# (k8snetworkplumbingwg multi-net-spec; the Network Operator's examples use it).
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def efa_network_interfaces(
    instance: InstanceType, security_group_ids: list[Any]
) -> list[dict[str, Any]]:
    """Launch-template interfaces, following AWS's EFA guidance for multi-card types.

    The primary ENA interface sits on card 0 / device 0; an EFA-only interface joins it
    on card 0 / device 1; every further EFA card gets an EFA-only interface at device 0.
    Every interface carries the pool's security groups (EFA traffic needs the
    self-referencing group on each).
    """
    if not instance.supports_efa:
        raise ValueError(f"{instance.name} has no EFA")
    interfaces = [
        {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
    ]
    for card in instance.efa_cards:
        interfaces.append(
            {
                "networkCardIndex": card,
                "deviceIndex": 1 if card == 0 else 0,
                "interfaceType": "efa-only",
            }
        )
    for interface in interfaces:
        interface["securityGroups"] = list(security_group_ids)
        interface["deleteOnTermination"] = "true"
    return interfaces


@dataclass(frozen=True)
class FabricProfile:
    """What one node of a pool offers, and the environment jobs on it need."""

    fabric: Fabric
    gpus_per_node: int
    # Extended resources per node besides GPUs (EFA/RDMA devices, hugepages).
    devices_per_node: dict[str, int] = field(default_factory=dict)
    hugepages_mi_per_node: int = 0
    env: dict[str, str] = field(default_factory=dict)
    # Shared devices (the RDMA shared device plugin) are requested once per replica.
    shared_devices: tuple[str, ...] = ()
    # The NetworkAttachmentDefinition ([namespace/]name) pods attach to as net1, if any.
    secondary_network: str | None = None

    def resources_for(self, gpus: int) -> dict[str, str]:
        """Requests (= limits) for a replica using `gpus` of a node's GPUs.

        Devices are shared out in proportion, so a replica may only take a share that
        divides evenly; anything else would strand devices or fail scheduling.
        """
        if gpus < 1 or gpus > self.gpus_per_node or self.gpus_per_node % gpus:
            raise ValueError(
                f"{gpus} GPUs per replica does not divide a {self.gpus_per_node}-GPU node; "
                f"use one of {', '.join(str(d) for d in divisors(self.gpus_per_node))}"
            )
        share = self.gpus_per_node // gpus
        resources = {GPU_RESOURCE: str(gpus)}
        resources |= dict.fromkeys(self.shared_devices, "1")
        for name, count in self.devices_per_node.items():
            if count % share:
                raise ValueError(
                    f"{count} {name} per node cannot be split over {share} replicas of {gpus} GPUs"
                )
            resources[name] = str(count // share)
        if self.hugepages_mi_per_node:
            resources[HUGEPAGES_RESOURCE] = f"{self.hugepages_mi_per_node // share}Mi"
        return resources

    def pod_annotations(self) -> dict[str, str]:
        """Annotations of every pod on the pool (the secondary network, through Multus)."""
        return {NETWORKS_ANNOTATION: self.secondary_network} if self.secondary_network else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "fabric": self.fabric,
            "gpusPerNode": self.gpus_per_node,
            "devicesPerNode": dict(sorted(self.devices_per_node.items())),
            "hugepagesMiPerNode": self.hugepages_mi_per_node,
            "sharedDevices": list(self.shared_devices),
            "secondaryNetwork": self.secondary_network,
            "env": dict(sorted(self.env.items())),
        }


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def efa_profile(instance: InstanceType) -> FabricProfile:
    """EFA on AWS: every EFA device, hugepages for libfabric, current aws-ofi-nccl env."""
    if not instance.supports_efa:
        raise ValueError(f"{instance.name} has no EFA")
    return FabricProfile(
        fabric="efa",
        gpus_per_node=instance.gpus,
        devices_per_node={EFA_RESOURCE: instance.efa_devices},
        hugepages_mi_per_node=EFA_HUGEPAGES_MI_PER_GPU * instance.gpus,
        env={
            **TORCH_NCCL_ENV,
            # Bootstrap traffic stays off loopback and container bridges.
            "NCCL_SOCKET_IFNAME": "^lo,docker0,veth_def_agent",
            "NCCL_TUNER_PLUGIN": AWS_OFI_NCCL_TUNER,
        },
    )


def rdma_profile(
    fabric: Literal["infiniband", "roce"],
    *,
    gpus_per_node: int,
    resource: str,
    hcas: str,
    socket_ifname: str,
    gid_index: int | None = None,
    secondary_network: str | None = None,
) -> FabricProfile:
    """InfiniBand or RoCE on an existing cluster, through the RDMA shared device plugin.

    Every replica on a node shares the node's HCAs through one `rdma/<name>` device and
    attaches to the pool's secondary network if it has one; it registers memory within the
    node runtime's RLIMIT_MEMLOCK (no capability: see IPC_LOCK above).
    NCCL_SOCKET_IFNAME picks the pod interface for NCCL's TCP bootstrap; RDMA traffic goes
    through the NCCL_IB_HCA devices whatever it says.
    """
    env = {**TORCH_NCCL_ENV, "NCCL_IB_HCA": hcas, "NCCL_SOCKET_IFNAME": socket_ifname}
    if fabric == "roce":
        # RoCE v2 needs the GID of the routable (IPv4) address; 3 on most Mellanox setups.
        env["NCCL_IB_GID_INDEX"] = str(3 if gid_index is None else gid_index)
    return FabricProfile(
        fabric=fabric,
        gpus_per_node=gpus_per_node,
        shared_devices=(resource,),
        env=env,
        secondary_network=secondary_network,
    )


def tcp_profile(gpus_per_node: int, socket_ifname: str) -> FabricProfile:
    """No RDMA: NCCL over sockets, with InfiniBand verbs explicitly off."""
    return FabricProfile(
        fabric="tcp",
        gpus_per_node=gpus_per_node,
        env={**TORCH_NCCL_ENV, "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": socket_ifname},
    )
