"""Fault injection on real runs: 2 worker processes, gloo, the supervisor around elastic_launch.

Every test here is marked ``faults`` (``pytest -m faults`` runs exactly these).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from trainstack_runtime.contract import ExitCode

from tests.runtime.harness import (
    EVERY,
    HAVE_TORCH,
    STEPS,
    Baseline,
    JobResult,
    RunJob,
    assert_matches_baseline,
    job_env,
    kill_all,
    start_pods,
    supervisor_cmd,
    terminate,
    wait_for,
)

if HAVE_TORCH:
    from trainstack_runtime.checkpoint import committed_steps, step_dir_name, verify

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed"),
]


def _verdict(result: JobResult) -> dict[str, object]:
    text = result.termination()
    assert text, result.output[-3000:]
    verdict: dict[str, object] = json.loads(text)
    return verdict


def test_killed_worker_then_job_restart_resumes_bit_exact(
    tmp_path: Path, run_job: RunJob, baseline: Baseline
) -> None:
    first = run_job(tmp_path, fault="sigkill@13,rank=1")
    assert first.code == ExitCode.KILLED, first.output[-3000:]
    assert _verdict(first)["retryable"] is True
    # Step 10's checkpoint commits asynchronously; on a loaded machine the kill at step 13
    # can land before the commit, and resuming from step 5 is then the correct behaviour.
    last = committed_steps(first.checkpoints)[-1]
    assert last in (5, 10)

    second = run_job(tmp_path)  # the scheduler's restart: same arguments, same volume
    assert second.code == ExitCode.OK, second.output[-3000:]
    assert f"resumed from {first.checkpoints / step_dir_name(last)}" in second.output
    assert_matches_baseline(second, baseline, replayed_from=last)


def test_killed_worker_in_pod_restart_resumes_bit_exact(
    tmp_path: Path, run_job: RunJob, baseline: Baseline
) -> None:
    result = run_job(tmp_path, fault="sigkill@13,rank=1", max_restarts=1)
    assert result.code == ExitCode.OK, result.output[-3000:]
    assert_matches_baseline(result, baseline, replayed_from=(10, 5))  # see above


def test_kill_during_checkpoint_write_keeps_previous(
    tmp_path: Path, run_job: RunJob, baseline: Baseline
) -> None:
    first = run_job(tmp_path, fault="kill-in-ckpt@10,rank=0")
    assert first.code == ExitCode.KILLED, first.output[-3000:]
    ckpt = first.checkpoints
    # The interrupted checkpoint never became visible; the previous one is intact.
    assert committed_steps(ckpt) == [5]
    assert (ckpt / (step_dir_name(10) + ".tmp")).is_dir()
    assert not (ckpt / step_dir_name(10) / "manifest.json").exists()
    assert verify(ckpt / step_dir_name(5)).ok

    second = run_job(tmp_path)
    assert second.code == ExitCode.OK, second.output[-3000:]
    assert step_dir_name(5) in second.output
    assert not (ckpt / (step_dir_name(10) + ".tmp")).exists()
    assert_matches_baseline(second, baseline, replayed_from=5)


def test_corrupt_newest_checkpoint_is_detected_and_skipped(
    tmp_path: Path, run_job: RunJob, baseline: Baseline
) -> None:
    first = run_job(tmp_path, args=("--steps", "17"))  # commits 5, 10, 15 and final 17
    assert first.code == ExitCode.OK, first.output[-3000:]
    newest = first.checkpoints / step_dir_name(17)
    # The largest of DCP's data files (one per writing rank): a flip in tensor bytes.
    data = max(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit, same size: only the checksum can tell
    data.write_bytes(bytes(raw))
    assert not verify(newest).ok

    second = run_job(tmp_path)
    assert second.code == ExitCode.OK, second.output[-3000:]
    assert "xxh3_128 mismatch" in second.output
    assert (first.checkpoints / (step_dir_name(17) + ".corrupt")).is_dir()
    assert step_dir_name(15) in second.output
    assert_matches_baseline(second, baseline, replayed_from=15)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def test_sigterm_saves_checkpoint_and_exits_preempted(
    tmp_path: Path, run_job: RunJob, baseline: Baseline
) -> None:
    progress = tmp_path / "run" / "progress"
    cmd = supervisor_cmd(tmp_path, args=("--step-sleep", "0.25"))
    proc = subprocess.Popen(
        cmd,
        env=job_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def past_first_checkpoint() -> bool:
            steps = []
            for p in progress.glob("rank-*.json"):
                try:
                    steps.append(json.loads(p.read_text())["step"])
                except ValueError:
                    return False
            return len(steps) == 2 and min(steps) >= EVERY + 1

        wait_for(past_first_checkpoint, 90, "training to pass the first checkpoint")
        port = int((tmp_path / "run" / "health.port").read_text())
        assert 'trainstack_step{rank="1"}' in _metrics(port)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        elapsed = time.monotonic() - sent
    finally:
        terminate(proc)
    assert proc.returncode == ExitCode.PREEMPTED, output[-3000:]
    # Generous bound: well inside Kubernetes' default 30 s grace period.
    assert elapsed < 30, elapsed
    interrupted = JobResult(proc.returncode, tmp_path, output)
    stopped = {max(per_step) for per_step in interrupted.losses().values()}
    assert len(stopped) == 1, "ranks must stop at the same step"
    (stop_step,) = stopped
    assert stop_step < STEPS
    assert committed_steps(interrupted.checkpoints)[-1] == stop_step
    assert verify(interrupted.checkpoints / step_dir_name(stop_step)).ok
    records = [json.loads(p.read_text()) for p in progress.glob("rank-*.json")]
    assert {r["last_ckpt_step"] for r in records} == {stop_step}

    resumed = run_job(tmp_path)
    assert resumed.code == ExitCode.OK, resumed.output[-3000:]
    # Nothing is replayed after a graceful stop: the checkpoint is at the last logged step.
    losses = resumed.losses()
    for rank, per_step in losses.items():
        assert sorted(per_step) == list(range(1, STEPS + 1))
        for step, values in per_step.items():
            assert values == [baseline[rank][step][0]], (rank, step)


@pytest.mark.parametrize(
    ("fault", "args", "extra_env", "expected"),
    [
        pytest.param("raise@7,rank=1", (), {}, ExitCode.USER_ERROR, id="user-error"),
        pytest.param(None, ("--lr", "-1"), {}, ExitCode.CONFIG_ERROR, id="bad-config"),
        pytest.param("oom@7,rank=0", (), {}, ExitCode.DEVICE_OOM, id="device-oom"),
        pytest.param(
            "hang@7,rank=1",
            (),
            {"TRAINSTACK_COMM_TIMEOUT_S": "5"},
            ExitCode.COMM_ERROR,
            id="comm-timeout",
        ),
        pytest.param("ecc@7,rank=1", (), {}, ExitCode.HARDWARE, id="hardware"),
        pytest.param("eio@7,rank=1", (), {}, ExitCode.STORAGE, id="storage"),
    ],
)
def test_failure_class_exit_code(
    tmp_path: Path,
    run_job: RunJob,
    *,
    fault: str | None,
    args: tuple[str, ...],
    extra_env: dict[str, str],
    expected: ExitCode,
) -> None:
    result = run_job(tmp_path, fault=fault, args=args, **extra_env)
    assert result.code == expected, result.output[-3000:]
    verdict = _verdict(result)
    assert verdict["code"] == expected
    assert verdict["retryable"] is (expected >= 128)


def test_lost_node_exits_peer_lost(tmp_path: Path) -> None:
    """Two single-process 'pods' with pod-level env (as Volcano/PyTorchJob set it); pod 1's
    launcher and worker vanish at once. The surviving pod reports a lost peer."""
    procs = start_pods(tmp_path, TRAINSTACK_FAULT="kill-node@7,rank=1")
    try:
        out0, _ = procs[0].communicate(timeout=120)
        procs[1].wait(timeout=60)
    finally:
        kill_all(procs)
    assert procs[1].returncode == -signal.SIGKILL
    assert procs[0].returncode == ExitCode.PEER_LOST, out0.decode(errors="replace")[-3000:]
    verdict = json.loads((tmp_path / "pod0" / "termination-log").read_text())
    assert verdict["class"] == "peer_lost"
    assert os.path.isdir(tmp_path / "ckpt")


@pytest.mark.faults
def test_max_duration_checkpoints_and_exits_deadline_across_restarts(
    tmp_path: Path, run_job: RunJob
) -> None:
    # The deadline is counted from the job's first start, kept in the checkpoint directory. It
    # leaves the workers time to start (torch import, process group) on a loaded 2-core machine
    # (at 4 s, a deadline that came before the first step left nothing to checkpoint), and the
    # job is far longer than it (1000 steps of 0.3 s), so it cannot finish first on an idle one.
    long_job = ("--step-sleep", "0.3", "--steps", "1000")
    first = run_job(tmp_path, args=long_job, TRAINSTACK_MAX_DURATION_S="12")
    assert first.code == ExitCode.DEADLINE_EXCEEDED, first.output[-3000:]
    assert "deadline_exceeded" in first.termination()
    assert committed_steps(first.checkpoints), "no checkpoint was taken at the deadline"
    # A restarted pod does not get a fresh budget: it stops at once, without training.
    second = run_job(tmp_path, TRAINSTACK_MAX_DURATION_S="12")
    assert second.code == ExitCode.DEADLINE_EXCEEDED, second.output[-3000:]
    assert "maximum duration already passed" in second.termination()


def test_liveness_kill_of_a_stuck_job_is_not_a_preemption(tmp_path: Path) -> None:
    """The kubelet's liveness probe kills (SIGTERM) only after /healthz failed; that kill used
    to be reported as a clean preemption (203), hiding the hang. A SIGTERM that follows a
    failed answer is now a communication-class failure naming the probe's reason."""
    cmd = supervisor_cmd(tmp_path)
    env = job_env(
        tmp_path,
        TRAINSTACK_FAULT="hang@7,rank=1",
        TRAINSTACK_COMM_TIMEOUT_S="300",  # the hang outlasts the probe, as a real one does
        TRAINSTACK_HEALTH_STALE_S="2",
    )
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        port_file = tmp_path / "run" / "health.port"
        wait_for(port_file.exists, 60, "the health server")
        port = int(port_file.read_text())

        def probe_fails() -> bool:  # what the kubelet sees before it kills
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).close()
            except urllib.error.HTTPError as err:
                return err.code == 503
            return False

        wait_for(probe_fails, 90, "/healthz to fail")
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=90)
    finally:
        terminate(proc)
    result = JobResult(proc.returncode, tmp_path, output)
    assert result.code == ExitCode.COMM_ERROR, output[-3000:]
    cause = str(_verdict(result)["cause"])
    assert "liveness probe" in cause
    assert "made no progress" in cause
