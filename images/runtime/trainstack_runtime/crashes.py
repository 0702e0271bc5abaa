"""The runtime's own restart budgets: crashes without progress, and failures (not preemptions).

A crash is retried, a few times (issue 22 #6).

SIGSEGV, SIGBUS, an illegal memory access or a launch failure is usually software (a native
extension, a kernel bug) or a full ``/dev/shm``: worth a retry, since a new pod may not hit it,
but a deterministic crash would otherwise restart until the job's ``maxRetry`` for nothing.
The supervisor counts the job instance's crash exits in the checkpoint directory (shared by
its pods, it outlives them; keyed like the deadline marker) and resets the count when a
checkpoint newer than the one at the last crash was committed. Beyond
``TRAINSTACK_MAX_CRASHES`` (default 2) crashes without progress the verdict is ``crash_loop``
(5, fatal).

Failures have a budget of their own (issue 40 #5). Volcano counts every ``RestartJob`` against
``maxRetry``, a preemption as much as a failure (v1.15.1 ``state/running.go``), so the job's
``maxRetry`` is set high and the runtime counts what its ``retry.maxRetries`` means: runs of the
job that ended in a failure. A run is an *incarnation*: Volcano's retry count when it created the
pods, the same for all pods of one run (``TRAINSTACK_JOB_RETRY``). When one pod fails, its peers
fail or are killed with it; one file per incarnation counts them once. Beyond
``TRAINSTACK_MAX_FAILURES`` failed incarnations the verdict is ``retries_exhausted`` (6, fatal).
A preempted pod exits ``preempted`` (203), and every pod of a preempted run does: the SIGTERM is
agreed across ranks (preemption.py), so nobody records a failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .deadline import instance_marker

CRASH_MARKER = ".trainstack-crashes"


def record_crash(checkpoint_dir: Path, instance: str | None, committed: int | None) -> int:
    """Count this crash; returns the crashes since the newest checkpoint ``committed`` (the
    newest step this pod's ranks committed, None if none)."""
    path = checkpoint_dir / instance_marker(CRASH_MARKER, instance)
    try:
        state = json.loads(path.read_text())
        count, step = int(state.get("count", 0)), state.get("step")
    except (OSError, ValueError, AttributeError):
        count, step = 0, None
    if committed is not None and (step is None or committed > int(step)):
        count, step = 0, committed
    count += 1
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"count": count, "step": step}) + "\n")
    os.replace(tmp, path)
    return count


FAILURE_MARKER = ".trainstack-failures"


def record_failure(checkpoint_dir: Path, instance: str | None, incarnation: int) -> list[int]:
    """Mark ``incarnation`` of the job instance failed; returns every failed incarnation.

    One empty file per incarnation in a directory of the instance's: creating it is idempotent
    and needs no read-modify-write, so pods of one incarnation failing at once count it once.
    """
    folder = checkpoint_dir / instance_marker(FAILURE_MARKER, instance)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(incarnation)).touch()
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
