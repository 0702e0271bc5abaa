"""Pod pieces shared by trainstack's own controllers (deadline enforcer, health repair,
health agent): one place for the hardened security context, the /healthz probes, the small
controller's resources and its single-replica Deployment, so a fix to one reaches all of them."""

from __future__ import annotations

from typing import Any

from trainstack.builders import labels
from trainstack.config.model import PlatformConfig


# What the restricted Pod Security Standard asks of a container, plus a read-only root: the
# controllers write nothing to disk.
# Functions, not shared dicts: a manifest is data that later steps may edit in place.
def hardened() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


# A controller holding a watch and a few pages of objects: 64 MiB, bursts to 256 MiB.
def controller_resources() -> dict[str, Any]:
    return {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }


def healthz_probes(port: str, *, period: int = 30, failures: int = 3) -> dict[str, Any]:
    """Liveness and readiness on one /healthz. Readiness on the same endpoint: the workload is
    available (what `pulumi up` awaits, and what kube-state-metrics reports) once the server
    answers, and not while its passes stall."""
    get = {"path": "/healthz", "port": port}
    return {
        "livenessProbe": {
            "httpGet": dict(get),
            "periodSeconds": period,
            "failureThreshold": failures,
        },
        "readinessProbe": {"httpGet": dict(get), "periodSeconds": 10},
    }


def controller_pod(
    cfg: PlatformConfig,
    service_account: str,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
) -> dict[str, Any]:
    """A controller's pod: non-root (the images' user 10001), the runtime's seccomp profile,
    on the system nodes where the platform has them (AWS)."""
    pod: dict[str, Any] = {
        "serviceAccountName": service_account,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if cfg.cloud == "aws":
        pod["nodeSelector"] = {labels.ROLE: "system"}
    return pod


def singleton_deployment(
    metadata: dict[str, Any], selector: dict[str, str], pod: dict[str, Any]
) -> dict[str, Any]:
    """One replica, replaced with Recreate: two copies of a controller never run at once."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": dict(selector)}, "spec": pod},
        },
    }
