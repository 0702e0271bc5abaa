"""`make bench-scheduling`'s tiny variant in `make test`: the organisation it builds, the burst,
the oracle's view of the queues, the run's measurements on synthetic watch events, and its
targets. The run itself needs the real control plane (`make bench-scheduling --quick`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from trainstack.bench import burst as bench
from trainstack.bench.oracle import Gang, Limits, Node, simulate
from trainstack.bench.targets import report
from trainstack.builders.fabric import GPU_RESOURCE
from trainstack.builders.scheduling import queues


def _pod(
    job: str, name: str, node: str = "", phase: str = "Pending", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team", "labels": {bench.JOB_LABEL: job}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def _event(kind: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"type": kind, "object": _pod(*args, **kwargs)}


JOBS = [
    bench.BurstJob("a", "t", "p", 2, 8, "high", 10.0),
    bench.BurstJob("b", "t", "p", 1, 8, "normal", 10.0),
]


def test_the_tracker_times_starts_partial_gangs_and_their_reasons() -> None:
    """Job a: member 0 bound at 1 s, member 1 at 3.5 s: partly bound for 2.5 s, longer than a
    scheduling period, while both existed (binding). Then its members end 2 s apart
    (finishing, which is reported but not counted as a gang the scheduler held). Job b
    starts at 0.5 s whole and is never partial."""
    tracker = bench.Tracker(JOBS, total_gpus=32)
    capacity = {"n1": 16, "n2": 16}
    tracker.submitted("a", 0.0)
    tracker.submitted("b", 0.0)
    tracker.event(0.1, _event("ADDED", "a", "a-0"))
    tracker.event(0.1, _event("ADDED", "a", "a-1"))
    tracker.event(0.2, _event("ADDED", "b", "b-0"))
    tracker.event(0.5, _event("MODIFIED", "b", "b-0", "n2", "Running"))
    tracker.event(1.0, _event("MODIFIED", "a", "a-0", "n1"))
    tracker.sample(2.0, capacity)  # a waits: 16 of 32 GPUs allocated (b-0 and a-0)
    tracker.event(3.5, _event("MODIFIED", "a", "a-1", "n1"))
    tracker.sample(4.0, capacity)  # nobody waits: not counted
    tracker.event(10.0, _event("MODIFIED", "b", "b-0", "n2", "Succeeded"))
    tracker.event(13.5, _event("MODIFIED", "a", "a-0", "n1", "Succeeded"))
    tracker.event(15.5, _event("MODIFIED", "a", "a-1", "n1", "Succeeded"))
    assert tracker.drained()
    result = tracker.result(20.0, 0.0)
    assert result["gpu_allocation"] == 0.5
    assert result["partial_gangs"] == 1
    assert result["partial_gang_reasons"] == {"binding": 1, "finishing": 1}
    assert result["longest_partial_s"] == 2.5
    assert result["drain_s"] == 15.5
    assert result["start_s_by_priority"] == {
        "high": {"p50": 3.5, "p95": 3.5, "jobs": 1},
        "normal": {"p50": 0.5, "p95": 0.5, "jobs": 1},
    }


@pytest.mark.parametrize(
    ("pods", "reason"),
    [
        ([("n1", "Running", False), ("", "Pending", False)], "binding"),
        ([("n1", "Running", False)], "creating"),
        ([("n1", "Running", False), ("n1", "Running", True)], "evicting"),
        ([("n1", "Running", False), ("n1", "Succeeded", False)], "finishing"),
        ([("n1", "Running", False), ("n1", "Running", False)], None),
        ([("", "Pending", False), ("", "Pending", False)], None),
    ],
)
def test_each_partial_gang_is_given_its_reason(
    pods: list[tuple[str, str, bool]], reason: str | None
) -> None:
    states = [bench._Pod("j", node, phase, deleting, 8) for node, phase, deleting in pods]
    assert bench.partial_reason(states, 2) == reason


def test_a_gang_partly_bound_within_one_period_is_not_counted() -> None:
    tracker = bench.Tracker(JOBS[:1], total_gpus=16)
    tracker.submitted("a", 0.0)
    tracker.event(0.1, _event("ADDED", "a", "a-0"))
    tracker.event(0.1, _event("ADDED", "a", "a-1"))
    tracker.event(1.0, _event("MODIFIED", "a", "a-0", "n1"))
    tracker.event(1.8, _event("MODIFIED", "a", "a-1", "n1"))
    result = tracker.result(5.0, 0.0)
    assert result["partial_gangs"] == 0
    assert result["partial_gang_reasons"] == {}
    assert not result["drained"]
    assert result["drain_s"] == 5.0


METRICS = """# HELP volcano_e2e_scheduling_latency_milliseconds E2e scheduling latency
volcano_e2e_scheduling_latency_milliseconds_bucket{le="1"} %d
volcano_e2e_scheduling_latency_milliseconds_bucket{le="10"} %d
volcano_e2e_scheduling_latency_milliseconds_bucket{le="100"} %d
volcano_e2e_scheduling_latency_milliseconds_bucket{le="+Inf"} %d
volcano_e2e_scheduling_latency_milliseconds_sum %f
volcano_e2e_scheduling_latency_milliseconds_count %d
"""


def test_the_cycle_time_is_the_sessions_between_two_scrapes() -> None:
    before = METRICS % (5, 5, 5, 5, 2.5, 5)
    # 100 more sessions: 10 within 1 ms, 80 within 10 ms, 10 within 100 ms; 700 ms in all.
    after = METRICS % (15, 95, 105, 105, 702.5, 105)
    assert bench.cycle_time(before, after) == {
        "cycles": 100,
        "cycle_ms_mean": 7.0,
        "cycle_ms_p95": 100.0,
        "phase_ms_mean": {},
    }
    assert bench.cycle_time(before, before)["cycles"] == 0
    # More than 5 % above the largest bound: only that bound is known.
    slow = METRICS % (15, 20, 25, 105, 90000.0, 105)
    assert bench.cycle_time(before, slow)["cycle_ms_p95"] == ">100"


PHASES = """volcano_open_session_duration_milliseconds_sum %f
volcano_open_session_duration_milliseconds_count %d
volcano_action_scheduling_latency_milliseconds_sum{action="allocate"} %f
volcano_action_scheduling_latency_milliseconds_count{action="allocate"} %d
volcano_action_scheduling_latency_milliseconds_sum{action="preempt"} %f
volcano_action_scheduling_latency_milliseconds_count{action="preempt"} %d
"""


def test_each_phase_of_a_session_is_its_mean_between_two_scrapes() -> None:
    before = PHASES % (10.0, 2, 100.0, 2, 0.0, 0)
    after = PHASES % (310.0, 12, 1100.0, 12, 4000.0, 10)
    assert bench.phase_means(before, after) == {
        "allocate": 100.0,
        "open": 30.0,
        "preempt": 400.0,
    }


def test_the_oracle_sees_each_queue_at_its_real_capability() -> None:
    """Volcano's capacity plugin lets a child allocate its parent's real capability minus
    every sibling's guarantee plus its own, capped by its capability (checkHierarchicalQueue).
    The quick organisation: 256 GPUs, 4 teams (one per group) guaranteed 32, deserved 64,
    borrowing 64: each group may use 256 - 4 x 32 + 32 = 160, each team min(128, 160) = 128."""
    from trainstack.config import PlatformConfig  # noqa: PLC0415
    from trainstack.config.loader import parse_stack_config  # noqa: PLC0415

    values = {"trainstack:platform": bench.org_config(bench.QUICK)}
    cfg = parse_stack_config(values, stack="org", source="Pulumi.org.yaml")
    assert isinstance(cfg, PlatformConfig)
    limits = bench.limits(queues(cfg), GPU_RESOURCE, bench.QUICK.gpus)
    assert set(limits.team_capability.values()) == {128}
    assert set(limits.group_capability.values()) == {160}
    assert limits.group_of == {t.name: f"group-{t.group}" for t in cfg.registry.teams}


def test_the_burst_is_seeded_and_scaled() -> None:
    scale = bench.Scale(nodes=64, jobs=40, teams=4, duration_scale=3.0)
    jobs = bench.burst(scale, ["t0", "t1"], ["p0", "p1"])
    assert jobs == bench.burst(scale, ["t0", "t1"], ["p0", "p1"])
    assert {(j.replicas, j.gpus) for j in jobs} <= set(bench.SHAPES)
    assert all(30 <= j.seconds <= 120 and j.seconds % 3 == 0 for j in jobs)
    assert [j.team for j in jobs[:4]] == ["t0", "t1", "t0", "t1"]
    with pytest.raises(ValueError, match="multiple of 8"):
        bench.org_config(bench.Scale(nodes=12))


def test_the_quick_burst_runs_through_the_oracle_and_its_platform_admits_it(tmp_path: Path) -> None:
    """The whole pipeline but the control plane: the quick organisation previews, its jobs
    render and pass every mandatory rule of the platform's policy pack (production refuses
    tagged images: the benchmark once failed at submission on exactly that), and the oracle
    schedules the burst within the queues' limits."""
    from tests.e2e.bench_scheduling import oracle, oracle_summary, organisation, workload  # noqa: PLC0415
    from trainstack.policy.objects import VOLCANO_JOB  # noqa: PLC0415
    from trainstack.policy.pack import evaluate  # noqa: PLC0415
    from trainstack.policy.settings import levels, pack_config  # noqa: PLC0415
    from trainstack.sandbox.nodes import stack_nodes  # noqa: PLC0415

    cfg, previewer = organisation(tmp_path, bench.QUICK)
    jobs, manifests = workload(cfg, previewer.preview("org").outputs, bench.QUICK)
    assert len(manifests) == bench.QUICK.jobs
    resources = [(VOLCANO_JOB, m["metadata"]["name"], m) for m in manifests]
    assert [
        v for v in evaluate(resources, pack_config(cfg), levels(cfg)) if v.level == "mandatory"
    ] == []
    assert [m["metadata"]["name"] for m in manifests] == [j.name for j in jobs]
    schedule = oracle(cfg, jobs, stack_nodes(cfg))
    summary = oracle_summary(schedule, jobs)
    assert summary["jobs_started"] == len(jobs)
    assert summary["unschedulable"] == []
    assert 0 < summary["gpu_allocation"] <= 1
    assert summary["drain_s"] >= max(j.seconds for j in jobs)


