"""Example training job on the trainstack runtime: a small MLP on synthetic data.

Run it as the image does:

    python -m trainstack_runtime.supervisor --nproc-per-node 2 -- train/main.py --steps 40

Every rank appends ``<step> <loss as float.hex>`` to ``<loss-log>/rank-<r>.txt`` so runs can be
compared bit for bit. Dropout draws from the global RNG on purpose: resume is only exact if
the RNG state is restored too.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from trainstack_runtime.checkpoint import TrainState
from trainstack_runtime.data import ResumableLoader, SyntheticRegression
from trainstack_runtime.exitcodes import ConfigError
from trainstack_runtime.session import Session, run


@dataclass(frozen=True)
class Args:
    steps: int
    batch_size: int
    lr: float
    dim: int
    hidden: int
    dataset_size: int
    seed: int
    loss_log: Path | None
    step_sleep: float
    parallel: str
    declare_replicated: bool


def parse_args(argv: list[str] | None = None) -> Args:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--dataset-size", type=int, default=96)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--loss-log", type=Path, default=None)
    p.add_argument("--step-sleep", type=float, default=0.0, help="slow steps down (tests)")
    p.add_argument(
        "--parallel",
        choices=("ddp", "fsdp2", "per-rank"),
        default="ddp",
        help="ddp: replicated model; fsdp2: fully_shard (parameters and optimizer state "
        "sharded across ranks); per-rank: every rank trains its own model",
    )
    p.add_argument(
        "--declare-replicated",
        action="store_true",
        help="tests: declare per-rank state replicated (the checkpoint must refuse it)",
    )
    ns = p.parse_args(argv)
    args = Args(**vars(ns))
    if args.steps < 1 or args.lr <= 0 or args.dim < 1 or args.hidden < 1:
        raise ConfigError(f"invalid arguments: {args}")
    return args


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def train(args: Args) -> None:
    with Session.start() as s:
        topo = s.topology
        per_rank = args.parallel == "per-rank"
        torch.manual_seed(args.seed + (topo.rank if per_rank else 0))
        # This rank's GPU where there is one (the runtime made it current), else the CPU. The
        # model and every batch live there: FSDP2 moves the parameters and the forward's
        # inputs to its mesh's GPU by itself, but not the targets (torch 2.13
        # _fsdp_init._move_states_to_device, _fsdp_state._root_pre_forward), so a CPU target
        # met a CUDA output in the loss; DDP of a CPU model left the GPUs idle.
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        model: nn.Module = MLP(args.dim, args.hidden).to(device)
        if topo.is_distributed and args.parallel == "ddp":
            model = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        elif topo.is_distributed and args.parallel == "fsdp2":
            fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
        loader = ResumableLoader(
            SyntheticRegression(args.dataset_size, args.dim, seed=args.seed),
            args.batch_size,
            rank=topo.rank,
            world_size=topo.world_size,
            seed=args.seed,
        )
        state = TrainState(
            model, optimizer, scheduler, loader, replicated=not per_rank or args.declare_replicated
        )
        start = s.restore(state)
        s.watch_comm(model)
        log = None
        if args.loss_log is not None:
            args.loss_log.mkdir(parents=True, exist_ok=True)
            log = open(args.loss_log / f"rank-{topo.rank}.txt", "a")  # noqa: SIM115
        metrics: dict[str, float] = {}  # the report's final metrics (hand-off)
        try:
            for step in range(start + 1, args.steps + 1):
                with s.timed_data():
                    x, y = next(loader)
                    x, y = x.to(device), y.to(device)
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                with s.timed_backward():
                    loss.backward()
                optimizer.step()
                scheduler.step()
                if step == args.steps:  # the report's (rank 0's); no host sync before
                    metrics["loss"] = loss.item()
                if log is not None:
                    log.write(f"{step} {loss.item().hex()}\n")
                    log.flush()
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                s.end_step(step, state, samples=x.shape[0])
            s.finish(args.steps, state, metrics=metrics)
        finally:
            if log is not None:
                log.close()


if __name__ == "__main__":
    run(lambda: train(parse_args()))
