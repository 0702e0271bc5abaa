"""Checkpoint stall and runtime overhead benchmark (``make bench-runtime``).

Measures in one run, single process on this machine:

* the training-loop stall per checkpoint: the runtime's async save (time blocked in ``save()``
  plus in ``wait_for_staging()`` before the next ``optimizer.step()``) versus a synchronous
  ``torch.save`` of the same state (tmp file, fsync, rename), at ~50M and ~200M parameters with
  Adam (so ~0.6 GB and ~2.4 GB of state). Saves are spaced so that the previous persist has
  finished: back-pressure is reported separately, it depends on the interval, not the design.
* step time with the runtime's per-step work (timers, progress record, preemption check,
  fault hook, checkpoint poll) versus the same plain loop, interleaved to cancel drift.

The last line printed is one JSON object (``async_stall_ratio_50m``, ``async_stall_ratio_200m``,
``runtime_overhead_ratio`` and the raw numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import CheckpointConfig, CheckpointManager, TrainState, capture_rng
from .contract import ENV_RUN_DIR


def _model(layers: int, width: int) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods)


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class _Trainer:
    def __init__(self, layers: int, width: int, batch: int) -> None:
        torch.manual_seed(0)
        self.model = _model(layers, width)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1000)
        self.x = torch.randn(batch, width)
        self.state = TrainState(self.model, self.opt, self.sched)

    def forward_backward(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.model(self.x).square().mean().backward()

    def optimizer_step(self) -> None:
        self.opt.step()
        self.sched.step()

    def step(self) -> None:
        self.forward_backward()
        self.optimizer_step()


def _sync_save(trainer: _Trainer, path: Path, step: int) -> float:
    t0 = time.perf_counter()
    state = {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.opt.state_dict(),
        "scheduler": trainer.sched.state_dict(),
        "step": step,
        "rng": capture_rng(),
    }
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return time.perf_counter() - t0


def bench_stall(layers: int, width: int, root: Path, saves: int) -> dict[str, Any]:
    trainer = _Trainer(layers, width, batch=4)
    for _ in range(2):
        trainer.step()  # materialise Adam state so both paths save the same bytes
    sync = []
    for i in range(2):
        sync.append(_sync_save(trainer, root / f"sync-{i}.pt", i))
        trainer.step()
    size = (root / "sync-0.pt").stat().st_size
    for f in root.glob("sync-*.pt"):
        f.unlink()

    mgr = CheckpointManager(CheckpointConfig(root=root / "async", keep=2))
    stalls, backpressure, persist, overlapped_steps = [], [], [], []
    step = 2
    # The first save allocates the reusable host buffers (a one-off, like a first-step save).
    for i in range(saves + 1):
        step += 1
        trainer.step()
        t0 = time.perf_counter()
        mgr.wait()  # previous persist done: measured separately as back-pressure
        waited = time.perf_counter() - t0
        t1 = time.perf_counter()
        mgr.save(step, trainer.state)
        call = time.perf_counter() - t1
        trainer.forward_backward()
        t2 = time.perf_counter()
        mgr.wait_for_staging()
        blocked = call + time.perf_counter() - t2
        trainer.optimizer_step()
        n = 1
        while mgr.in_flight():
            trainer.step()
            n += 1
        mgr.poll()
        if i > 0:
            stalls.append(blocked)
            backpressure.append(waited)
            persist.append(mgr.last_persist_s)
            overlapped_steps.append(n)
    mgr.close()
    median_sync = statistics.median(sync)
    median_stall = statistics.median(stalls)
    return {
        "params": _params(trainer.model),
        "state_bytes": size,
        "sync_save_s": sync,
        "async_stall_s": stalls,
        "async_backpressure_s": backpressure,
        "async_persist_s": persist,
        "steps_overlapping_persist": overlapped_steps,
        "stall_ratio": median_stall / median_sync,
        "stall_ratio_max": max(stalls) / min(sync),
    }


def bench_overhead(rounds: int, steps: int, root: Path) -> dict[str, Any]:
    from .session import Session  # noqa: PLC0415 - needs ENV_RUN_DIR set first

    os.environ[ENV_RUN_DIR] = str(root / "run")
    trainer = _Trainer(layers=4, width=1024, batch=64)
    session = Session.start(CheckpointConfig(root=root / "overhead"))
    session.watch_comm(trainer.model)
    plain: list[float] = []
    runtime: list[float] = []
    step = 0
    for _ in range(3):
        trainer.step()  # warm-up
    for _ in range(rounds):
        for _ in range(steps):
            t0 = time.perf_counter()
            trainer.forward_backward()
            trainer.optimizer_step()
            plain.append(time.perf_counter() - t0)
        for _ in range(steps):
            step += 1
            t0 = time.perf_counter()
            with session.timed_data():
                pass  # the plain loop has no loader either
            trainer.opt.zero_grad(set_to_none=True)
            loss = trainer.model(trainer.x).square().mean()
            with session.timed_backward():
                loss.backward()
            session.before_optimizer_step()
            trainer.optimizer_step()
            session.end_step(step, trainer.state, samples=trainer.x.shape[0])
            runtime.append(time.perf_counter() - t0)
    session.checkpoints.close()
    return {
        "plain_step_s": statistics.median(plain),
        "runtime_step_s": statistics.median(runtime),
        "overhead_ratio": statistics.median(runtime) / statistics.median(plain),
        "steps_each": len(plain),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainstack_runtime.bench")
    parser.add_argument("--dir", type=Path, default=None, help="scratch dir (default: a tmp dir)")
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    sizes = {"50m": (12, 2048), "200m": (48, 2048)}
    if args.quick:
        sizes = {"50m": (2, 256), "200m": (4, 256)}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="trainstack-bench-") as tmp:
        root = Path(tmp)
        result: dict[str, Any] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
        for label, (layers, width) in sizes.items():
            sub = root / label
            sub.mkdir()
            r = bench_stall(layers, width, sub, args.saves)
            print(f"{label}: {json.dumps(r)}", flush=True)
            result[f"async_stall_ratio_{label}"] = round(r["stall_ratio"], 5)
            result[f"detail_{label}"] = r
        o = bench_overhead(rounds=2 if args.quick else 10, steps=5 if args.quick else 20, root=root)
        print(f"overhead: {json.dumps(o)}", flush=True)
        result["runtime_overhead_ratio"] = round(o["overhead_ratio"], 5)
        result["detail_overhead"] = o
    print(json.dumps(result, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
