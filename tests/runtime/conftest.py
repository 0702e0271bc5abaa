"""Fixtures for the runtime tests (helpers live in harness.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.harness import (
    HAVE_TORCH,
    STEPS,
    Baseline,
    JobResult,
    RunJob,
    job_env,
    supervisor_cmd,
)


@pytest.fixture
def run_job() -> RunJob:
    def run(
        workdir: Path,
        *,
        fault: str | None = None,
        max_restarts: int = 0,
        args: tuple[str, ...] = (),
        nproc: int = 2,
        timeout: float = 120,
        **env: str,
    ) -> JobResult:
        workdir.mkdir(parents=True, exist_ok=True)
        if fault:
            env["TRAINSTACK_FAULT"] = fault
        proc = subprocess.run(
            supervisor_cmd(workdir, nproc=nproc, max_restarts=max_restarts, args=args),
            env=job_env(workdir, **env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return JobResult(proc.returncode, workdir, proc.stdout + proc.stderr)

    return run


@pytest.fixture(scope="session")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Baseline]:
    """Losses of an uninterrupted run of the example job with ``args``: the reference every
    resumed run with the same args must match exactly. Computed once per args."""
    if not HAVE_TORCH:
        pytest.skip("torch is not installed")
    cache: dict[tuple[tuple[str, ...], int], Baseline] = {}

    def get(args: tuple[str, ...] = (), nproc: int = 2) -> Baseline:
        if (args, nproc) in cache:
            return cache[args, nproc]
        workdir = tmp_path_factory.mktemp("baseline")
        proc = subprocess.run(
            supervisor_cmd(workdir, nproc=nproc, args=args),
            env=job_env(workdir),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        losses = JobResult(0, workdir, "").losses()
        assert set(losses) == set(range(nproc))
        for per_step in losses.values():
            assert sorted(per_step) == list(range(1, STEPS + 1))
        cache[args, nproc] = losses
        return losses

    return get


@pytest.fixture(scope="session")
def baseline(baselines: Callable[..., Baseline]) -> Baseline:
    return baselines()
