"""The node dataset cache (issue 24 #1) as Kubernetes objects: the cache agent's DaemonSet,
its CSIDriver and ServiceAccount (docs/prewarm.md, "One cache per node").

The agent (`trainstack-prewarm agent`, images/prewarm) runs in the system namespace, whose Pod
Security level is privileged (builders/platform.py): it owns the node's cache directory (a
hostPath), bind-mounts versions into pods (privileged, the kubelet's pods directory with
Bidirectional propagation) and serves the CSI node service on a socket the kubelet finds
through node-driver-registrar. Workload pods use an inline `csi` volume of DRIVER, which
Pod Security baseline and restricted both allow (docs/prewarm.md cites the standard).

RBAC: neither container calls the Kubernetes API (the agent talks only to the kubelet and to
the dataset store; the registrar only to the kubelet's plugin registration socket), so the
ServiceAccount gets no Role and no token is mounted. On AWS it carries an IRSA role that may
read the dataset sources (components/storage.py).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Final

from trainstack.builders import labels, netpol, scanner
from trainstack.builders.pools import (
    CACHE_NODE_LABEL,
    GPU_TOLERATION,
    has_dataset_cache,
    max_nodes,
)
from trainstack.builders.storage import CACHE_DRIVER, cache_sources, s3_read_statements
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig

# = trainstack_prewarm.csi.DRIVER_NAME (tests/builders/test_cache.py holds them equal).
DRIVER: Final = CACHE_DRIVER
NAME: Final = "trainstack-cache-agent"
# The kubelet's --root-dir is storage.nvmeCache.kubeletDir (default /var/lib/kubelet): there
# is no API that tells a CSI driver where it is (kubernetes/kubernetes#92664), and k0s
# (/var/lib/k0s/kubelet, docs.k0sproject.io "k0s directories") and MicroK8s differ.


def plugin_dir(kubelet_dir: str) -> str:
    return f"{kubelet_dir}/plugins/{DRIVER}"


def registration_dir(kubelet_dir: str) -> str:
    return f"{kubelet_dir}/plugins_registry"


SOCKET: Final = "csi.sock"
CACHE_ROOT: Final = "/cache"  # the node's cache directory inside the agent
START_JITTER_S: Final = 10  # spreads the first requests of a fleet's nodes (issue 24 #2)
# The agent's liveness probe (`trainstack-prewarm probe`: CSI Identity.Probe on its socket),
# because a hung gRPC server leaves every pod that mounts the cache on its node in
# ContainerCreating while the process looks alive. Publishes (each may wait up to 60 s for
# its fill) never take the server's last 4 threads (trainstack_prewarm.csi.RESERVED_WORKERS),
# so a probe is answered while pods wait; three unanswered probes in a row (about a minute)
# restart it; the CLI's 5 s deadline leaves the exec its Python start-up within the
# kubelet's 10 s.
PROBE_TIMEOUT_S: Final = 5
LIVENESS: Final = {"periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 3}
# node-driver-registrar's own health endpoint (v2.13.0, the registrarImage default: README
# "Health Check with the http server"; cmd/csi-node-driver-registrar/node_register.go
# httpServer): /healthz answers 200 while its registration socket exists and answers a gRPC
# GetInfo, so a registrar whose socket the kubelet lost is restarted. In the pod's network
# namespace (no hostNetwork), so the port cannot clash with anything on the node.
REGISTRAR_HEALTH_PORT: Final = 9809

# What the scanner finds in the DaemonSet and why each finding stands (builders/scanner.py).
# Everything else it checks is met: a RuntimeDefault seccomp profile for the pod (which
# confines the registrar; the runtime runs a privileged container unconfined whatever the pod
# says: containerd v1.7.29 pkg/cri/sbserver/container_create_linux.go
# generateSeccompSpecOpts), read-only root file systems, liveness probes on both containers,
# no ServiceAccount token, and a NetworkPolicy (network_policy).
_PRIVILEGED_CAPS = (
    "the agent is privileged and the runtime gives a privileged container every capability "
    "whatever its drop list says (containerd v1.7.29 pkg/cri/sbserver/container_create.go "
    "applies oci.WithPrivileged after the drop list), so a drop would only look safer; the "
    "registrar drops ALL"
)
_ROOT = (
    "uid 0 by necessity: the agent mounts (mount(2) needs CAP_SYS_ADMIN, which containerd "
    "gives a privileged container only as root since it clears ambient capabilities, "
    "container_create.go WithoutAmbientCaps) and owns the node cache directory; the registrar "
    "creates its socket in the kubelet's root-owned plugins_registry (node-driver-registrar "
    "v2.13.0 README, Required permissions)"
)
EXCEPTIONS: Final = {
    "CKV_K8S_16": (
        "a CSI node plugin: the agent bind-mounts dataset versions into pod volumes under "
        "/var/lib/kubelet/pods with Bidirectional mount propagation, which the API allows only "
        "to privileged containers (k8s.io/kubernetes v1.37.2 pkg/apis/core/validation "
        "validateMountPropagation; Kubernetes docs, Volumes, Mount propagation); the registrar "
        "is not privileged"
    ),
    "CKV_K8S_20": (
        "implied by privileged: the API refuses allowPrivilegeEscalation false together with "
        "privileged true (k8s.io/kubernetes v1.37.2 pkg/apis/core/validation "
        "ValidateSecurityContext); the registrar sets it false"
    ),
    "CKV_K8S_23": _ROOT,
    "CKV_K8S_40": _ROOT,
    "CKV_K8S_28": _PRIVILEGED_CAPS,
    "CKV_K8S_37": _PRIVILEGED_CAPS,
    "CKV_K8S_9": (
        "readiness gates Service traffic and no Service routes to a CSI node plugin: the "
        "kubelet calls it on its socket (registered by node-driver-registrar); liveness probes "
        "restart either container when it stops answering"
    ),
}


def node_request_rate(budget: float, nodes: int) -> float:
    """Each node's ceiling (requests/s to one source) so that ``nodes`` of them together stay
    within the fleet's ``budget``: ``nodes * rate <= budget`` exactly (the float quotient is
    stepped down where rounding put it above), never above the budget (``nodes < 1``: the
    whole budget). The agent counts it in whole requests per window (limits.py), which keeps
    the fleet under the budget in every one-second window without coordination."""
    if budget <= 0:
        raise ValueError(f"request-rate budget {budget!r} must be > 0")
    if nodes < 1:
        return float(budget)
    rate = budget / nodes
    while Fraction(rate) * nodes > Fraction(budget):  # exact: the quotient may round up
        rate = math.nextafter(rate, 0.0)
    return min(rate, float(budget))


def cache_nodes(cfg: PlatformConfig) -> int:
    """The most nodes the agent's DaemonSet can run on at once: the sum of the maximum sizes of
    the GPU pools it selects (aws: the pools with an instance-store array, whose nodes carry
    CACHE_NODE_LABEL; existing: each pool's nodeSelector). A node in two existing pools is
    counted twice, which only lowers each node's share."""
    return sum(max_nodes(pool) for pool in cfg.gpu_pools if has_dataset_cache(cfg, pool))


def max_request_rate(cfg: PlatformConfig) -> float:
    """The ceiling the agent gets as --max-request-rate: its share of the fleet's budget."""
    cache = cfg.storage.nvme_cache
    assert cache is not None
    return node_request_rate(cache.request_rate_budget, cache_nodes(cfg))


def _dir_parts(path: str) -> tuple[str, ...] | None:
    """The components of an absolute, normalised directory path (one trailing `/` allowed),
    else None: relative, `/` itself, or with a `.`, `..` or empty segment. The agent's
    own check (trainstack_prewarm.sources.dir_parts) is the same; tests/jobs holds the two
    layers to the same verdicts."""
    if not path.startswith("/"):
        return None
    parts = tuple(path[1:].removesuffix("/").split("/"))
    return None if any(p in {"", ".", ".."} for p in parts) else parts


def source_under(source: str, prefix: str) -> bool:
    """Is `source` inside the cache source `prefix`? S3: the key's text starts with the
    prefix, as the agent's IAM policy grants it (`s3:prefix` `prefix*`); a directory:
    component by component, both normalised, so neither `/data/sets/../../etc/` nor
    `/data/setsX/` is inside `/data/sets/`."""
    if prefix.startswith("s3://"):
        return source.startswith(prefix)
    src, root = _dir_parts(source), _dir_parts(prefix)
    return src is not None and root is not None and src[: len(root)] == root


def cache_source_issue(source: str, allowed: list[str]) -> str | None:
    """Why the node cache agent would refuse to fetch `source` (a job's cacheFrom), or None:
    the job layer refuses the job when it renders instead of leaving its pods pending."""
    if not source.startswith("s3://") and _dir_parts(source) is None:
        return (
            f"{source!r} is not a normalised absolute path (the cache agent refuses '.', '..' "
            "and empty segments); write the dataset version's directory itself, such as "
            "/fsx/datasets/imagenet/v1/"
        )
    if any(source_under(source, prefix) for prefix in allowed):
        return None
    return (
        f"{source!r} is not under a source the node cache fetches from "
        f"({', '.join(allowed) or 'none'}); the platform adds one in storage.nvmeCache.sources"
    )


def pod_labels() -> dict[str, str]:
    return {labels.APP_NAME: NAME}


def _meta(cfg: PlatformConfig, name: str, namespace: str | None = None) -> dict[str, Any]:
    return labels.app_metadata(cfg.stack, NAME, name, namespace)


def csi_driver(cfg: PlatformConfig) -> dict[str, Any]:
    """Inline (ephemeral) volumes only, no attach, pod info on mount (CSI volume context);
    `fsGroupPolicy: None`: the kubelet never chowns a read-only, shared version."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": _meta(cfg, DRIVER),
        "spec": {
            "attachRequired": False,
            "podInfoOnMount": True,
            "volumeLifecycleModes": ["Ephemeral"],
            "fsGroupPolicy": "None",
            "requiresRepublish": False,
            "storageCapacity": False,
        },
    }


def service_account(cfg: PlatformConfig, role_arn: Any = None) -> dict[str, Any]:
    metadata = _meta(cfg, NAME, SYSTEM_NAMESPACE)
    if role_arn is not None:
        metadata["annotations"] = {"eks.amazonaws.com/role-arn": role_arn}
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata,
        "automountServiceAccountToken": False,
    }


def agent_args(cfg: PlatformConfig) -> list[str]:
    cache = cfg.storage.nvme_cache
    assert cache is not None
    args = [
        "agent",
        "--cache", CACHE_ROOT,
        "--csi-endpoint", f"unix:///csi/{SOCKET}",
        "--node-id", "$(NODE_NAME)",
        "--concurrency", str(cache.max_concurrent_fetches),
        "--max-request-rate", repr(max_request_rate(cfg)),
        "--start-jitter", str(START_JITTER_S),
        "--reserve", f"{cache.reserve_percent:g}",
    ]  # fmt: skip
    for source in cache_sources(cfg):
        args += ["--allow-source", source]
    return args


def probe_command() -> list[str]:
    return [
        "trainstack-prewarm", "probe",
        "--csi-endpoint", f"unix:///csi/{SOCKET}",
        "--timeout", str(PROBE_TIMEOUT_S),
    ]  # fmt: skip


def _host(name: str, path: str, kind: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def directory_sources(cfg: PlatformConfig) -> list[str]:
    """The directory sources (`/fsx/datasets/`): the agent reads them from its own file
    system, so each is mounted into it (daemonset)."""
    return [s for s in cache_sources(cfg) if not s.startswith("s3://")]


def daemonset(cfg: PlatformConfig) -> dict[str, Any]:
    cache = cfg.storage.nvme_cache
    assert cache is not None
    kubelet = cache.kubelet_dir
    # Each directory source, read-only at its own path (the agent fetches the path a job
    # names). type Directory: where the node lacks it (the file system is not mounted) the
    # agent does not start, rather than fill from an empty directory made on the root volume.
    # No mountPropagation: a host mount made later under it is not seen (restart the agent),
    # and nothing the agent mounts can reach the host through it.
    sources = [(f"source-{i}", path.rstrip("/")) for i, path in enumerate(directory_sources(cfg))]
    agent: dict[str, Any] = {
        "name": "agent",
        "image": cache.agent_image,
        "args": agent_args(cfg),
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        # Bind mounts into pods need CAP_SYS_ADMIN and Bidirectional propagation, which the
        # API allows only to privileged containers (EXCEPTIONS). Its root file system is
        # read-only: it writes only under /cache (versions, its state, the staging mounts:
        # trainstack_prewarm agent.py, cli.py build_agent) and its socket under /csi.
        "securityContext": {
            "privileged": True,
            "runAsUser": 0,
            "runAsNonRoot": False,
            "readOnlyRootFilesystem": True,
        },
        "livenessProbe": {
            "exec": {"command": probe_command()},
            **LIVENESS,
        },
        "resources": {
            "requests": {"cpu": "500m", "memory": "1Gi"},
            "limits": {"cpu": "4", "memory": "4Gi"},
        },
        "volumeMounts": [
            {"name": "cache", "mountPath": CACHE_ROOT},
            {"name": "plugin", "mountPath": "/csi"},
            {
                "name": "pods",
                # The same path as on the host: the kubelet names targets by host path.
                "mountPath": f"{kubelet}/pods",
                "mountPropagation": "Bidirectional",
            },
            *({"name": name, "mountPath": path, "readOnly": True} for name, path in sources),
        ],
    }
    registrar: dict[str, Any] = {
        "name": "node-driver-registrar",
        "image": cache.registrar_image,  # storage.nvmeCache.registrarImage
        "args": [
            f"--csi-address=/csi/{SOCKET}",
            f"--kubelet-registration-path={plugin_dir(kubelet)}/{SOCKET}",
            f"--http-endpoint=:{REGISTRAR_HEALTH_PORT}",
        ],
        "ports": [{"name": "healthz", "containerPort": REGISTRAR_HEALTH_PORT}],
        # As upstream's example DaemonSet probes it (README, "Example").
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "healthz"},
            "initialDelaySeconds": 5,
            "timeoutSeconds": 5,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "100m", "memory": "64Mi"},
        },
        "volumeMounts": [
            {"name": "plugin", "mountPath": "/csi"},
            {"name": "registration", "mountPath": "/registration"},
        ],
    }
    pod: dict[str, Any] = {
        "serviceAccountName": NAME,
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "priorityClassName": "system-node-critical",
        "tolerations": [GPU_TOLERATION],
        "containers": [agent, registrar],
        "volumes": [
            # The cache directory must exist (aws: the node's user data makes it on the
            # instance-store array); never created on the root volume.
            _host("cache", cache.host_dir, "Directory"),
            _host("plugin", plugin_dir(kubelet), "DirectoryOrCreate"),
            _host("registration", registration_dir(kubelet), "Directory"),
            _host("pods", f"{kubelet}/pods", "Directory"),
            *(_host(name, path, "Directory") for name, path in sources),
        ],
    }
    if cfg.cloud == "aws":
        # Only nodes with the cache directory: elsewhere the hostPath (type Directory) keeps
        # the agent from starting, the rollout never completes and a cached job waits forever.
        pod["nodeSelector"] = {CACHE_NODE_LABEL: "true"}
    else:
        # Only the pools' nodes, so that cache_nodes() bounds the agents and their budget.
        terms = [
            {"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in sel]}
            for sel in dict.fromkeys(p.existing.node_selector for p in cfg.gpu_pools if p.existing)
        ]
        if terms:
            pod["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
                }
            }
    reasons = {**EXCEPTIONS, **scanner.unpinned_image_reasons([agent["image"], registrar["image"]])}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": scanner.annotate(_meta(cfg, NAME, SYSTEM_NAMESPACE), reasons),
        "spec": {
            "selector": {"matchLabels": pod_labels()},
            # An agent replaced while pods run re-takes their holds first (agent.recover).
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": pod_labels()}, "spec": pod},
        },
    }


def network_policy(cfg: PlatformConfig) -> dict[str, Any]:
    """No ingress: the kubelet reaches both containers through sockets on the node and probes
    them from the node. Egress only where it fetches over the network: DNS and HTTPS for S3
    sources (and STS for its IRSA role); a directory source is a mount on the node, so with
    only those the agent reaches nothing."""
    s3 = any(source.startswith("s3://") for source in cache_sources(cfg))
    egress = [netpol.dns_egress(), netpol.https_egress()] if s3 else []
    return netpol.network_policy(cfg, NAME, ingress=[], egress=egress)


def s3_read_policy(cfg: PlatformConfig) -> dict[str, Any] | None:
    """The agent's IAM policy: list and read its S3 sources, nothing else (None: no S3)."""
    statements: list[dict[str, Any]] = []
    for i, source in enumerate(s for s in cache_sources(cfg) if s.startswith("s3://")):
        bucket, _, prefix = source.removeprefix("s3://").partition("/")
        statements += s3_read_statements(bucket, prefix, f"Source{i}")
    return {"Version": "2012-10-17", "Statement": statements} if statements else None
