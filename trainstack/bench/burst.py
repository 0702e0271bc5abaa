"""The scheduling benchmark's organisation, burst and measurements (`make bench-scheduling`).

Pure: the platform config of a generated organisation at a given scale, the burst of gang jobs
its teams submit, the same burst as the oracle's gangs and queue limits (bench/oracle.py), and
`Tracker`, which turns the pods' watch events into what the benchmark reports: allocation
while jobs wait, time to start per priority class, gangs seen partly bound and why, drain.
tests/e2e/bench_scheduling.py drives the real control plane with these; tests/bench/ runs them
on synthetic events in `make test`, so the arithmetic cannot rot unseen.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainstack.bench.oracle import Gang, Limits, Node, percentile
from trainstack.bench.org import OrgSize, platform_config
from trainstack.kube import quantity

POOLS = 8
GPUS_PER_NODE = 8  # p5 and p5en
SHAPES = [(1, 1), (1, 8), (2, 8), (4, 8), (8, 8)]  # (replicas, GPUs per replica)
PRIORITIES = ["normal", "normal", "high", "preemptible"]
SECONDS = (10, 40)  # a job's run time before duration_scale
PERIOD_S = 1.0  # the scheduler's --schedule-period (sandbox/cluster.py restart_scheduler)
JOB_LABEL = "volcano.sh/job-name"  # Volcano's job controller labels every pod it creates


@dataclass(frozen=True)
class Scale:
    """The organisation and its burst. `jobs` is sized so demand is a few times what the
    nodes hold (the scheduler must choose), `duration_scale` stretches every job's run time
    so the control plane's latency on two cores is small against it (the probe measures it)."""

    nodes: int = 1000
    jobs: int = 800
    teams: int = 50
    duration_scale: float = 3.0
    seed: int = 20261201

    @property
    def nodes_per_pool(self) -> int:
        return self.nodes // POOLS

    @property
    def gpus(self) -> int:
        return self.nodes_per_pool * POOLS * GPUS_PER_NODE


QUICK = Scale(nodes=32, jobs=24, teams=4, duration_scale=1.0)


def org_config(scale: Scale) -> dict[str, Any]:
    """bench/org's platform at `scale.nodes` nodes (8 pools, half of them a reservation: the
    firm capacity) with every team's quota sized to it: guarantees fill the firm GPUs, deserved
    shares all of them, and each team may borrow as much again, so demand can exceed supply."""
    if scale.nodes % POOLS or scale.nodes < POOLS:
        raise ValueError(f"nodes must be a multiple of {POOLS}, got {scale.nodes}")
    config = platform_config(OrgSize(pools=POOLS, teams=scale.teams, jobs=0))
    per_pool = scale.nodes_per_pool
    firm = 0
    for pool in config["gpuPools"]:
        size = pool["size"]
        size["max"] = per_pool
        if size["min"]:
            size["min"] = size["desired"] = per_pool
            firm += per_pool * GPUS_PER_NODE
    guarantee = firm // scale.teams // GPUS_PER_NODE * GPUS_PER_NODE
    deserved = scale.gpus // scale.teams // GPUS_PER_NODE * GPUS_PER_NODE
    for team in config["registry"]["teams"]:
        team["quota"] = {"gpus": guarantee, "deserved": deserved, "borrowLimit": deserved}
        team["priorityClasses"] = ["high", "normal", "preemptible"]
    return config


@dataclass(frozen=True)
class BurstJob:
    name: str
    team: str
    pool: str
    replicas: int
    gpus: int  # per replica
    priority: str  # the team's short class name
    seconds: float  # run time, duration_scale applied


def burst(scale: Scale, teams: Sequence[str], pools: Sequence[str]) -> list[BurstJob]:
    """The jobs, in submission order: a seeded draw of shape, pool, class and run time; teams
    take turns."""
    rng = random.Random(scale.seed)
    shapes = [(r, g) for r, g in SHAPES if r <= scale.nodes_per_pool]  # a gang fits its pool
    jobs = []
    for index in range(scale.jobs):
        replicas, gpus = rng.choice(shapes)
        pool = rng.choice(list(pools))
        priority = rng.choice(PRIORITIES)
        seconds = rng.randint(*SECONDS) * scale.duration_scale
        jobs.append(
            BurstJob(
                f"bench-{index}", teams[index % len(teams)], pool, replicas, gpus, priority, seconds
            )
        )
    return jobs


