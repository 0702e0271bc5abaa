"""`make bench-runtime --quick`: two real gloo workers, the last line's keys, the A/A control.

No wall-clock assertions: timings belong to the benchmark's own run (docs/runtime.md), not to
tests. What is checked is the harness: every figure present for the four configurations, the
A/A figure formed from two measurements of the same no-checkpoint arm, the arms' order varied
between repeats with a fixed seed, and checkpoints only where they belong.
"""

from __future__ import annotations

import json

import pytest

from tests.runtime.harness import HAVE_TORCH

if HAVE_TORCH:
    from trainstack_runtime import bench

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
    for name in (*bench.MAPS, "target_met"):
        assert set(result[name]) == {"ddp_50m", "ddp_200m", "fsdp2_50m", "fsdp2_200m"}, name
    assert result["world_size"] == 2
    assert {"runtime_overhead_ratio", "runtime_overhead_aa_ratio"} <= set(result)

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
        # The A/A control is A2 against A of the same repeat; the loss is B against that A.
        aa = [a2 / a - 1 for a, a2 in zip(walls["A"], walls["A2"], strict=True)]
        loss = [b / a - 1 for a, b in zip(walls["A"], walls["B"], strict=True)]
        assert result["aa_control_spread"][key] == [round(min(aa), 5), round(max(aa), 5)]
        assert result["goodput_loss_spread"][key] == [round(min(loss), 5), round(max(loss), 5)]
        # Every repeat runs every arm once, in an order that is not always the same.
        orders = detail["orders"]
        assert all(sorted(o) == sorted(bench.ARMS) for o in orders)
        assert orders == bench.arm_orders(repeats, result["seed"])


def test_arm_order_alternates_with_a_fixed_seed() -> None:
    orders = bench.arm_orders(6, seed=22)
    assert orders == bench.arm_orders(6, seed=22)
    assert len({tuple(o) for o in orders}) > 1
    # each arm goes first in some repeat and not in all of them
    assert {o[0] for o in orders} != {orders[0][0]}
