"""Checkpoint cost benchmark of the runtime (``make bench-runtime``; docs/runtime.md, Benchmark).

One run measures DDP and FSDP2 (``fully_shard`` per layer) at ~50M and ~200M parameters (an MLP
trained with Adam), each on 2 real worker processes (gloo, ``torch.multiprocessing`` spawn, one
thread each), the four configurations one after the other in the same two workers. What it
measures is **seconds of training lost per checkpoint**, with a 95 % confidence interval:

* **Windows.** A checkpoint window is an async ``CheckpointManager.save()`` followed by W = a + r
  steps; a placebo window is the same harness with a timed no-op in place of ``save()``. They
  alternate (checkpoint, placebo, checkpoint, ...), ``Plan.windows`` of each. The first ``a``
  steps are the after steps: ``a`` is set in the warm-up, the steps two trial async saves took
  to commit on both ranks plus ``Plan.margin``, then fixed for the configuration. The last
  ``r`` steps are the window's own reference. A checkpoint window whose save had not committed
  on every rank when its reference steps began is counted in ``uncommitted_windows`` (its
  reference steps still carried the save: the estimate is low) and fails the target.
* **Estimator** (``bench_stats.window_estimate``, per window and rank, then the mean of the two
  ranks): time in ``save()`` and the end-of-window ``wait()`` + the after steps' time over the
  mean of the reference steps. ``cost_s`` and ``cost_ci95``: mean and t-interval over the
  checkpoint windows; ``placebo_ci95`` the same over the placebo windows, which must hold 0;
  ``paired_cost_ci95``: each checkpoint window's whole time minus the mean of its neighbouring
  placebo windows' (no in-window reference: the check that the reference steps were clean).
* **Loss.** ``interval_s`` is fixed in advance per configuration (``FULL``); ``loss_upper`` =
  ``cost_ci95[1] / interval_s``, which ``goodput_loss`` holds too. ``target_met``
  (``bench_stats.verdict``): ``loss_upper`` and ``paired_loss_upper`` (the paired figure's)
  <= 5 %, the placebo's interval holds 0 and its half-width is <= 1 % of the interval, and no
  uncommitted window.
* **Stall.** Per checkpoint window, the time blocked in ``save()`` plus in the optimizer step
  pre-hook that waits for staging (``take_hook_stall()``), the larger of the two ranks';
  ``async_stall_ratio`` = upper 95 % bound of its mean / the median **sync save** (a blocking
  ``save(..., blocking=True)`` between barriers, ``Plan.sync_saves`` of them after the windows).
* **Cross-check.** ``background_cpu_s``: CPU seconds (user + system) of the rank's threads
  other than the main one, from window start to end, mean over ranks and windows;
  ``background_cpu_placebo_s`` the same in placebo windows (the control: ~0).

The last line printed is one JSON object: maps keyed like ``KEYS`` (``MAPS``, ``target_met``),
``runtime_overhead_ratio`` (the runtime's per-step work, single process, ``bench_overhead``)
and the raw numbers under ``detail``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.multiprocessing.spawn import start_processes
from torch.nn.parallel import DistributedDataParallel

from .bench_overhead import bench_overhead, mlp
from .bench_stats import TARGET_LOSS, mean_ci95, verdict, window_estimate
from .checkpoint import CheckpointConfig, CheckpointManager, TrainState, step_dir_name

KEYS = ("ddp_50m", "ddp_200m", "fsdp2_50m", "fsdp2_200m")
KINDS = ("checkpoint", "placebo")  # the windows' order: alternating, a checkpoint first
WORLD = 2
# The last line's maps (each keyed like KEYS), besides the verdict's (summarize).
MAPS = (
    "goodput_loss",  # = loss_upper (the upper 95 % bound), the name readers know
    "async_stall_ratio",  # upper 95 % bound of the mean stall / median sync save
    "cost_s",
    "cost_ci95",
    "placebo_s",
    "placebo_ci95",
    "paired_cost_ci95",
    "interval_s",
    "loss_upper",
    "paired_loss_upper",  # paired_cost_ci95[1] / interval_s: must be <= 5 % too
    "interval_for_target_s",
    "uncommitted_windows",
    "background_cpu_s",
    "background_cpu_placebo_s",
    "async_stall_s",
    "sync_save_s",
    "persist_s",
    "step_s",
    "a",
    "r",
    "windows",
)


@dataclass(frozen=True)
class Plan:
    """One configuration: model size, parallelism, and the measurement it gets."""

    key: str
    parallel: str  # "ddp" | "fsdp2"
    layers: int
    width: int
    batch: int  # per rank
    windows: int  # checkpoint windows; as many placebo windows
    interval_s: float  # the checkpoint interval the loss is taken against: fixed in advance
    ref: int = 3  # r: reference steps at the end of each window
    margin: int = 1  # a = steps the trial saves took to commit + margin
    sync_saves: int = 3
    trial_cap: int = 200  # steps at most that a trial save may take to commit


# ~50M: 12 x 2048^2 + biases = 50.4M; ~200M: 48 x 2048^2 = 201.4M parameters. The intervals
# (docs/runtime.md, Benchmark, says why) were fixed before this estimator's first run and are
# not to be tuned on its results. Window counts: the full run within ~40 min on 2 cores (steps
# ~0.6 / 2.2-2.7 / 0.9-1.1 / 4-5 s; windows of a + r = 5-7 steps; the 200M ones dominate).
# The margin, in steps: 2 where a save persists in about one step (ddp_50m's trial saves read 1
# step and its windows' saves then committed after 2 in 20 of 48 rank-windows, 2026-12-04), 1
# for fsdp2_200m, whose save persists in about half a step (~2.2 s of ~4.8 s).
FULL = (
    Plan("ddp_50m", "ddp", 12, 2048, 16, windows=24, interval_s=30.0, margin=2),
    Plan("ddp_200m", "ddp", 48, 2048, 8, windows=20, interval_s=60.0, margin=2),
    Plan("fsdp2_50m", "fsdp2", 12, 2048, 16, windows=24, interval_s=30.0, margin=2),
    Plan("fsdp2_200m", "fsdp2", 48, 2048, 8, windows=20, interval_s=60.0),
)
# --quick: tiny models (steps of ~ms), a few windows; what tests/runtime/test_bench.py runs.
QUICK = tuple(
    replace(p, layers=p.layers // 6, width=128, batch=8, windows=4, ref=2, margin=1,
            sync_saves=1, trial_cap=50)
    for p in FULL
)  # fmt: skip


class _Trainer:
    def __init__(self, plan: Plan, rank: int, seed: int) -> None:
        torch.manual_seed(seed)
        inner = mlp(plan.layers, plan.width)
        self.params = sum(p.numel() for p in inner.parameters())
        self.model: nn.Module
        if plan.parallel == "ddp":
            self.model = DistributedDataParallel(inner, gradient_as_bucket_view=True)
        else:
            for layer in inner:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(inner)
            self.model = inner
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1000)
        gen = torch.Generator().manual_seed(seed + 1 + rank)
        self.x = torch.randn(plan.batch, plan.width, generator=gen)
        self.state = TrainState(self.model, self.opt, self.sched)

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.model(self.x).square().mean().backward()
        self.opt.step()  # the checkpoint manager's pre-hook waits for staging here
        self.sched.step()


_TICK = os.sysconf("SC_CLK_TCK")


def background_cpu() -> dict[int, float]:
    """CPU seconds (user + system) so far of each Python thread but the main one, by native id.

    They are the checkpoint's: ``CheckpointManager`` persists on its own single-thread pool
    (``thread_name_prefix="ckpt"``; DCP's ``dcp.save`` runs there, and ``ChecksumWriter``
    writes in that calling thread, ``thread_count=1``), and its ``DefaultStager`` with
    ``use_async_staging=True`` copies on a ``ThreadPoolExecutor(max_workers=1)`` of its own
    (torch 2.13.0, distributed/checkpoint/staging.py ``DefaultStager.__init__``/``stage``).
    DCP's ``async_save`` (state_dict_saver.py) is not used: it would add a third pool,
    ``_ThreadBasedAsyncCheckpointExecutor``. Gloo's and OpenMP's native threads are left out
    (not Python threads): they run the training's collectives as well, the noise this figure
    would otherwise carry; the small collectives the writer issues run on them too."""
    main = threading.main_thread()
    out: dict[int, float] = {}
    for thread in threading.enumerate():
        tid = thread.native_id
        if thread is main or tid is None:
            continue
        try:
            raw = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # exited meanwhile (or no /proc): counts nothing
            continue
        fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "; field 3 is [0]
        out[tid] = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return out


def _cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """A thread that started in between counts from 0; one that ended counts nothing."""
    return sum(t - before.get(tid, 0.0) for tid, t in after.items())


def _timed(fn: Callable[[], None]) -> float:
    """Wall time of ``fn`` on all ranks: barrier, run, barrier (rank 0's clock)."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def _noop() -> None:
    pass


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class _Run:
    """One configuration on one rank."""

    def __init__(self, plan: Plan, rank: int, root: Path, seed: int) -> None:
        self.plan, self.rank, self.root = plan, rank, root
        self.trainer = _Trainer(plan, rank, seed)
        self.mgr = CheckpointManager(
            CheckpointConfig(root=root, keep=1), rank=rank, world_size=dist.get_world_size()
        )
        self.label = 0  # checkpoint step labels: increasing, one per save
        self.a = 0
        self.trials: list[int] = []
        self.records: list[dict[str, Any]] = []
        self.sync: list[float] = []
        self.state_bytes = 0

    def _save(self, blocking: bool = False) -> None:
        self.label += 1
        self.mgr.save(self.label, self.trainer.state, blocking=blocking)

    def warm_up(self) -> None:
        trainer = self.trainer
        for _ in range(2):
            trainer.step()  # Adam state exists from here on: every save holds the same bytes
        # The first save allocates the stager's host copies (the rank's share) and hashes
        # every replicated tensor for the comparison across ranks; the second is the first
        # to reuse the copies. One-offs of a run, not per-checkpoint costs: with one save
        # here the first repeat's sync save took 1.15 s against 0.46-0.55 s after
        # (fsdp2_50m, 2026-12-02, when the first save still staged the whole state).
        for _ in range(2):
            self._save(blocking=True)
        for _ in range(4):  # caches, allocator, the hook's first wait
            trainer.step()
        # Two trial async saves: the steps until committed on both ranks, under training's load
        # (the blocking saves above ran without it). The flag is reduced every step so that both
        # ranks run the same number of steps.
        for _ in range(2):
            self._save()
            steps, busy = 0, True
            while busy and steps < self.plan.trial_cap:
                trainer.step()
                steps += 1
                flag = torch.tensor([int(self.mgr.in_flight())])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                busy = bool(flag.item())
            self.mgr.wait()
            self.trials.append(steps)
            for _ in range(self.plan.ref):
                trainer.step()
        self.a = max(self.trials) + self.plan.margin
        self.mgr.take_hook_stall()

    def window(self, kind: str) -> None:
        mgr, a, w = self.mgr, self.a, self.a + self.plan.ref
        cpu0 = background_cpu()
        mgr.take_hook_stall()
        start = self._save if kind == "checkpoint" else _noop  # the same harness for both
        t0 = time.perf_counter()
        start()
        save_s = time.perf_counter() - t0
        # commit_step: after how many steps the save was seen committed on this rank (0: no
        # save; -1: not within the window). Checked between steps, off their clocks.
        steps, commit_step = [], 0 if kind == "placebo" else -1
        for _ in range(w):
            t0 = time.perf_counter()
            self.trainer.step()
            steps.append(time.perf_counter() - t0)
            mgr.poll()
            if commit_step < 0 and not mgr.in_flight():
                commit_step = len(steps)
        t0 = time.perf_counter()
        mgr.wait()  # a no-op when committed; else its time is the window's (conservative)
        wait_s = time.perf_counter() - t0
        hook_s = mgr.take_hook_stall()
        self.records.append(
            {
                "kind": kind,
                "steps": [round(t, 6) for t in steps],
                "save_s": round(save_s, 6),
                "wait_s": round(wait_s, 6),
                "hook_s": round(hook_s, 6),
                "commit_step": commit_step,
                "committed": 0 <= commit_step <= a,  # before the reference steps began
                "bg_cpu_s": round(_cpu_between(cpu0, background_cpu()), 3),
                "persist_s": round(mgr.last_persist_s, 4) if kind == "checkpoint" else 0.0,
            }
        )

    def sync_saves(self) -> None:
        for _ in range(self.plan.sync_saves):
            self.sync.append(_timed(self._save_blocking))
        if self.rank == 0:
            self.state_bytes = _dir_bytes(self.root / step_dir_name(self.label))

    def _save_blocking(self) -> None:
        self._save(blocking=True)


def measure(plan: Plan, rank: int, root: Path, seed: int) -> dict[str, Any]:
    """One configuration, all its windows; runs on every rank (collectives). Rank 0 returns the
    raw data of both ranks (``windows[i]["ranks"]``), rank 1 an empty dict."""
    run = _Run(plan, rank, root, seed)
    t0 = time.perf_counter()
    run.warm_up()
    for i in range(2 * plan.windows):
        run.window(KINDS[i % 2])
    run.sync_saves()
    run.mgr.close()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, run.records)
    out: dict[str, Any] = {}
    if rank == 0:
        out = {
            "plan": asdict(plan),
            "params": run.trainer.params,
            "state_bytes": run.state_bytes,
            "a": run.a,
            "r": plan.ref,
            "trial_commit_steps": run.trials,
            "sync_save_s": run.sync,
            "windows": [
                {"kind": recs[0]["kind"], "ranks": list(recs)}
                for recs in zip(*gathered, strict=True)
            ],
            "max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "seconds": round(time.perf_counter() - t0, 1),
        }
    del run  # the next configuration needs the memory
    gc.collect()
    return out


