"""`make bench-runtime --quick`: two real gloo workers, the last line's keys, the A/A control.

No wall-clock assertions: timings belong to the benchmark's own run (docs/runtime.md), not to
tests. What is checked is the harness: every figure present for the four configurations, the
A/A figure formed from two measurements of the same no-checkpoint arm, the arms' order varied
between repeats with a fixed seed, checkpoints only where they belong, and the runtime-overhead
loop's ratio and its A/A control formed alike, per cycle of interleaved steps.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.harness import HAVE_TORCH

if HAVE_TORCH:
    import torch
    from trainstack_runtime import bench, bench_overhead

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed"),
]

REQUIRED = (  # issue 22; bench.MAPS has more
    "goodput_loss",
    "goodput_loss_spread",
    "aa_control",
    "aa_control_spread",
    "async_stall_ratio",
)


def test_quick_run_prints_the_figures_and_an_aa_control_of_one_arm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.main(["--quick"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert set(REQUIRED) <= set(bench.MAPS)
    for name in (*bench.MAPS, "target_met", "loss_below_floor"):
        assert set(result[name]) == {"ddp_50m", "ddp_200m", "fsdp2_50m", "fsdp2_200m"}, name
    assert result["world_size"] == 2
    assert {
        "runtime_overhead_ratio",
        "runtime_overhead_aa_ratio",
        "runtime_overhead_ratio_spread",
    } <= set(result)

    for key in bench.KEYS:
        detail = result["detail"][key]
        plan = detail["plan"]
        walls = detail["wall_s"]
        repeats = plan["repeats"]
        assert all(len(walls[arm]) == repeats for arm in ("A", "A2", "B"))
        # A and A2 are the same arm (no checkpoints); B checkpoints every K of its N steps.
        assert detail["saves_per_window"]["A"] == [0] * repeats
        assert detail["saves_per_window"]["A2"] == [0] * repeats
        assert detail["saves_per_window"]["B"] == [plan["steps"] // plan["every"]] * repeats
        assert len(detail["sync_save_s"]) == repeats
        assert len(detail["async_stall_s"]) == repeats * plan["steps"] // plan["every"]
        # The A/A control is A2 against A of the same repeat; the loss is B against the mean
        # of that repeat's A and A2.
        aa = [a2 / a - 1 for a, a2 in zip(walls["A"], walls["A2"], strict=True)]
        plain = [(a + a2) / 2 for a, a2 in zip(walls["A"], walls["A2"], strict=True)]
        loss = [b / ref - 1 for ref, b in zip(plain, walls["B"], strict=True)]
        assert result["aa_control_spread"][key] == [round(min(aa), 5), round(max(aa), 5)]
        assert result["goodput_loss_spread"][key] == [round(min(loss), 5), round(max(loss), 5)]
        # Every repeat runs every arm once, in an order that is not always the same.
        orders = detail["orders"]
        assert all(sorted(o) == sorted(bench.ARMS) for o in orders)
        assert orders == bench.arm_orders(repeats, result["seed"])
        # Settling steps run before every window, off its clock, in each window arm alike;
        # the log records what ran before each window (a carryover diagnosis needs it).
        flat = [arm for order in orders for arm in order]
        windows = [
            (arm, before)
            for arm, before in zip(flat, ["warm-up", *flat[:-1]], strict=True)
            if arm != "S"
        ]
        assert [(arm, before) for arm, before, _ in detail["step_log"]] == windows
        for _, _, steps in detail["step_log"]:
            settle = plan["settle"]
            assert settle >= 1
            assert all(t < 0 for t in steps[:settle]), steps  # negative: untimed
            assert len(steps) == settle + plan["steps"]
            assert all(t >= 0 for t in steps[settle:]), steps


def test_arm_order_alternates_with_a_fixed_seed() -> None:
    orders = bench.arm_orders(6, seed=22)
    assert orders == bench.arm_orders(6, seed=22)
    assert len({tuple(o) for o in orders}) > 1
    # each arm goes first in some repeat and not in all of them
    assert {o[0] for o in orders} != {orders[0][0]}
    assert bench.arm_orders(4, seed=1) != bench.arm_orders(4, seed=22)


def _detail(a: list[float], a2: list[float], b: list[float]) -> dict[str, Any]:
    return {
        "plan": {"steps": 10, "every": 10, "repeats": len(a)},
        "wall_s": {"A": a, "A2": a2, "B": b},
        "sync_save_s": [1.0] * len(a),
        "async_stall_s": [0.01] * len(a),
        "persist_s": [1.0] * len(a),
        "step_s": 1.0,
    }


def test_a_loss_below_its_floor_is_not_a_target_met() -> None:
    """Checkpoints cannot make training faster: a loss whose whole spread is below 0 is a
    wrong measurement, however small, and the loss is against the mean of A and A'."""
    fine = _detail([10.0, 10.2, 9.8, 10.0], [10.2, 10.0, 10.0, 9.8], [10.3, 10.1, 10.4, 9.9])
    biased = _detail([10.0, 10.2, 9.8, 10.0], [10.2, 10.0, 10.0, 9.8], [9.5, 9.6, 9.4, 9.7])
    out = bench.summarize({"ddp_50m": fine, "fsdp2_50m": biased})
    assert out["loss_below_floor"] == {"ddp_50m": False, "fsdp2_50m": True}
    assert out["target_met"] == {"ddp_50m": True, "fsdp2_50m": False}
    assert out["goodput_loss_spread"]["ddp_50m"][0] == round(9.9 / 9.9 - 1, 5)


