"""`make bench-runtime`: the --quick run end to end, and the estimator on synthetic step times.

No wall-clock assertions on real runs: timings belong to the benchmark's own run
(docs/runtime.md, Benchmark), not to tests. What is checked: every figure present for the four
configurations, the windows as planned (alternating, W = a + r steps, both ranks' records), the
summary formed from the raw windows as documented; and on synthetic step times with a known
answer, that the estimator recovers a known cost within its interval, that a placebo with no
effect holds 0, that the interval covers at its nominal rate, and that the target fails when
the placebo excludes 0 or is wide, when a save was uncommitted, or when the bound exceeds 5 %.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.harness import HAVE_TORCH

if HAVE_TORCH:
    import torch
    from trainstack_runtime import bench, bench_overhead
from trainstack_runtime import bench_stats
from trainstack_runtime.bench_stats import mean_ci95, verdict, window_estimate

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

REQUIRED = (  # the figures; bench.MAPS has more
    "goodput_loss",
    "async_stall_ratio",
    "cost_s",
    "cost_ci95",
    "placebo_ci95",
    "interval_s",
    "loss_upper",
)


@pytest.mark.slow
@needs_torch
def test_quick_run_prints_the_figures_from_alternating_windows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.main(["--quick"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert set(REQUIRED) <= set(bench.MAPS)
    for name in (*bench.MAPS, "target_met", "placebo_holds_zero", "placebo_narrow"):
        assert set(result[name]) == set(bench.KEYS), name
    assert result["world_size"] == 2
    assert {
        "runtime_overhead_ratio",
        "runtime_overhead_aa_ratio",
        "runtime_overhead_ratio_spread",
    } <= set(result)
    plans = {p.key: p for p in bench.QUICK}
    for key in bench.KEYS:
        detail, plan = result["detail"][key], plans[key]
        a, r = detail["a"], detail["r"]
        assert r == plan.ref
        assert a == max(detail["trial_commit_steps"]) + plan.margin
        windows = detail["windows"]
        kinds = [w["kind"] for w in windows]
        assert kinds == ["checkpoint", "placebo"] * plan.windows
        assert result["windows"][key] == {"checkpoint": plan.windows, "placebo": plan.windows}
        for w in windows:
            assert len(w["ranks"]) == 2
            for rec in w["ranks"]:
                assert len(rec["steps"]) == a + r
                assert rec["committed"] == (0 <= rec["commit_step"] <= a)
                if w["kind"] == "placebo":
                    assert rec["persist_s"] == 0.0
                    assert rec["commit_step"] == 0
                else:
                    assert rec["commit_step"] != 0
        assert len(detail["sync_save_s"]) == plan.sync_saves
        # The figures are the documented functions of the raw windows.
        est = [
            statistics.fmean(
                window_estimate(rec["steps"], a, rec["save_s"] + rec["wait_s"])
                for rec in w["ranks"]
            )
            for w in windows
            if w["kind"] == "checkpoint"
        ]
        mean, lo, hi = mean_ci95(est)
        assert result["cost_s"][key] == pytest.approx(mean, abs=1e-5)
        assert result["cost_ci95"][key] == pytest.approx([lo, hi], abs=1e-5)
        for name, mean_name in (("cost_ci95", "cost_s"), ("placebo_ci95", "placebo_s")):
            lo, hi = result[name][key]
            assert lo <= result[mean_name][key] <= hi, name
        assert result["interval_s"][key] == plan.interval_s
        assert result["goodput_loss"][key] == result["loss_upper"][key]
        paired_upper = result["paired_cost_ci95"][key][1] / plan.interval_s
        assert result["paired_loss_upper"][key] == pytest.approx(paired_upper, abs=1e-5)
        upper = result["cost_ci95"][key][1] / plan.interval_s
        assert result["loss_upper"][key] == pytest.approx(upper, abs=1e-5)
        uncommitted = sum(
            not all(rec["committed"] for rec in w["ranks"])
            for w in windows
            if w["kind"] == "checkpoint"
        )
        assert result["uncommitted_windows"][key] == uncommitted
        if uncommitted:
            assert result["target_met"][key] is False


# --- the statistics, on synthetic step times ---------------------------------------------------


@pytest.mark.parametrize(
    ("df", "table"),
    [(1, 12.7062), (2, 4.3027), (4, 2.7764), (5, 2.5706), (10, 2.2281), (23, 2.0687), (60, 2.0003)],
)
def test_t_quantile_matches_the_tables(df: int, table: float) -> None:
    assert bench_stats.t_quantile(0.975, df) == pytest.approx(table, abs=1e-3)
    assert bench_stats.t_quantile(0.025, df) == pytest.approx(-table, abs=1e-3)


def test_mean_ci95_is_the_t_interval() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]  # mean 3, stdev sqrt(2.5)
    mean, lo, hi = mean_ci95(values)
    half = 2.7764 * 2.5**0.5 / 5**0.5
    assert mean == 3.0
    assert (lo, hi) == pytest.approx((3 - half, 3 + half), abs=1e-3)


def test_window_estimate_is_outside_time_plus_after_steps_over_the_reference_mean() -> None:
    steps = [1.3, 1.1, 1.0, 0.9, 1.1]  # reference (a=2): mean(1.0, 0.9, 1.1) = 1.0
    assert window_estimate(steps, 2, outside=0.05) == pytest.approx(0.05 + 0.3 + 0.1)
    # the mean, not the median: median(1.0, 0.9, 1.2) = 1.0 but the mean is 1.033
    assert window_estimate([1.0, 1.0, 0.9, 1.2], 1) == pytest.approx(-1 / 30)
    with pytest.raises(ValueError, match="need 0 < a"):
        window_estimate(steps, 5)
    with pytest.raises(ValueError, match="need 0 < a"):
        window_estimate(steps, 0)


EXTRA = (0.15, 0.1, 0.05, 0.0)  # a checkpoint's +0.3 s, spread over the after steps
SAVE_S = 0.01  # time in save()
A, R = 4, 3


def _windows(rng: random.Random, n: int, extra: tuple[float, ...]) -> list[float]:
    """n synthetic windows' estimates: each window has its own step time (drift between
    windows, 0.8-1.2 s, which the in-window reference removes), steps with skewed noise, and
    ``extra`` added to its after steps."""
    out = []
    for _ in range(n):
        base = rng.uniform(0.8, 1.2)
        steps = [base + rng.gauss(0, 0.02) + rng.expovariate(50) for _ in range(A + R)]
        steps = [t + (extra[i] if i < len(extra) else 0.0) for i, t in enumerate(steps)]
        out.append(window_estimate(steps, A, SAVE_S if any(extra) else 0.0))
    return out


def test_a_known_cost_is_recovered_within_its_interval_and_a_placebo_holds_zero() -> None:
    rng = random.Random(7)
    cost = mean_ci95(_windows(rng, 24, EXTRA))
    placebo = mean_ci95(_windows(rng, 24, ()))
    truth = sum(EXTRA) + SAVE_S
    assert cost[1] <= truth <= cost[2]
    assert cost[1] > 0  # and it resolves it: the interval excludes 0
    assert placebo[1] <= 0 <= placebo[2]
    assert placebo[2] - placebo[1] < truth  # narrower than the effect
    # Drift between windows does not enter: the same windows at one fixed step time read alike.
    assert cost[2] - cost[1] < 0.1


def test_the_interval_covers_the_truth_at_its_nominal_rate() -> None:
    """Over 400 synthetic runs of 24 windows each, the 95 % interval holds the true cost in
    90-99 % of them (96.5 % here): an interval on the wrong scale falls out of that range
    (stdev/n for stdev/sqrt(n) covers 37 %, stdev alone 100 %)."""
    rng = random.Random(11)
    truth = sum(EXTRA) + SAVE_S
    hits = sum(
        lo <= truth <= hi for _, lo, hi in (mean_ci95(_windows(rng, 24, EXTRA)) for _ in range(400))
    )
    zero = sum(
        lo <= 0 <= hi for _, lo, hi in (mean_ci95(_windows(rng, 24, ())) for _ in range(400))
    )
    assert 0.90 <= hits / 400 <= 0.99
    assert 0.90 <= zero / 400 <= 0.99


def test_the_placebo_estimate_is_unbiased_with_skewed_step_times() -> None:
    """Over 3,000 no-effect windows the mean estimate is within 4 standard errors of 0. The
    same windows with a median reference read a positive cost (the median of 3 right-skewed
    step times sits below their mean): what the placebo would flag in a real run."""
    rng = random.Random(3)
    windows = []
    for _ in range(3000):
        base = rng.uniform(0.8, 1.2)
        windows.append([base + rng.gauss(0, 0.02) + rng.expovariate(50) for _ in range(A + R)])
    est = [window_estimate(w, A) for w in windows]
    se = statistics.stdev(est) / len(est) ** 0.5
    assert abs(statistics.fmean(est)) < 4 * se
    median_ref = [sum(t - statistics.median(w[A:]) for t in w[:A]) for w in windows]
    assert statistics.fmean(median_ref) > 4 * se


def test_target_needs_the_bound_under_5_percent_a_narrow_placebo_at_0_and_committed_saves() -> None:
    ok = verdict(1.5, (-0.1, 0.1), 30.0, 0)
    assert ok["target_met"]
    assert ok["loss_upper"] == pytest.approx(0.05)
    assert not verdict(1.51, (-0.1, 0.1), 30.0, 0)["target_met"]  # loss_upper > 5 %
    excluded = verdict(0.5, (0.05, 0.2), 30.0, 0)  # the placebo finds a cost where none is
    assert not excluded["placebo_holds_zero"]
    assert not excluded["target_met"]
    assert not verdict(0.5, (-0.4, -0.01), 30.0, 0)["target_met"]
    wide = verdict(0.5, (-0.31, 0.31), 30.0, 0)  # half-width 0.31 s > 1 % of 30 s
    assert wide["placebo_holds_zero"]
    assert not wide["placebo_narrow"]
    assert not wide["target_met"]
    assert verdict(0.5, (-0.29, 0.29), 30.0, 0)["target_met"]
    assert not verdict(0.5, (-0.1, 0.1), 30.0, 1)["target_met"]  # an uncommitted window
    # The paired whole-window bound must hold too (a reference slowed by the save reads low).
    paired = verdict(0.5, (-0.1, 0.1), 30.0, 0, paired_hi=1.6)
    assert paired["loss_upper"] < 0.05 < paired["paired_loss_upper"]
    assert not paired["target_met"]
    assert verdict(0.5, (-0.1, 0.1), 30.0, 0, paired_hi=1.5)["target_met"]


def _rec(steps: list[float], **kw: Any) -> dict[str, Any]:
    rec = {"steps": steps, "save_s": 0.0, "wait_s": 0.0, "hook_s": 0.0, "committed": True}
    return {**rec, "bg_cpu_s": 0.0, "persist_s": 0.5, **kw}


@needs_torch
def test_summary_of_synthetic_windows() -> None:
    """Per window the mean of both ranks; save() and wait() time count, the hook's stall does
    not (it is inside the first after step); a window uncommitted on one rank counts; the
    paired figure is formed from whole windows."""
    ckpt = [1.5, 1.0, 1.0, 1.0]  # a=1, r=3: +0.5 s
    windows = []
    for i in range(6):
        r1 = {"committed": i != 3}  # one window where rank 1 had not committed
        c = [_rec(ckpt, save_s=0.1, hook_s=0.4), _rec(ckpt, wait_s=0.1 * (i % 2), **r1)]
        p = [_rec([1.0 + 0.01 * (i % 2), 1.0, 1.0, 1.0], persist_s=0.0)] * 2
        windows += [{"kind": "checkpoint", "ranks": c}, {"kind": "placebo", "ranks": p}]
    detail = {"a": 1, "r": 3, "plan": {"interval_s": 30.0}, "sync_save_s": [1.0, 2.0, 3.0]}
    out = bench.summarize({"ddp_50m": {**detail, "windows": windows}})
    # rank 0: 0.1 + 0.5; rank 1: 0.5 + 0.1 every other window -> mean 0.575
    assert out["cost_s"]["ddp_50m"] == pytest.approx(0.575)
    assert out["placebo_s"]["ddp_50m"] == pytest.approx(0.005)
    assert out["uncommitted_windows"]["ddp_50m"] == 1
    assert out["async_stall_s"]["ddp_50m"] == pytest.approx(0.5)  # max over ranks of save + hook
    assert out["async_stall_ratio"]["ddp_50m"] == pytest.approx(0.5 / 2.0)  # no spread: = mean
    assert out["goodput_loss"] == out["loss_upper"]
    assert out["target_met"] == {"ddp_50m": False}
    # Paired: a checkpoint window's whole time against the mean of the placebos next to it
    # (the first has one): 0.55, then 0.595 and 0.545 in turn.
    lo, hi = out["paired_cost_ci95"]["ddp_50m"]
    assert (lo + hi) / 2 == pytest.approx((0.55 + 3 * 0.595 + 2 * 0.545) / 6, abs=1e-5)
    assert out["windows"]["ddp_50m"] == {"checkpoint": 6, "placebo": 6}


@needs_torch
def test_background_cpu_counts_other_python_threads_not_the_main_one() -> None:
    stop = threading.Event()
    spent: list[float] = []

    def spin() -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.1:
            pass
        spent.append(time.thread_time() - t0)
        stop.wait()

    before = bench.background_cpu()
    thread = threading.Thread(target=spin)
    thread.start()
    while not spent:
        time.sleep(0.01)
    after = bench.background_cpu()
    stop.set()
    thread.join()
    assert threading.main_thread().native_id not in after
    assert thread.native_id in after
    # clock ticks (10 ms): at least the thread's own CPU time less a tick or two
    assert after[thread.native_id] - before.get(thread.native_id, 0.0) >= spent[0] - 0.03


# --- the runtime-overhead loop (bench_overhead) --------------------------------------------


@pytest.mark.slow
@needs_torch
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
