"""An offline scheduler of `make bench-scheduling`'s burst: what a simple, well-known packing
heuristic achieves on the same nodes, queues and jobs, so that the real Volcano run's GPU
allocation can be reported as a fraction of it (issue 46).

The model, in simulated time:

- Nodes belong to one pool each and have a number of GPUs; nothing else (CPU, memory) is
  modelled, since the benchmark's jobs are sized so that GPUs are what runs out.
- A gang is one Volcano job: `replicas` pods of `gpus` GPUs each, all started together or not
  at all (Volcano's gang plugin, minAvailable = replicas), every pod on a node of the gang's
  pool (the job's node selector). Several pods of a gang may share a node.
- The queues' capabilities (Volcano's capacity plugin): a team's gangs together may hold at
  most its capability in GPUs, and a team's allocation also counts against its parent queue's
  capability. `deserved` and guarantees are not modelled: without preemption they only decide
  who reclaims, and this scheduler never takes anything back.
- Each gang runs for `duration_s` once started and then frees its GPUs.

The scheduler is list scheduling (Graham, "Bounds for certain multiprocessing anomalies",
Bell System Technical Journal 45, 1966; with resource constraints, Garey and Graham, "Bounds
for multiprocessor scheduling with resource constraints", SIAM J. Comput. 4, 1975), event
driven: at every submission or completion it scans the waiting gangs in one fixed order --
priority descending, then the gang's total GPUs descending, then submission time, then name --
and starts every gang that fits now. Largest first is first-fit decreasing's order (Johnson,
Demers, Ullman, Garey and Graham, "Worst-case performance bounds for simple one-dimensional
packing algorithms", SIAM J. Comput. 3, 1974): small gangs fill what the big ones leave. A
gang that does not fit does not block the gangs after it (no reservation: Volcano's allocate
action does not reserve either), so a lower-priority gang may start before a higher one that
does not fit yet, but never in its place: within one event a gang starts only if every gang
before it in the order that is still waiting did not fit with what was started before it.

Within a gang, each pod goes to the pool's node with the fewest free GPUs that still holds it
(best fit), ties to the node listed first. Filling the fullest nodes first keeps whole nodes
free for the gangs of whole-node pods; it is what Volcano's binpack plugin on nvidia.com/gpu
(trainstack's generated configuration, builders/scheduling.py) prefers, a node's score
growing with its GPU utilisation after the placement; for a pool of equal nodes (every
trainstack pool is one instance type) the two orders are the same.

Nothing is preempted and nothing moves once started, so the result is a reference for what
a non-preemptive greedy scheduler should reach, not the optimum: on identical nodes list
scheduling can take 2 - 1/m times the optimal drain time (Graham 1966), and
tests/bench/test_oracle.py holds it against an exhaustive search on small instances, with the
bounds it proves there.

The same function (`allocation_while_waiting`) measures the oracle's allocation and can
measure the benchmark's own samples: the mean fraction of all GPUs allocated over the time at
least one submitted gang was waiting to start.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    gpus: int


@dataclass(frozen=True)
class Gang:
    """One Volcano job: all replicas start together or not at all."""

    name: str
    team: str
    pool: str  # the only pool its pods may use (the job's node selector)
    replicas: int
    gpus: int  # per replica; a replica must fit on one node
    priority: int  # higher starts first when both fit
    duration_s: float
    submit_s: float = 0.0

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus


@dataclass(frozen=True)
class Limits:
    """The queues' capabilities in GPUs (Volcano's capacity plugin): a queue may not allocate
    past its capability, and a child's allocation also counts against its parent's."""

    team_capability: Mapping[str, int] = field(default_factory=dict)  # missing: unlimited
    group_of: Mapping[str, str] = field(default_factory=dict)  # team -> parent queue
    group_capability: Mapping[str, int] = field(default_factory=dict)  # missing: unlimited

    def team_cap(self, team: str) -> int | None:
        return self.team_capability.get(team)

    def group(self, team: str) -> str | None:
        return self.group_of.get(team)

    def group_cap(self, team: str) -> int | None:
        group = self.group_of.get(team)
        return None if group is None else self.group_capability.get(group)


@dataclass(frozen=True)
class Placement:
    gang: str
    start_s: float
    end_s: float
    nodes: tuple[str, ...]  # one per replica, in placement order; a node may repeat
    submit_s: float = 0.0


@dataclass(frozen=True)
class Sample:
    """The cluster from `time_s` until the next sample: GPUs allocated, and how many
    submitted gangs were waiting to start."""

    time_s: float
    allocated_gpus: float
    waiting: int


@dataclass(frozen=True)
class Schedule:
    placements: tuple[Placement, ...]  # in start order
    unschedulable: tuple[str, ...]  # gangs that can never fit (too big for their pool or limits)
    drain_s: float  # last end time (0.0 when nothing ran)
    # Time-weighted mean of allocated / total GPUs over the time at least one submitted,
    # schedulable gang was waiting (not yet started); 0.0 if none ever waited.
    gpu_allocation: float
    total_gpus: int
    timeline: tuple[Sample, ...] = ()  # the state after each event

    @cached_property
    def _by_gang(self) -> dict[str, Placement]:
        return {p.gang: p for p in self.placements}

    def placement(self, gang: str) -> Placement:
        """KeyError for a gang that never ran (unschedulable or unknown)."""
        return self._by_gang[gang]

    def start_s(self, gang: str) -> float:
        """The gang's wait: its start minus its submission, in seconds."""
        placed = self._by_gang[gang]
        return placed.start_s - placed.submit_s

    @property
    def waits(self) -> tuple[float, ...]:
        """Every placed gang's wait (start minus submission), in start order."""
        return tuple(p.start_s - p.submit_s for p in self.placements)