def _worker(rank: int, plans: tuple[Plan, ...], tmp: str, seed: int, threads: int) -> None:
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # a deep ReLU stack drifts into denormals: slow on CPU
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        for plan in plans:
            result = measure(plan, rank, Path(tmp) / plan.key, seed)
            if rank == 0:
                Path(tmp, f"{plan.key}.json").write_text(json.dumps(result))
                print(f"{plan.key}: {json.dumps(summarize_one(result))}", flush=True)
    finally:
        dist.destroy_process_group()


def _r(x: float, digits: int = 5) -> float:
    return round(x, digits)


def _ci(ci: tuple[float, float, float]) -> list[float]:
    return [_r(ci[1]), _r(ci[2])]


def _paired(windows: list[dict[str, Any]]) -> list[float]:
    """Per checkpoint window: its whole time (outside + all W steps) minus that of the mean of
    the placebo windows before and after it (a linear drift cancels), mean of the ranks. No
    in-window reference: what a save left in its window's reference steps shows here."""

    def total(win: dict[str, Any]) -> float:
        return statistics.fmean(sum(r["steps"]) + r["save_s"] + r["wait_s"] for r in win["ranks"])

    out = []
    for i, win in enumerate(windows):
        if win["kind"] == "checkpoint":
            near = [
                windows[j]
                for j in (i - 1, i + 1)
                if 0 <= j < len(windows) and windows[j]["kind"] == "placebo"
            ]
            out.append(total(win) - statistics.fmean(total(w) for w in near))
    return out