def gangs(jobs: Sequence[BurstJob], priority_values: Mapping[str, int]) -> list[Gang]:
    """The burst as the oracle's gangs, all submitted at once (the real burst takes the
    seconds its creates take; each job's time to start counts from its own create)."""
    return [
        Gang(j.name, j.team, j.pool, j.replicas, j.gpus, priority_values[j.priority], j.seconds)
        for j in jobs
    ]


def oracle_nodes(
    simulated: Sequence[Mapping[str, Any]], pool_label: str, resource: str
) -> list[Node]:
    return [
        Node(
            n["metadata"]["name"],
            n["metadata"]["labels"][pool_label],
            int(n["status"]["allocatable"][resource]),
        )
        for n in simulated
    ]


def limits(queues: Sequence[Mapping[str, Any]], resource: str, total: int) -> Limits:
    """Each queue's real capability in GPUs, as Volcano's capacity plugin computes it
    (v1.15.1 plugins/capacity/capacity.go checkHierarchicalQueue): a child may allocate its
    parent's real capability minus every sibling's guarantee (its own added back), capped by
    its own capability. The root's is the cluster's. Queues are the platform's manifests
    (builders/scheduling.py queues); teams are the leaves, groups their parents."""
    spec = {q["metadata"]["name"]: q["spec"] for q in queues}
    children: dict[str, list[str]] = {}
    for name, s in spec.items():
        children.setdefault(s.get("parent", "root"), []).append(name)

    def gpus(resources: Mapping[str, Any] | None) -> float | None:
        if not resources or resource not in resources:
            return None
        return quantity(resources[resource])

    real: dict[str, float] = {"root": float(total)}
    order = ["root"]
    for parent in order:
        kids = children.get(parent, [])
        guaranteed = sum(gpus(spec[k].get("guarantee", {}).get("resource")) or 0 for k in kids)
        for kid in kids:
            own = gpus(spec[kid].get("guarantee", {}).get("resource")) or 0
            cap = gpus(spec[kid].get("capability"))
            value = real[parent] - guaranteed + own
            real[kid] = min(value, cap) if cap is not None else value
            order.append(kid)
    leaves = {n for n in spec if n not in children}
    parent_of = {n: spec[n].get("parent", "root") for n in leaves}
    groups = {p for p in parent_of.values() if p in spec and spec[p].get("parent")}
    return Limits(
        team_capability={n: int(real[n]) for n in leaves},
        group_of={n: p for n, p in parent_of.items() if p in groups},
        group_capability={g: int(real[g]) for g in groups},
    )


# -- following the run ------------------------------------------------------------------------


@dataclass
class _Pod:
    job: str
    node: str
    phase: str
    deleting: bool
    gpus: int


@dataclass
class _Job:
    replicas: int
    submitted: float
    started: float | None = None
    finished: float | None = None
    partial_since: float | None = None
    reasons: set[str] = field(default_factory=set)
    longest_partial: float = 0.0
    partial_reasons: set[str] = field(default_factory=set)
    evicted: bool = False  # a bound, running member deleted: a preempt or reclaim victim


def partial_reason(pods: Sequence[_Pod], replicas: int) -> str | None:
    """Why a gang is partly bound (some, not all, of its members on nodes), or None if it is
    not: `finishing` (a member already ended: kwok ends a gang's pods one by one), `evicting`
    (a member is being deleted: a preempt or reclaim victim), `creating` (the job controller
    has not created every member yet), or `binding` (every member exists, some are bound:
    the scheduler's binds still landing, or a gang allocated in part)."""
    alive = [p for p in pods if p.phase not in ("Succeeded", "Failed")]
    bound = sum(1 for p in alive if p.node and not p.deleting)
    if not 0 < bound < replicas:
        return None
    if len(alive) < len(pods):
        return "finishing"
    if any(p.deleting for p in alive):
        return "evicting"
    if len(alive) < replicas:
        return "creating"
    return "binding"


