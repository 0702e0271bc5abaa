"""Capacity arithmetic: what the pools provide, firm and elastic, and whether the queues'
promises fit in it. One checker, by max-flow, for the loader and the diff report.

A guarantee is a promise that a team's GPUs are there when it submits. Volcano keeps it by
allocation bounds and reclaim (docs/scheduling.md), but neither creates GPUs: the promise holds
only if the GPUs that cannot vanish (firm) cover every guarantee, each on the pools its team may
use. That is a bipartite supply problem: claims (teams, a group's headroom) on one side, pools
on the other. It is feasible exactly when the maximum flow from claims to pools carries every
claim; when it is not, the source side of a minimum cut names the claims and pools that do not
fit (Hall's condition, found in polynomial time instead of by enumerating pool subsets).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainstack.catalog import lookup
from trainstack.config.checks import dict_items
from trainstack.config.errors import ConfigIssue, join_path
from trainstack.config.model import GpuPool, Group, NodeGroupSize, PlatformConfig, Team

# -- supply ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Supply:
    """A pool's GPUs: firm ones back guarantees; elastic ones may be absent when needed."""

    pool: str
    kind: str  # existing | onDemand | spot | reservation | capacityBlock
    gpus_per_node: int
    firm_nodes: int
    max_nodes: int
    why: str  # what makes `firm_nodes` firm, or why they are not, in the user's words
    # Every GPU cut into slices (gpuSharing): they count towards fair shares and capabilities
    # (a GPU of quota is a GPU's worth of slices, builders/scheduling.pools_shape) but back
    # no guarantee: guarantees are in nvidia.com/gpu, which a slice never is.
    sliced: bool = False

    @property
    def firm(self) -> int:
        return 0 if self.sliced else self.firm_nodes * self.gpus_per_node

    @property
    def total(self) -> int:
        return self.max_nodes * self.gpus_per_node

    @property
    def elastic(self) -> int:
        return self.total - self.firm


def supply(pool: GpuPool, now: datetime) -> Supply:
    """Firm nodes: those that exist whatever the autoscaler and EC2 do.

    - existing clusters: every node the config declares.
    - onDemand: the node group's minimum. Nodes above it come from EC2's on-demand pool, which
      can be out of an instance type ("InsufficientInstanceCapacity", EC2 docs
      troubleshooting-launch.html#troubleshooting-launch-capacity).
    - spot: none; EC2 reclaims spot instances with two minutes' notice (spot-interruptions.html).
    - reservation: the reservation's instances (`capacity.instanceCount`), up to the pool's
      maximum; an On-Demand Capacity Reservation holds them whether they run or not
      (ec2-capacity-reservations.html). Without the count, only the minimum.
    - capacityBlock: its instances, but only inside its window (`capacity.window`): outside it
      the block's instances do not exist and EKS scales its node group to zero
      (capacity-blocks.html, eks/latest/userguide/capacity-blocks-mng.html).
    """
    if pool.aws is None:
        assert pool.existing is not None
        nodes = pool.existing.nodes
        why = _sliced("nodes", pool)
        sliced = pool.sharing is not None
        return Supply(pool.name, "existing", pool.existing.gpus_per_node, nodes, nodes, why, sliced)
    size, capacity = pool.aws.size, pool.aws.capacity
    firm, why = _firm_nodes(capacity.type, capacity.instance_count, capacity.window, size, now)
    per_node = lookup(pool.aws.instance_type).gpus
    sliced = pool.sharing is not None
    return Supply(pool.name, capacity.type, per_node, firm, size.max, _sliced(why, pool), sliced)


def _sliced(why: str, pool: GpuPool) -> str:
    """A sliced pool's GPUs are never firm, whatever buys them (Supply.sliced)."""
    return why if pool.sharing is None else "sliced: backs no guarantee"


def _firm_nodes(
    kind: str,
    count: int | None,
    window: tuple[datetime, datetime] | None,
    size: NodeGroupSize,
    now: datetime,
) -> tuple[int, str]:
    if kind == "spot":
        return 0, "spot: EC2 can reclaim it"
    if kind == "reservation" and count is not None:
        return min(count, size.max), f"reservation of {count}"
    if kind == "capacityBlock":
        if window is None:
            return 0, "capacity block, no window"
        start, end = window
        if not start <= now < end:
            return 0, f"block outside {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
        return min(count or size.max, size.max), f"block until {end:%Y-%m-%d %H:%M} UTC"
    return size.min, "minimum size" if kind == "onDemand" else "minimum size, no instanceCount"


