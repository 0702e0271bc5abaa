"""What the supervisor puts in its workers' environment, seen by real workers under
`elastic_launch` with gloo on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.harness import HAVE_TORCH, job_env

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

REPORTED = (
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "OMP_NUM_THREADS",
)
REPORTER = f"""
import json, os, sys
import torch
names = {REPORTED!r}
report = {{n: os.environ.get(n) for n in names}} | {{"threads": torch.get_num_threads()}}
with open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"] + ".json"), "w") as fh:
    json.dump(report, fh)
"""


def worker_env(
    tmp_path: Path, *, nproc: int = 2, unset: tuple[str, ...] = (), **env: str
) -> dict[int, dict[str, Any]]:
    """Run `nproc` reporting workers under the real supervisor; rank -> what each saw."""
    script, out = tmp_path / "report.py", tmp_path / "report"
    script.write_text(REPORTER)
    out.mkdir()
    cmd = [sys.executable, "-m", "trainstack_runtime.supervisor", "--nproc-per-node",
           str(nproc), str(script), "--", str(out)]  # fmt: skip
    env = {k: v for k, v in {**job_env(tmp_path), **env}.items() if k not in unset}
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=120, check=False
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {int(p.stem[5:]): json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))}


def test_nccl_watchdog_and_flight_recorder_dumps(tmp_path: Path) -> None:
    """Issue 22 #8. Workers keep torch's own watchdog mode, 3 (tear down without aborting the
    communicators, whose abort can hang: pytorch/pytorch#110723), which the launcher would
    otherwise turn into 1 (local_elastic_agent.py); dumps go to the checkpoint volume,
    which outlives the container, not to torch's default under $HOME/.cache."""
    seen = worker_env(tmp_path, TORCH_NCCL_DUMP_ON_TIMEOUT="1")
    assert set(seen) == {0, 1}
    folder = tmp_path / "ckpt" / "flight-recorder"
    assert folder.is_dir()
    for report in seen.values():
        assert report["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
        prefix = Path(report["TORCH_FR_DUMP_TEMP_FILE"])
        assert prefix.parent == folder
        assert prefix.name.endswith("-rank_")  # torch appends the rank


def test_a_jobs_own_dump_location_and_watchdog_mode_are_kept(tmp_path: Path) -> None:
    seen = worker_env(
        tmp_path,
        nproc=1,
        TORCH_NCCL_DEBUG_INFO_TEMP_FILE="/x/trace_",
        TORCH_NCCL_ASYNC_ERROR_HANDLING="2",
    )
    assert seen[0]["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/x/trace_"
    assert seen[0]["TORCH_FR_DUMP_TEMP_FILE"] is None  # it would win over the job's own
    assert seen[0]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"


def test_workers_share_the_pods_cpus(tmp_path: Path) -> None:
    """Issue 22 #9. torchrun sets OMP_NUM_THREADS=1 for several workers per node
    (torch/distributed/run.py config_from_args), but the supervisor launches through the
    elastic API, which does not: every worker ran as many threads as the machine has cores."""
    seen = worker_env(tmp_path, nproc=2, unset=("OMP_NUM_THREADS",))  # the harness pins it
    cpus = len(os.sched_getaffinity(0))
    for report in seen.values():
        assert report["OMP_NUM_THREADS"] == str(max(1, cpus // 2))
        assert report["threads"] == max(1, cpus // 2)


def test_a_jobs_own_thread_count_is_kept(tmp_path: Path) -> None:
    seen = worker_env(tmp_path, nproc=1, OMP_NUM_THREADS="1")  # alone it would get every CPU
    assert (seen[0]["OMP_NUM_THREADS"], seen[0]["threads"]) == ("1", 1)


@pytest.mark.parametrize(
    ("files", "limit"),
    [({"cpu.max": "400000 100000\n"}, 4.0), ({"cpu.max": "max 100000\n"}, None),
     ({"cpu.max": "150000 100000\n"}, 1.5),
     ({"cpu/cpu.cfs_quota_us": "800000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8.0),
     ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
     ({}, None)],
    ids=["v2", "v2-unlimited", "v2-fraction", "v1", "v1-unlimited", "none"],
)  # fmt: skip
def test_the_pods_cpu_limit_from_its_cgroup(
    tmp_path: Path, files: dict[str, str], limit: float | None
) -> None:
    from trainstack_runtime.supervisor import cpu_limit  # noqa: PLC0415 (imports torch)

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_limit(tmp_path) == limit


def test_threads_per_worker() -> None:
    from trainstack_runtime.supervisor import omp_threads  # noqa: PLC0415 (imports torch)

    assert omp_threads(8, 32.0, 192) == 4  # a 32-CPU pod on a 192-core node, 8 GPUs
    assert omp_threads(2, 32.0, 192) == 16  # the embeddings-ps workers
    assert omp_threads(1, 1.5, 192) == 1
    assert omp_threads(8, 4.0, 192) == 1  # never 0
    assert omp_threads(2, None, 2) == 1  # no limit: the CPUs it may run on
    assert omp_threads(1, 64.0, 16) == 16  # a limit above the CPUs it may run on
