"""A wedged rank is a communication failure, not a kill (issue 22 #5).

A rank stuck in native code keeps the runtime's SIGTERM handler (preemption.py only sets a
flag), so the launcher's SIGTERM after the first failure does nothing and it SIGKILLs the rank
30 s later (torch 2.13 torch/distributed/elastic/multiprocessing/api.py,
``SubprocessContext._poll`` → ``close()`` → ``_close(timeout=30)``). That -9 ranked above the
peer's comm timeout (killed > comm_error), so the job was reported as 137. Exits after the
first failure are now collateral (exitcodes.classify_failures).
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
from trainstack_runtime.contract import ExitCode
from trainstack_runtime.exitcodes import classify_failures

from tests.runtime.harness import HAVE_TORCH, RunJob


@dataclass
class Failure:
    """The fields of torch's ProcessFailure the supervisor reads."""

    exitcode: int
    pid: int
    timestamp: int | None
    message: str = ""


def _record(run_dir: Path, rank: int, pid: int, code: int, when: float) -> None:
    (run_dir / "exit").mkdir(parents=True, exist_ok=True)
    path = run_dir / "exit" / f"rank-{rank:05d}.json"
    path.write_text(json.dumps({"pid": pid, "code": code, "message": "", "time": when}))


T0 = 1_800_000_000


@pytest.mark.parametrize(
    ("failures", "records", "expected", "collateral"),
    [
        pytest.param(
            {0: Failure(200, 10, T0), 1: Failure(-signal.SIGKILL, 11, T0 + 31)},
            {0: (200, T0 + 0.4)},
            ExitCode.COMM_ERROR,
            {1},
            id="wedged-rank-sigkilled-after-the-grace",
        ),
        pytest.param(
            {0: Failure(200, 10, T0), 1: Failure(-signal.SIGTERM, 11, T0 + 1)},
            {0: (200, T0 + 0.4)},
            ExitCode.COMM_ERROR,
            {1},
            id="sigterm-is-collateral",
        ),
        pytest.param(
            {0: Failure(204, 10, T0 + 1), 1: Failure(-signal.SIGKILL, 11, T0)},
            {0: (204, T0 + 0.7)},
            ExitCode.KILLED,
            set(),
            id="oom-kill-first-peer-lost-after",
        ),
        pytest.param(
            {0: Failure(-signal.SIGKILL, 10, T0), 1: Failure(-signal.SIGKILL, 11, T0 + 31)},
            {},
            ExitCode.KILLED,
            {1},
            id="first-kill-is-the-cause",
        ),
        pytest.param(
            {0: Failure(202, 10, T0), 1: Failure(200, 11, T0 + 9)},
            {0: (202, T0 + 0.1), 1: (200, T0 + 9.5)},
            ExitCode.STORAGE,
            {1},
            id="later-own-exit-is-collateral",
        ),
        pytest.param(
            {0: Failure(202, 10, T0), 1: Failure(200, 11, None)},
            {0: (202, T0 + 30)},
            ExitCode.STORAGE,
            set(),
            id="unknown-time-is-a-cause",
        ),
        pytest.param(
            {0: Failure(-signal.SIGTERM, 10, T0)},
            {},
            ExitCode.PREEMPTED,
            set(),
            id="only-sigterm",
        ),
    ],
)
def test_exits_after_the_first_failure_are_collateral(
    tmp_path: Path,
    failures: dict[int, Failure],
    records: dict[int, tuple[int, float]],
    expected: ExitCode,
    collateral: set[int],
) -> None:
    for rank, (code, when) in records.items():
        _record(tmp_path, rank, failures[rank].pid, code, when)
    outcome = classify_failures(dict(failures), tmp_path)
    assert outcome.code == expected
    marked = {r for r, entry in outcome.ranks.items() if entry.get("collateral")}
    sigterms = {r for r, f in failures.items() if f.exitcode == -signal.SIGTERM}
    assert marked == collateral or marked == collateral | sigterms


@pytest.mark.faults
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_wedged_rank_is_a_communication_error(tmp_path: Path, run_job: RunJob) -> None:
    """Rank 1 wedges keeping the SIGTERM handler; rank 0 times out in the next collective
    (5 s) and exits 200; the launcher SIGKILLs rank 1 30 s later. Before the fix: 137."""
    result = run_job(tmp_path, fault="wedge@7,rank=1", timeout=180, TRAINSTACK_COMM_TIMEOUT_S="5")
    assert result.code == ExitCode.COMM_ERROR, result.output[-3000:]
    verdict = json.loads(result.termination())
    assert verdict["class"] == "comm_error"
    assert verdict["ranks"]["1"]["signal"] == "SIGKILL"
    assert verdict["ranks"]["1"]["collateral"] is True
