"""Small facts of a Volcano Job that every check uses."""

from __future__ import annotations

from trainstack.explain.model import Obj


def key(job: Obj) -> str:
    """`namespace/name`, as the answers name a job."""
    meta = job.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def attempt(job: Obj) -> int:
    """Which run of the job this is: 1 + status.retryCount (Volcano counts each restart of the
    job there; the platform adds no annotation of its own)."""
    return 1 + int(job.get("status", {}).get("retryCount", 0) or 0)


def replicas(job: Obj) -> int:
    return sum(int(t.get("replicas", 1)) for t in job.get("spec", {}).get("tasks") or [])
