"""What the supervisor puts in its workers' environment, seen by real workers under
`elastic_launch` with gloo on CPU."""

from __future__ import annotations

import json
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
)
REPORTER = f"""
import json, os, sys
import torch
names = {REPORTED!r}
report = {{n: os.environ.get(n) for n in names}} | {{"threads": torch.get_num_threads()}}
with open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"] + ".json"), "w") as fh:
    json.dump(report, fh)
"""


def worker_env(tmp_path: Path, *, nproc: int = 2, **env: str) -> dict[int, dict[str, Any]]:
    """Run `nproc` reporting workers under the real supervisor; rank -> what each saw."""
    script, out = tmp_path / "report.py", tmp_path / "report"
    script.write_text(REPORTER)
    out.mkdir()
    cmd = [sys.executable, "-m", "trainstack_runtime.supervisor", "--nproc-per-node",
           str(nproc), str(script), "--", str(out)]  # fmt: skip
    proc = subprocess.run(
        cmd, env={**job_env(tmp_path), **env}, capture_output=True, text=True, timeout=120,
        check=False,
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