class _Pool:
    """The free GPUs of one pool's nodes, the nodes bucketed by how many GPUs they have free,
    so that "does a gang fit" costs one step per distinct free count instead of one per node
    (the benchmark asks it about a thousand waiting gangs at every event)."""

    def __init__(self, names: list[str], gpus: list[int]) -> None:
        self.names = names
        self.free = list(gpus)
        self.total_free = sum(gpus)
        # free GPUs -> indices of the nodes with that many free, ascending (first fit on ties)
        self.buckets: dict[int, list[int]] = {}
        for index, free in enumerate(gpus):
            self.buckets.setdefault(free, []).append(index)
        self.levels = sorted(self.buckets)  # the free counts that some node has, ascending

    def slots(self, gpus: int) -> int:
        """How many more pods of `gpus` GPUs the pool's nodes hold now."""
        return sum(
            len(self.buckets[free]) * (free // gpus)
            for free in self.levels[bisect.bisect_left(self.levels, gpus) :]
        )

    def take(self, gpus: int) -> int:
        """Place one pod of `gpus` GPUs (best fit) and return its node's index; the caller has
        checked that it fits."""
        level = self.levels[bisect.bisect_left(self.levels, gpus)]
        node = self.buckets[level][0]
        self._move(node, level - gpus)
        return node

    def give(self, node: int, gpus: int) -> None:
        self._move(node, self.free[node] + gpus)

    def _move(self, node: int, to: int) -> None:
        level = self.free[node]
        bucket = self.buckets[level]
        del bucket[bisect.bisect_left(bucket, node)]
        if not bucket:
            del self.buckets[level]
            del self.levels[bisect.bisect_left(self.levels, level)]
        if to not in self.buckets:
            self.buckets[to] = []
            bisect.insort(self.levels, to)
        bisect.insort(self.buckets[to], node)
        self.total_free += level - to
        self.free[node] = to


def order_key(gang: Gang) -> tuple[int, int, float, str]:
    """The order in which waiting gangs are considered: priority descending, total GPUs
    descending (first-fit decreasing), submission time, name."""
    return (-gang.priority, -gang.total_gpus, gang.submit_s, gang.name)


def unschedulable_reason(gang: Gang, nodes: Sequence[Node], limits: Limits) -> str | None:
    """Why `gang` can never start, even on an empty cluster with every queue empty; None if it
    can."""
    pool = [n.gpus for n in nodes if n.pool == gang.pool]
    if not pool:
        return f"pool {gang.pool!r} has no nodes"
    if sum(free // gang.gpus for free in pool) < gang.replicas:
        return f"pool {gang.pool!r} cannot hold {gang.replicas} x {gang.gpus} GPUs"
    team_cap = limits.team_cap(gang.team)
    if team_cap is not None and gang.total_gpus > team_cap:
        return f"{gang.total_gpus} GPUs exceed team {gang.team!r}'s capability {team_cap}"
    group_cap = limits.group_cap(gang.team)
    if group_cap is not None and gang.total_gpus > group_cap:
        return f"{gang.total_gpus} GPUs exceed group {limits.group(gang.team)!r}'s capability"
    return None


def _validate(nodes: Sequence[Node], gangs: Sequence[Gang]) -> None:
    if len({n.name for n in nodes}) != len(nodes):
        raise ValueError("node names must be unique")
    if len({g.name for g in gangs}) != len(gangs):
        raise ValueError("gang names must be unique")
    for node in nodes:
        if node.gpus < 0:
            raise ValueError(f"node {node.name}: negative GPUs")
    for gang in gangs:
        if gang.replicas < 1 or gang.gpus < 1:
            raise ValueError(f"gang {gang.name}: needs at least one replica of at least one GPU")
        # Positive durations: a gang that ends the instant it starts would need a second pass
        # at the same event, and no real job does.
        if not (0 < gang.duration_s < math.inf):
            raise ValueError(f"gang {gang.name}: duration must be positive and finite")
        if not (0 <= gang.submit_s < math.inf):
            raise ValueError(f"gang {gang.name}: submission must be non-negative and finite")


class _Cluster:
    """What is free while the simulation runs: the pools' nodes and the queues' allocations."""

    def __init__(self, nodes: Sequence[Node], gangs: Sequence[Gang], limits: Limits) -> None:
        by_pool: dict[str, tuple[list[str], list[int]]] = {}
        for node in nodes:
            names, gpus = by_pool.setdefault(node.pool, ([], []))
            names.append(node.name)
            gpus.append(node.gpus)
        self.pools = {name: _Pool(names, gpus) for name, (names, gpus) in by_pool.items()}
        # Looked up once per team: the scan asks about every waiting gang at every event.
        self.team_cap = {g.team: limits.team_cap(g.team) for g in gangs}
        self.group_of = {g.team: limits.group(g.team) for g in gangs}
        self.group_cap = {g.team: limits.group_cap(g.team) for g in gangs}
        self.team_used: dict[str, int] = dict.fromkeys(self.team_cap, 0)
        self.group_used: dict[str | None, int] = dict.fromkeys(self.group_of.values(), 0)
        self.allocated = 0
        self.placed: dict[str, list[int]] = {}  # running gang -> its replicas' node indices

    def within_limits(self, gang: Gang) -> bool:
        demand = gang.total_gpus
        cap = self.team_cap[gang.team]
        if cap is not None and self.team_used[gang.team] + demand > cap:
            return False
        cap = self.group_cap[gang.team]
        return cap is None or self.group_used[self.group_of[gang.team]] + demand <= cap

    def start(self, gang: Gang) -> tuple[str, ...]:
        """Place every replica (the caller has checked that they fit): their nodes."""
        pool = self.pools[gang.pool]
        placed = self.placed[gang.name] = [pool.take(gang.gpus) for _ in range(gang.replicas)]
        self._count(gang, gang.total_gpus)
        return tuple(pool.names[i] for i in placed)

    def finish(self, gang: Gang) -> None:
        pool = self.pools[gang.pool]
        for index in self.placed.pop(gang.name):
            pool.give(index, gang.gpus)
        self._count(gang, -gang.total_gpus)

    def _count(self, gang: Gang, gpus: int) -> None:
        self.team_used[gang.team] += gpus
        self.group_used[self.group_of[gang.team]] += gpus
        self.allocated += gpus


_Waiting = tuple[tuple[int, int, float, str], Gang]  # (order_key, gang): sorts in scan order


def _scan(
    cluster: _Cluster, waiting: list[_Waiting]
) -> tuple[list[tuple[Gang, tuple[str, ...]]], list[_Waiting]]:
    """Start, in scan order, every waiting gang that fits: ((gang, its nodes) started, still
    waiting).

    One scan is a fixed point: starting a gang only takes resources, so a gang that did not
    fit earlier in the scan cannot fit later in it. For the same reason, once `r` pods of `g`
    GPUs did not fit in a pool, no gang of r or more such pods fits there for the rest of the
    scan: skipped without counting slots, which keeps a scan of a thousand gangs cheap.
    """
    unfit: dict[tuple[str, int], float] = {}
    started: list[tuple[Gang, tuple[str, ...]]] = []
    still: list[_Waiting] = []
    for entry in waiting:
        gang = entry[1]
        pool = cluster.pools[gang.pool]
        shape = (gang.pool, gang.gpus)
        if gang.replicas >= unfit.get(shape, math.inf) or not cluster.within_limits(gang):
            still.append(entry)
        elif pool.total_free < gang.total_gpus or pool.slots(gang.gpus) < gang.replicas:
            unfit[shape] = gang.replicas  # smaller than any before it: bigger ones skip
            still.append(entry)
        else:
            started.append((gang, cluster.start(gang)))
    return started, still


def simulate(nodes: Sequence[Node], gangs: Sequence[Gang], limits: Limits) -> Schedule:
    """Schedule `gangs` on `nodes` under `limits` by gang-aware first-fit decreasing list
    scheduling (the module's docstring); deterministic for the same input."""
    _validate(nodes, gangs)
    unschedulable = tuple(g.name for g in gangs if unschedulable_reason(g, nodes, limits))
    never = set(unschedulable)
    # Submissions in time order, ties in scan order (they join the same event anyway).
    arrivals = sorted(
        (g for g in gangs if g.name not in never), key=lambda g: (g.submit_s, order_key(g))
    )
    cluster = _Cluster(nodes, arrivals, limits)
    total_gpus = sum(n.gpus for n in nodes)
    waiting: list[_Waiting] = []
    running: list[tuple[float, int, Gang]] = []  # a heap: end, start sequence, gang
    placements: list[Placement] = []
    timeline: list[Sample] = []
    arrived = 0
    while arrived < len(arrivals) or running:
        now = min(
            arrivals[arrived].submit_s if arrived < len(arrivals) else math.inf,
            running[0][0] if running else math.inf,
        )
        # Completions first: what ends now is free for what starts now.
        while running and running[0][0] == now:
            cluster.finish(heapq.heappop(running)[2])
        while arrived < len(arrivals) and arrivals[arrived].submit_s == now:
            bisect.insort(waiting, (order_key(arrivals[arrived]), arrivals[arrived]))
            arrived += 1
        started, waiting = _scan(cluster, waiting)
        for gang, placed in started:
            end = now + gang.duration_s
            heapq.heappush(running, (end, len(placements), gang))
            placements.append(Placement(gang.name, now, end, placed, gang.submit_s))
        timeline.append(Sample(now, cluster.allocated, len(waiting)))
        if waiting and not running and arrived == len(arrivals):
            # Cannot happen: on an empty cluster every schedulable gang fits.
            raise RuntimeError(f"gangs left waiting on an idle cluster: {waiting[0][1].name}")
    drain = max((p.end_s for p in placements), default=0.0)
    allocation = allocation_while_waiting(timeline, total_gpus, drain) if total_gpus else 0.0
    return Schedule(
        placements=tuple(placements),
        unschedulable=unschedulable,
        drain_s=drain,
        gpu_allocation=allocation,
        total_gpus=total_gpus,
        timeline=tuple(timeline),
    )


def allocation_while_waiting(
    samples: Sequence[Sample], total_gpus: int, end_s: float | None = None
) -> float:
    """The time-weighted mean of allocated / `total_gpus` over the time when at least one
    gang was waiting; 0.0 if none ever was.

    `samples` are a step function in time order: each holds from its time until the next
    sample's, the last until `end_s` (without `end_s` the last sample only closes the one
    before it). For the benchmark's samples, taken about once a second, this is their mean
    while jobs wait, each weighted by how long it actually held.
    """
    if total_gpus <= 0:
        raise ValueError("total_gpus must be positive")
    weighted = span = 0.0
    for index, sample in enumerate(samples):
        if index + 1 < len(samples):
            until = samples[index + 1].time_s
        elif end_s is not None:
            until = end_s
        else:
            break
        held = until - sample.time_s
        if held < 0:
            raise ValueError(f"samples out of time order at {sample.time_s}")
        if sample.waiting > 0:
            weighted += sample.allocated_gpus * held
            span += held
    return weighted / (span * total_gpus) if span > 0 else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 <= q <= 100) of `values`: the smallest value
    with at least q % of the values at or below it (Hyndman and Fan's definition 1, no
    interpolation), so the result is always one of the values; q = 0 gives the minimum."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    # q * n / 100 is exact for whole q: a product of integers below 2**53, one rounding.
    rank = max(1, math.ceil(q * len(ordered) / 100))
    return ordered[rank - 1]