def test_the_scheduling_bench_prints_its_targets_and_a_verdict() -> None:
    from tests.e2e.bench_scheduling import targets  # noqa: PLC0415

    generated = {
        "drained": True,
        "jobs_finished": 800,
        "gpu_allocation": 0.8,
        "allocation_vs_oracle": 0.91,
        "partial_gangs": 0,
    }
    default = {**generated, "gpu_allocation": 0.3, "allocation_vs_oracle": 0.35}
    lines = report(targets({"generated": generated, "default": default}, 800))
    assert "  ok     generated: allocation_vs_oracle >= 0.9 (measured 0.91)" in lines
    assert lines[-1] == "result: pass (all 5 targets met)"
    short = {**generated, "allocation_vs_oracle": 0.85, "partial_gangs": 2}
    lines = report(targets({"generated": short, "default": default}, 800))
    assert lines[-1] == (
        "result: FAIL (2 of 5 missed: generated: allocation_vs_oracle >= 0.9; "
        "generated: partial_gangs == 0)"
    )


def test_the_scheduling_bench_compares_the_preempt_search_it_replaces() -> None:
    """issue 39 #3: `generated-sampled-preempt` is the generated configuration with only the
    preempt action's candidate search put back to Volcano's default."""
    from tests.e2e.bench_scheduling import sampled_preempt  # noqa: PLC0415
    from trainstack.builders.scheduling import scheduler_config  # noqa: PLC0415
    from trainstack.config import PlatformConfig, load_stack_file  # noqa: PLC0415

    cfg = load_stack_file(ROOT / "stacks" / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    generated = scheduler_config(cfg)
    sampled = sampled_preempt(generated)
    assert sampled["configurations"] == [
        {"name": "preempt", "arguments": {"enableTopologyAwarePreemption": True}}
    ]
    assert generated["configurations"][0]["arguments"]["minCandidateNodesPercentage"] == 100
    assert {k: v for k, v in sampled.items() if k != "configurations"} == {
        k: v for k, v in generated.items() if k != "configurations"
    }


def test_a_tiny_oracle_schedule_is_what_first_fit_gives() -> None:
    """Two 8-GPU nodes: the 2x8 gang (higher priority) first, the 1x8 after it ends."""
    nodes = [Node("n1", "p", 8), Node("n2", "p", 8)]
    gangs = [Gang("small", "t", "p", 1, 8, 1, 5.0), Gang("big", "t", "p", 2, 8, 2, 10.0)]
    schedule = simulate(nodes, gangs, Limits(team_capability={}))
    assert schedule.start_s("big") == 0.0
    assert schedule.start_s("small") == 10.0
    assert schedule.drain_s == 15.0
    assert schedule.gpu_allocation == 1.0


def test_a_resync_after_a_dropped_watch_catches_up_with_what_was_missed() -> None:
    """kube-apiserver drops a watcher that falls behind (it did, in the first 1,000-node run:
    the tracker then saw 45 of 800 jobs start and none finish). A fresh list must bring the
    tracker to the same state as the events it missed would have, pods gone included."""
    capacity = {"n1": 16, "n2": 16}
    tracker = bench.Tracker(JOBS, total_gpus=32)
    tracker.submitted("a", 0.0)
    tracker.submitted("b", 0.0)
    tracker.event(0.1, _event("ADDED", "a", "a-0"))
    tracker.event(0.1, _event("ADDED", "b", "b-0"))
    tracker.event(0.2, {"type": "ERROR", "object": {"kind": "Status", "code": 410}})
    # Missed: a's gang bound and finished, b bound; a's pods deleted, b's still running.
    tracker.resync(5.0, [_pod("b", "b-0", "n2", "Running"), _pod("other", "x", "n1")])
    assert tracker.jobs["b"].started == 5.0
    assert tracker.jobs["a"].started is None  # never seen whole: not invented
    tracker.sample(6.0, capacity)
    assert tracker.samples[-1][1] == 8  # b's 8 GPUs; a's deleted pods are forgotten
    tracker.resync(9.0, [_pod("b", "b-0", "n2", "Succeeded")])
    assert tracker.jobs["b"].finished == 9.0
    assert tracker.result(10.0, 0.0)["watch_resyncs"] == 2
    assert tracker.result(10.0, 0.0)["jobs_evicted"] == 0
    tracker.resync(11.0, [_pod("b", "b-0", "n2", "Running", deleting=True)])
    assert tracker.result(12.0, 0.0)["jobs_evicted"] == 1
