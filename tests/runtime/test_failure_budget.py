"""Failures have a budget, preemptions do not consume it (issue 40 #5).

Volcano counts every RestartJob against ``maxRetry`` (v1.15.1 ``state/running.go``
``RetryCount++``), so a job preempted ``maxRetries + 1`` times used to fail. Now the rendered
``maxRetry`` is high (trainstack.jobs.lifecycle.volcano_max_retry) and the supervisor counts
failed *incarnations* itself: one file per Volcano retry count (``TRAINSTACK_JOB_RETRY``, the
pod annotation ``volcano.sh/job-retry-count``), so the pods of one failed run count once and a
preempted run not at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainstack_runtime.contract import EXIT_CLASS, FATAL, ExitCode
from trainstack_runtime.crashes import FAILURE_MARKER, record_failure

from tests.runtime.harness import HAVE_TORCH, RunJob

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def test_failed_incarnations_count_once(tmp_path: Path) -> None:
    assert record_failure(tmp_path, "job-uid1", 0) == [0]
    assert record_failure(tmp_path, "job-uid1", 0) == [0]  # a second pod of the same run
    assert record_failure(tmp_path, "job-uid1", 3) == [0, 3]
    assert record_failure(tmp_path, "job-uid2", 3) == [3]  # another instance of the job
    assert sorted(p.name for p in (tmp_path / f"{FAILURE_MARKER}.job-uid1").iterdir()) == [
        "0",
        "3",
    ]


@needs_torch
def test_preemptions_do_not_spend_the_failure_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainstack_runtime.exitcodes import Outcome  # noqa: PLC0415
    from trainstack_runtime.supervisor import judge  # noqa: PLC0415

    monkeypatch.setenv("TRAINSTACK_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TRAINSTACK_JOB_INSTANCE", "train-uid1")
    monkeypatch.setenv("TRAINSTACK_MAX_FAILURES", "2")
    monkeypatch.delenv("TRAINSTACK_GPU_EVIDENCE", raising=False)

    def run(incarnation: int, code: ExitCode) -> ExitCode:
        monkeypatch.setenv("TRAINSTACK_JOB_RETRY", str(incarnation))
        return judge(Outcome(code, cause="x"), None, tmp_path / "run").code

    # Run 0: two pods fail with it (a gang); the run counts once.
    assert run(0, ExitCode.COMM_ERROR) is ExitCode.COMM_ERROR
    assert run(0, ExitCode.PEER_LOST) is ExitCode.PEER_LOST
    # Runs 1-10: preempted ten times (more than maxRetries): every one is restarted.
    for incarnation in range(1, 11):
        assert run(incarnation, ExitCode.PREEMPTED) is ExitCode.PREEMPTED
    # Run 11: the second failure, still within maxRetries 2.
    assert run(11, ExitCode.STORAGE) is ExitCode.STORAGE
    # Run 12: the third failed run is one more than maxRetries: fatal, with the cause kept.
    assert run(12, ExitCode.KILLED) is ExitCode.RETRIES_EXHAUSTED
    assert ExitCode.RETRIES_EXHAUSTED in FATAL
    assert EXIT_CLASS[ExitCode.RETRIES_EXHAUSTED] == "retries_exhausted"


@needs_torch
def test_no_budget_without_an_incarnation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod that does not know its run (not rendered by trainstack) leaves the bound to
    Volcano's maxRetry: counting each pod would count a gang's failure once per pod."""
    from trainstack_runtime.exitcodes import Outcome  # noqa: PLC0415
    from trainstack_runtime.supervisor import judge  # noqa: PLC0415

    monkeypatch.setenv("TRAINSTACK_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TRAINSTACK_MAX_FAILURES", "0")
    monkeypatch.delenv("TRAINSTACK_JOB_RETRY", raising=False)
    monkeypatch.delenv("TRAINSTACK_GPU_EVIDENCE", raising=False)
    for _ in range(3):
        outcome = judge(Outcome(ExitCode.COMM_ERROR), None, tmp_path / "run")
        assert outcome.code is ExitCode.COMM_ERROR
    assert not (tmp_path / "ckpt").exists()


@needs_torch
@pytest.mark.faults
def test_the_run_beyond_the_budget_exits_retries_exhausted(tmp_path: Path, run_job: RunJob) -> None:
    """The real supervisor and workers: a storage error in the job's second failed run, with
    maxRetries 1, ends the job (6 -> AbortJob) with the error's cause in the verdict."""
    env = {"TRAINSTACK_MAX_FAILURES": "1", "TRAINSTACK_JOB_INSTANCE": "train-uid1"}
    first = run_job(tmp_path / "a", fault="eio@3,rank=1", TRAINSTACK_JOB_RETRY="0", **env)
    assert first.code == ExitCode.STORAGE, first.output[-3000:]
    ckpt = tmp_path / "a" / "ckpt"
    second = run_job(
        tmp_path / "b",
        fault="eio@3,rank=1",
        TRAINSTACK_JOB_RETRY="4",
        TRAINSTACK_CHECKPOINT_DIR=str(ckpt),
        **env,
    )
    assert second.code == ExitCode.RETRIES_EXHAUSTED, second.output[-3000:]
    verdict = json.loads((tmp_path / "b" / "termination-log").read_text())
    assert verdict["class"] == "retries_exhausted"
    assert verdict["retryable"] is False
    assert "Volcano retry counts 0, 4" in verdict["cause"]
    assert "Input/output error" in verdict["cause"] or "EIO" in verdict["cause"]
