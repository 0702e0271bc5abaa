"""A job's maximum duration, counted across restarts.

Volcano Jobs have no activeDeadlineSeconds, and a pod-level deadline restarts with every
pod. The first supervisor of a job writes its start time into the (shared, persistent)
checkpoint directory; every later incarnation reads it. At the deadline the workers get
SIGTERM (so they checkpoint) and the container exits DEADLINE_EXCEEDED, which the job
layer maps to TerminateJob instead of a retry.

The checkpoint directory belongs to the job's name and outlives the job, so the marker is
keyed to the job instance (``TRAINSTACK_JOB_INSTANCE``; rendered jobs pass Volcano's
PodGroup name, ``<job>-<job uid>``): a job deleted and created again under the same name
counts from its own first start.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

START_MARKER = ".trainstack-job-start"


def instance_marker(base: str, instance: str | None) -> str:
    """A marker's file name for this job instance (the bare name if none is known)."""
    if not instance:
        return base
    return f"{base}.{re.sub(r'[^A-Za-z0-9._-]', '_', instance)}"


def start_marker(instance: str | None) -> str:
    """The start marker's file name for this job instance."""
    return instance_marker(START_MARKER, instance)


def job_start(
    checkpoint_dir: Path, instance: str | None = None, now: Callable[[], float] = time.time
) -> float:
    """The job instance's first start time; created atomically by whichever pod gets there
    first.

    The marker appears with its content or not at all: the time is written and synced to a
    file of this process's own, then hard-linked to the marker's name, which fails if another
    pod's link got there first (link(2) never replaces; POSIX, and so on Lustre and NFSv4).
    Creating the marker empty and writing it after, as before, left an empty marker when the
    pod was killed in between, and every later pod then failed until its retries ran out
    (issue 40 #7). An empty marker such a pod left is replaced once no writer filled it.
    """
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    marker = checkpoint_dir / start_marker(instance)
    for _ in range(50):  # an older runtime may be between its create and its write
        try:
            text = marker.read_text().strip()
        except FileNotFoundError:
            break
        if text:
            return float(text)
        time.sleep(0.02)
    else:
        return _write_marker(marker, now(), replace=True)  # left empty by a killed pod
    try:
        return _write_marker(marker, now(), replace=False)
    except FileExistsError:
        return float(marker.read_text().strip())  # another pod's link came first: complete


def _write_marker(marker: Path, started: float, *, replace: bool) -> float:
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "x") as handle:
            handle.write(f"{started}\n")
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, marker)
            return float(marker.read_text().strip())  # a pod replacing it too may have won
        os.link(tmp, marker)
    finally:
        tmp.unlink(missing_ok=True)
    return started


class DeadlineWatch:
    """Sends SIGTERM to this process at the deadline and remembers that it did."""

    def __init__(self, deadline: float, now: Callable[[], float] = time.time) -> None:
        self.deadline = deadline
        self.fired = threading.Event()
        self._now = now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deadline", daemon=True)

    @property
    def remaining(self) -> float:
        return self.deadline - self._now()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        if self._stop.wait(max(self.remaining, 0.0)):
            return
        self.fired.set()
        os.kill(os.getpid(), signal.SIGTERM)
