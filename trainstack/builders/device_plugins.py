"""The GPU node daemons' values: the NVIDIA device plugin (and GFD, NFD), the GPU operator, the
EFA device plugin and the Network Operator, with the device plugin's named configurations for
time-shared GPUs (docs/gpu-sharing.md). Split from pools.py, which holds the pools as data.
"""

from __future__ import annotations

import json
from typing import Any

from trainstack.builders import labels
from trainstack.builders.pools import (
    GPU_PRESENT_LABEL,
    GPU_TOLERATION,
    NFD_NVIDIA_PCI_LABEL,
    NFD_WORKER_TOLERATIONS,
    RDMA_PLUGIN_IMAGE,
    gpu_daemon_tolerations,
    time_slicing_config_name,
    uses_mig,
    uses_time_slicing,
)
from trainstack.config.model import PlatformConfig, TimeSlicing
from trainstack.slices import WHOLE_GPU_RESOURCE

# The device plugin's configuration for GPUs handed out whole (the key nodes without the
# label fall back to: config.default).
DEFAULT_PLUGIN_CONFIG = "default"
PLUGIN_CONFIG_MAP = "trainstack-device-plugin"


def device_plugin_configs(cfg: PlatformConfig) -> dict[str, str]:
    """The device plugin's named configs (k8s-device-plugin v0.18.2 api/config/v1): the
    default for whole GPUs and one time-slicing config per replica count the pools use.
    renameByDefault advertises the shared GPUs as nvidia.com/gpu.shared, so a job asking for
    whole GPUs can never land on one, and the rules can tell them apart by name;
    failRequestsGreaterThanOne refuses a pod asking for two replicas of one GPU, which would
    get no more compute (README "With CUDA Time-Slicing")."""
    configs = {DEFAULT_PLUGIN_CONFIG: json.dumps({"version": "v1"})}
    for pool in cfg.gpu_pools:
        if isinstance(pool.sharing, TimeSlicing):
            replicas = pool.sharing.replicas
            configs[time_slicing_config_name(replicas)] = json.dumps(
                {
                    "version": "v1",
                    "sharing": {
                        "timeSlicing": {
                            "renameByDefault": True,
                            "failRequestsGreaterThanOne": True,
                            "resources": [{"name": WHOLE_GPU_RESOURCE, "replicas": replicas}],
                        }
                    },
                },
                sort_keys=True,
            )
    return configs


def network_operator_enabled(cfg: PlatformConfig) -> bool:
    """RDMA pools on an existing cluster get the NVIDIA Network Operator (and its NFD)."""
    return any(p.existing is not None and p.existing.rdma for p in cfg.gpu_pools)


def _term(selector: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "matchExpressions": [
            {"key": key, "operator": "In", "values": [value]} for key, value in selector
        ]
    }


