"""The supervisor runs `-m package.module` as the job layer renders it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.harness import HAVE_TORCH, STEPS, TRAIN_SCRIPT, JobResult, job_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed"),
]


def test_module_mode_trains_like_script_mode(tmp_path: Path) -> None:
    project = TRAIN_SCRIPT.parent.parent  # images/project: `train` is a package there
    cmd = [
        sys.executable, "-m", "trainstack_runtime.supervisor", "--nproc-per-node", "2",
        "--", "-m", "train.main", "--steps", str(STEPS), "--loss-log", str(tmp_path / "loss"),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=project, env=job_env(tmp_path), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = JobResult(0, tmp_path, "").losses()
    assert {rank: sorted(steps) for rank, steps in losses.items()} == {
        0: list(range(1, STEPS + 1)),
        1: list(range(1, STEPS + 1)),
    }


def test_module_mode_needs_a_module(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainstack_runtime.supervisor", "--", "-m"],
        env=job_env(tmp_path), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
