"""The job deadline: one start time per job, kept across restarts; the watch fires once."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from trainstack_runtime.deadline import START_MARKER, DeadlineWatch, job_start


def test_first_start_wins_and_survives_restarts(tmp_path: Path) -> None:
    assert job_start(tmp_path, now=lambda: 1000.0) == 1000.0
    assert job_start(tmp_path, now=lambda: 5000.0) == 1000.0  # a restarted pod
    assert (tmp_path / START_MARKER).read_text().strip() == "1000.0"


def test_concurrent_pods_agree(tmp_path: Path) -> None:
    starts: list[float] = []

    def pod(at: float) -> None:
        starts.append(job_start(tmp_path, now=lambda: at))

    threads = [threading.Thread(target=pod, args=(float(i),)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(starts)) == 1


def test_watch_sends_sigterm_at_the_deadline() -> None:
    received = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: received.set())
    try:
        clock = [100.0]
        watch = DeadlineWatch(deadline=100.0, now=lambda: clock[0])
        watch.start()
        assert received.wait(5)
        assert watch.fired.is_set()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stopped_watch_never_fires() -> None:
    watch = DeadlineWatch(deadline=time.time() + 60)
    watch.start()
    watch.stop()
    watch._thread.join(5)
    assert not watch._thread.is_alive()
    assert not watch.fired.is_set()
