"""`trainstack status`: a team's Volcano Jobs, one row each, from the live objects."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainstack.explain.model import Obj
from trainstack.explain.resources import age, job_gpus, timestamp


@dataclass(frozen=True)
class JobRow:
    name: str
    state: str  # status.state.phase
    age: str
    gpus: int  # each task's pod template GPUs x replicas
    # 1 + status.retryCount: Volcano counts each restart of the job there (the platform adds
    # no annotation of its own; its lifecycle policies spend maxRetry, jobs/lifecycle.py).
    attempts: int
    max_attempts: int | None  # spec.maxRetry


def job_rows(jobs: Iterable[Obj], now: float) -> list[JobRow]:
    rows = []
    for job in jobs:
        meta = job.get("metadata", {})
        created = timestamp(meta.get("creationTimestamp"))
        status = job.get("status", {})
        max_retry = job.get("spec", {}).get("maxRetry")
        rows.append(
            JobRow(
                name=str(meta.get("name", "")),
                state=str(status.get("state", {}).get("phase") or "Pending"),
                age=age(now - created) if created is not None else "?",
                gpus=job_gpus(job),
                attempts=1 + int(status.get("retryCount", 0) or 0),
                max_attempts=int(max_retry) if max_retry is not None else None,
            )
        )
    return sorted(rows, key=lambda r: r.name)
