"""The runtime's per-step overhead, one process (``runtime_overhead_ratio`` of
``make bench-runtime``; docs/runtime.md, Benchmark): the runtime's per-step work against the
plain loop, interleaved step by step with an A/A control. ``bench`` runs it first and puts its
ratios on the last line."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import CheckpointConfig, TrainState
from .contract import ENV_RUN_DIR


def mlp(layers: int, width: int) -> nn.Sequential:
    """The benchmarks' model: ``layers`` Linear(width, width) + ReLU."""
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods)


def bench_overhead(
    cycles: int, warmup: int, width: int, root: Path, threads: int = 1
) -> dict[str, Any]:
    """The runtime's per-step work (timers, progress record, preemption check, fault hook,
    checkpoint poll; no checkpoints) against the same plain loop, one process, with an A/A
    control (the plain loop again, ``aa_ratio``).

    Interleaved at the step level: each cycle runs one step of each arm (plain, plain', runtime)
    in an order that goes through all six permutations, and the ratios are per cycle (runtime /
    plain, plain' / plain), so drift and load bursts, which last far longer than a cycle, hit
    the arms of a cycle alike. Each arm trains its own identical copy of the model on the same
    input, so the three steps of a cycle do the same arithmetic on the same numbers.
    ``overhead_ratio`` and ``aa_ratio`` are the medians over the cycles, their ``_spread`` the
    interquartile range."""
    from .session import Session  # noqa: PLC0415 - needs ENV_RUN_DIR set first

    # Blocks of steps per arm on one shared model read 0.76 against an A/A of 0.97: the MLP
    # trained on square().mean() dies within ~100 steps (all gradients 0), Adam's exp_avg then
    # decays by 0.9 a step into denormals from ~step 600 (opt.step() 3-8x slower without
    # flush-denormal), and on a busy 2-core machine two threads per step stall on each other;
    # whichever arm's block caught more of that read slower. As each worker does: flush
    # denormals, a fixed thread count. Both are process-wide; restored at the end because run()
    # and the tests call this in their own process (flush-denormal is off by default and has
    # no getter).
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    previous = os.environ.get(ENV_RUN_DIR)
    os.environ[ENV_RUN_DIR] = str(root / "run")
    try:
        torch.manual_seed(0)
        x = torch.randn(64, width)
        models = {arm: mlp(4, width) for arm in ("plain", "plain2", "runtime")}
        for model in models.values():
            model.load_state_dict(models["plain"].state_dict())
        opts = {arm: torch.optim.Adam(m.parameters(), lr=1e-4) for arm, m in models.items()}
        state = TrainState(models["runtime"], opts["runtime"])
        # The checkpoint manager's optimizer step pre-hook is process-wide, so the plain steps
        # run it too (an attribute check while no save is in flight): a few µs not counted.
        session = Session.start(CheckpointConfig(root=root / "overhead"))
        session.watch_comm(models["runtime"])

        def plain_step(arm: str, _: int) -> None:
            opts[arm].zero_grad(set_to_none=True)
            models[arm](x).square().mean().backward()
            opts[arm].step()

        def runtime_step(arm: str, cycle: int) -> None:  # one runtime step per cycle
            with session.timed_data():
                pass  # the plain loop has no loader either
            opts[arm].zero_grad(set_to_none=True)
            loss = models[arm](x).square().mean()
            with session.timed_backward():
                loss.backward()
            session.before_optimizer_step()
            opts[arm].step()
            session.end_step(cycle + 1, state, samples=x.shape[0])

        run_arm: dict[str, Callable[[str, int], None]] = {
            "plain": plain_step,
            "plain2": plain_step,
            "runtime": runtime_step,
        }
        # All six orders, so each arm is first, middle and last equally often; in this sequence
        # the step before each one is, over six cycles, each other arm exactly twice and never
        # its own (a step right after its own model's step finds that model in cache: an A/A of
        # 0.98 at width 64 when plain' followed itself). Whole balance needs cycles % 6 == 0.
        orders = [
            [("plain", "plain2", "runtime")[int(c)] for c in order]
            for order in ("012", "021", "210", "102", "120", "201")
        ]
        step_s: dict[str, list[float]] = {arm: [] for arm in run_arm}
        for i in range(warmup + cycles):  # warm-up: allocator, caches, first progress record
            for arm in orders[i % len(orders)]:
                t0 = time.perf_counter()
                run_arm[arm](arm, i)
                if i >= warmup:
                    step_s[arm].append(time.perf_counter() - t0)
        session.checkpoints.close()
    finally:
        if previous is None:
            os.environ.pop(ENV_RUN_DIR, None)
        else:
            os.environ[ENV_RUN_DIR] = previous
        torch.set_num_threads(previous_threads)
        torch.set_flush_denormal(False)
    plain = step_s["plain"]
    # Per cycle, both against the plain step of the same cycle: measured the same way.
    ratio = {
        name: [t / p for p, t in zip(plain, step_s[arm], strict=True)]
        for name, arm in (("overhead_ratio", "runtime"), ("aa_ratio", "plain2"))
    }
    return {
        "plain_step_s": statistics.median(plain),
        "runtime_step_s": statistics.median(step_s["runtime"]),
        "overhead_step_s": statistics.median(
            t - p for p, t in zip(plain, step_s["runtime"], strict=True)
        ),
        **{name: statistics.median(values) for name, values in ratio.items()},
        **{  # interquartile range
            f"{name}_spread": [
                round(q, 5) for q in statistics.quantiles(values, n=4, method="inclusive")[::2]
            ]
            for name, values in ratio.items()
        },
        "steps_each": cycles,
        "warmup_cycles": warmup,
        "threads": threads,
        "orders": orders,
        "step_s": {arm: [round(t, 9) for t in ts] for arm, ts in step_s.items()},
    }
