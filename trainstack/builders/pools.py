"""GPU pools as data: fabric profile, node labels and taint, node bootstrap, plugin values."""

from __future__ import annotations

import json
import shlex
from typing import Any

from trainstack.builders import labels
from trainstack.builders.fabric import (
    FabricProfile,
    efa_profile,
    rdma_profile,
    tcp_profile,
)
from trainstack.catalog import InstanceType, lookup
from trainstack.config.model import (
    SYSTEM_NAMESPACE,
    GpuPool,
    MigSharing,
    NvmeCache,
    PlatformConfig,
    PrePull,
    TimeSlicing,
)
from trainstack.contracts import health as health_contract
from trainstack.slices import (
    WHOLE_GPU_RESOURCE,
    Slice,
    mig_catalog,
    mig_slices,
    time_slices,
)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
# The health gate's startup taint (issue 42, docs/health.md): a new GPU node takes no work
# until the health agent's checks pass and it removes the taint.
HEALTH_TAINT = {
    "key": health_contract.TAINT_KEY,
    "value": health_contract.TAINT_PENDING,
    "effect": health_contract.TAINT_EFFECT,
}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# The gate's taint, whatever its value (pending, checking, failed): tolerated by the agent and
# by the node daemons that label a node or advertise its GPUs, never by a team's pods (policy
# rule health-gate).
HEALTH_TOLERATION = {
    "key": health_contract.TAINT_KEY,
    "operator": "Exists",
    "effect": health_contract.TAINT_EFFECT,
}


def gpu_daemon_tolerations(cfg: PlatformConfig) -> list[dict[str, str]]:
    """The device plugin's, GPU Feature Discovery's and NFD's tolerations: the GPU taint, and
    with the gate on its taint too. DaemonSets get no custom tolerations of their own (k8s
    v1.37.2 pkg/controller/daemon/util/daemonset_util.go AddOrUpdateDaemonPodTolerations adds
    only the node-condition ones), and on an existing cluster a pool may select a label GFD
    or NFD sets: without this a gated node would never get those labels, so never its agent,
    so never pass."""
    return [dict(GPU_TOLERATION), *([dict(HEALTH_TOLERATION)] if cfg.health.enabled else [])]


# The NVIDIA device plugin chart's default affinity honours this label. Set by the AWS pools'
# node groups (node_labels) or by the GPU operator; GPU Feature Discovery never sets it.
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
# Node Feature Discovery's label for a node with an NVIDIA (PCI vendor 10de) device: the first
# term of the device plugin chart's default affinity.
NFD_NVIDIA_PCI_LABEL = "feature.node.kubernetes.io/pci-10de.present"
# The device plugin chart's NFD worker tolerations (values.yaml), with the GPU taint accepted
# whatever its value (the chart's only tolerates nvidia.com/gpu=present).
NFD_WORKER_TOLERATIONS = (
    {
        "key": "node-role.kubernetes.io/master",
        "operator": "Equal",
        "value": "",
        "effect": "NoSchedule",
    },
    GPU_TOLERATION,
)
GPU_MODEL = f"{labels.PREFIX}/gpu-model"
PLACEMENT_GROUP = f"{labels.PREFIX}/placement-group"
# Nodes where the dataset cache agent runs: its directory is on the instance-store array, so
# an AWS pool without one has no cache (issue 39 #9).
CACHE_NODE_LABEL = f"{labels.PREFIX}/dataset-cache"
CAPACITY = f"{labels.PREFIX}/capacity"
INSTANCE_STORE_MOUNT = "/mnt/k8s-disks/0"  # where nodeadm mounts the RAID0 array
# The NVMe cache's own directory on the array, the cache agent's (see cache_setup_script).
CACHE_ARRAY_DIR = f"{INSTANCE_STORE_MOUNT}/trainstack-cache"
# The training images' user and group (images/README.md: "user `trainer` (UID/GID 10001)").
TRAINING_UID = 10001
CACHE_OWNER_ID = TRAINING_UID
CACHE_SETUP_SCRIPT = "/usr/local/sbin/trainstack-nvme-cache"
CACHE_SETUP_UNIT = "trainstack-nvme-cache.service"

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


# Fractional GPUs (docs/gpu-sharing.md). The node labels that pick each node's share: the GPU
# operator's MIG manager applies the layout named by nvidia.com/mig.config (gpu-operator
# v26.3.0 controllers/state_manager.go; mig-parted v0.14.0 cmd/nvidia-mig-manager/main.go
# MigConfigLabel) and reports nvidia.com/mig.config.state; the device plugin's config manager
# loads the config named by nvidia.com/device-plugin.config (k8s-device-plugin v0.18.2
# cmd/config-manager/main.go DefaultConfigLabel; README "Multiple Config File Example").
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"


