"""`trainstack status`: a team's Volcano Jobs, one row each, from the live objects."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainstack.explain.jobinfo import attempt
from trainstack.explain.model import Obj
from trainstack.explain.resources import age, job_gpus, timestamp


@dataclass(frozen=True)
class JobRow:
    name: str
    state: str  # status.state.phase
    age: str
    gpus: int  # each task's pod template GPUs x replicas
    attempts: int  # jobinfo.attempt; the lifecycle policies spend maxRetry (jobs/lifecycle.py)
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
                attempts=attempt(job),
                max_attempts=int(max_retry) if max_retry is not None else None,
            )
        )
    return sorted(rows, key=lambda r: r.name)