@pytest.mark.parametrize("n", [2, 4, 6, 8])
def test_williams_square_balances_position_and_carryover(n: int) -> None:
    rows = bench.williams(n)
    for position in range(n):
        assert sorted(row[position] for row in rows) == list(range(n))
    follows = [pair for row in rows for pair in itertools.pairwise(row)]
    assert sorted(follows) == [(a, b) for a in range(n) for b in range(n) if a != b]


def test_four_repeats_run_each_arm_after_each_other_arm_once() -> None:
    orders = bench.arm_orders(4, seed=22)
    assert all(sorted(order) == sorted(bench.ARMS) for order in orders)
    follows = [pair for order in orders for pair in itertools.pairwise(order)]
    assert len(follows) == len(set(follows)) == 12


def test_overhead_and_aa_are_paired_per_cycle_ratios_of_interleaved_steps(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    o = bench_overhead.bench_overhead(12, 2, 16, tmp_path, threads=1)
    assert torch.get_num_threads() == threads  # process-wide setting restored
    arms = ("plain", "plain2", "runtime")
    steps = o["step_s"]
    assert all(len(steps[arm]) == 12 for arm in arms)  # one step per arm and cycle
    # Both ratios are formed the same way: per cycle, against the plain step of that cycle.
    plain = steps["plain"]
    overhead = [r / p for p, r in zip(plain, steps["runtime"], strict=True)]
    aa = [a / p for p, a in zip(plain, steps["plain2"], strict=True)]
    # (rel: the step times come back rounded to the nanosecond)
    assert o["overhead_ratio"] == pytest.approx(statistics.median(overhead), rel=1e-4)
    assert o["aa_ratio"] == pytest.approx(statistics.median(aa), rel=1e-4)
    lo, hi = o["overhead_ratio_spread"]
    assert min(overhead) - 1e-5 <= lo <= hi <= max(overhead) + 1e-5
    # The orders: all six, each arm in each position equally often, and in the stream of
    # steps no arm right after itself and each after each other arm equally often.
    orders = o["orders"]
    assert sorted(map(tuple, orders)) == sorted(
        (a, b, c) for a in arms for b in arms for c in arms if len({a, b, c}) == 3
    )
    stream = [arm for order in orders * 2 for arm in order]
    pairs = list(itertools.pairwise(stream))[: 3 * len(orders)]
    assert all(a != b for a, b in pairs)
    assert {pairs.count((a, b)) for a in arms for b in arms if a != b} == {3}
    # No checkpoint: the runtime arm polls but never saves.
    assert not any(tmp_path.joinpath("overhead").glob("step-*"))
