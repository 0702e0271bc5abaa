"""The GPU node health gate (issue 42, docs/health.md) as Kubernetes objects: the expectations
ConfigMap, the node agent's DaemonSet and the repair controller's Deployment; their
NetworkPolicies come from builders/health_netpol.py, the identities, RBAC and admission policies
from builders/health_access.py.

Names, the taint, the files and the port are the health contract's (trainstack/contracts/
health.py), which the programs in images/health import too; the PodMonitors and alerts are
monitoring's (builders/monitoring/health.py), which select the pods by AGENT_APP / REPAIR_APP.
"""

from __future__ import annotations

import json
from typing import Any, Final

from trainstack.builders import containers, health_access, health_netpol, labels, prepull, scanner
from trainstack.builders.monitoring.health import AGENT_APP, REPAIR_APP
from trainstack.builders.pools import GPU_TOLERATION, instance_of, pool_selector
from trainstack.builders.pools import HEALTH_TOLERATION as POOLS_HEALTH_TOLERATION
from trainstack.config.model import SYSTEM_NAMESPACE, GpuPool, PlatformConfig
from trainstack.contracts import health as contract

assert contract.SYSTEM_NAMESPACE == SYSTEM_NAMESPACE
assert contract.AGENT_SERVICE_ACCOUNT == AGENT_APP
assert contract.REPAIR_SERVICE_ACCOUNT == REPAIR_APP
assert contract.PREPULL_APP == prepull.APP
assert contract.APP_LABEL == labels.APP_NAME

AGENT: Final = contract.AGENT_SERVICE_ACCOUNT
REPAIR: Final = contract.REPAIR_SERVICE_ACCOUNT
EXPECTATIONS_KEY: Final = "expectations.json"
EXPECTATIONS_DIR, _, EXPECTATIONS_FILE = contract.EXPECTATIONS_PATH.rpartition("/")
assert EXPECTATIONS_FILE == EXPECTATIONS_KEY
PROGRAM: Final = contract.PROG  # the image's entry point (images/health pyproject.toml)

# The agent tolerates its own taint whatever its value (pending, checking, failed: it must
# keep running on a failed node to re-check it) and the GPU pools' taint.
HEALTH_TOLERATION: Final = POOLS_HEALTH_TOLERATION

# What the scanner finds in the agent's DaemonSet and why each finding stands
# (builders/scanner.py). The rest is met: seccomp RuntimeDefault for the pod, probes, a
# NetworkPolicy, resource requests and limits, a digest in production.
_PRIVILEGED_CAPS = (
    "the agent is privileged and containerd gives a privileged container every capability "
    "whatever its drop list says (containerd v1.7.29 pkg/cri/sbserver/container_create.go "
    "applies oci.WithPrivileged after the drop list), so a drop would only look safer"
)
_ROOT = (
    "uid 0 by necessity: DCGM's diagnostic, the ECC and XID probes and the fabric probes open "
    "the host's GPU, kernel log and RDMA devices, root-owned on the node (docs/health.md, "
    "The agent's privileges)"
)
AGENT_EXCEPTIONS: Final = {
    "CKV_K8S_16": (
        "the node agent checks the node's hardware: the kernel log (/dev/kmsg, XID errors), "
        "every GPU through the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES all is honoured only "
        "for privileged containers under the volume-mounts strategy) and the RDMA devices; "
        "a privileged container gets every host device (containerd v1.7.29 "
        "pkg/cri/sbserver/container_create_linux.go oci.WithHostDevices)"
    ),
    "CKV_K8S_20": (
        "implied by privileged: the API refuses allowPrivilegeEscalation false together with "
        "privileged true (k8s.io/kubernetes v1.37.2 pkg/apis/core/validation "
        "ValidateSecurityContext)"
    ),
    "CKV_K8S_22": (
        "DCGM's diagnostic and NCCL write logs and scratch files where their own defaults say; "
        "a read-only root file system would not confine a privileged container, which can "
        "remount anything (docs/health.md, The agent's privileges)"
    ),
    "CKV_K8S_23": _ROOT,
    "CKV_K8S_40": _ROOT,
    "CKV_K8S_28": _PRIVILEGED_CAPS,
    "CKV_K8S_37": _PRIVILEGED_CAPS,
    "CKV_K8S_38": (
        "the agent patches its own Node (the health taint and labels) and creates Events "
        "with its pod-bound token, whose node name the admission policy "
        "trainstack-health-agent-own-node compares with the Node it changes "
        "(builders/health_access.py agent_policy)"
    ),
}
REPAIR_EXCEPTIONS: Final = {
    "CKV_K8S_38": (
        "the repair controller lists nodes, evicts training pods in team namespaces and "
        "patches the repair labels with its token; RBAC and the admission policy "
        "trainstack-health-repair-node-fields allow only that (builders/health_access.py)"
    ),
}


def _meta(cfg: PlatformConfig, app: str, name: str) -> dict[str, Any]:
    return labels.app_metadata(cfg.stack, app, name, SYSTEM_NAMESPACE)