class Tracker:
    """The run as the pods' watch events tell it. `event` takes each event with the time it
    arrived; `sample` records allocation and waiting jobs; `result` sums them up."""

    def __init__(
        self, jobs: Sequence[BurstJob], total_gpus: int, period_s: float = PERIOD_S
    ) -> None:
        self.total = total_gpus
        self.period = period_s
        self.burst = {j.name: j for j in jobs}
        self.jobs: dict[str, _Job] = {}
        self.pods: dict[str, dict[str, _Pod]] = {}  # job -> pod -> state
        self.samples: list[tuple[float, int, int, float]] = []  # time, allocated, waiting, frag
        self.resyncs = 0  # lists after a dropped watch

    def submitted(self, name: str, at: float) -> None:
        self.jobs[name] = _Job(self.burst[name].replicas, at)

    def event(self, at: float, event: Mapping[str, Any]) -> None:
        if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK, or ERROR (the watch ends after it and the caller resyncs)
        pod = event["object"]
        meta = pod.get("metadata", {})
        job = meta.get("labels", {}).get(JOB_LABEL)
        if job not in self.jobs:
            return
        key = self._key(pod)
        pods = self.pods.setdefault(job, {})
        if event["type"] == "DELETED":
            pods.pop(key, None)
        else:
            pods[key] = self._pod(job, pod)
        self._update(job, at)

    def resync(self, at: float, pods: Sequence[Mapping[str, Any]]) -> None:
        """Every job pod as a fresh list shows it, after the watch was dropped: what changed
        meanwhile is dated `at` (late by the gap; `resyncs` counts them), pods gone are
        forgotten."""
        self.resyncs += 1
        seen: dict[str, dict[str, _Pod]] = {name: {} for name in self.jobs}
        for pod in pods:
            job = pod.get("metadata", {}).get("labels", {}).get(JOB_LABEL)
            if job in seen:
                seen[job][self._key(pod)] = self._pod(job, pod)
        for name, now in seen.items():
            self.pods[name] = now
            self._update(name, at)

    @staticmethod
    def _key(pod: Mapping[str, Any]) -> str:
        return f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"

    def _pod(self, job: str, pod: Mapping[str, Any]) -> _Pod:
        return _Pod(
            job,
            pod["spec"].get("nodeName", ""),
            pod.get("status", {}).get("phase", ""),
            bool(pod["metadata"].get("deletionTimestamp")),
            self.burst[job].gpus,
        )

    def _update(self, name: str, at: float) -> None:
        job = self.jobs[name]
        pods = list(self.pods.get(name, {}).values())
        alive = [p for p in pods if p.phase not in ("Succeeded", "Failed")]
        bound = [p for p in alive if p.node and not p.deleting]
        if any(p.node and p.deleting for p in alive):
            job.evicted = True
        if job.started is None and len(bound) == job.replicas:
            job.started = at
        if job.finished is None and sum(p.phase == "Succeeded" for p in pods) == job.replicas:
            job.finished = at
        reason = partial_reason(pods, job.replicas)
        if reason is not None:
            if job.partial_since is None:
                job.partial_since, job.reasons = at, set()
            job.reasons.add(reason)
        elif job.partial_since is not None:
            self._close_partial(job, at)

    def _close_partial(self, job: _Job, at: float) -> None:
        assert job.partial_since is not None
        held = at - job.partial_since
        job.longest_partial = max(job.longest_partial, held)
        if held > self.period:
            job.partial_reasons |= job.reasons
        job.partial_since = None

    def sample(self, at: float, capacity: Mapping[str, int]) -> None:
        used: Counter[str] = Counter()
        for pod in (p for pods in self.pods.values() for p in pods.values()):
            if pod.node and pod.phase not in ("Succeeded", "Failed"):
                used[pod.node] += pod.gpus
        waiting = sum(1 for j in self.jobs.values() if j.started is None)
        free = sum(capacity[n] - used[n] for n in capacity)
        free_partial = sum(capacity[n] - used[n] for n in capacity if 0 < used[n] < capacity[n])
        self.samples.append((at, sum(used.values()), waiting, free_partial / free if free else 0.0))

    def drained(self) -> bool:
        return len(self.jobs) == len(self.burst) and all(
            j.finished is not None for j in self.jobs.values()
        )

    def result(self, end: float, start: float) -> dict[str, Any]:
        for job in self.jobs.values():
            if job.partial_since is not None:
                self._close_partial(job, end)
        waiting = [s for s in self.samples if s[2]]
        starts = {n: j.started - j.submitted for n, j in self.jobs.items() if j.started is not None}
        reasons: Counter[str] = Counter()
        held = 0
        for job in self.jobs.values():
            # A gang that was only ever finishing is not one the scheduler held partly bound.
            if job.partial_reasons - {"finishing"}:
                held += 1
            reasons.update(job.partial_reasons)
        finished = [j.finished for j in self.jobs.values() if j.finished is not None]
        return {
            "gpu_allocation": round(sum(s[1] for s in waiting) / len(waiting) / self.total, 3)
            if waiting
            else 0.0,
            "jobs_started": len(starts),
            "jobs_finished": len(finished),
            "jobs_evicted": sum(j.evicted for j in self.jobs.values()),
            "partial_gangs": held,
            "partial_gang_reasons": dict(sorted(reasons.items())),
            "longest_partial_s": round(
                max((j.longest_partial for j in self.jobs.values()), default=0.0), 1
            ),
            "drain_s": round((max(finished) if self.drained() else end) - start, 1),
            "drained": self.drained(),
            "watch_resyncs": self.resyncs,
            **start_percentiles(starts, {n: j.priority for n, j in self.burst.items()}),
            "fragmentation": round(sum(s[3] for s in waiting) / len(waiting), 3)
            if waiting
            else 0.0,
        }


