"""The exit-code contract and the mapping of failures onto it."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from trainstack_runtime.contract import EXIT_CLASS, FATAL, RETRYABLE, ExitCode, is_retryable
from trainstack_runtime.exitcodes import (
    ConfigError,
    Preempted,
    StorageError,
    classify_exception,
    classify_exit,
    classify_failures,
    classify_text,
    verdict,
)

from tests.runtime.harness import RUNTIME_SRC


def test_contract_partition() -> None:
    assert RETRYABLE | FATAL | {ExitCode.OK} == set(ExitCode)
    assert not RETRYABLE & FATAL
    # Kubeflow's ExitCode restart policy retries exactly the codes >= 128.
    assert all(c >= 128 for c in RETRYABLE)
    assert all(1 <= c < 128 for c in FATAL)
    # 200+ never collides with 128+signal (signals stop at 64 on Linux).
    assert all(c > 128 + 64 for c in RETRYABLE if c != ExitCode.KILLED)
    assert set(EXIT_CLASS) == set(ExitCode)
    assert is_retryable(203)
    assert not is_retryable(2)
    assert is_retryable(143)  # unknown 128+signal
    assert not is_retryable(42)
    assert not is_retryable(ExitCode.DEADLINE_EXCEEDED)


def test_contract_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import trainstack_runtime.contract as c, trainstack_runtime.exitcodes\n"
        "import trainstack_runtime.topology\n"
        "print(int(c.ExitCode.PREEMPTED), c.CHECKPOINT_DIR_DEFAULT, c.HEALTH_PORT_DEFAULT)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(RUNTIME_SRC)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["203", "/checkpoints", "8080"]


class DistBackendError(RuntimeError):
    """Same name as torch's; classification goes by class name, not import."""


class DistStoreError(RuntimeError):
    pass


class OutOfMemoryError(RuntimeError):
    pass


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ValueError("bad shape"), ExitCode.USER_ERROR),
        (KeyError("x"), ExitCode.USER_ERROR),
        (ConfigError("--lr must be > 0"), ExitCode.CONFIG_ERROR),
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), ExitCode.DEVICE_OOM),
        (MemoryError(), ExitCode.KILLED),
        (OSError(errno.EIO, "Input/output error"), ExitCode.STORAGE),
        (OSError(errno.ESTALE, "Stale file handle"), ExitCode.STORAGE),
        (StorageError("upload failed"), ExitCode.STORAGE),
        # Issue 22 #6: missing files, permissions and timeouts of a rendezvous or store were
        # user errors (AbortJob); on a job's volumes they are usually the mount.
        (FileNotFoundError(errno.ENOENT, "no such file"), ExitCode.STORAGE),
        (PermissionError(errno.EACCES, "Permission denied"), ExitCode.STORAGE),
        (PermissionError(errno.EPERM, "Operation not permitted"), ExitCode.STORAGE),
        (TimeoutError("timed out"), ExitCode.COMM_ERROR),
        (
            RuntimeError(
                "Timed out initializing process group in store based barrier on rank 1, "
                "for key: store_based_barrier_key:1 (world_size=2, num_workers_joined=1)"
            ),
            ExitCode.COMM_ERROR,
        ),
        (
            RuntimeError("RendezvousTimeoutError: The node did not join the rendezvous"),
            ExitCode.COMM_ERROR,
        ),
        (DistBackendError("NCCL error: unhandled system error"), ExitCode.COMM_ERROR),
        (DistBackendError("Connection reset by peer"), ExitCode.PEER_LOST),
        (DistStoreError("Socket Timeout"), ExitCode.PEER_LOST),
        (
            RuntimeError("[pair.cc:553] Connection closed by peer [10.0.0.2]:4780"),
            ExitCode.PEER_LOST,
        ),
        (RuntimeError("Application timeout caused pair closure"), ExitCode.COMM_ERROR),
        (
            RuntimeError("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL"),
            ExitCode.COMM_ERROR,
        ),
        # Usually a kernel bug: a crash, hardware only with the node's evidence (evidence.py).
        (RuntimeError("CUDA error: an illegal memory access was encountered"), ExitCode.CRASH),
        (RuntimeError("CUDA error: unspecified launch failure"), ExitCode.CRASH),
        (DistBackendError("NCCL error: an illegal memory access"), ExitCode.CRASH),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), ExitCode.HARDWARE),
        (Preempted(12), ExitCode.PREEMPTED),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_classify_exception(exc: BaseException, expected: ExitCode) -> None:
    assert classify_exception(exc) is expected


def test_classify_exception_follows_cause() -> None:
    outer = ValueError("loading shard failed")
    outer.__cause__ = OSError(errno.EIO, "Input/output error")
    assert classify_exception(outer) is ExitCode.STORAGE