def pod_labels(app: str) -> dict[str, str]:
    """The pods' labels: what the PodMonitors and NetworkPolicies select."""
    return {labels.APP_NAME: app}


def pools_of(cfg: PlatformConfig) -> tuple[GpuPool, ...]:
    """The pools the gate covers: every GPU pool (none: nothing is deployed)."""
    return cfg.gpu_pools if cfg.health.enabled else ()


# --- expectations ------------------------------------------------------------------------


def pool_expectations(cfg: PlatformConfig, pool: GpuPool) -> dict[str, Any]:
    """What a healthy node of `pool` looks like, in the contract's format. AWS pools from the
    catalog; an existing pool from its declaration, which names no instance type (so no
    model and no bandwidth floor) and no link rate (ibRateGbps null: ports need only be
    active)."""
    level = cfg.health.dcgm_level
    # With image pre-pull on, a new node's check waits for the pool's images (docs/prepull.md);
    # gateMinutes 0: it does not wait.
    pulls = pool in prepull.pools_of(cfg)
    gate = (cfg.pre_pull.gate_minutes * 60 or None) if pulls else None
    if pool.aws is not None:
        instance = instance_of(pool)
        return {
            "instanceType": instance.name,
            "gpus": instance.gpus,
            "gpuModel": instance.gpu_model,
            # EFA interfaces exist only where the launch template lays them out (fabric efa).
            "efaDevices": instance.efa_devices if pool.fabric == "efa" else 0,
            "ibPorts": 0,  # no InfiniBand or RoCE on EC2: its RDMA is EFA
            "ibRateGbps": None,
            "busbwFloorGBps": instance.busbw_floor_gbps,
            "dcgmLevel": level,
            "prePullGateSeconds": gate,
        }
    assert pool.existing is not None
    rdma = pool.existing.rdma
    return {
        "instanceType": None,
        "gpus": pool.existing.gpus_per_node,
        "gpuModel": None,
        "efaDevices": 0,
        # One RDMA port per interface the pool declares for the RDMA device plugin.
        "ibPorts": len(rdma.interfaces) if rdma is not None else 0,
        "ibRateGbps": None,
        "busbwFloorGBps": None,
        "dcgmLevel": level,
        "prePullGateSeconds": gate,
    }


def expectations(cfg: PlatformConfig) -> dict[str, Any]:
    """The ConfigMap's expectations.json: contracts/health.py documents the format."""
    health = cfg.health
    repair = health.repair
    return {
        "pools": {pool.name: pool_expectations(cfg, pool) for pool in pools_of(cfg)},
        "recheckSeconds": health.recheck_minutes * 60,
        "repair": {
            "mode": repair.mode,
            "hookUrl": repair.hook_url,
            "delaySeconds": repair.delay_minutes * 60,
            "region": cfg.aws.region if cfg.aws is not None else None,
            "clusterName": cfg.cluster_name,
            "prometheusUrl": repair.prometheus_url,
            "stragglerAlerts": health.straggler_alerts,
        },
    }


def configmap(cfg: PlatformConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": labels.app_metadata(cfg.stack, AGENT, contract.CONFIGMAP, SYSTEM_NAMESPACE),
        "data": {EXPECTATIONS_KEY: json.dumps(expectations(cfg), indent=2, sort_keys=True)},
    }


def _expectations_volume() -> dict[str, Any]:
    # No subPath: the kubelet refreshes a ConfigMap volume, so a new pool or setting reaches
    # running pods without a restart.
    return {
        "name": "expectations",
        "configMap": {
            "name": contract.CONFIGMAP,
            "items": [{"key": EXPECTATIONS_KEY, "path": EXPECTATIONS_FILE}],
        },
    }


def _expectations_mount() -> dict[str, Any]:
    return {"name": "expectations", "mountPath": EXPECTATIONS_DIR, "readOnly": True}


# --- the agent -----------------------------------------------------------------------------


