"""The job deadline: one start time per job, kept across restarts; the watch fires once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trainstack_runtime.deadline import START_MARKER, DeadlineWatch, job_start

from tests.runtime.harness import HAVE_TORCH, job_env


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


def test_a_pod_killed_while_it_writes_the_marker_leaves_none_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 40 #7: the marker was created empty, then written; a pod killed in between left
    it empty and every later pod failed. Now it appears complete or not at all."""

    def killed(*_: object) -> None:
        raise KeyboardInterrupt  # the pod's end, between its own file and the marker

    with monkeypatch.context() as patched:
        patched.setattr(os, "link", killed)
        with pytest.raises(KeyboardInterrupt):
            job_start(tmp_path, now=lambda: 1000.0)
    assert not (tmp_path / START_MARKER).exists()
    assert job_start(tmp_path, now=lambda: 2000.0) == 2000.0
    assert sorted(p.name for p in tmp_path.iterdir()) == [START_MARKER]  # no temp file left


def test_an_empty_marker_left_by_an_older_runtime_is_replaced(tmp_path: Path) -> None:
    """Before: FileExistsError after a second of waiting, in every pod, until the job's
    retries ran out."""
    (tmp_path / START_MARKER).write_text("")
    assert job_start(tmp_path, now=lambda: 3000.0) == 3000.0
    assert job_start(tmp_path, now=lambda: 4000.0) == 3000.0


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


def test_each_job_instance_has_its_own_start(tmp_path: Path) -> None:
    """Issue 22 #10: a job deleted and created again under the same name (a new Volcano Job
    uid, the same checkpoint directory) is a new job with a new deadline."""
    assert job_start(tmp_path, "demo-train-uid-1", now=lambda: 1000.0) == 1000.0
    assert job_start(tmp_path, "demo-train-uid-2", now=lambda: 9000.0) == 9000.0
    assert job_start(tmp_path, "demo-train-uid-1", now=lambda: 9500.0) == 1000.0  # a restart


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_a_recreated_job_starts_under_the_real_supervisor(tmp_path: Path) -> None:
    """The first job runs into its maximum duration (exit 4); the job created again under
    its name, with the same checkpoint directory, trains; a restart of the first stays out."""
    script = tmp_path / "sleep.py"
    script.write_text("import sys, time\ntime.sleep(float(sys.argv[1]))\n")

    def run(instance: str, seconds: float) -> subprocess.CompletedProcess[str]:
        env = job_env(tmp_path, TRAINSTACK_MAX_DURATION_S="3", TRAINSTACK_JOB_INSTANCE=instance)
        cmd = [sys.executable, "-m", "trainstack_runtime.supervisor", "--nproc-per-node", "1",
               "--shutdown-timeout", "5", str(script), "--", str(seconds)]  # fmt: skip
        return subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=120, check=False
        )  # fmt: skip

    first = run("demo-train-3f1c", 60)
    assert first.returncode == 4, first.stdout + first.stderr
    again = run("demo-train-9a2e", 0)
    assert again.returncode == 0, again.stdout + again.stderr
    restarted = run("demo-train-3f1c", 0)
    assert restarted.returncode == 4, restarted.stdout + restarted.stderr
