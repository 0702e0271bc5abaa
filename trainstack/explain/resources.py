"""Resource arithmetic on live objects: Kubernetes quantities, pod and job requests."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from trainstack.explain.model import Obj

GPU = "nvidia.com/gpu"  # builders/fabric.GPU_RESOURCE; kept here so this layer stays small
_SUFFIX = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip
_QUANTITY = re.compile(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)")


def quantity(value: Any) -> float:
    """A Kubernetes quantity (`8`, `500m`, `16Gi`) as a number; 0 for nothing readable."""
    if isinstance(value, int | float):
        return float(value)
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None or match[2] not in _SUFFIX:
        return 0.0
    return float(match[1]) * _SUFFIX[match[2]]


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


def job_gpus(job: Obj) -> int:
    """GPUs the Job asks for: each task's pod template x its replicas."""
    total = 0.0
    for task in job.get("spec", {}).get("tasks") or []:
        per = pod_spec_requests(task.get("template", {}).get("spec", {})).get(GPU, 0.0)
        total += per * int(task.get("replicas", 1))
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
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
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
