"""Helpers for the runtime tests: run the example job under the supervisor, read its losses."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME_SRC = REPO / "images" / "runtime"
TRAIN_SCRIPT = REPO / "images" / "project" / "train" / "main.py"
try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
# The runtime is normally pip-installed (-e images/runtime); fall back to the source tree.
if importlib.util.find_spec("trainstack_runtime") is None:
    sys.path.insert(0, str(RUNTIME_SRC))

# Small and fast on a 2-core CI machine: 20 steps, a checkpoint every 5.
STEPS = 20
EVERY = 5


@dataclass
class JobResult:
    code: int
    workdir: Path
    output: str

    @property
    def checkpoints(self) -> Path:
        return self.workdir / "ckpt"

    def losses(self) -> dict[int, dict[int, list[str]]]:
        """rank -> step -> every loss (hex) logged for that step, in order."""
        out: dict[int, dict[int, list[str]]] = {}
        for path in sorted((self.workdir / "loss").glob("rank-*.txt")):
            rank = int(path.stem.split("-")[1])
            per_step: dict[int, list[str]] = {}
            for line in path.read_text().splitlines():
                step, value = line.split()
                per_step.setdefault(int(step), []).append(value)
            out[rank] = per_step
        return out

    def termination(self) -> str:
        path = self.workdir / "termination-log"
        return path.read_text() if path.exists() else ""


def job_env(workdir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINSTACK_", "PET_"))}
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(name, None)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(RUNTIME_SRC), env.get("PYTHONPATH")])),
        TRAINSTACK_CHECKPOINT_DIR=str(workdir / "ckpt"),
        TRAINSTACK_CHECKPOINT_EVERY=str(EVERY),
        TRAINSTACK_RUN_DIR=str(workdir / "run"),
        TRAINSTACK_TERMINATION_LOG=str(workdir / "termination-log"),
        TRAINSTACK_HEALTH_PORT="0",
    )
    env.update(extra)
    return env


def supervisor_cmd(
    workdir: Path, *, nproc: int = 2, max_restarts: int = 0, args: tuple[str, ...] = ()
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainstack_runtime.supervisor",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(max_restarts),
        "--shutdown-timeout",
        "10",
        str(TRAIN_SCRIPT),
        "--",
        "--steps",
        str(STEPS),
        "--loss-log",
        str(workdir / "loss"),
        *args,
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_pods(
    tmp_path: Path, *, max_restarts: int = 0, **env: str
) -> list[subprocess.Popen[bytes]]:
    """Two one-worker "pods" with pod-level env (as Volcano's pytorch plugin and PyTorchJob
    set it) on one checkpoint volume: ``tmp_path/pod<N>`` each, losses in ``tmp_path/loss``."""
    port = free_port()
    procs = []
    for pod in (0, 1):
        workdir = tmp_path / f"pod{pod}"
        pod_env = job_env(
            workdir,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE="2",
            RANK=str(pod),
            TRAINSTACK_CHECKPOINT_DIR=str(tmp_path / "ckpt"),
            **env,
        )
        cmd = supervisor_cmd(workdir, nproc=1, max_restarts=max_restarts)
        cmd[cmd.index("--loss-log") + 1] = str(tmp_path / "loss")
        procs.append(
            subprocess.Popen(cmd, env=pod_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    return procs


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


RunJob = Callable[..., JobResult]
Baseline = dict[int, dict[int, list[str]]]


def assert_matches_baseline(
    result: JobResult,
    baseline: dict[int, dict[int, list[str]]],
    *,
    replayed_from: int | tuple[int, ...],
) -> None:
    """Every logged loss (including steps replayed after a resume) equals the baseline bits,
    and the steps after the resumed checkpoint (one of ``replayed_from``) ran twice."""
    allowed = (replayed_from,) if isinstance(replayed_from, int) else replayed_from
    losses = result.losses()
    assert set(losses) == set(baseline)
    for rank, per_step in losses.items():
        assert sorted(per_step) == sorted(baseline[rank]), f"rank {rank} missing steps"
        for step, values in per_step.items():
            expected = baseline[rank][step][0]
            assert all(v == expected for v in values), (rank, step, values, expected)
        replayed = sorted(s for s, v in per_step.items() if len(v) > 1)
        assert replayed, f"rank {rank}: nothing was replayed"
        assert replayed[0] - 1 in allowed, (rank, replayed, allowed)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def terminate(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