@pytest.mark.parametrize(
    ("exitcode", "message", "expected"),
    [
        (0, "", ExitCode.OK),
        (1, "", ExitCode.USER_ERROR),
        (1, "RuntimeError: NCCL communicator was aborted", ExitCode.COMM_ERROR),
        (2, "", ExitCode.CONFIG_ERROR),
        (200, "", ExitCode.COMM_ERROR),
        (203, "", ExitCode.PREEMPTED),
        (-signal.SIGKILL, "", ExitCode.KILLED),
        (-signal.SIGABRT, "", ExitCode.COMM_ERROR),
        (-signal.SIGSEGV, "", ExitCode.CRASH),
        (-signal.SIGBUS, "", ExitCode.CRASH),
        (-signal.SIGILL, "", ExitCode.CRASH),
        (-signal.SIGTERM, "", ExitCode.PREEMPTED),
        (143, "", ExitCode.PREEMPTED),
        (139, "", ExitCode.CRASH),
        (135, "", ExitCode.CRASH),
        (134, "", ExitCode.COMM_ERROR),
        (205, "", ExitCode.CRASH),
        (42, "", ExitCode.USER_ERROR),
    ],
)
def test_classify_exit(exitcode: int, message: str, expected: ExitCode) -> None:
    assert classify_exit(exitcode, message) is expected


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([], ExitCode.OK),
        ([ExitCode.OK, ExitCode.OK], ExitCode.OK),
        ([ExitCode.PEER_LOST, ExitCode.USER_ERROR], ExitCode.USER_ERROR),
        ([ExitCode.KILLED, ExitCode.PEER_LOST], ExitCode.KILLED),
        ([ExitCode.COMM_ERROR, ExitCode.HARDWARE], ExitCode.HARDWARE),
        ([ExitCode.PREEMPTED, ExitCode.COMM_ERROR], ExitCode.COMM_ERROR),
        ([ExitCode.USER_ERROR, ExitCode.CONFIG_ERROR], ExitCode.CONFIG_ERROR),
        ([ExitCode.PEER_LOST, ExitCode.CRASH], ExitCode.CRASH),
        ([ExitCode.KILLED, ExitCode.CRASH, ExitCode.COMM_ERROR], ExitCode.CRASH),
        ([ExitCode.CRASH, ExitCode.HARDWARE], ExitCode.HARDWARE),
        ([ExitCode.CRASH, ExitCode.USER_ERROR], ExitCode.USER_ERROR),
    ],
)
def test_verdict(codes: list[ExitCode], expected: ExitCode) -> None:
    assert verdict(codes) is expected


def test_classify_text_default() -> None:
    assert classify_text("something odd") is ExitCode.USER_ERROR
    assert classify_text("something odd", default=ExitCode.COMM_ERROR) is ExitCode.COMM_ERROR


@dataclass
class FakeFailure:
    exitcode: int
    pid: int
    message: str = ""


def test_classify_failures_drops_collateral_sigterm(tmp_path: Path) -> None:
    (tmp_path / "exit").mkdir()
    record = {"rank": 1, "pid": 11, "code": 202, "message": "OSError: [Errno 5] EIO"}
    (tmp_path / "exit" / "rank-00001.json").write_text(json.dumps(record))
    outcome = classify_failures(
        {0: FakeFailure(-signal.SIGTERM, 10), 1: FakeFailure(202, 11)}, tmp_path
    )
    assert outcome.code is ExitCode.STORAGE
    assert outcome.cause == "OSError: [Errno 5] EIO"
    msg = json.loads(outcome.termination_message())
    assert msg["code"] == 202
    assert msg["class"] == "storage"
    assert msg["retryable"] is True
    assert msg["ranks"]["0"] == {
        "exitcode": -15,
        "code": 203,
        "signal": "SIGTERM",
        "collateral": True,
    }


def test_classify_failures_ignores_stale_exit_record(tmp_path: Path) -> None:
    (tmp_path / "exit").mkdir()
    stale = {"rank": 0, "pid": 999, "code": 1, "message": "ValueError: from an earlier attempt"}
    (tmp_path / "exit" / "rank-00000.json").write_text(json.dumps(stale))
    outcome = classify_failures({0: FakeFailure(-signal.SIGKILL, 5)}, tmp_path)
    assert outcome.code is ExitCode.KILLED
    assert "earlier attempt" not in outcome.cause


def test_only_sigterm_failures_mean_preempted(tmp_path: Path) -> None:
    outcome = classify_failures({0: FakeFailure(-signal.SIGTERM, 5)}, tmp_path)
    assert outcome.code is ExitCode.PREEMPTED