def nvidia_device_plugin_values(cfg: PlatformConfig) -> dict[str, Any]:
    """The plugin (and, on existing clusters, GPU Feature Discovery) on GPU nodes only.

    On AWS every pool's node group sets nvidia.com/gpu.present (node_labels). On an existing
    cluster nothing sets it (GFD never does; the GPU operator would) and pools may select GFD
    labels such as nvidia.com/gpu.product, so GFD is on, and the plugin and GFD (which shares
    this affinity) also run on NFD's NVIDIA PCI label and on every pool's selector. The
    Network Operator brings its own NFD (v25.7.0 values.yaml: PCI classes 0300/0302 by vendor,
    `nvidia.com` labels allowed), so the chart's stays off; otherwise the chart's NFD comes
    along, tolerating the GPU taint. Chart facts: NVIDIA/k8s-device-plugin v0.18.2
    deployments/helm/nvidia-device-plugin (values.yaml, Chart.yaml, templates/daemonset-gfd.yml).
    """
    terms = [_term([(GPU_PRESENT_LABEL, "true")])]
    extra: dict[str, Any] = {}
    if cfg.cloud == "existing":
        terms.insert(0, _term([(NFD_NVIDIA_PCI_LABEL, "true")]))
        for pool in cfg.gpu_pools:
            if pool.existing is not None and _term(list(pool.existing.node_selector)) not in terms:
                terms.append(_term(list(pool.existing.node_selector)))
        extra["gfd"] = {"enabled": True}
        extra["nfd"] = (
            {"enabled": False}
            if network_operator_enabled(cfg)
            else {
                "worker": {
                    "tolerations": [
                        *NFD_WORKER_TOLERATIONS,
                        *gpu_daemon_tolerations(cfg)[1:],
                    ]
                }
            }
        )
    if cfg.gpu_device_list_strategy == "volume-mounts":
        # Each allocated GPU as a mount under /var/run/nvidia-container-devices/<UUID>, which
        # the toolkit configured by TOOLKIT_ISOLATION honours (v0.18.2 values.yaml
        # `deviceListStrategy`, `deviceIDStrategy`; the chart gives the plugin SYS_ADMIN for
        # it, templates/daemonset-device-plugin.yml, so no securityContext is set here).
        extra |= {"deviceListStrategy": "volume-mounts", "deviceIDStrategy": "uuid"}
    if uses_time_slicing(cfg):
        # Named configs, one picked per node by its DEVICE_PLUGIN_CONFIG_LABEL (chart
        # values.yaml `config.map`, `config.default`; README "Multiple Config File Example").
        extra["config"] = {"map": device_plugin_configs(cfg), "default": DEFAULT_PLUGIN_CONFIG}
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        },
        "tolerations": gpu_daemon_tolerations(cfg),
        "priorityClassName": "system-node-critical",
        **extra,
    }


def gpu_operator_values(cfg: PlatformConfig) -> dict[str, Any]:
    """The EKS accelerated AMI ships the driver and container toolkit: do not reinstall. The
    toolkit's settings come from the node's user data (TOOLKIT_ISOLATION), since the operator's
    toolkit is off; its device plugin takes the strategy from its environment, applied after
    the operator's own defaults (gpu-operator v26.3.0 deployments/gpu-operator/values.yaml
    `devicePlugin.env`; controllers/object_controls.go)."""
    values: dict[str, Any] = {
        "driver": {"enabled": False},
        "toolkit": {"enabled": False},
        # Every operand DaemonSet (device plugin, GFD, MIG manager, validator) takes these
        # (v26.3.0 controllers/object_controls.go: config.Daemonsets.Tolerations replaces the
        # pod's): with the health gate on, the gate's taint too, or a gated node would never
        # get its GPUs advertised or its MIG layout applied, so never pass its checks.
        "daemonsets": {"tolerations": gpu_daemon_tolerations(cfg)},
        # trainstack runs its own dcgm-exporter with the GPU operator too (monitoring/values.py
        # dcgm_enabled_here); the operator's, on by default (v26.3.0 values.yaml
        # dcgmExporter.enabled), would be a second one without trainstack's counters.
        "dcgmExporter": {"enabled": False},
    }
    if cfg.gpu_device_list_strategy == "volume-mounts":
        values["devicePlugin"] = {
            "env": [{"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"}]
        }
    if uses_mig(cfg):
        # mixed: each MIG profile its own resource, nvidia.com/mig-<profile> (v26.3.0
        # values.yaml `mig.strategy`, default single, which would advertise every slice as
        # an nvidia.com/gpu: quotas could not tell a slice from a GPU). The MIG manager is on
        # by default; with migManager.config.name empty it generates the all-<profile> and
        # all-balanced layouts from the hardware (values.yaml, clusterpolicy_types.go).
        values["mig"] = {"strategy": "mixed"}
        values["migManager"] = {"enabled": True}
    if uses_time_slicing(cfg):
        # The operator makes the ConfigMap from `data` (values.yaml devicePlugin.config:
        # create, name, default, data) and its plugin reads the same node label.
        values.setdefault("devicePlugin", {})["config"] = {
            "create": True,
            "name": PLUGIN_CONFIG_MAP,
            "default": DEFAULT_PLUGIN_CONFIG,
            "data": device_plugin_configs(cfg),
        }
    return values


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
        terms.append(_term(list(pool.existing.node_selector)))
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
