"""The training job of tests/runtime/test_elastic.py: it records what a resize does.

Run under the supervisor, one process per "pod". Every rank appends one JSON line per
optimizer step to ``<log>/rank-<r>.jsonl``: the step, the world size, the learning rate the
step used and, per micro-batch, the loader's epoch and the dataset indices it read. After
restoring, every rank writes the model and optimizer state it holds to
``<dump>/restored-<step>-w<world>-r<rank>.pt``; at the end rank 0 writes
``<dump>/final-<step>.pt``. The test compares them with the checkpoint on disk.

``--worlds A[,B] --switch-at K``: steps up to K run on A workers, later ones on B. A worker
group of another size holds where it is, training nothing, until its agent stops it for the
next round (SIGTERM), so which world size trains which steps does not depend on when each
pod happened to join the rendezvous or the test stopped one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.nn.parallel import DistributedDataParallel
from trainstack_runtime.checkpoint import TrainState
from trainstack_runtime.data import ResumableLoader, SyntheticRegression
from trainstack_runtime.exitcodes import Preempted
from trainstack_runtime.session import PEER_STOP_GRACE_S, Session, run

LR = 0.05
LR_EVERY, LR_GAMMA = 4, 0.5  # StepLR: the rate halves every 4 steps


class Indexed(SyntheticRegression):
    """The synthetic samples, each with its index."""

    def __getitem__(self, index: Any) -> Any:
        x, y = super().__getitem__(index)
        return x, y, torch.tensor(index)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--dataset-size", type=int, default=96)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--dump", type=Path, required=True)
    p.add_argument("--worlds", type=lambda raw: [int(w) for w in raw.split(",")], required=True)
    p.add_argument("--switch-at", type=int, default=0)
    return p.parse_args()


def dump(path: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    msd, osd = get_state_dict(model, [optimizer])
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "model": msd, "optim": osd}, path)


def hold(s: Session, state: TrainState, step: int) -> None:
    """Train nothing until the agent stops this worker group for a new round (SIGTERM)."""
    while True:
        time.sleep(0.05)
        if step > 0:  # as a loop that stays at ``step``: its checkpoint, then Preempted
            s.end_step(step, state)
        elif s.preemption.agreed():  # a fresh start: nothing to save; as end_step stops
            if not s.preemption.requested:
                s.preemption.until_signalled(PEER_STOP_GRACE_S)
            raise Preempted(step)


def world_for(args: argparse.Namespace, step: int) -> int:
    worlds: list[int] = args.worlds
    return worlds[0] if step <= args.switch_at or len(worlds) == 1 else worlds[1]


def train(args: argparse.Namespace) -> None:
    with Session.start() as s:
        topo = s.topology
        torch.manual_seed(args.seed)
        model: nn.Module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        if topo.is_distributed:
            model = DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, LR_EVERY, LR_GAMMA)
        dataset = Indexed(args.dataset_size, 16, seed=args.seed)
        loader = ResumableLoader(
            dataset,
            args.micro_batch,
            rank=topo.rank,
            world_size=topo.world_size,
            seed=args.seed,
        )
        state = TrainState(model, optimizer, scheduler, loader)
        start = s.restore(state)
        if topo.world_size == world_for(args, start + 1):
            name = f"restored-{start}-w{topo.world_size}-r{topo.rank}.pt"
            dump(args.dump / name, start, model, optimizer)
        plan = s.batch_plan(args.micro_batch)
        args.log.mkdir(parents=True, exist_ok=True)
        with open(args.log / f"rank-{topo.rank}.jsonl", "a") as log:
            for step in range(start + 1, args.steps + 1):
                if topo.world_size != world_for(args, step):
                    hold(s, state, step - 1)
                record: dict[str, Any] = {
                    "step": step,
                    "world": topo.world_size,
                    "rank": topo.rank,
                    "restarts": topo.restart_count,  # TORCHELASTIC_RESTART_COUNT
                    "lr": optimizer.param_groups[0]["lr"],
                    "accumulation": plan.accumulation,
                    "batches": [],
                }
                optimizer.zero_grad(set_to_none=True)
                for _ in range(plan.accumulation):
                    with s.timed_data():
                        x, y, index = next(loader)
                    record["batches"].append([loader.epoch, index.tolist()])
                    loss = nn.functional.mse_loss(model(x), y) / plan.accumulation
                    with s.timed_backward():
                        loss.backward()
                optimizer.step()
                scheduler.step()
                log.write(json.dumps(record) + "\n")
                log.flush()
                s.end_step(step, state, samples=plan.micro_batch * plan.accumulation)
            s.finish(args.steps, state)
        if topo.rank == 0:
            dump(args.dump / f"final-{args.steps}.pt", args.steps, model, optimizer)


if __name__ == "__main__":
    run(lambda: train(parse_args()))
