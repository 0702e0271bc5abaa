"""A job on a pool cut into slices (gpuSharing, docs/gpu-sharing.md): which slice each replica
gets, and the rules that keep slices to the jobs they suit.

The pool's slices come from the platform stack's output (builders/pools.pool_output "slices"):
each a resource the device plugin advertises (nvidia.com/mig-<profile> or
nvidia.com/gpu.shared), how many per GPU, and the memory a replica may count on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainstack.catalog import catalog
from trainstack.config.errors import ConfigIssue
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.spec import JobSpec, memory_bytes
from trainstack.policy.isolation import SHARED_GPUS_ALLOW, SHARED_GPUS_ANNOTATION
from trainstack.slices import Slice, smallest_fit


def slices(pool: Mapping[str, Any]) -> tuple[Slice, ...]:
    return tuple(Slice.from_json(s) for s in pool.get("slices") or [] if isinstance(s, Mapping))


def chosen(spec: JobSpec, pool: Mapping[str, Any]) -> Slice | None:
    """The smallest slice of the pool that holds the job's gpuMemory; None on a pool of whole
    GPUs, or when none holds it."""
    wanted = memory_bytes(spec.workers.gpu_memory) if spec.workers.gpu_memory else None
    return smallest_fit(slices(pool), wanted)


def devices(spec: JobSpec, pool: Mapping[str, Any]) -> dict[str, str] | None:
    """What a worker replica requests on a sliced pool: one slice (None: whole GPUs)."""
    if not slices(pool):
        return None
    pick = chosen(spec, pool)
    assert pick is not None, "slice_issues refuses a job no slice holds"
    return {pick.resource: "1"}


def _describe(pool: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{s.profile} ({s.memory_gb:g} GB)" if s.memory_gb is not None else s.profile
        for s in slices(pool)
    )


def _holding(spec: JobSpec, view: PlatformView) -> list[str]:
    """Pools where the job's gpuMemory fits: a slice that holds it, or whole GPUs as large."""
    assert spec.workers.gpu_memory is not None
    wanted = memory_bytes(spec.workers.gpu_memory)
    found = []
    for name in view.pool_names():
        pool = view.pool(name) or {}
        if slices(pool):
            pick = chosen(spec, pool)
            if pick is not None:
                found.append(f"{name} ({pick.profile})")
        elif (
            pool.get("instanceType") in catalog()
            and catalog()[pool["instanceType"]].gpu_memory_gib * 2**30 >= wanted
        ):
            found.append(f"{name} (whole GPUs)")
    return found


def slice_issues(spec: JobSpec, view: PlatformView, pool: Mapping[str, Any]) -> list[ConfigIssue]:
    """A job on a sliced pool: one slice per replica, one that holds its gpuMemory, and on
    time-shared GPUs one replica unless the spec allows more (sharedGpus)."""
    offered = slices(pool)
    if not offered:
        return []
    issues: list[ConfigIssue] = []
    if spec.workers.gpu_memory is None:
        issues.append(
            ConfigIssue(
                "job.spec.workers.gpuMemory",
                f"required on pool {spec.pool}, whose GPUs are cut into slices "
                f"({_describe(pool)}) and has no whole GPUs: give the GPU memory a replica "
                "needs and it gets the smallest slice that holds it, or choose a pool of "
                "whole GPUs",
            )
        )
    elif chosen(spec, pool) is None:
        where = _holding(spec, view)
        issues.append(
            ConfigIssue(
                "job.spec.workers.gpuMemory",
                f"{spec.workers.gpu_memory} fits no slice of pool {spec.pool} "
                f"({_describe(pool)}); pools that hold it: {', '.join(where) or 'none'}",
            )
        )
    if spec.workers.gpus != 1:
        issues.append(
            ConfigIssue(
                "job.spec.workers.gpus",
                f"{spec.workers.gpus} GPUs per replica, but pool {spec.pool} has no whole "
                "GPUs: a replica gets one slice (a CUDA process uses one MIG instance; a "
                "second time-shared replica of the same GPU adds no compute); set gpus: 1, "
                "or choose a pool of whole GPUs",
            )
        )
    shared = any(not s.isolated for s in offered)
    replicas = spec.workers.scale.max
    if shared and replicas > 1 and not spec.workers.shared_gpus:
        issues.append(
            ConfigIssue(
                "job.spec.workers.replicas",
                f"{replicas} replicas on pool {spec.pool}'s time-shared GPUs: processes that "
                "take turns on a GPU make NCCL fail or crawl, and share its memory and faults; "
                "use one replica, a MIG or whole-GPU pool, or set workers.sharedGpus: true "
                "if the job does not communicate over NCCL",
            )
        )
    return issues


def job_annotations(spec: JobSpec) -> dict[str, str]:
    """The Job's annotation that lets the shared-gpus rule pass a distributed job on
    time-shared GPUs (the spec said so)."""
    return {SHARED_GPUS_ANNOTATION: SHARED_GPUS_ALLOW} if spec.workers.shared_gpus else {}
