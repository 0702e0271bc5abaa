"""The bandwidth program of `trainstack healthcheck` (trainstack_runtime.busbw), for real:
three gloo ranks under torchrun on this CPU, as the Volcano job runs it on GPUs with NCCL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trainstack_runtime import busbw

from tests.runtime.harness import HAVE_TORCH, free_port, job_env

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def torchrun(tmp_path: Path, *args: str, nproc: int = 3) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
        "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "-m", "trainstack_runtime.busbw", *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=180, check=False
    )


def report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout + proc.stderr  # rank 0 alone prints
    result: dict[str, Any] = json.loads(lines[0])
    return result


def test_bus_bandwidth_is_nccl_tests_formula() -> None:
    # 1 GB in 0.1 s is 10 GB/s algorithm bandwidth; on 8 ranks 2 x 7 / 8 of it crosses the bus.
    assert busbw.algorithm_bandwidth(10**9, 0.1) == pytest.approx(10.0)
    assert busbw.bus_bandwidth(10**9, 0.1, 8) == pytest.approx(17.5)
    assert busbw.bus_bandwidth(10**9, 0.1, 2) == pytest.approx(10.0)  # 2 ranks: factor 1


@pytest.mark.parametrize(
    ("text", "size"), [("8", 8), ("64K", 65536), ("64M", 64 * 2**20), ("1g", 2**30), ("2MB", 2**21)]
)
def test_sizes_use_binary_units(text: str, size: int) -> None:
    assert busbw.parse_size(text) == size


def test_the_floor_is_held_against_the_largest_size() -> None:
    result = {
        "results": [
            {"bytes": 1024, "busbwGBps": 50.0, "wrong": 0},
            {"bytes": 2**20, "busbwGBps": 5.0, "wrong": 0},
        ]
    }
    assert busbw.verdict(result, 4.0)["passed"] is True
    low = busbw.verdict(result, 6.0)  # the small size's 50 GB/s does not count
    assert (low["passed"], low["busbwGBps"], low["avgBusbwGBps"]) == (False, 5.0, 27.5)
    wrong = {"results": [{"bytes": 1024, "busbwGBps": 50.0, "wrong": 3}]}
    assert busbw.verdict(wrong, None)["passed"] is False


@needs_torch
@pytest.mark.slow
def test_three_gloo_ranks_report_consistent_bandwidth(tmp_path: Path) -> None:
    proc = torchrun(tmp_path, "--sizes", "4K,256K", "--iters", "5", "--warmup", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = report(proc)
    assert (result["backend"], result["worldSize"], result["nodes"]) == ("gloo", 3, 1)
    assert [r["bytes"] for r in result["results"]] == [4096, 262144]
    for row in result["results"]:
        assert row["wrong"] == 0
        seconds = row["timeUs"] / 1e6
        # algbw from the reported bytes and time; busbw = algbw x 2 (3 - 1) / 3
        assert row["algbwGBps"] == pytest.approx(row["bytes"] / seconds / 1e9, rel=1e-3)
        assert row["busbwGBps"] == pytest.approx(row["algbwGBps"] * 4 / 3, rel=1e-3)
    assert result["busbwGBps"] == result["results"][-1]["busbwGBps"]
    assert result["passed"] is True
    assert result["floorGBps"] is None


@needs_torch
@pytest.mark.slow
def test_below_the_floor_every_rank_exits_non_zero(tmp_path: Path) -> None:
    proc = torchrun(
        tmp_path, "--sizes", "4K", "--iters", "2", "--warmup", "0", "--floor", "1e9", nproc=2
    )
    assert proc.returncode != 0
    result = report(proc)
    assert result["passed"] is False
    assert result["floorGBps"] == 1e9
    assert result["busbwGBps"] < 1e9


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as exc:
        busbw.main(["--sizes", "lots"])
    assert exc.value.code == 2


@needs_torch
@pytest.mark.slow
def test_the_healthcheck_jobs_command_runs_it_under_the_supervisor(tmp_path: Path) -> None:
    """What `trainstack healthcheck` renders: the runtime's supervisor (its torchrun) starting
    one busbw process per GPU; below the floor the pod fails as a user error (exit 1), which
    the job's lifecycle policy aborts instead of retrying."""
    cmd = [
        sys.executable, "-m", "trainstack_runtime.supervisor", "--nproc-per-node", "2",
        "--", "-m", "trainstack_runtime.busbw", "--sizes", "4K", "--iters", "2", "--floor", "1e9",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, env=job_env(tmp_path), capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report(proc)["worldSize"] == 2
    verdict = json.loads((tmp_path / "termination-log").read_text())
    assert verdict["class"] == "user_error"
