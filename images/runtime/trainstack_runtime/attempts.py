"""A job's attempts, as its pods lived them: when each started and ended, on how many GPUs,
and how it ended. What the hand-off's report says of GPU-hours and attempts comes from here.

Each pod's supervisor writes one record when it launches and completes it when it exits, in
the checkpoint directory (shared by the job's pods; it outlives them), under the job
instance's folder (keyed like the deadline and crash markers) and the pod's incarnation
(Volcano's retry count when it created the pod, ``TRAINSTACK_JOB_RETRY``): ::

    .trainstack-attempts.<instance>/<incarnation>/<pod>.<pid>.json
      {"pod": ..., "gpus": 8, "started": 1796053932.6, "ended": ..., "code": 0, "class": "ok"}

One file per supervisor process, created once and replaced when it ends, so no two writers
share a file and a pod restarted in place adds a record instead of losing one. A record
without an end is a pod still running (the current attempt at hand-off) or one that was
killed before it could write (SIGKILL, a lost node): its GPU time then counts up to the
newest time any record of the job shows, and its class is ``unknown``. The record is
bookkeeping: a failure to write it is logged, never fatal.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contract import EXIT_CLASS, ExitCode
from .deadline import instance_marker

log = logging.getLogger("trainstack.attempts")

ATTEMPTS_MARKER = ".trainstack-attempts"
# When one attempt's pods end differently, the attempt's class is the first of these that any
# of its pods has: a pod killed as collateral of a peer's failure says less than the failure.
_SEVERITY = (
    "user_error",
    "config_error",
    "device_oom",
    "deadline_exceeded",
    "crash_loop",
    "retries_exhausted",
    "hardware",
    "crash",
    "storage",
    "comm_error",
    "below_minimum",
    "peer_lost",
    "killed",
    "preempted",
    "unknown",
    "ok",
)


def _folder(checkpoint_dir: Path, instance: str | None, incarnation: int) -> Path:
    return checkpoint_dir / instance_marker(ATTEMPTS_MARKER, instance) / str(incarnation)


def _write(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True) + "\n")
    os.replace(tmp, path)


def record_start(
    checkpoint_dir: Path,
    instance: str | None,
    incarnation: int,
    *,
    pod: str,
    gpus: int,
    now: float | None = None,
) -> Path | None:
    """This pod's record of the attempt; its path, or None if it could not be written."""
    safe_pod = re.sub(r"[^A-Za-z0-9._-]", "_", pod) or "pod"
    path = _folder(checkpoint_dir, instance, incarnation) / f"{safe_pod}.{os.getpid()}.json"
    record = {"pod": pod, "gpus": gpus, "started": time.time() if now is None else now}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, record)
    except OSError as err:
        log.warning("could not record this attempt in %s: %s", path.parent, err)
        return None
    return path


def record_end(path: Path | None, code: ExitCode, now: float | None = None) -> None:
    if path is None:
        return
    try:
        record = json.loads(path.read_text())
        record.update(
            ended=time.time() if now is None else now, code=int(code), **{"class": EXIT_CLASS[code]}
        )
        _write(path, record)
    except (OSError, ValueError) as err:
        log.warning("could not complete the attempt record %s: %s", path, err)


@dataclass(frozen=True)
class Attempt:
    attempt: int  # the incarnation
    exit_class: str
    pods: int
    gpu_hours: float
    started: float
    ended: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "class": self.exit_class,
            "pods": self.pods,
            "gpu_hours": round(self.gpu_hours, 6),
            "started": self.started,
            "ended": self.ended,
        }


def attempts(
    checkpoint_dir: Path,
    instance: str | None,
    *,
    now: float | None = None,
    current: int | None = None,
) -> list[Attempt]:
    """Every attempt of the job instance, oldest first. Records of ``current`` without an
    end are running now (their time counts up to ``now``, their class is ``ok`` so far)."""
    now = time.time() if now is None else now
    base = checkpoint_dir / instance_marker(ATTEMPTS_MARKER, instance)
    records: dict[int, list[dict[str, Any]]] = {}
    if base.is_dir():
        for folder in base.iterdir():
            if not folder.name.lstrip("-").isdigit():
                continue
            for path in folder.glob("*.json"):
                try:
                    record = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(record, dict) and isinstance(record.get("started"), int | float):
                    records.setdefault(int(folder.name), []).append(record)
    # A pod that never wrote its end ran at most until the last sign of life of its job.
    horizon = max(
        (float(r.get("ended") or r["started"]) for rs in records.values() for r in rs),
        default=now,
    )
    starts = {n: min(float(r["started"]) for r in rs) for n, rs in records.items()}
    out = []
    for number in sorted(records):
        pods = records[number]
        running = number == current
        # Volcano starts the next attempt only after this one's pods are gone.
        later = [t for n, t in starts.items() if n > number]
        silent_end = now if running else min(later, default=horizon)
        classes = {str(r.get("class") or ("ok" if running else "unknown")) for r in pods}
        exit_class = next((c for c in _SEVERITY if c in classes), sorted(classes)[0])
        hours = 0.0
        for r in pods:
            end = r.get("ended") or silent_end
            hours += max(0.0, float(end) - float(r["started"])) * int(r.get("gpus", 0)) / 3600
        ends = [r.get("ended") for r in pods]
        out.append(
            Attempt(
                attempt=number,
                exit_class=exit_class,
                pods=len(pods),
                gpu_hours=hours,
                started=min(float(r["started"]) for r in pods),
                ended=None if running or None in ends else max(float(e) for e in ends if e),
            )
        )
    return out