def time_slicing_config_name(replicas: int) -> str:
    return f"time-slicing-{replicas}"


def pool_slices(pool: GpuPool) -> tuple[Slice, ...]:
    """The slices each GPU of the pool is cut into (empty: whole GPUs)."""
    if isinstance(pool.sharing, MigSharing):
        return mig_slices(mig_catalog()[pool.sharing.gpu], pool.sharing.layout)
    if isinstance(pool.sharing, TimeSlicing):
        memory = instance_of(pool).gpu_memory_gib * 2**30 / 1e9 if pool.aws else None
        return time_slices(pool.sharing.replicas, memory)
    return ()


def gpu_resources_per_node(pool: GpuPool) -> dict[str, int]:
    """What the device plugin advertises on one node: whole GPUs, or every slice of them
    (with the `mixed` MIG strategy a MIG-enabled GPU is not an nvidia.com/gpu any more, and a
    renamed time-shared one is nvidia.com/gpu.shared only)."""
    gpus = gpus_per_node(pool)
    slices = pool_slices(pool)
    if not slices:
        return {WHOLE_GPU_RESOURCE: gpus}
    return {s.resource: s.per_gpu * gpus for s in slices}


def sharing_node_labels(pool: GpuPool) -> dict[str, str]:
    """The labels that make a node's MIG manager or device plugin cut its GPUs."""
    if isinstance(pool.sharing, MigSharing):
        return {MIG_CONFIG_LABEL: pool.sharing.layout}
    if isinstance(pool.sharing, TimeSlicing):
        return {DEVICE_PLUGIN_CONFIG_LABEL: time_slicing_config_name(pool.sharing.replicas)}
    return {}


def uses_mig(cfg: PlatformConfig) -> bool:
    return any(isinstance(p.sharing, MigSharing) for p in cfg.gpu_pools)


def uses_time_slicing(cfg: PlatformConfig) -> bool:
    return any(isinstance(p.sharing, TimeSlicing) for p in cfg.gpu_pools)


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
            secondary_network=rdma.secondary_network,
        )
    ifname = pool.existing.socket_ifname if pool.existing is not None else "^lo,docker0"
    return tcp_profile(gpus_per_node(pool), ifname)


def placement_group_name(cluster_name: str, pool: GpuPool) -> str:
    """The pool's cluster placement group: the existing one it names, else the one trainstack
    creates for it."""
    if pool.aws is not None and pool.aws.placement_group_name is not None:
        return pool.aws.placement_group_name
    return f"{cluster_name}-{pool.name}"


def has_dataset_cache(cfg: PlatformConfig, pool: GpuPool) -> bool:
    """Does the cache agent run on this pool's nodes? AWS: pools whose instance store is
    striped into the array that holds the cache directory; existing pools: the operator
    provides the directory on every pool's nodes (storage.nvmeCache.hostDir)."""
    if cfg.storage.nvme_cache is None:
        return False
    return pool.aws is None or pool.aws.instance_store_raid0


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
    if has_dataset_cache(cfg, pool):
        result[CACHE_NODE_LABEL] = "true"
    return result | sharing_node_labels(pool)


def node_taints(cfg: PlatformConfig, pool: GpuPool) -> list[dict[str, str]]:
    """The taints an AWS pool's nodes register with: the GPU taint, and with the health gate
    on, its startup taint.

    Both go in the managed node group's `taints`, not in the launch template's NodeConfig:
    EKS appends its own NodeConfig to the user data, after ours, with the node group's taints
    as one `--register-with-taints` kubelet flag (eksctl docs, "Node bootstrapping": "the
    default NodeConfig is being added by EKS MNG under the hood, appended"), nodeadm appends
    kubelet flags in document order (awslabs/amazon-eks-ami nodeadm/internal/api/merge.go
    transformKubeletFlags), and the kubelet keeps only the last value of that flag
    (k8s.io/kubernetes v1.37.2 pkg/util/taints/taints.go taintsVar.Set replaces the list):
    a flag of ours would be overwritten by the node group's. The kubelet applies the flag
    only when it first registers the Node (pkg/kubelet/kubelet_node_status.go initialNode),
    so once the agent removes the taint nothing on the node puts it back. EKS documents
    node-group taints as set at creation and changed through UpdateNodegroupConfig ("Node
    taints on managed node groups"), which trainstack calls only when this list changes
    (turning the gate on taints the pools' nodes; the agent then checks them). Cluster
    Autoscaler reads these taints into its scale-from-zero template
    (DescribeNodegroup), so it must treat the health taint as a startup taint
    (builders/autoscaler.py values)."""
    assert pool.aws is not None
    taints = [dict(GPU_TAINT)]
    if cfg.health.enabled:
        taints.append(dict(HEALTH_TAINT))
    return taints