def node_affinity(cfg: PlatformConfig) -> dict[str, Any]:
    """The GPU pools' nodes and no others. On AWS every GPU node, and only a GPU node, carries
    the pool label (pools.node_labels; the system node group has none), so one term matches
    them all and adding a pool does not roll every agent. An existing cluster's pools are
    whatever their selectors say: one term per selector (terms are ORed)."""
    terms: list[dict[str, Any]]
    if cfg.cloud == "aws":
        terms = [{"matchExpressions": [{"key": contract.POOL_LABEL, "operator": "Exists"}]}]
    else:
        selectors = dict.fromkeys(
            tuple(sorted(pool_selector(cfg, p).items())) for p in pools_of(cfg)
        )
        terms = [
            {"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in sel]}
            for sel in selectors
        ]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


def agent_daemonset(cfg: PlatformConfig) -> dict[str, Any]:
    image = cfg.health.image
    container: dict[str, Any] = {
        "name": "agent",
        "image": image,
        "command": [PROGRAM],
        "args": ["agent", "--metrics-port", str(contract.METRICS_PORT)],
        "env": [
            # The node it checks and may change (the admission policy holds it to this one).
            {
                "name": contract.NODE_NAME_ENV,
                "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
            },
            # Every GPU of the node, without requesting any: the agent must run beside the
            # training pods that hold them. The NVIDIA container runtime injects the devices
            # and driver libraries this variable names; on nodes whose toolkit refuses it from
            # unprivileged containers (deviceListStrategy volume-mounts, builders/pools.py
            # TOOLKIT_ISOLATION) it still honours it from a privileged one (NVIDIA,
            # "Preventing unprivileged access to GPUs in Kubernetes"). Not requesting
            # nvidia.com/gpu also keeps the device plugin from counting the GPUs as taken.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        ],
        "ports": [{"name": "metrics", "containerPort": contract.METRICS_PORT}],
        # /healthz answers 200 while steps keep ending, and through one long step (DCGM level
        # 3 takes about 15 minutes) for up to 3 hours (trainstack_health cli.py STEP_LIMIT_S).
        **containers.healthz_probes("metrics", period=30, failures=4),
        # Privileged: see AGENT_EXCEPTIONS and docs/health.md. hostPID stays false: the probes
        # read devices and sysfs, not other processes.
        "securityContext": {"privileged": True, "runAsUser": 0, "runAsNonRoot": False},
        # The all-reduce and DCGM's diagnostic run on the GPUs; on the CPU side they need a
        # core and a few GiB of pinned host memory for NCCL's buffers.
        "resources": {
            "requests": {"cpu": "250m", "memory": "512Mi"},
            "limits": {"cpu": "4", "memory": "8Gi"},
        },
        "volumeMounts": [_expectations_mount()],
    }
    pod: dict[str, Any] = {
        "serviceAccountName": AGENT,
        # The default projected token is bound to this pod and carries its node's name in
        # the API server's userInfo.extra (contracts.health.NODE_NAME_EXTRA, Kubernetes 1.32+,
        # config/health.py), which the admission policy checks.
        "automountServiceAccountToken": True,
        "hostPID": False,
        "priorityClassName": "system-node-critical",
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "tolerations": [HEALTH_TOLERATION, GPU_TOLERATION],
        "affinity": node_affinity(cfg),
        "containers": [container],
        "volumes": [_expectations_volume()],
    }
    reasons = {**AGENT_EXCEPTIONS, **scanner.unpinned_image_reasons([image])}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": scanner.annotate(_meta(cfg, AGENT_APP, AGENT), reasons),
        "spec": {
            "selector": {"matchLabels": pod_labels(AGENT_APP)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": pod_labels(AGENT_APP)}, "spec": pod},
        },
    }


# --- the repair controller -----------------------------------------------------------------


def repair_deployment(cfg: PlatformConfig) -> dict[str, Any]:
    """One replica, replaced with Recreate: two controllers could drain or replace one node
    twice."""
    image = cfg.health.image
    container: dict[str, Any] = {
        "name": "repair",
        "image": image,
        "command": [PROGRAM],
        "args": ["repair", "--metrics-port", str(contract.METRICS_PORT)],
        "ports": [{"name": "metrics", "containerPort": contract.METRICS_PORT}],
        # /healthz fails when no pass ended for 3 intervals + 60 s (trainstack_health
        # repair/cli.py).
        **containers.healthz_probes("metrics", period=30, failures=3),
        "resources": containers.controller_resources(),
        "securityContext": containers.hardened(),
        "volumeMounts": [_expectations_mount()],
    }
    pod = containers.controller_pod(cfg, REPAIR, container, [_expectations_volume()])
    reasons = {**REPAIR_EXCEPTIONS, **scanner.unpinned_image_reasons([image])}
    return containers.singleton_deployment(
        scanner.annotate(_meta(cfg, REPAIR_APP, REPAIR), reasons), pod_labels(REPAIR_APP), pod
    )


# The Events the programs write about Nodes go where the kubelet writes its node events,
# namespace "default" (contracts.health.EVENT_NAMESPACE), so the Roles that allow creating
# them live there (builders/health_access.py); the scanner's CKV_K8S_21 flags any object there.
DEFAULT_NAMESPACE_REASON: Final = (
    "Events about a Node go to namespace default, where the kubelet reports node events "
    "(contracts/health.py EVENT_NAMESPACE); this Role and its binding grant only create on "
    "events there (builders/health_access.py EVENT_RULE)"
)


def access(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """builders/health_access.py's identities, RBAC and admission policies, with the
    scanner's exception on the objects that must live in namespace default."""
    made = health_access.access_objects(cfg)
    for manifest in made:
        if manifest["metadata"].get("namespace") == contract.EVENT_NAMESPACE:
            scanner.annotate(manifest["metadata"], {"CKV_K8S_21": DEFAULT_NAMESPACE_REASON})
    return made


def objects(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Everything the gate deploys in Kubernetes, in creation order (none with the gate off or
    no GPU pool): admission and RBAC first, then the expectations, then the workloads."""
    if not pools_of(cfg):
        return []
    return [
        *access(cfg),
        configmap(cfg),
        health_netpol.agent_network_policy(cfg),
        health_netpol.repair_network_policy(cfg),
        agent_daemonset(cfg),
        repair_deployment(cfg),
    ]
