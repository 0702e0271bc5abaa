"""The offline scheduler of the scheduling benchmark (trainstack/bench/oracle.py, issue 46).

Held against an exhaustive search on tiny instances, which finds the least drain time of any
non-preemptive schedule (every start time, every placement):

- it never beats the optimum: a schedule that overcommitted a node or a queue would;
- it matches the optimum where list scheduling is known to be optimal (each test says why);
- elsewhere it stays within bounds proved here, in the docstrings of the tests that check them.
  The classic one is Graham's: on identical machines a list schedule drains within twice the
  optimum, also when jobs arrive over time ("Bounds on multiprocessing timing anomalies", SIAM
  J. Appl. Math. 17, 1969; with release dates, e.g. Hall and Shmoys, "Approximation schemes
  for constrained scheduling problems", FOCS 1989); with s resource limits besides, s + 1 as
  in Garey and Graham's bound for resource-constrained list scheduling (SIAM J. Comput. 4,
  1975). A one-line example shows that it is not optimal either.

And invariants on random instances: no node, team or group over its GPUs at any time, whole
gangs, every pod in its pool, the unschedulable reported and never placed, no gang waiting
while it fits, and no gang overtaken within an event by one after it in the scan order.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainstack.bench.oracle import (
    Gang,
    Limits,
    Node,
    Placement,
    Sample,
    Schedule,
    allocation_while_waiting,
    percentile,
    simulate,
)

Instance = tuple[list[Node], list[Gang], Limits]
State = Sequence[tuple[Gang, tuple[str, ...]]]  # running gangs and their replicas' nodes


# -- an independent statement of the model ----------------------------------------------------


def scan_key(gang: Gang) -> tuple[int, int, float, str]:
    """The documented order: priority descending, total GPUs descending, submission, name."""
    return (-gang.priority, -gang.replicas * gang.gpus, gang.submit_s, gang.name)


def group_cap(limits: Limits, team: str) -> float:
    group = limits.group_of.get(team)
    return math.inf if group is None else limits.group_capability.get(group, math.inf)


def schedulable(gang: Gang, nodes: Sequence[Node], limits: Limits) -> bool:
    pool = [n.gpus for n in nodes if n.pool == gang.pool]
    demand = gang.replicas * gang.gpus
    return (
        sum(gpus // gang.gpus for gpus in pool) >= gang.replicas
        and demand <= limits.team_capability.get(gang.team, math.inf)
        and demand <= group_cap(limits, gang.team)
    )


def within_limits(gang: Gang, state: State, limits: Limits) -> bool:
    demand = gang.replicas * gang.gpus
    team = sum(g.replicas * g.gpus for g, _ in state if g.team == gang.team)
    group = limits.group_of.get(gang.team)
    grouped = sum(
        g.replicas * g.gpus for g, _ in state if group and limits.group_of.get(g.team) == group
    )
    team_ok = team + demand <= limits.team_capability.get(gang.team, math.inf)
    return team_ok and grouped + demand <= group_cap(limits, gang.team)


def node_use(state: State) -> Counter[str]:
    used: Counter[str] = Counter()
    for gang, nodes in state:
        for node in nodes:
            used[node] += gang.gpus
    return used


def fits(gang: Gang, state: State, nodes: Sequence[Node], limits: Limits) -> bool:
    """Whether every replica of `gang` could start next to `state`, on some placement."""
    used = node_use(state)
    slots = sum((n.gpus - used[n.name]) // gang.gpus for n in nodes if n.pool == gang.pool)
    return slots >= gang.replicas and within_limits(gang, state, limits)


def placements(
    gang: Gang, state: State, nodes: Sequence[Node], limits: Limits
) -> list[tuple[str, ...]]:
    """Every placement of `gang`'s replicas next to `state` (a node may take several), up to
    the symmetry of empty nodes of the same size: of those, only the first `replicas` are
    candidates, since any placement on the others is the same one renamed."""
    if not within_limits(gang, state, limits):
        return []
    used = node_use(state)
    candidates = []
    empty: Counter[int] = Counter()
    for node in nodes:
        if node.pool != gang.pool or node.gpus - used[node.name] < gang.gpus:
            continue
        if used[node.name] == 0:
            empty[node.gpus] += 1
            if empty[node.gpus] > gang.replicas:
                continue
        candidates.append(node)
    capacity = {n.name: n.gpus - used[n.name] for n in candidates}
    found = []
    for chosen in itertools.combinations_with_replacement(candidates, gang.replicas):
        names = tuple(n.name for n in chosen)
        if all(k * gang.gpus <= capacity[name] for name, k in Counter(names).items()):
            found.append(names)
    return found


def optimum(nodes: Sequence[Node], gangs: Sequence[Gang], limits: Limits) -> float:
    """The least drain time of any non-preemptive schedule of the schedulable gangs, by
    exhaustive search.

    Only submissions and ends are tried as start times. That loses nothing: take an optimal
    schedule and, in start order, move each gang back to the latest submission, end or start
    of an earlier-moved gang before it (not before its own submission). In between nothing
    that it overlaps starts or ends, so the gangs running next to it there are the ones
    running next to it at its start, on the same nodes: the move keeps every node and queue
    within its GPUs and shortens nothing. Starts of moved gangs are themselves submissions or
    ends, so every gang then starts at one. At each such instant the search tries every subset
    of the waiting gangs, each on every placement.
    """
    todo = tuple(g for g in gangs if schedulable(g, nodes, limits))
    if not todo:
        return 0.0
    best = math.inf
    Running = tuple[tuple[float, Gang, tuple[str, ...]], ...]

    def search(now: float, running: Running, pending: tuple[Gang, ...], finish: float) -> None:
        running = tuple(r for r in running if r[0] > now)
        bound = max(finish, *(max(g.submit_s, now) + g.duration_s for g in pending))
        if bound >= best:
            return
        ready = [g for g in pending if g.submit_s <= now]

        def choose(index: int, active: Running, started: frozenset[str], last: float) -> None:
            nonlocal best
            if index == len(ready):
                rest = tuple(g for g in pending if g.name not in started)
                if not rest:
                    best = min(best, last)
                    return
                later = [end for end, _, _ in active] + [
                    g.submit_s for g in rest if g.submit_s > now
                ]
                if later:  # else nothing runs and nothing comes: a dead end
                    search(min(later), active, rest, last)
                return
            gang = ready[index]
            state = [(g, n) for _, g, n in active]
            end = now + gang.duration_s
            for nodes_of in placements(gang, state, nodes, limits):
                choose(
                    index + 1,
                    (*active, (end, gang, nodes_of)),
                    started | {gang.name},
                    max(last, end),
                )
            choose(index + 1, active, started, last)

        choose(0, running, frozenset(), finish)

    search(min(g.submit_s for g in todo), (), todo, 0.0)
    return best


# -- the invariants -----------------------------------------------------------------------------


def check_invariants(
    nodes: Sequence[Node], gangs: Sequence[Gang], limits: Limits, schedule: Schedule
) -> None:
    """Every gang placed once or reported unschedulable, whole, in its pool; no node, team or
    group over its GPUs at any time (a sweep over starts and ends, ends first at a tie)."""
    by_name = {g.name: g for g in gangs}
    node_of = {n.name: n for n in nodes}
    placed = [p.gang for p in schedule.placements]
    assert len(placed) == len(set(placed))
    assert set(schedule.unschedulable) == {
        g.name for g in gangs if not schedulable(g, nodes, limits)
    }
    assert set(placed) == set(by_name) - set(schedule.unschedulable)
    events = []
    for place in schedule.placements:
        gang = by_name[place.gang]
        assert len(place.nodes) == gang.replicas  # all replicas, at one start
        assert all(node_of[n].pool == gang.pool for n in place.nodes)
        assert place.start_s >= gang.submit_s == place.submit_s
        assert place.end_s == place.start_s + gang.duration_s
        assert schedule.start_s(gang.name) == place.start_s - gang.submit_s
        events += [(place.start_s, 1, gang, place.nodes), (place.end_s, 0, gang, place.nodes)]
    node_used: Counter[str] = Counter()
    team_used: Counter[str] = Counter()
    group_used: Counter[str] = Counter()
    for _, starts, gang, on in sorted(events, key=lambda e: (e[0], e[1], e[2].name)):
        sign = 1 if starts else -1
        for node in on:
            node_used[node] += sign * gang.gpus
        team_used[gang.team] += sign * gang.replicas * gang.gpus
        group = limits.group_of.get(gang.team)
        if group:
            group_used[group] += sign * gang.replicas * gang.gpus
        if starts:
            assert all(node_used[n] <= node_of[n].gpus for n in on)
            assert team_used[gang.team] <= limits.team_capability.get(gang.team, math.inf)
            assert not group or group_used[group] <= limits.group_capability.get(group, math.inf)
    assert schedule.drain_s == max((p.end_s for p in schedule.placements), default=0.0)
    assert schedule.total_gpus == sum(n.gpus for n in nodes)
    assert schedule.gpu_allocation == pytest.approx(allocation_by_hand(gangs, schedule))


def allocation_by_hand(gangs: Sequence[Gang], schedule: Schedule) -> float:
    """The metric recomputed from the placements alone: between consecutive instants where
    anything happens, the GPUs allocated, counted only while a placed gang waits."""
    by_name = {g.name: g for g in gangs}
    places = schedule.placements
    times = sorted({t for p in places for t in (p.submit_s, p.start_s, p.end_s)})
    weighted = span = 0.0
    for here, after in itertools.pairwise(times):
        if any(p.submit_s <= here < p.start_s for p in places):
            allocated = sum(
                by_name[p.gang].replicas * by_name[p.gang].gpus
                for p in places
                if p.start_s <= here < p.end_s
            )
            weighted += (after - here) * allocated
            span += after - here
    return weighted / span / schedule.total_gpus if span else 0.0


def check_greedy(
    nodes: Sequence[Node], gangs: Sequence[Gang], limits: Limits, schedule: Schedule
) -> None:
    """No gang waits while it fits; and within an event, no gang starts while one before it in
    the scan order waits that fitted next to what had started before that one."""
    by_name = {g.name: g for g in gangs}
    places = schedule.placements

    def waiting(t: float) -> list[Gang]:
        return [by_name[p.gang] for p in places if p.submit_s <= t < p.start_s]

    for t in sorted({g.submit_s for g in gangs} | {p.end_s for p in places}):
        state = [(by_name[p.gang], p.nodes) for p in places if p.start_s <= t < p.end_s]
        for gang in waiting(t):
            assert not fits(gang, state, nodes, limits), (gang.name, t)
    for later in places:
        t = later.start_s
        for gang in waiting(t):
            if scan_key(gang) > scan_key(by_name[later.gang]):
                continue
            before = [
                (by_name[p.gang], p.nodes)
                for p in places
                if p.start_s < t < p.end_s
                or (p.start_s == t and scan_key(by_name[p.gang]) < scan_key(gang))
            ]
            assert not fits(gang, before, nodes, limits), (gang.name, later.gang, t)


# -- strategies ---------------------------------------------------------------------------------

POOLS = ("a", "b")
TEAMS = ("t1", "t2", "t3")
GROUPED = {"t1": "g", "t2": "g"}  # t3 has no parent queue


@st.composite
def instances(draw: st.DrawFn, max_gangs: int = 4, max_nodes: int = 3) -> Instance:
    """Tiny clusters of two pools, three teams (two in one group), optional capabilities."""
    node_specs = draw(
        st.lists(
            st.tuples(st.sampled_from(POOLS), st.integers(1, 4)), min_size=1, max_size=max_nodes
        )
    )
    nodes = [Node(f"n{i}", pool, gpus) for i, (pool, gpus) in enumerate(node_specs)]
    gang_specs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(TEAMS),
                st.sampled_from(POOLS),
                st.integers(1, 2),  # replicas
                st.integers(1, 4),  # GPUs each
                st.integers(0, 2),  # priority
                st.integers(1, 3),  # duration
                st.integers(0, 2),  # submission
            ),
            min_size=1,
            max_size=max_gangs,
        )
    )
    gangs = [
        Gang(f"j{i}", team, pool, replicas, gpus, priority, float(duration), float(submit))
        for i, (team, pool, replicas, gpus, priority, duration, submit) in enumerate(gang_specs)
    ]
    limits = Limits(
        draw(st.dictionaries(st.sampled_from(TEAMS), st.integers(1, 6))),
        GROUPED,
        draw(st.dictionaries(st.just("g"), st.integers(1, 8))),
    )
    return nodes, gangs, limits


def conflicts(gang: Gang, other: Gang, limits: Limits) -> bool:
    """Whether `other` running can keep `gang` from starting: same pool, or same capped team,
    or teams under the same capped group."""
    group = limits.group_of.get(gang.team)
    return (
        other.pool == gang.pool
        or (other.team == gang.team and gang.team in limits.team_capability)
        or (
            group is not None
            and group in limits.group_capability
            and limits.group_of.get(other.team) == group
        )
    )


# -- against the exhaustive optimum -------------------------------------------------------------


@settings(max_examples=150)
@given(instances())
def test_never_beats_the_optimum_and_waits_only_for_what_conflicts(instance: Instance) -> None:
    """The optimum is a lower bound on every valid schedule, so drain >= optimum; a schedule
    that beat it overcommitted something.

    And for every gang J: end(J) <= submit(J) + duration(J) + the durations of the other gangs
    that conflict with J (same pool, same capped team, same capped group). Proof: while J
    waits, J does not fit (check_greedy), and J would fit if none of those ran (its pool and
    its queues empty: J is schedulable), so at every instant of the wait one of them runs, and
    each runs for its duration at most. A loose bound, but it holds with fragmentation and
    limits, where no constant ratio to the optimum does for any list scheduler.
    """
    nodes, gangs, limits = instance
    schedule = simulate(nodes, gangs, limits)
    check_invariants(nodes, gangs, limits, schedule)
    check_greedy(nodes, gangs, limits, schedule)
    best = optimum(nodes, gangs, limits)
    assert schedule.drain_s >= best
    placed = {p.gang: p for p in schedule.placements}
    for gang in gangs:
        if gang.name in placed:
            others = sum(
                g.duration_s
                for g in gangs
                if g is not gang and g.name in placed and conflicts(gang, g, limits)
            )
            assert placed[gang.name].end_s <= gang.submit_s + gang.duration_s + others


@st.composite
def uniform_instances(draw: st.DrawFn) -> Instance:
    """One pool of m equal nodes; every gang r replicas of a whole node (so d = r x node GPUs
    each); m and every capability multiples of r and of d. Allocations are then multiples of
    d, so a gang that does not fit finds its pool, its team or its group full."""
    size = draw(st.sampled_from([1, 2, 4]))
    replicas = draw(st.integers(1, 2))
    machines = replicas * draw(st.integers(1, 2))
    demand = replicas * size
    nodes = [Node(f"n{i}", "a", size) for i in range(machines)]
    specs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(TEAMS), st.integers(0, 2), st.integers(1, 4), st.integers(0, 3)
            ),
            min_size=1,
            max_size=5,
        )
    )
    gangs = [
        Gang(f"j{i}", team, "a", replicas, size, priority, float(duration), float(submit))
        for i, (team, priority, duration, submit) in enumerate(specs)
    ]
    teams = draw(st.dictionaries(st.sampled_from(TEAMS), st.integers(1, 2)))
    groups = draw(st.dictionaries(st.just("g"), st.integers(1, 2)))
    limits = Limits(
        {t: k * demand for t, k in teams.items()},
        GROUPED,
        {g: k * demand for g, k in groups.items()},
    )
    return nodes, gangs, limits


@settings(max_examples=150)
@given(uniform_instances())
def test_gangs_of_equal_shape_drain_within_one_plus_the_limits_times_the_optimum(
    instance: Instance,
) -> None:
    """Bound: for every gang J, end(J) <= submit(J) + duration(J) + sum over J's resources R
    (its pool; its team and its group where capped) of W_R / cap_R, W_R the GPU-seconds of
    the other gangs that use R.

    Proof (Graham's argument, one resource at a time): while J waits it does not fit, and
    with allocations in multiples of J's demand one of its resources is then full. R full for
    a time T means cap_R x T GPU-seconds of the others' work on R, so T <= W_R / cap_R. Each
    term is at most the optimum (no schedule does R's work faster than cap_R at a time), as is
    submit(J) + duration(J): drain <= (1 + s) x optimum with s the capped queues over J. With
    no limits that is list scheduling on identical machines with release dates: 2 x optimum.
    """
    nodes, gangs, limits = instance
    schedule = simulate(nodes, gangs, limits)
    check_invariants(nodes, gangs, limits, schedule)
    check_greedy(nodes, gangs, limits, schedule)
    best = optimum(nodes, gangs, limits)
    assert schedule.drain_s >= best
    pool_gpus = sum(n.gpus for n in nodes)
    for place in schedule.placements:
        gang = next(g for g in gangs if g.name == place.gang)
        others = [g for g in gangs if g is not gang]
        terms = [sum(g.replicas * g.gpus * g.duration_s for g in others) / pool_gpus]
        if gang.team in limits.team_capability:
            work = sum(g.replicas * g.gpus * g.duration_s for g in others if g.team == gang.team)
            terms.append(work / limits.team_capability[gang.team])
        group = limits.group_of.get(gang.team)
        if group is not None and group in limits.group_capability:
            work = sum(
                g.replicas * g.gpus * g.duration_s
                for g in others
                if limits.group_of.get(g.team) == group
            )
            terms.append(work / limits.group_capability[group])
        assert place.end_s <= gang.submit_s + gang.duration_s + sum(terms)
        assert place.end_s <= (1 + len(terms)) * best
    if not limits.team_capability and not limits.group_capability:
        assert schedule.drain_s <= 2 * best


@settings(max_examples=60)
@given(
    st.integers(1, 3),
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 4), st.integers(0, 6)), min_size=1, max_size=5
    ),
)
def test_gangs_that_each_need_the_whole_pool_drain_as_early_as_possible(
    machines: int, specs: list[tuple[int, int, int]]
) -> None:
    """Optimal: no two such gangs ever run together, so the pool is one machine, and on one
    machine every schedule that idles only while nothing is waiting (as list scheduling does)
    has the same busy periods, the least possible. Whatever the priorities."""
    nodes = [Node(f"n{i}", "a", 8) for i in range(machines)]
    gangs = [
        Gang(f"j{i}", "t", "a", machines, 8, priority, float(duration), float(submit))
        for i, (priority, duration, submit) in enumerate(specs)
    ]
    schedule = simulate(nodes, gangs, Limits())
    check_invariants(nodes, gangs, Limits(), schedule)
    busy_until = 0.0
    for gang in sorted(gangs, key=lambda g: g.submit_s):
        busy_until = max(busy_until, gang.submit_s) + gang.duration_s
    assert schedule.drain_s == busy_until == optimum(nodes, gangs, Limits())


@settings(max_examples=60)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 3), st.sampled_from([1, 2, 8]))
def test_equal_unit_gangs_drain_in_as_few_rounds_as_possible(
    machines: int, count: int, duration: int, size: int
) -> None:
    """Optimal: at most `machines` such gangs run at a time and each takes `duration`, so no
    schedule drains before ceil(count / machines) rounds; list scheduling runs full rounds."""
    nodes = [Node(f"n{i}", "a", size) for i in range(machines)]
    gangs = [Gang(f"j{i}", "t", "a", 1, size, i % 2, float(duration)) for i in range(count)]
    schedule = simulate(nodes, gangs, Limits())
    check_invariants(nodes, gangs, Limits(), schedule)
    rounds = math.ceil(count / machines) * duration
    assert schedule.drain_s == rounds == optimum(nodes, gangs, Limits())


@settings(max_examples=60)
@given(instances(max_gangs=4))
def test_when_everything_fits_at_once_nobody_waits(instance: Instance) -> None:
    """Optimal: each gang starts at its submission and no schedule ends one earlier than its
    submission plus its duration. The pool of each gang here has a node per replica."""
    _, gangs, _ = instance
    nodes = [Node(f"{g.name}-{r}", g.pool, g.gpus) for g in gangs for r in range(g.replicas)]
    schedule = simulate(nodes, gangs, Limits())
    check_invariants(nodes, gangs, Limits(), schedule)
    assert schedule.waits == (0.0,) * len(gangs)
    assert schedule.drain_s == max(g.submit_s + g.duration_s for g in gangs)
    assert schedule.gpu_allocation == 0.0  # nobody ever waited


def test_list_scheduling_is_an_upper_bound_not_the_optimum() -> None:
    """Graham's example: two machines, two short jobs ahead of a long one in the list. The
    short ones take both machines and the long one starts after them: 3 where 2 was possible
    (the long one at once, the short ones after each other): 2 - 1/m of the optimum."""
    nodes = [Node("n0", "a", 1), Node("n1", "a", 1)]
    gangs = [
        Gang("short1", "t", "a", 1, 1, 2, 1.0),
        Gang("short2", "t", "a", 1, 1, 1, 1.0),
        Gang("long", "t", "a", 1, 1, 0, 2.0),
    ]
    schedule = simulate(nodes, gangs, Limits())
    assert schedule.drain_s == 3.0
    assert optimum(nodes, gangs, Limits()) == 2.0


# -- invariants on bigger random instances ------------------------------------------------------


@settings(max_examples=150)
@given(instances(max_gangs=12, max_nodes=6))
def test_invariants_hold_on_random_instances(instance: Instance) -> None:
    nodes, gangs, limits = instance
    schedule = simulate(nodes, gangs, limits)
    check_invariants(nodes, gangs, limits, schedule)
    check_greedy(nodes, gangs, limits, schedule)
    shuffled = list(gangs)
    random.Random(len(gangs)).shuffle(shuffled)
    assert simulate(nodes, shuffled, limits).placements == schedule.placements  # input order


def benchmark_like(
    seed: int, *, pools: int, nodes: int, teams: int, gangs: int, caps: tuple[int, int] | None
) -> Instance:
    """The shape of `make bench-scheduling`: nodes of 8 GPUs spread over the pools, teams in
    5 groups, the benchmark's job shapes and priorities, submitted over a minute; `caps`: each
    team's and each group's capability, or none."""
    rng = random.Random(seed)
    pool_names = [f"pool{i}" for i in range(pools)]
    team_names = [f"team{i}" for i in range(teams)]
    shapes = [(1, 1), (1, 8), (2, 8), (4, 8), (8, 8)]
    jobs = []
    for index in range(gangs):
        replicas, gpus = rng.choice(shapes)
        jobs.append(
            Gang(
                f"bench-{index}",
                team_names[index % teams],
                rng.choice(pool_names),
                replicas,
                gpus,
                rng.choice([0, 0, 1, -1]),
                float(rng.randint(10, 400)),
                float(rng.randint(0, 60)),
            )
        )
    limits = Limits(
        dict.fromkeys(team_names, caps[0]) if caps else {},
        {t: f"group{i % 5}" for i, t in enumerate(team_names)},
        {f"group{i}": caps[1] for i in range(5)} if caps else {},
    )
    machines = [Node(f"node{i}", pool_names[i % pools], 8) for i in range(nodes)]
    return machines, jobs, limits


@pytest.mark.parametrize("seed", range(4))
def test_invariants_hold_on_seeded_medium_instances(seed: int) -> None:
    """Dozens of gangs queueing in three pools of four nodes, under limits (half the seeds):
    every check, the pairwise ones included. Hypothesis's tiny instances seldom have a gang
    that does not fit followed by one that does; here most events have both."""
    caps = (24, 40) if seed % 2 else None
    nodes, gangs, limits = benchmark_like(seed, pools=3, nodes=12, teams=10, gangs=60, caps=caps)
    schedule = simulate(nodes, gangs, limits)
    check_invariants(nodes, gangs, limits, schedule)
    check_greedy(nodes, gangs, limits, schedule)
    assert max(schedule.waits) > 0  # they did queue


@pytest.mark.parametrize("limited", [True, False])
def test_a_benchmark_sized_burst_is_scheduled(limited: bool) -> None:
    """Finishes (how fast is not asserted: docs/testing.md), places everything, keeps every
    invariant; the sweep checks are linear, the pairwise ones are left to small instances."""
    nodes, gangs, limits = benchmark_like(
        46, pools=8, nodes=1000, teams=50, gangs=1000, caps=(96, 1200) if limited else None
    )
    schedule = simulate(nodes, gangs, limits)
    by_name = {g.name: g for g in gangs}
    node_of = {n.name: n for n in nodes}
    assert not schedule.unschedulable
    assert len(schedule.placements) == len(gangs)
    for place in schedule.placements:
        gang = by_name[place.gang]
        assert len(place.nodes) == gang.replicas
        assert {node_of[n].pool for n in place.nodes} == {gang.pool}
    events = sorted(
        (t, starts, p.gang)
        for p in schedule.placements
        for t, starts in ((p.start_s, 1), (p.end_s, 0))
    )
    used: Counter[str] = Counter()
    team_used: Counter[str] = Counter()
    for _, starts, name in events:
        gang = by_name[name]
        for node in schedule.placement(name).nodes:
            used[node] += gang.gpus if starts else -gang.gpus
            assert used[node] <= 8
        team_used[gang.team] += (1 if starts else -1) * gang.replicas * gang.gpus
        assert not limited or team_used[gang.team] <= 96
    assert 0.0 < schedule.gpu_allocation <= 1.0
    assert simulate(nodes, gangs, limits) == schedule  # deterministic


# -- hand-made cases ----------------------------------------------------------------------------


def test_best_fit_keeps_a_whole_node_free_for_a_whole_node_gang() -> None:
    """A half-node pod goes to the half-used node, not the empty one (first node listed):
    the whole-node gang after it starts at once. Spreading would make it wait 10 s."""
    nodes = [Node("empty", "a", 8), Node("half", "a", 8)]
    gangs = [
        Gang("first", "t", "a", 1, 4, 0, 10.0),
        Gang("second", "t", "a", 1, 4, 1, 10.0, submit_s=1.0),
        Gang("whole", "t", "a", 1, 8, 0, 1.0, submit_s=1.0),
    ]
    schedule = simulate(nodes, gangs, Limits())
    assert schedule.placement("first").nodes == ("empty",)  # both empty: the first listed
    assert schedule.placement("second").nodes == ("empty",)  # the fuller one that fits
    assert schedule.placement("whole").nodes == ("half",)
    assert schedule.start_s("whole") == 0.0


def test_replicas_of_one_gang_fill_a_node_before_the_next() -> None:
    nodes = [Node("n0", "a", 8), Node("n1", "a", 8)]
    schedule = simulate(nodes, [Gang("four", "t", "a", 4, 2, 0, 1.0)], Limits())
    assert schedule.placement("four").nodes == ("n0",) * 4


def test_priority_decides_between_competing_gangs_before_size() -> None:
    """Both want the only node; the high-priority one is smaller but goes first."""
    nodes = [Node("n0", "a", 8)]
    gangs = [
        Gang("big-low", "t", "a", 1, 8, 0, 5.0),
        Gang("small-high", "u", "a", 1, 4, 1, 5.0),
    ]
    schedule = simulate(nodes, gangs, Limits())
    assert schedule.start_s("small-high") == 0.0
    assert schedule.start_s("big-low") == 5.0


def test_bigger_gangs_first_at_equal_priority() -> None:
    """First-fit decreasing: the 8-GPU gang before the 1-GPU ones that would split its node."""
    nodes = [Node("n0", "a", 8), Node("n1", "a", 8)]
    gangs = [Gang(f"one{i}", "t", "a", 1, 1, 0, 5.0) for i in range(9)]
    gangs.append(Gang("whole", "t", "a", 1, 8, 0, 5.0))
    schedule = simulate(nodes, gangs, Limits())
    assert schedule.start_s("whole") == 0.0
    assert [schedule.start_s(f"one{i}") for i in range(9)] == [0.0] * 8 + [5.0]


def test_a_lower_priority_gang_backfills_what_a_higher_one_cannot_use() -> None:
    """No reservation: the 2-node gang does not fit while one node is busy, so the 1-node gang
    after it in the order takes the free node (Volcano's allocate action does the same)."""
    nodes = [Node("n0", "a", 8), Node("n1", "a", 8)]
    gangs = [
        Gang("running", "t", "a", 1, 8, 9, 10.0),
        Gang("two-nodes", "t", "a", 2, 8, 5, 1.0),
        Gang("one-node", "t", "a", 1, 8, 0, 20.0),
    ]
    schedule = simulate(nodes, gangs, Limits())
    assert schedule.start_s("one-node") == 0.0
    assert schedule.start_s("two-nodes") == 20.0


def test_team_and_group_capabilities_hold_gangs_back() -> None:
    nodes = [Node(f"n{i}", "a", 8) for i in range(4)]
    limits = Limits({"t1": 8}, {"t1": "g", "t2": "g"}, {"g": 16})
    gangs = [
        Gang("t1-a", "t1", "a", 1, 8, 0, 10.0),
        Gang("t1-b", "t1", "a", 1, 8, 0, 10.0),  # over t1's 8: waits for t1-a
        Gang("t2-a", "t2", "a", 1, 8, 0, 10.0),
        Gang("t2-b", "t2", "a", 1, 8, 0, 10.0),  # over the group's 16: waits
        Gang("t3", "t3", "a", 1, 8, 0, 10.0),  # no limits: the last free node
    ]
    schedule = simulate(nodes, gangs, limits)
    check_invariants(nodes, gangs, limits, schedule)
    assert {g.name: schedule.start_s(g.name) for g in gangs} == {
        "t1-a": 0.0,
        "t1-b": 10.0,
        "t2-a": 0.0,
        "t2-b": 10.0,
        "t3": 0.0,
    }


@pytest.mark.parametrize(
    "gang",
    [
        Gang("pod-bigger-than-any-node", "t", "a", 1, 16, 0, 1.0),
        Gang("more-pods-than-the-pool-holds", "t", "a", 5, 4, 0, 1.0),  # 2 x 8: 4 of 4
        Gang("no-such-pool", "t", "zz", 1, 1, 0, 1.0),
        Gang("over-its-team", "capped", "a", 2, 4, 0, 1.0),
        Gang("over-its-group", "grouped", "a", 2, 8, 0, 1.0),
    ],
    ids=lambda g: g.name,
)
def test_gangs_that_can_never_fit_are_reported_not_placed(gang: Gang) -> None:
    nodes = [Node("n0", "a", 8), Node("n1", "a", 8)]
    limits = Limits({"capped": 4}, {"grouped": "g"}, {"g": 8})
    fine = Gang("fine", "t", "a", 1, 8, 0, 1.0)
    schedule = simulate(nodes, [gang, fine], limits)
    assert schedule.unschedulable == (gang.name,)
    assert [p.gang for p in schedule.placements] == ["fine"]
    with pytest.raises(KeyError):
        schedule.start_s(gang.name)
    assert schedule.drain_s == 1.0
    assert schedule.gpu_allocation == 0.0  # the unschedulable one does not count as waiting


def test_gpu_allocation_by_hand() -> None:
    """2 nodes of 8. At 0: `a` (8) on n0, `b` (4) on n1, `c` (2 x 8) waits: 12 of 16 for 2 s.
    At 2 `b` ends: 8 of 16 for 8 s, `c` still waiting (one node free). At 10 `a` ends and `c`
    starts, nobody waits. (12 x 2 + 8 x 8) / (16 x 10) = 0.55."""
    nodes = [Node("n0", "a", 8), Node("n1", "a", 8)]
    gangs = [
        Gang("a", "t", "a", 1, 8, 1, 10.0),
        Gang("b", "t", "a", 1, 4, 1, 2.0),
        Gang("c", "t", "a", 2, 8, 0, 5.0),
    ]
    schedule = simulate(nodes, gangs, Limits())
    assert schedule.gpu_allocation == pytest.approx(0.55)
    assert schedule.drain_s == 15.0
    assert schedule.waits == (0.0, 0.0, 10.0)
    assert schedule.timeline == (
        Sample(0.0, 12, 1),
        Sample(2.0, 8, 1),
        Sample(10.0, 16, 0),
        Sample(15.0, 0, 0),
    )
    assert schedule.placement("c") == Placement("c", 10.0, 15.0, ("n0", "n1"), 0.0)


def test_nothing_to_schedule() -> None:
    schedule = simulate([Node("n0", "a", 8)], [], Limits())
    assert schedule == Schedule((), (), 0.0, 0.0, 8, ())


@pytest.mark.parametrize(
    ("nodes", "gangs", "message"),
    [
        ([Node("n", "a", 8), Node("n", "a", 8)], [], "node names"),
        ([], [Gang("j", "t", "a", 1, 1, 0, 1.0)] * 2, "gang names"),
        ([Node("n", "a", -1)], [], "negative"),
        ([], [Gang("j", "t", "a", 0, 1, 0, 1.0)], "replica"),
        ([], [Gang("j", "t", "a", 1, 0, 0, 1.0)], "replica"),
        ([], [Gang("j", "t", "a", 1, 1, 0, 0.0)], "duration"),
        ([], [Gang("j", "t", "a", 1, 1, 0, math.inf)], "duration"),
        ([], [Gang("j", "t", "a", 1, 1, 0, 1.0, -1.0)], "submission"),
    ],
)
def test_invalid_input_is_refused(nodes: list[Node], gangs: list[Gang], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        simulate(nodes, gangs, Limits())


# -- allocation_while_waiting and percentile ----------------------------------------------------


def test_allocation_while_waiting_weights_samples_by_how_long_they_held() -> None:
    samples = [Sample(0.0, 4, 2), Sample(2.0, 8, 1), Sample(5.0, 6, 0)]
    # waiting over [0, 5): (4 x 2 + 8 x 3) / (8 x 5); [5, 10) has nobody waiting
    assert allocation_while_waiting(samples, 8, end_s=10.0) == pytest.approx(32 / 40)
    # without an end the last sample carries no weight
    assert allocation_while_waiting(samples[:2], 8) == pytest.approx(4 / 8)
    assert allocation_while_waiting(samples[:2], 8, end_s=3.0) == pytest.approx((8 + 8) / 24)
    assert allocation_while_waiting([Sample(0.0, 8, 0)], 8, end_s=5.0) == 0.0
    assert allocation_while_waiting([], 8) == 0.0


def test_allocation_while_waiting_of_regular_samples_is_their_mean_while_waiting() -> None:
    """The benchmark's samples, about a second apart: the same as its plain mean then."""
    allocated = [100, 400, 800, 1200, 1600, 900]
    samples = [Sample(float(t), gpus, 1) for t, gpus in enumerate(allocated)]
    samples.append(Sample(float(len(allocated)), 0, 0))
    mean = sum(allocated) / len(allocated) / 1664
    assert allocation_while_waiting(samples, 1664) == pytest.approx(mean)


def test_allocation_while_waiting_refuses_what_it_cannot_weigh() -> None:
    with pytest.raises(ValueError, match="order"):
        allocation_while_waiting([Sample(2.0, 1, 1), Sample(1.0, 1, 1)], 8)
    with pytest.raises(ValueError, match="positive"):
        allocation_while_waiting([Sample(0.0, 1, 1)], 0)


@pytest.mark.parametrize(
    ("q", "expected"), [(0, 1.0), (10, 1.0), (50, 5.0), (90, 9.0), (95, 10.0), (100, 10.0)]
)
def test_percentile_is_nearest_rank(q: float, expected: float) -> None:
    values = [float(v) for v in (7, 3, 10, 1, 5, 9, 2, 8, 4, 6)]
    assert percentile(values, q) == expected


def test_percentile_of_one_value_and_of_none() -> None:
    assert percentile([3.5], 99) == 3.5
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.integers(0, 100))
def test_percentile_is_a_value_with_q_percent_at_or_below_it(values: list[float], q: int) -> None:
    result = percentile(values, q)
    assert result in values
    assert sum(v <= result for v in values) >= q * len(values) / 100
    assert sum(v < result for v in values) < max(1, q * len(values) / 100)
