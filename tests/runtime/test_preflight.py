"""RDMA trainers fail fast, with the reason, on a node whose memlock limit would break NCCL.

Issue 19 #10 dropped IPC_LOCK from RDMA pods: a non-root trainer never holds an added
capability (see trainstack_runtime/preflight.py), so the node's RLIMIT_MEMLOCK is what counts.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from trainstack_runtime.preflight import memlock_issue, uses_ib_verbs

from tests.runtime.harness import HAVE_TORCH, TRAIN_SCRIPT, job_env

IB = {"NCCL_IB_HCA": "mlx5_0,mlx5_1"}
UNLIMITED = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)


def test_only_ib_verbs_need_the_limit() -> None:
    assert uses_ib_verbs(IB)
    assert not uses_ib_verbs({**IB, "NCCL_IB_DISABLE": "1"})  # the tcp profile
    assert not uses_ib_verbs({})  # EFA and TCP pools name no HCAs
    assert memlock_issue({}, lambda _: (65536, 65536)) is None


def test_a_limited_memlock_is_reported_with_the_fix() -> None:
    issue = memlock_issue(IB, lambda _: (8 << 20, 8 << 20))
    assert issue is not None
    assert "RLIMIT_MEMLOCK is 8388608 bytes" in issue
    assert "LimitMEMLOCK=infinity" in issue
    assert memlock_issue(IB, lambda _: UNLIMITED) is None


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_the_supervisor_stops_before_training(tmp_path: Path) -> None:
    """The real supervisor, under a real lowered limit: exit 2 (config error, not retried)."""
    _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    low = 64 << 10 if hard == resource.RLIM_INFINITY else min(hard, 64 << 10)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (low, hard))

    proc = subprocess.run(
        [sys.executable, "-m", "trainstack_runtime.supervisor", str(TRAIN_SCRIPT)],
        env={**job_env(tmp_path), **IB}, capture_output=True, text=True, timeout=120,
        check=False, preexec_fn=lower,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "LimitMEMLOCK=infinity" in proc.stdout + proc.stderr