def pool_selector(cfg: PlatformConfig, pool: GpuPool) -> dict[str, str]:
    """Node labels that select this pool's nodes, for jobs and topology."""
    if pool.existing is not None:
        return dict(pool.existing.node_selector)
    del cfg
    return {labels.POOL: pool.name}


def hugepages_2mi(pool: GpuPool) -> int:
    """2 MiB pages to preallocate on each node (EFA's libfabric uses them)."""
    return fabric_profile(pool).hugepages_mi_per_node // 2


def cache_setup_script(cache: NvmeCache) -> str:
    """Runs on every boot once the array is mounted, before kubelet (cache_user_data).

    Makes the cache's own directory of the array and bind-mounts it at `hostDir`, the node
    cache agent's hostPath (builders/cache.py, type Directory: without the array there is no
    directory and the agent does not start there, rather than fill the root volume). The
    array root, where nodeadm's setup-local-disks also keeps /var/lib/kubelet,
    /var/lib/containerd and /var/log/pods, is never handed to the agent. Owned by root, 0755:
    the agent (root) writes, pods read through their read-only bind mounts.
    """
    array = shlex.quote(INSTANCE_STORE_MOUNT)
    src, dst = shlex.quote(CACHE_ARRAY_DIR), shlex.quote(cache.host_dir)
    return "\n".join(
        [
            "#!/bin/bash",
            "# trainstack NVMe cache: the cache agent's directory on the instance-store array.",
            "set -euo pipefail",
            f"if ! mountpoint -q {array}; then",
            f'  echo "trainstack-nvme-cache: {INSTANCE_STORE_MOUNT} is not mounted; no cache" >&2',
            "  exit 1",
            "fi",
            f"install -d -m 0755 -o 0 -g 0 {src}",
            f"mkdir -p {dst}",
            f"mountpoint -q {dst} || mount --bind {src} {dst}",
            "",
        ]
    )


def cache_user_data(cache: NvmeCache) -> str:
    """The shell part that installs cache_setup_script as a systemd unit.

    Order on AL2023 (amazon-eks-ami v20260724, templates/al2023/runtime/rootfs/etc/systemd/
    system/): nodeadm-config.service runs before cloud-init; user-data shell parts run in
    cloud-final; nodeadm-run.service (`After=cloud-final.service`) then runs the run phase,
    whose local-disk aspect calls setup-local-disks (nodeadm/cmd/nodeadm/init/init.go,
    nodeadm/internal/system/local_disk.go) to build, mount and enable the array's mount unit,
    and (re)starts kubelet. So this part cannot touch the array itself: it installs a unit
    that kubelet's start pulls in (`WantedBy=kubelet.service`), ordered after the array's
    mount (`RequiresMountsFor`) and before kubelet, on the first boot and every reboot.
    """
    unit = "\n".join(
        [
            "[Unit]",
            "Description=trainstack NVMe cache directory on the instance-store array",
            f"RequiresMountsFor={INSTANCE_STORE_MOUNT}",
            "Before=kubelet.service",
            "[Service]",
            "Type=oneshot",
            "RemainAfterExit=yes",
            f"ExecStart={CACHE_SETUP_SCRIPT}",
            "[Install]",
            "WantedBy=kubelet.service",
        ]
    )
    return "\n".join(
        [
            "#!/bin/bash",
            "set -euo pipefail",
            f"mkdir -p {shlex.quote(CACHE_SETUP_SCRIPT.rsplit('/', 1)[0])}",
            f"cat > {CACHE_SETUP_SCRIPT} <<'TRAINSTACK_SCRIPT'",
            cache_setup_script(cache).rstrip("\n"),
            "TRAINSTACK_SCRIPT",
            f"chmod 0755 {CACHE_SETUP_SCRIPT}",
            f"cat > /etc/systemd/system/{CACHE_SETUP_UNIT} <<'TRAINSTACK_UNIT'",
            unit,
            "TRAINSTACK_UNIT",
            "systemctl daemon-reload",
            f"systemctl enable {CACHE_SETUP_UNIT}",
        ]
    )


# The NVIDIA container toolkit's settings (nvidia-container-toolkit v1.19.1, top-level keys of
# /etc/nvidia-container-runtime/config.toml, read at every container create by the runtime
# and its hook: internal/config/config.go) that keep a pod to the GPUs it was allocated. The
# EKS AL2023 NVIDIA AMI makes `nvidia` containerd's default runtime (amazon-eks-ami v20260724
# nodeadm runtime_config_nvidia.go) and leaves the package's defaults: an unprivileged
# container whose image or spec sets NVIDIA_VISIBLE_DEVICES=all gets every GPU of the node,
# GPUs allocated to other teams' pods included, whatever it requested. With these, the toolkit
# takes a container's GPUs only from the device plugin's mounts under
# /var/run/nvidia-container-devices (deviceListStrategy volume-mounts), and ignores the
# variable from unprivileged containers (NVIDIA, "Preventing unprivileged access to GPUs in
# Kubernetes"; Bottlerocket ships the same). Privileged means CAP_SYS_ADMIN to the toolkit,
# which no team pod may have (Pod Security restricted).
TOOLKIT_ISOLATION = (
    ("accept-nvidia-visible-devices-as-volume-mounts", "true"),
    ("accept-nvidia-visible-devices-envvar-when-unprivileged", "false"),
)


