"""The maximum-duration enforcer (images/deadlines, docs/deadlines.md) as Kubernetes objects:
a Deployment in the system namespace, its ServiceAccount, least-privilege RBAC and its state
ConfigMap. The PodMonitor and the alerts are monitoring's (builders/monitoring).

RBAC, per what the program calls (trainstack_deadlines.controller):

- in each **team** namespace, through a RoleBinding to one ClusterRole: Volcano Jobs `get`,
  `list`; Commands `get`, `list`, `create`. No `update` or `delete` of anything: it stops a
  job only by asking Volcano to. Nothing outside team namespaces.
- in the **system** namespace: `get` and `patch` of its own state ConfigMap, by name. The
  platform creates that ConfigMap (empty), so the program needs no `create`.

The team registry (namespaces, `maxJobHours`) reaches it as the platform's registry ConfigMap,
mounted: no API read of namespaces or ConfigMaps.
"""

from __future__ import annotations

from typing import Any, Final

from trainstack.builders import containers, labels, netpol, scanner
from trainstack.builders.platform import PLATFORM_CONFIGMAP
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig
from trainstack.contracts import deadlines as contract

NAME: Final = contract.SERVICE_ACCOUNT
STATE_ROLE: Final = f"{NAME}-state"
APP_LABEL: Final = labels.APP_NAME
CONTAINER: Final = "enforcer"
RBAC: Final = "rbac.authorization.k8s.io/v1"
REGISTRY_DIR: Final = contract.REGISTRY_PATH.rsplit("/", 1)[0]
assert contract.SYSTEM_NAMESPACE == SYSTEM_NAMESPACE

# What the program does with each resource (controller.py), nothing more.
TEAM_RULES: Final[list[dict[str, Any]]] = [
    {"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"], "verbs": ["get", "list"]},
    {
        "apiGroups": ["bus.volcano.sh"],
        "resources": ["commands"],
        "verbs": ["get", "list", "create"],
    },
]
STATE_RULES: Final[list[dict[str, Any]]] = [
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [contract.STATE_CONFIGMAP],
        "verbs": ["get", "patch"],
    }
]


# What the scanner finds in the Deployment and why it stands (builders/scanner.py); the rest of
# what it checks is met (non-root, read-only root, no capabilities, seccomp, probes, and
# network_policy).
EXCEPTIONS: Final = {
    "CKV_K8S_38": (
        "the enforcer calls the API server as its ServiceAccount with the mounted token "
        "(images/deadlines trainstack_deadlines/kube.py Access.in_cluster): it lists Volcano "
        "Jobs and creates Commands in team namespaces and patches its state ConfigMap, and its "
        "RBAC allows only that (TEAM_RULES and STATE_RULES in builders/deadlines.py)"
    ),
}


def pod_labels() -> dict[str, str]:
    return {APP_LABEL: NAME}


def _meta(cfg: PlatformConfig, name: str, namespace: str | None = None) -> dict[str, Any]:
    return labels.app_metadata(cfg.stack, NAME, name, namespace)


def _subject() -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": NAME, "namespace": SYSTEM_NAMESPACE}


def service_account(cfg: PlatformConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(cfg, NAME, SYSTEM_NAMESPACE),
    }


def cluster_role(cfg: PlatformConfig) -> dict[str, Any]:
    """Granted only in team namespaces (`team_binding`), never cluster-wide."""
    return {
        "apiVersion": RBAC,
        "kind": "ClusterRole",
        "metadata": _meta(cfg, NAME),
        "rules": TEAM_RULES,
    }


def team_binding(cfg: PlatformConfig, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": RBAC,
        "kind": "RoleBinding",
        "metadata": _meta(cfg, NAME, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [_subject()],
    }


def state_role(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Role and RoleBinding: its own state ConfigMap, by name."""
    return [
        {
            "apiVersion": RBAC,
            "kind": "Role",
            "metadata": _meta(cfg, STATE_ROLE, SYSTEM_NAMESPACE),
            "rules": STATE_RULES,
        },
        {
            "apiVersion": RBAC,
            "kind": "RoleBinding",
            "metadata": _meta(cfg, STATE_ROLE, SYSTEM_NAMESPACE),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": STATE_ROLE,
            },
            "subjects": [_subject()],
        },
    ]


def state_configmap(cfg: PlatformConfig) -> dict[str, Any]:
    """Created empty; only the enforcer writes its keys (one per Job UID). No `data` here, so
    a later `pulumi up` (server-side apply) owns none of them and leaves them alone."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cfg, contract.STATE_CONFIGMAP, SYSTEM_NAMESPACE),
    }


def args(cfg: PlatformConfig) -> list[str]:
    d = cfg.scheduling.deadlines
    return [
        "--interval", str(d.interval_seconds),
        "--margin", str(d.margin_seconds),
        "--registry", contract.REGISTRY_PATH,
        "--state", f"{SYSTEM_NAMESPACE}/{contract.STATE_CONFIGMAP}",
        "--port", str(contract.METRICS_PORT),
    ]  # fmt: skip


def deployment(cfg: PlatformConfig) -> dict[str, Any]:
    """One replica, replaced with `Recreate`, so two enforcers never run at once (their
    Commands could not be duplicated anyway: a Command's name is its job's UID)."""
    d = cfg.scheduling.deadlines
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": d.image,
        "args": args(cfg),
        "ports": [{"name": "metrics", "containerPort": contract.METRICS_PORT}],
        # /healthz fails when no pass ended for 3 intervals + 60 s (trainstack_deadlines.cli).
        **containers.healthz_probes("metrics", period=30, failures=3),
        "resources": containers.controller_resources(),
        "securityContext": containers.hardened(),
        "volumeMounts": [{"name": "registry", "mountPath": REGISTRY_DIR, "readOnly": True}],
    }
    registry = {
        "name": "registry",
        # The kubelet refreshes a ConfigMap volume (no subPath): a new team is seen without a
        # restart.
        "configMap": {
            "name": PLATFORM_CONFIGMAP,
            "items": [{"key": "registry.json", "path": "registry.json"}],
        },
    }
    pod = containers.controller_pod(cfg, NAME, container, [registry])
    reasons = {**EXCEPTIONS, **scanner.unpinned_image_reasons([d.image])}
    return containers.singleton_deployment(
        scanner.annotate(_meta(cfg, NAME, SYSTEM_NAMESPACE), reasons), pod_labels(), pod
    )


def network_policy(cfg: PlatformConfig) -> dict[str, Any]:
    """Prometheus scrapes its metrics port (monitoring's PodMonitor); it calls only the API
    server, at KUBERNETES_SERVICE_HOST. That is the `kubernetes` Service's address as the
    kubelet sets it, but a cluster's admission webhook may put a host name there instead
    (Gardener's kubernetes-service-host webhook; AKS's set-kube-service-host-fqdn), so
    cluster DNS is allowed too."""
    return netpol.network_policy(
        cfg,
        NAME,
        ingress=[netpol.monitoring_ingress(contract.METRICS_PORT)],
        egress=[netpol.dns_egress(), netpol.api_server_egress(cfg)],
    )