def summarize_one(detail: dict[str, Any]) -> dict[str, Any]:
    """The figures of one configuration from its raw windows (module doc)."""
    a, interval = detail["a"], detail["plan"]["interval_s"]
    est: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
    blocked: list[float] = []
    uncommitted = 0
    for win in detail["windows"]:
        recs, kind = win["ranks"], win["kind"]
        per_rank = [window_estimate(r["steps"], a, r["save_s"] + r["wait_s"]) for r in recs]
        est[kind].append(statistics.fmean(per_rank))
        cpu[kind].append(statistics.fmean(r["bg_cpu_s"] for r in recs))
        if kind == "checkpoint":
            blocked.append(max(r["save_s"] + r["hook_s"] for r in recs))
            uncommitted += not all(r["committed"] for r in recs)
    cost, placebo = mean_ci95(est["checkpoint"]), mean_ci95(est["placebo"])
    paired = mean_ci95(_paired(detail["windows"]))
    stall = mean_ci95(blocked)
    sync = statistics.median(detail["sync_save_s"])
    v = verdict(cost[2], (placebo[1], placebo[2]), interval, uncommitted, paired_hi=paired[2])
    ranks = {kind: [r for w in detail["windows"] if w["kind"] == kind for r in w["ranks"]]
             for kind in KINDS}  # fmt: skip
    placebo_steps = [t for r in ranks["placebo"] for t in r["steps"]]
    persist = [r["persist_s"] for r in ranks["checkpoint"]]
    return {
        "goodput_loss": _r(v["loss_upper"]),
        "async_stall_ratio": _r(stall[2] / sync),
        "cost_s": _r(cost[0]),
        "cost_ci95": _ci(cost),
        "placebo_s": _r(placebo[0]),
        "placebo_ci95": _ci(placebo),
        "paired_cost_ci95": _ci(paired),
        "interval_s": interval,
        "loss_upper": _r(v["loss_upper"]),
        "paired_loss_upper": _r(v["paired_loss_upper"]),
        "interval_for_target_s": _r(max(cost[2], paired[2], 0.0) / TARGET_LOSS, 1),
        "uncommitted_windows": uncommitted,
        "background_cpu_s": _r(statistics.fmean(cpu["checkpoint"]), 3),
        "background_cpu_placebo_s": _r(statistics.fmean(cpu["placebo"]), 3),
        "async_stall_s": _r(stall[0]),
        "sync_save_s": _r(sync, 4),
        "persist_s": _r(statistics.median(persist), 4),
        "step_s": _r(statistics.median(placebo_steps), 4),
        "a": a,
        "r": detail["r"],
        "windows": {kind: len(values) for kind, values in est.items()},
        "placebo_holds_zero": v["placebo_holds_zero"],
        "placebo_narrow": v["placebo_narrow"],
        "target_met": v["target_met"],
    }