def gpu_isolation_user_data() -> str:
    """The shell part that sets TOOLKIT_ISOLATION on the node, before kubelet starts (so
    before the device plugin hands out a GPU: volume mounts are accepted first)."""
    sets = " ".join(f"--set {key}={value}" for key, value in TOOLKIT_ISOLATION)
    return "\n".join(
        [
            "#!/bin/bash",
            "set -euo pipefail",
            f"nvidia-ctk config --in-place {sets}",
        ]
    )


# Image pulls on the GPU nodes (prePull.soci / prePull.maxConcurrentDownloads, docs/prepull.md),
# through nodeadm's NodeConfig (amazon-eks-ami v20260724 nodeadm/doc/examples.md, "Enabling
# fast image pull (experimental)" and "Configuring containerd"). FastImagePull points the
# kubelet's image service at the AMI's SOCI snapshotter in parallel pull and unpack mode
# (nodeadm/internal/containerd/config.go UseSOCISnapshotter; ignored below 4 vCPU / 7 GiB, which
# no GPU instance is). The AMI's containerd (2.2.4) pulls for the CRI through its transfer
# service (containerd v2.2 docs/cri/config.md "Image Pull Configuration (since containerd
# v2.1)"), so the download concurrency is the transfer plugin's; the CRI plugin's own
# max_concurrent_downloads, set to anything but 3, silently switches the CRI back to its old
# local pull (internal/cri/config/config.go).
TRANSFER_PLUGIN = 'plugins."io.containerd.transfer.v1.local"'
# What nodeadm's docs recommend for FastImagePull on the root volume ("at least 600MiB/s");
# gp3 allows it at its 3000 baseline IOPS (0.25 MiB/s per IOPS: Amazon EBS User Guide,
# "General Purpose SSD volumes", gp3).
FAST_PULL_ROOT_THROUGHPUT_MIBPS = 600


def pull_node_config(pre_pull: PrePull) -> dict[str, Any]:
    """The NodeConfig `spec` keys that set how the node pulls images (empty: the AMI's own)."""
    spec: dict[str, Any] = {}
    if pre_pull.soci == "parallel-pull-unpack":
        spec["featureGates"] = {"FastImagePull": True}
    if pre_pull.max_concurrent_downloads is not None:
        spec["containerd"] = {
            "config": f"[{TRANSFER_PLUGIN}]\n"
            f"max_concurrent_downloads = {pre_pull.max_concurrent_downloads}\n"
        }
    return spec


def node_user_data(
    pool: GpuPool,
    cache: NvmeCache | None = None,
    *,
    isolate_gpus: bool = True,
    pre_pull: PrePull | None = None,
) -> str:
    """AL2023 MIME user data: nodeadm NodeConfig (RAID0 instance store; how images are pulled,
    pull_node_config) + hugepages, the container toolkit's GPU isolation (with `isolate_gpus`:
    gpu.deviceListStrategy volume-mounts), and with `cache` on a RAID0 pool the unit that
    publishes the NVMe cache directories.

    Shell parts run after nodeadm's config phase and before its run phase makes the array and
    starts kubelet, so kubelet sees the hugepages as allocatable.
    """
    assert pool.aws is not None
    boundary = "TRAINSTACK-BOUNDARY"
    parts: list[tuple[str, str]] = []
    spec = pull_node_config(pre_pull) if pre_pull is not None else {}
    if pool.aws.instance_store_raid0:
        spec = {"instance": {"localStorage": {"strategy": "RAID0"}}, **spec}
    if spec:
        node_config = {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}
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
    if isolate_gpus:
        parts.append(("text/x-shellscript", gpu_isolation_user_data()))
    if pool.aws.instance_store_raid0 and cache is not None:
        parts.append(("text/x-shellscript", cache_user_data(cache)))
    if not parts:
        return ""
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{boundary}"', ""]
    for content_type, body in parts:
        lines += [f"--{boundary}", f"Content-Type: {content_type}", "", body, ""]
    lines.append(f"--{boundary}--")
    return "\n".join(lines) + "\n"


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
        "datasetCache": has_dataset_cache(cfg, pool),
        # Fractional GPUs: what one replica may ask for instead of a GPU (jobs/checks.py).
        "slices": [s.to_json() for s in pool_slices(pool)],
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
