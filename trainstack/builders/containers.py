"""Container pieces shared by trainstack's own controllers (deadline enforcer, health repair,
health agent): one place for the hardened security context, the /healthz probes and the small
controller's resources, so a fix to one reaches all of them."""

from __future__ import annotations

from typing import Any


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
