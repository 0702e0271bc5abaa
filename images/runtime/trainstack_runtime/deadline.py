"""A job's maximum duration, counted across restarts.

Volcano Jobs have no activeDeadlineSeconds, and a pod-level deadline restarts with every
pod. The first supervisor of a job writes its start time into the (shared, persistent)
checkpoint directory; every later incarnation reads it. At the deadline the workers get
SIGTERM (so they checkpoint) and the container exits DEADLINE_EXCEEDED, which the job
layer maps to TerminateJob instead of a retry.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

START_MARKER = ".trainstack-job-start"


def job_start(checkpoint_dir: Path, now: Callable[[], float] = time.time) -> float:
    """The job's first start time; created atomically by whichever pod gets there first."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    marker = checkpoint_dir / START_MARKER
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        for _ in range(50):  # another pod may be between create and write
            text = marker.read_text().strip()
            if text:
                return float(text)
            time.sleep(0.02)
        raise
    with os.fdopen(fd, "w") as handle:
        started = now()
        handle.write(f"{started}\n")
        handle.flush()
        os.fsync(handle.fileno())
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