def supplies(cfg: PlatformConfig, now: datetime | None = None) -> dict[str, Supply]:
    at = now or datetime.now(UTC)
    return {p.name: supply(p, at) for p in cfg.gpu_pools}


# -- the checker -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """GPUs somebody is promised, on any of the named pools."""

    name: str  # as messages show it: "vision", "group research headroom"
    gpus: int
    pools: frozenset[str]


@dataclass(frozen=True)
class Shortfall:
    """Claims that together need more than the pools they may use provide."""

    claims: tuple[Claim, ...]
    pools: tuple[str, ...]
    available: int

    @property
    def need(self) -> int:
        return sum(c.gpus for c in self.claims)


class _Flow:
    """Dinic's max-flow on an adjacency list; small graphs (claims + pools + 2)."""

    def __init__(self, size: int) -> None:
        self.edges: list[list[int]] = [[] for _ in range(size)]
        self.to: list[int] = []
        self.cap: list[int] = []

    def add(self, a: int, b: int, cap: int) -> None:
        self.edges[a].append(len(self.to))
        self.to.append(b)
        self.cap.append(cap)
        self.edges[b].append(len(self.to))
        self.to.append(a)
        self.cap.append(0)

    def _levels(self, source: int) -> list[int]:
        level = [-1] * len(self.edges)
        level[source] = 0
        queue = deque([source])
        while queue:
            node = queue.popleft()
            for e in self.edges[node]:
                if self.cap[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[node] + 1
                    queue.append(self.to[e])
        return level

    def run(self, source: int, sink: int) -> int:
        total = 0
        while True:
            level = self._levels(source)
            if level[sink] < 0:
                return total
            nxt = [0] * len(self.edges)

            def push(node: int, amount: int, level: list[int] = level, nxt: list[int] = nxt) -> int:
                if node == sink:
                    return amount
                while nxt[node] < len(self.edges[node]):
                    e = self.edges[node][nxt[node]]
                    to = self.to[e]
                    if self.cap[e] > 0 and level[to] == level[node] + 1:
                        pushed = push(to, min(amount, self.cap[e]))
                        if pushed:
                            self.cap[e] -= pushed
                            self.cap[e ^ 1] += pushed
                            return pushed
                    nxt[node] += 1
                return 0

            while pushed := push(source, sum(self.cap[e] for e in self.edges[source]) or 1):
                total += pushed

    def reachable(self, source: int) -> set[int]:
        """Nodes on the source side of a minimum cut (after run)."""
        return {n for n, lvl in enumerate(self._levels(source)) if lvl >= 0}


def _network(wanted: list[Claim], capacity: Mapping[str, int]) -> tuple[_Flow, dict[str, int], int]:
    """Source 0, claim i at node i (from 1, in order), then the pools (sorted), then the sink;
    the source's edges are the claims', in order. Returns the network, each pool's node and
    the sink."""
    pools = sorted(capacity)
    sink = 1 + len(wanted) + len(pools)
    index = {p: 1 + len(wanted) + i for i, p in enumerate(pools)}
    flow = _Flow(sink + 1)
    unlimited = sum(c.gpus for c in wanted) + 1
    for i, claim in enumerate(wanted, start=1):
        flow.add(0, i, claim.gpus)
        for pool in claim.pools & capacity.keys():
            flow.add(i, index[pool], unlimited)
    for pool in pools:
        flow.add(index[pool], sink, capacity[pool])
    return flow, index, sink


def carried(claims: Iterable[Claim], capacity: Mapping[str, int]) -> dict[str, int]:
    """What a maximum flow places of each claim (by name) on the pools it may use: their sum
    is the most the claims can hold there together."""
    wanted = [c for c in claims if c.gpus > 0]
    flow, _, sink = _network(wanted, capacity)
    flow.run(0, sink)
    # The source's edges, in claim order: what is left of each is what was not placed.
    return {claim.name: claim.gpus - flow.cap[flow.edges[0][i]] for i, claim in enumerate(wanted)}


def shortfalls(claims: Iterable[Claim], capacity: Mapping[str, int]) -> list[Shortfall]:
    """Every independent set of claims the pools cannot carry, each with its pools.

    The source side of a minimum cut holds every claim that is not fully carried and every
    pool those claims could use, all of it full; split into connected parts, each part needs
    more than its pools provide (the flow into a part's pools comes from its claims alone),
    so independent shortfalls are reported separately, not hidden behind the first.
    """
    wanted = [c for c in claims if c.gpus > 0]
    pools = sorted(capacity)
    flow, index, sink = _network(wanted, capacity)
    source = 0
    if flow.run(source, sink) == sum(c.gpus for c in wanted):
        return []
    side = flow.reachable(source)
    # Connected parts of the cut's source side, by the claim -> pool edges inside it.
    parent = list(range(sink + 1))

    def root(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for i, claim in enumerate(wanted, start=1):
        if i in side:
            for pool in claim.pools & capacity.keys():
                parent[root(index[pool])] = root(i)
    parts: dict[int, tuple[list[Claim], list[str]]] = {}
    for i, claim in enumerate(wanted, start=1):
        if i in side:
            parts.setdefault(root(i), ([], []))[0].append(claim)
    for pool in pools:
        if index[pool] in side:
            parts.setdefault(root(index[pool]), ([], []))[1].append(pool)
    found = [
        Shortfall(tuple(cs), tuple(ps), sum(capacity[p] for p in ps)) for cs, ps in parts.values()
    ]
    return sorted(found, key=lambda s: (s.pools, [c.name for c in s.claims]))


# -- what the platform promises ------------------------------------------------------------


def group_envelope(cfg: PlatformConfig, group: Group) -> tuple[int, int]:
    """A group's guarantee and deserved share in GPUs, as its queue carries them."""
    members = [t for t in cfg.registry.teams if t.group == group.name]
    guarantee = (
        group.quota_gpus if group.quota_gpus is not None else sum(t.quota.gpus for t in members)
    )
    deserved = (
        group.deserved_gpus
        if group.deserved_gpus is not None
        else max(guarantee, sum(t.quota.deserved_gpus for t in members))
    )
    return guarantee, deserved


@dataclass(frozen=True)
class Promise:
    """What one team is promised, as the checker needs it (from a config or a plan)."""

    team: str
    group: str | None
    guarantee: int
    deserved: int
    pools: frozenset[str]


def promises(cfg: PlatformConfig) -> list[Promise]:
    return [
        Promise(t.name, t.group, t.quota.gpus, t.quota.deserved_gpus, frozenset(t.pools))
        for t in cfg.registry.teams
    ]


def envelopes(cfg: PlatformConfig) -> dict[str, tuple[int, int]]:
    """Group queues (hierarchical mode): name -> (guarantee, deserved)."""
    if cfg.scheduling.queue_mode != "hierarchical":
        return {}
    return {
        g.name: group_envelope(cfg, g)
        for g in cfg.registry.groups
        if any(t.group == g.name for t in cfg.registry.teams)
    }


def claims(
    teams: Iterable[Promise], groups: Mapping[str, tuple[int, int]], level: str
) -> list[Claim]:
    """Teams' guarantees (level "guarantee") or fair shares ("deserved"), and what group
    queues promise above their teams' sums, on the pools their teams may use."""
    deserved = level == "deserved"
    teams = list(teams)
    found = [Claim(t.team, t.deserved if deserved else t.guarantee, t.pools) for t in teams]
    for group, envelope in sorted(groups.items()):
        members = [t for t in teams if t.group == group]
        members_sum = sum(t.deserved if deserved else t.guarantee for t in members)
        amount = envelope[1 if deserved else 0]
        if amount > members_sum:
            pools = frozenset(p for t in members for p in t.pools)
            found.append(Claim(f"group {group} headroom", amount - members_sum, pools))
    return found


def check(
    teams: Iterable[Promise],
    groups: Mapping[str, tuple[int, int]],
    pools: Mapping[str, tuple[int, int]],
    hierarchical: bool,
) -> dict[str, list[Shortfall]]:
    """The one capacity check, for the loader and the diff report. `pools`: name -> (firm,
    total) GPUs. Guarantees must fit firm capacity; in hierarchical mode, deserved shares
    must fit all of it (the capacity plugin reads them; flat mode's proportion plugin derives
    its own from weights)."""
    teams = list(teams)
    found = {"guarantee": shortfalls(claims(teams, groups, "guarantee"), _at(pools, 0))}
    if hierarchical:
        found["deserved"] = shortfalls(claims(teams, groups, "deserved"), _at(pools, 1))
    return found


def _at(pools: Mapping[str, tuple[int, int]], index: int) -> dict[str, int]:
    return {name: amounts[index] for name, amounts in pools.items()}


def _pools_text(found: Shortfall, pools: Mapping[str, Supply], firm: bool) -> str:
    if not firm:
        return ", ".join(found.pools)
    return "; ".join(f"{n} {pools[n].firm}: {pools[n].why}" for n in found.pools)


def capacity_issues(cfg: PlatformConfig, now: datetime | None = None) -> list[ConfigIssue]:
    """Quota arithmetic nobody else checks, with the claims, pools and numbers in each message."""
    if not cfg.gpu_pools:
        return []
    pools = supplies(cfg, now)
    path = "trainstack:platform.registry.teams"
    issues: list[ConfigIssue] = []
    found = check(
        promises(cfg),
        envelopes(cfg),
        {p: (s.firm, s.total) for p, s in pools.items()},
        cfg.scheduling.queue_mode == "hierarchical",
    )
    for short in found["guarantee"]:
        elastic = sum(pools[p].elastic for p in short.pools)
        issues.append(
            ConfigIssue(
                path,
                f"guarantees exceed firm capacity: {claim_text(short.claims)} = {short.need} "
                f"GPUs, but their pools provide {short.available} firm "
                f"({_pools_text(short, pools, firm=True)}) and {elastic} elastic, which cannot "
                f"back a guarantee; {_fix(elastic)}",
            )
        )
    # A team without its own deserved share deserves its guarantee: where the two shortfalls
    # name the same claims and pools, the guarantee's message already says it.
    same = {(tuple(c.name for c in f.claims), f.pools) for f in found["guarantee"]}
    for short in found.get("deserved", []):
        if (tuple(c.name for c in short.claims), short.pools) in same:
            continue
        issues.append(
            ConfigIssue(
                path,
                f"deserved shares exceed capacity: {claim_text(short.claims)} = {short.need} "
                f"GPUs, but pools {_pools_text(short, pools, firm=False)} provide "
                f"{short.available} at their maximum size; fair shares could never be honoured",
            )
        )
    for index, team in enumerate(cfg.registry.teams):
        room = sum(pools[p].total for p in team.pools if p in pools)
        if team.quota.capability_gpus > room:
            field = "borrowLimit" if team.quota.borrow_limit else "deserved"
            issues.append(
                ConfigIssue(
                    f"{path}[{index}].quota.{field}",
                    f"team {team.name} may use {team.quota.capability_gpus} GPUs (deserved + "
                    f"borrowLimit), but its pools {', '.join(team.pools)} provide {room}; "
                    f"lower it to at most {room}",
                )
            )
    return issues + _group_issues(cfg)


def _fix(elastic: int) -> str:
    if not elastic:
        return "lower the guarantees or add firm capacity"
    return (
        "lower the guarantees, raise the pools' minimum size, or declare the instanceCount "
        "of a reservation or the window of a capacity block"
    )


def claim_text(found: Iterable[Claim]) -> str:
    return " + ".join(f"{c.name} ({c.gpus})" for c in found)


def _teams_text(teams: list[Team], deserved: bool) -> str:
    return claim_text(
        Claim(t.name, t.quota.deserved_gpus if deserved else t.quota.gpus, frozenset())
        for t in teams
    )


def _group_issues(cfg: PlatformConfig) -> list[ConfigIssue]:
    issues = []
    teams = "trainstack:platform.registry.teams"
    for index, group in enumerate(cfg.registry.groups):
        children = [t for t in cfg.registry.teams if t.group == group.name]
        need = sum(t.quota.gpus for t in children)
        if group.quota_gpus is not None and group.quota_gpus < need:
            # Each team's value with where it is set: the fix may be on either side.
            where = " + ".join(
                f"{t.name} {t.quota.gpus} ({teams}[{i}].quota.gpus)"
                for i, t in enumerate(cfg.registry.teams)
                if t.group == group.name
            )
            issues.append(
                ConfigIssue(
                    f"trainstack:platform.registry.groups[{index}].quota.gpus",
                    f"group {group.name} guarantees {group.quota_gpus} GPUs but its teams "
                    f"guarantee {need}: {where}; a parent's guarantee must cover its "
                    f"children's: raise this to at least {need} or lower the teams' quota.gpus",
                )
            )
        guarantee, _ = group_envelope(cfg, group)
        members_deserved = sum(t.quota.deserved_gpus for t in children)
        floor = max(guarantee, members_deserved)
        if group.deserved_gpus is not None and group.deserved_gpus < floor:
            issues.append(
                ConfigIssue(
                    f"trainstack:platform.registry.groups[{index}].quota.deserved",
                    f"group {group.name} deserves {group.deserved_gpus} GPUs but its guarantee "
                    f"is {guarantee} and its teams {_teams_text(children, True)} = "
                    f"{members_deserved}; raise it to at least {floor}",
                )
            )
    return issues


# -- pool-blind reclaim (issue 46 #5) ----------------------------------------------------------


@dataclass(frozen=True)
class Keeper:
    """A team that may keep GPUs of a confined team's pools which reclaim will not take."""

    team: str
    index: int  # in registry.teams
    gpus: int  # of the confined team's firm GPUs it may keep (one maximum placement)
    share: int  # what it keeps them under: its deserved share, or its capability
    why: str  # "deserved" | "flat" (the share follows demand) | "unreclaimable"


@dataclass(frozen=True)
class Exposure:
    """A confined team's guarantee that Volcano may leave waiting with GPUs free elsewhere."""

    team: str
    index: int
    guarantee: int
    pools: tuple[str, ...]
    firm: int  # GPUs of those pools
    keepers: tuple[Keeper, ...]

    @property
    def kept(self) -> int:
        return sum(k.gpus for k in self.keepers)

    @property
    def left(self) -> int:
        return max(0, self.firm - self.kept)


def _kept_under(team: Team, hierarchical: bool) -> tuple[int, str]:
    """The most GPUs a team's queue holds that reclaim never takes, and why.

    - A queue with `reclaimable: false` is never a victim (v1.15.1 actions/reclaim/reclaim.go,
      reclaimForTask: `q.Reclaimable()`): up to its capability.
    - hierarchical: the capacity plugin takes a victim only while its queue's allocation is
      above its deserved share (capacity.go reclaimableFn, checkDeservedExceedance:
      `allocated.GreaterPartlyWithRelevantDimensions(deserved, ...)`), and never below its
      guarantee (checkGuaranteeConstraint).
    - flat: the proportion plugin's share is the queue's weighted part of the cluster, capped
      at what it asks for, so while the cluster has room for every request each queue deserves
      what it asks (proportion.go OnSessionOpen) and none is a victim (reclaimableFn:
      `!allocated.LessEqual(deserved)`): up to its capability.
    """
    if not team.quota.reclaimable:
        return team.quota.capability_gpus, "unreclaimable"
    if hierarchical:
        return team.quota.deserved_gpus, "deserved"
    return team.quota.capability_gpus, "flat"


def pool_blind(cfg: PlatformConfig, now: datetime | None = None) -> list[Exposure]:
    """Confined teams whose guarantee other teams can hold off while within their shares.

    Volcano's queues do not know pools: a reclaimer looks for victims only on the nodes it
    fits (reclaim.go reclaimForTask), and takes one only from a queue above its share, wherever
    that queue's other pods are. So a team that may use some pools only waits, GPUs free on
    the others, while teams within their shares hold its pools, until their jobs end. For each
    such team the worst case is a maximum flow: every other team sharing its pools, each up to
    what reclaim leaves it (`_kept_under`), onto the firm GPUs of those pools (a guarantee
    rests on firm GPUs). It is reported when the rest is less than the team's guarantee.
    A team that may use every pool is not: whatever it waits for is not on a pool it cannot
    leave (the guarantee and deserved checks above bound that).
    """
    supply = supplies(cfg, now)
    hierarchical = cfg.scheduling.queue_mode == "hierarchical"
    teams = cfg.registry.teams
    found = []
    for index, team in enumerate(teams):
        mine = frozenset(team.pools) & supply.keys()
        if team.quota.gpus <= 0 or mine == supply.keys():
            continue
        firm = {p: supply[p].firm for p in mine}
        others = [(i, t) for i, t in enumerate(teams) if i != index and mine & set(t.pools)]
        under = {t.name: _kept_under(t, hierarchical) for _, t in others}
        placed = carried(
            [Claim(t.name, under[t.name][0], mine & frozenset(t.pools)) for _, t in others], firm
        )
        keepers = tuple(
            Keeper(t.name, i, placed[t.name], *under[t.name])
            for i, t in others
            if placed.get(t.name)
        )
        exposure = Exposure(
            team.name, index, team.quota.gpus, tuple(sorted(mine)), sum(firm.values()), keepers
        )
        # With no keeper the firm GPUs fall short by themselves: the guarantee check's case.
        if keepers and exposure.left < exposure.guarantee:
            found.append(exposure)
    return found


def _why(keeper: Keeper) -> str:
    if keeper.why == "unreclaimable":
        return f"reclaimable: false, up to its capability {keeper.share}"
    if keeper.why == "flat":
        return f"queueMode flat: a share follows demand, up to its capability {keeper.share}"
    return f"deserved {keeper.share}"


def _keepers_text(exposure: Exposure) -> str:
    """Who may keep how many of the confined team's firm GPUs, and under what share."""
    if len(exposure.keepers) == 1:
        [keeper] = exposure.keepers
        return (
            f"{keeper.team} may keep {keeper.gpus} of them within its fair share ({_why(keeper)})"
        )
    names = ", ".join(k.team for k in exposure.keepers[:-1])
    each = "; ".join(f"{k.team} {k.gpus}: {_why(k)}" for k in exposure.keepers)
    return (
        f"{names} and {exposure.keepers[-1].team} may keep {exposure.kept} of them within "
        f"their fair shares ({each})"
    )


def _pools_have(exposure: Exposure) -> str:
    if len(exposure.pools) == 1:
        return f"its pool {exposure.pools[0]} has"
    return f"its pools {', '.join(exposure.pools)} have"


def _pool_blind_fix(cfg: PlatformConfig, exposure: Exposure) -> str:
    """Lower what the keepers keep there by the shortfall, or take the pools from them."""
    short = exposure.guarantee - exposure.left
    teams = cfg.registry.teams
    fixes = []
    if len(exposure.keepers) == 1:
        [keeper] = exposure.keepers
        quota = teams[keeper.index].quota
        where = f"registry.teams[{keeper.index}].quota"
        target = keeper.gpus - short  # what it may then keep there at most
        steps = []
        # Below its guarantee nothing is reclaimed: then only moving it helps.
        if target >= quota.gpus and cfg.scheduling.queue_mode == "hierarchical":
            if quota.deserved_gpus > target:
                steps.append(
                    f"lower {keeper.team}'s deserved to at most {target} ({where}.deserved; "
                    "raise its borrowLimit to keep its capability)"
                )
        elif target >= quota.gpus:
            steps.append(
                f"lower {keeper.team}'s borrowLimit to at most {target - quota.gpus} "
                f"({where}.borrowLimit), or use queueMode hierarchical with its deserved at "
                f"most {target}"
            )
        if steps and keeper.why == "unreclaimable":
            steps.append(f"set its reclaimable: true ({where}.reclaimable)")
        elif target >= quota.gpus and keeper.why == "unreclaimable":
            steps.append(f"set {keeper.team}'s reclaimable: true ({where}.reclaimable)")
        if steps:
            fixes.append(
                f"{' and '.join(steps)}, so that what it holds above {target} is borrowed and "
                "reclaim returns it"
            )
    else:
        names = ", ".join(k.team for k in exposure.keepers)
        fixes.append(
            f"lower the shares of {names} so that they keep {short} fewer there "
            f"({exposure.kept - short} at most in all): what they hold above their shares is "
            "borrowed, and reclaim returns it"
        )
    pools = set(exposure.pools)
    for keeper in exposure.keepers:
        entry = teams[keeper.index]
        if set(entry.pools) - pools:
            shared = ", ".join(p for p in entry.pools if p in pools)
            fixes.append(
                f"give {keeper.team} pools without {shared} (registry.teams[{keeper.index}].pools)"
            )
    if not fixes:
        fixes.append(f"lower {exposure.team}'s guarantee to at most {exposure.left}")
    return "; or ".join(fixes)


def pool_blind_warnings(cfg: PlatformConfig, now: datetime | None = None) -> list[ConfigIssue]:
    """`pool_blind` as the preview and `trainstack validate` print it: a warning, not an
    error. The wait is bounded (it ends when the keepers' jobs on those pools end, within
    their maximum duration), and the arrangement that causes it, a team that may use every
    pool with a fair share larger than a confined team's guarantee leaves on its pools, is
    the platform's default and often wanted (docs/scheduling.md, "What a guarantee does not
    cover")."""
    return [pool_blind_warning(cfg, exposure) for exposure in pool_blind(cfg, now)]


def pool_blind_warning(cfg: PlatformConfig, exposure: Exposure) -> ConfigIssue:
    return ConfigIssue(
        f"trainstack:platform.registry.teams[{exposure.index}].quota.gpus",
        f"team {exposure.team}'s guarantee of {exposure.guarantee} GPUs may wait for other "
        f"teams' jobs to end: {_pools_have(exposure)} {exposure.firm} firm GPUs, "
        f"{_keepers_text(exposure)}, leaving {exposure.team} {exposure.left}; Volcano reclaims "
        "nothing from a queue within its share, whatever pool its pods sit on "
        '(docs/scheduling.md, "What a guarantee does not cover"); '
        f"{_pool_blind_fix(cfg, exposure)}",
    )


# -- settings the queue mode ignores ----------------------------------------------------------


def mode_issues(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    """Refuse settings that the chosen queue mode's Volcano plugin never reads (raw document).

    flat uses the proportion plugin: it computes each queue's deserved share from `weight`
    over the cluster's resources and never reads spec.deserved (v1.15.1
    pkg/scheduler/plugins/proportion/proportion.go, OnSessionOpen: `attr.deserved.Add(
    remaining.Multi(weight / totalWeight))`), and flat mode has no group queues. hierarchical
    uses the capacity plugin, which reads guarantee, deserved and capability and never a
    queue's weight (plugins/capacity/capacity.go has no reference to it).
    """
    scheduling = doc.get("scheduling")
    mode = scheduling.get("queueMode") if isinstance(scheduling, Mapping) else None
    mode = mode or "hierarchical"
    registry = doc.get("registry")
    if not isinstance(registry, Mapping):
        return []
    issues = []
    teams_path = join_path(root, "registry", "teams")
    for index, team in dict_items(registry.get("teams")):
        quota = team.get("quota")
        if not isinstance(quota, Mapping):
            continue
        if mode == "flat" and "deserved" in quota:
            issues.append(
                ConfigIssue(
                    join_path(teams_path, index, "quota", "deserved"),
                    "has no effect with queueMode flat: the proportion plugin derives fair "
                    "shares from weight; remove it and set weight, or use queueMode "
                    "hierarchical",
                )
            )
        if mode == "hierarchical" and "weight" in quota:
            issues.append(
                ConfigIssue(
                    join_path(teams_path, index, "quota", "weight"),
                    "has no effect with queueMode hierarchical: the capacity plugin shares by "
                    "deserved, not weight; remove it and set deserved, or use queueMode flat",
                )
            )
    if mode == "flat":
        for index, group in dict_items(registry.get("groups")):
            if "quota" in group:
                issues.append(
                    ConfigIssue(
                        join_path(root, "registry", "groups", index, "quota"),
                        "has no effect with queueMode flat: there are no group queues; remove "
                        "it or use queueMode hierarchical",
                    )
                )
    return issues


# -- the summary the preview prints -----------------------------------------------------------


def summary(cfg: PlatformConfig, now: datetime | None = None) -> dict[str, Any]:
    """Firm and elastic GPUs per pool and in all, and what the queues promise."""
    pools = supplies(cfg, now)
    teams = cfg.registry.teams
    promised, groups = promises(cfg), envelopes(cfg)
    return {
        "pools": {
            name: {"kind": s.kind, "firm": s.firm, "elastic": s.elastic, "why": s.why}
            for name, s in pools.items()
        },
        "firm": sum(s.firm for s in pools.values()),
        "elastic": sum(s.elastic for s in pools.values()),
        "total": sum(s.total for s in pools.values()),
        # What the checker weighs: teams' shares and the groups' headroom above them.
        "guaranteed": sum(c.gpus for c in claims(promised, groups, "guarantee")),
        "deserved": sum(c.gpus for c in claims(promised, groups, "deserved")),
        "capability": sum(t.quota.capability_gpus for t in teams),
        "groups": {
            name: dict(zip(("guarantee", "deserved"), envelope, strict=True))
            for name, envelope in groups.items()
        },
        # Confined teams' guarantees that reclaim may not free (pool_blind): a warning each.
        "poolBlind": [
            {
                "team": e.team,
                "guarantee": e.guarantee,
                "pools": list(e.pools),
                "firm": e.firm,
                "kept": {k.team: k.gpus for k in e.keepers},
                "left": e.left,
                "warning": str(pool_blind_warning(cfg, e)),
            }
            for e in pool_blind(cfg, now)
        ],
    }
