"""An OSError in the supervisor before any worker starts is a retryable storage failure with a
verdict, not a traceback and exit 1 (user error, AbortJob). Issue 22 #11."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.harness import HAVE_TORCH, job_env

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def supervise(tmp_path: Path, **env: str) -> tuple[int, str, dict[str, object]]:
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "trainstack_runtime.supervisor", "--nproc-per-node", "1",
         str(script)],
        env=job_env(tmp_path, **env), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    log = tmp_path / "termination-log"
    verdict = json.loads(log.read_text()) if log.is_file() else {}
    return proc.returncode, proc.stdout + proc.stderr, verdict


def unwritable(tmp_path: Path) -> str:
    """A checkpoint path nobody can create, root included: below a regular file."""
    (tmp_path / "not-a-dir").write_text("")
    return str(tmp_path / "not-a-dir" / "ckpt")


@pytest.mark.parametrize("deadline", [False, True], ids=["no-deadline", "deadline"])
def test_an_unwritable_checkpoint_path(tmp_path: Path, deadline: bool) -> None:
    """With a deadline, the job's start marker is the first write; without, the
    flight-recorder folder."""
    extra = {"TRAINSTACK_MAX_DURATION_S": "3600"} if deadline else {}
    code, output, verdict = supervise(
        tmp_path, TRAINSTACK_CHECKPOINT_DIR=unwritable(tmp_path), **extra
    )
    assert code == 202, output
    assert "Traceback" not in output
    assert verdict["class"] == "storage"
    assert verdict["retryable"] is True
    assert "Not a directory" in str(verdict["cause"]), verdict


def test_the_health_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output, verdict = supervise(tmp_path, TRAINSTACK_HEALTH_PORT=str(port))
    assert code == 202, output
    assert "Traceback" not in output
    assert verdict["class"] == "storage"
    assert f"health port {port}" in str(verdict["cause"]), verdict


def test_a_health_port_that_is_not_a_number(tmp_path: Path) -> None:
    """A bad value from the environment is a configuration error with a verdict (exit 2,
    not retried), not a traceback (found after issue 22 #11)."""
    code, output, verdict = supervise(tmp_path, TRAINSTACK_HEALTH_PORT="http")
    assert code == 2, output
    assert "Traceback" not in output
    assert verdict["class"] == "config_error"
    assert "TRAINSTACK_HEALTH_PORT='http' is not a port number" in str(verdict["cause"]), verdict