def summarize(details: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The last line's figures: one map per figure, keyed like ``KEYS``."""
    keys = [key for key in KEYS if key in details]  # all four, except in a calibration run
    per = {key: summarize_one(details[key]) for key in keys}
    names = (*MAPS, "placebo_holds_zero", "placebo_narrow", "target_met")
    return {name: {key: per[key][name] for key in keys} for name in names}


def run(
    plans: tuple[Plan, ...], *, scratch: Path | None, seed: int, overhead: tuple[int, int, int]
) -> dict[str, Any]:
    if any(p.windows < 2 or p.ref < 1 for p in plans):
        raise ValueError("each configuration needs >= 2 windows of each kind and >= 1 ref step")
    with tempfile.TemporaryDirectory(dir=scratch, prefix="trainstack-bench-") as tmp:
        # One thread per worker: two workers on a 2-core machine, as the supervisor sets
        # OMP_NUM_THREADS from the pod's CPUs; the overhead loop gets a worker's count.
        threads = max(1, (os.cpu_count() or WORLD) // WORLD)
        o = bench_overhead(*overhead, root=Path(tmp), threads=threads)  # first: fails fast
        brief = {k: v for k, v in o.items() if k not in ("step_s", "orders")}  # raw: detail
        print(f"overhead: {json.dumps(brief)}", flush=True)
        t0 = time.perf_counter()
        start_processes(  # type: ignore[no-untyped-call]
            _worker,
            args=(plans, tmp, seed, threads),
            nprocs=WORLD,
            join=True,
            start_method="spawn",
        )
        details = {p.key: json.loads(Path(tmp, f"{p.key}.json").read_text()) for p in plans}
        distributed_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "world_size": WORLD,
        "threads_per_worker": threads,
        "cpus": os.cpu_count(),
        "seed": seed,
    }
    result.update(summarize(details))
    result["runtime_overhead_ratio"] = round(o["overhead_ratio"], 5)
    result["runtime_overhead_aa_ratio"] = round(o["aa_ratio"], 5)
    result["runtime_overhead_ratio_spread"] = o["overhead_ratio_spread"]
    result["seconds"] = round(distributed_s, 1)
    result["detail"] = {**details, "overhead": o}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainstack_runtime.bench")
    parser.add_argument("--dir", type=Path, default=None, help="scratch dir (default: a tmp dir)")
    parser.add_argument("--quick", action="store_true", help="tiny models, few windows (tests)")
    parser.add_argument("--seed", type=int, default=22, help="seed of the weights and inputs")
    parser.add_argument("--only", nargs="*", choices=KEYS, help="calibration: these configs")
    args = parser.parse_args(argv)
    plans: tuple[Plan, ...] = QUICK if args.quick else FULL
    if args.only:
        plans = tuple(p for p in plans if p.key in args.only)
    overhead = (12, 2, 128) if args.quick else (300, 20, 1024)  # cycles, warm-up, width
    result = run(plans, scratch=args.dir, seed=args.seed, overhead=overhead)
    print(json.dumps(result, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