def start_percentiles(starts: Mapping[str, float], priority: Mapping[str, str]) -> dict[str, Any]:
    """p50 and p95 of the time from submission to the whole gang bound, overall and per
    priority class (jobs that never started are left out: `jobs_started` says how many)."""
    by_class: dict[str, list[float]] = {}
    for name, seconds in starts.items():
        by_class.setdefault(priority[name], []).append(seconds)
    values = list(starts.values())
    return {
        "p50_start_s": round(percentile(values, 50), 1) if values else None,
        "p95_start_s": round(percentile(values, 95), 1) if values else None,
        "start_s_by_priority": {
            cls: {
                "p50": round(percentile(v, 50), 1),
                "p95": round(percentile(v, 95), 1),
                "jobs": len(v),
            }
            for cls, v in sorted(by_class.items())
        },
    }


# -- the scheduler's own cycle time -----------------------------------------------------------

CYCLE_METRIC = "volcano_e2e_scheduling_latency_milliseconds"  # v1.15.1 scheduler/metrics


def histogram(text: str, metric: str) -> tuple[list[tuple[float, float]], float, float]:
    """A Prometheus text-format histogram without labels: its cumulative buckets
    (upper bound, count), sum and count."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(f"{metric}_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound), float(line.rsplit(" ", 1)[1])))
        elif line.startswith(f"{metric}_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{metric}_count"):
            count = float(line.rsplit(" ", 1)[1])
    return buckets, total, count


def cycle_time(before: str, after: str) -> dict[str, Any]:
    """The scheduler's sessions between two scrapes: how many, their mean and their p95 (the
    upper bound of the bucket holding it, as Prometheus' histogram_quantile interpolates
    within it linearly; here the bound, so the value never understates)."""
    b_buckets, b_sum, b_count = histogram(before, CYCLE_METRIC)
    a_buckets, a_sum, a_count = histogram(after, CYCLE_METRIC)
    count = a_count - b_count
    if count <= 0:
        return {"cycles": 0, "cycle_ms_mean": None, "cycle_ms_p95": None}
    earlier = dict(b_buckets)
    p95 = None
    for bound, cumulative in a_buckets:
        if cumulative - earlier.get(bound, 0.0) >= 0.95 * count:
            p95 = bound
            break
    finite = [bound for bound, _ in a_buckets if bound != float("inf")]
    return {
        "cycles": int(count),
        "cycle_ms_mean": round((a_sum - b_sum) / count, 1),
        # Above the histogram's largest bound (5,000 ms at v1.15.1): only that is known.
        "cycle_ms_p95": f">{max(finite):g}"
        if p95 == float("inf") and finite
        else (None if p95 is None else round(p95, 1)),
        "phase_ms_mean": phase_means(before, after),
    }


# Where a session's time goes (v1.15.1 pkg/scheduler/metrics/metrics.go): opening it (the
# cache snapshot and the plugins' OnSessionOpen) and each action.
OPEN_METRIC = "volcano_open_session_duration_milliseconds"
ACTION_METRIC = "volcano_action_scheduling_latency_milliseconds"


def _sums(text: str, metric: str) -> dict[str, tuple[float, float]]:
    """Each series' sum and count of a histogram, by its `action` label ("" without)."""
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        for part, slot in (("_sum", 0), ("_count", 1)):
            if line.startswith(metric + part) and line[len(metric + part)] in "{ ":
                label = line.split('action="', 1)[1].split('"', 1)[0] if "action=" in line else ""
                found.setdefault(label, [0.0, 0.0])[slot] = float(line.rsplit(" ", 1)[1])
    return {label: (v[0], v[1]) for label, v in found.items()}


def phase_means(before: str, after: str) -> dict[str, float]:
    """Mean milliseconds per session of opening it and of each action, between two scrapes."""
    means = {}
    for name, metric in (("open", OPEN_METRIC), ("action", ACTION_METRIC)):
        earlier = _sums(before, metric)
        for label, (total, count) in sorted(_sums(after, metric).items()):
            b_total, b_count = earlier.get(label, (0.0, 0.0))
            if count > b_count:
                means[label or name] = round((total - b_total) / (count - b_count), 1)
    return means
