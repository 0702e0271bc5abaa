"""Resource arithmetic on live objects: Kubernetes quantities, pod and job requests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from trainstack import kube
from trainstack.builders.fabric import GPU_RESOURCE
from trainstack.explain.model import Obj

GPU = GPU_RESOURCE  # what every check counts


def quantity(value: Any) -> float:
    """A Kubernetes quantity (`8`, `500m`, `16Gi`) as a number (the client's parser); 0 for
    nothing readable: a live object's odd value must not stop the answer."""
    try:
        return kube.quantity(value if isinstance(value, int | float) else str(value))
    except ValueError:
        return 0.0


def add(total: dict[str, float], more: Mapping[str, float], times: float = 1.0) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0.0) + value * times


def pod_spec_requests(spec: Obj) -> dict[str, float]:
    """What the scheduler counts for one pod: the sum of its containers' requests (limits
    where no request is set, as the API server defaults them), at least the largest init
    container's."""
    total: dict[str, float] = {}
    for container in spec.get("containers") or []:
        add(total, _container(container))
    for container in spec.get("initContainers") or []:
        for key, value in _container(container).items():
            total[key] = max(total.get(key, 0.0), value)
    return total


def _container(container: Obj) -> dict[str, float]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {k: quantity(v) for k, v in merged.items()}


def task_requests(task: Obj) -> dict[str, float]:
    """What one pod of a Volcano Job's task requests (its pod template)."""
    return pod_spec_requests(task.get("template", {}).get("spec", {}))


def job_gpus(job: Obj) -> int:
    """GPUs the Job asks for: each task's pod template x its replicas."""
    total = 0.0
    for task in job.get("spec", {}).get("tasks") or []:
        total += task_requests(task).get(GPU, 0.0) * int(task.get("replicas", 1))
    return int(total)


def bound_requests(pods: Iterable[Obj]) -> dict[str, dict[str, float]]:
    """node -> what its bound, unfinished pods request."""
    used: dict[str, dict[str, float]] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        add(used.setdefault(str(node), {}), pod_spec_requests(pod.get("spec", {})))
    return used


def timestamp(text: Any) -> float | None:
    """An RFC 3339 time from the API (`2026-12-06T03:29:43Z`) as Unix seconds."""
    if not text:
        return None
    try:
        return kube.rfc3339_seconds(str(text))
    except ValueError:
        return None


def age(seconds: float) -> str:
    """`kubectl`'s style: 45s, 12m, 3h, 2d."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def span(seconds: float) -> str:
    """A duration as a person reads it: 40s, 12m, 24h, 24.2h."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{round(seconds / 3600, 1):g}h"


def fmt(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value / 2**30:.0f}Gi"
