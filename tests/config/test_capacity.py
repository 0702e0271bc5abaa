"""The capacity checker (trainstack/config/capacity.py): firm and elastic supply, max-flow
shortfalls against an independent oracle, and settings a queue mode ignores."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainstack.config import ConfigError, PlatformConfig, parse_stack_config
from trainstack.config import capacity as c

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def platform(pools: list[dict[str, Any]], teams: list[dict[str, Any]], **extra: Any) -> Any:
    doc = {
        "cloud": "aws",
        "kubernetesVersion": "1.33",
        "aws": {
            "region": "us-east-1",
            "network": {
                "vpcCidr": "10.0.0.0/16",
                "availabilityZones": ["us-east-1a", "us-east-1b"],
            },
        },
        "gpuPools": pools,
        "registry": {"groups": extra.pop("groups", []), "teams": teams},
        **extra,
    }
    return {"trainstack:platform": doc}


def pool(name: str, capacity: dict[str, Any], **size: int) -> dict[str, Any]:
    return {
        "name": name,
        "instanceType": "p5.48xlarge",
        "fabric": "efa",
        "availabilityZone": "us-east-1a",
        "size": {"max": 4, **size},
        "capacity": capacity,
    }


def team(name: str, gpus: int, pools: list[str] | None = None, **quota: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name, "owners": ["o@example.com"], "quota": {"gpus": gpus}}
    doc["quota"] |= quota
    if pools is not None:
        doc["pools"] = pools
    return doc


def load(values: dict[str, Any]) -> PlatformConfig:
    cfg = parse_stack_config(values, stack="t", source="test")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def errors(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, stack="t", source="test")
    return [str(i) for i in caught.value.issues]


RESERVATION = {"type": "reservation", "reservationId": "cr-0a1b2c3d4e5f60718"}
BLOCK = {"type": "capacityBlock", "reservationId": "cr-0a1b2c3d4e5f60718"}
WINDOW = {"start": "2026-11-30T11:30:00Z", "end": "2026-12-14T11:30:00Z"}


# -- what is firm ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "size", "firm", "why"),
    [
        ({"type": "onDemand"}, {"min": 1}, 8, "minimum size"),
        ({"type": "spot"}, {"min": 2}, 0, "spot: EC2 can reclaim it"),
        (RESERVATION, {"min": 1}, 8, "minimum size, no instanceCount"),
        ({**RESERVATION, "instanceCount": 3}, {}, 24, "reservation of 3"),
        ({**RESERVATION, "instanceCount": 9}, {}, 32, "reservation of 9"),  # up to max
        (BLOCK, {}, 0, "capacity block, no window"),
        ({**BLOCK, "window": WINDOW}, {}, 32, "block until 2026-12-14 11:30 UTC"),
        ({**BLOCK, "window": WINDOW, "instanceCount": 2}, {}, 16, "block until 2026-12-14 11:30 UTC"),  # noqa: E501
        (
            {**BLOCK, "window": {"start": "2026-12-02T00:00:00+01:00", "end": "2026-12-03T00:00:00Z"}},  # noqa: E501
            {},
            0,
            "block outside 2026-12-01 23:00 to 2026-12-03 00:00 UTC",
        ),
    ],
)  # fmt: skip
def test_firm_capacity_by_how_gpus_are_bought(
    capacity: dict[str, Any], size: dict[str, int], firm: int, why: str
) -> None:
    cfg = load(platform([pool("p", capacity, **size)], [team("a", 0)]))
    supply = c.supplies(cfg, NOW)["p"]
    assert (supply.firm, supply.elastic, supply.why) == (firm, 32 - firm, why)


@pytest.mark.parametrize(
    ("capacity", "message"),
    [
        (
            {"type": "spot", "instanceCount": 2},
            "gpuPools[0].capacity.instanceCount: only a reservation or capacity block has an "
            "instance count, not spot; remove it",
        ),
        (
            {**RESERVATION, "window": WINDOW},
            "gpuPools[0].capacity.window: only a capacity block has a window, not reservation; "
            "remove it",
        ),
        (
            {**BLOCK, "window": {"start": "2026-12-01", "end": "2026-12-02T00:00:00Z"}},
            "gpuPools[0].capacity.window.start: '2026-12-01' is not an RFC 3339 date-time with "
            "an offset; write it quoted, like '2026-12-01T11:30:00Z'",
        ),
        (
            {**BLOCK, "window": {"start": "2026-12-02T00:00:00Z", "end": "2026-12-01T00:00:00Z"}},
            "gpuPools[0].capacity.window.end: must be after start",
        ),
    ],
)
def test_capacity_settings_are_checked(capacity: dict[str, Any], message: str) -> None:
    assert errors(platform([pool("p", capacity)], [team("a", 0)])) == [
        f"trainstack:platform.{message}"
    ]


# -- the checker -------------------------------------------------------------------------------


def claim(name: str, gpus: int, *pools: str) -> c.Claim:
    return c.Claim(name, gpus, frozenset(pools))


def test_a_triangle_of_pool_pairs_is_caught() -> None:
    """Issue 16 #5: every pair of pools a team names fits its team, all three do not; a check
    on the pool sets teams name passed this."""
    found = c.shortfalls(
        [claim("a", 11, "A", "B"), claim("b", 11, "B", "C"), claim("c", 11, "A", "C")],
        {"A": 10, "B": 10, "C": 10},
    )
    assert [(f.pools, f.need, f.available) for f in found] == [(("A", "B", "C"), 33, 30)]


def test_independent_shortfalls_are_each_reported() -> None:
    """Issue 16 #4: supersets of a reported set were skipped, hiding a second violation."""
    found = c.shortfalls(
        [claim("a", 9, "A"), claim("b", 5, "B"), claim("c", 3, "B", "C"), claim("d", 1, "D")],
        {"A": 8, "B": 4, "C": 2, "D": 1},
    )
    assert [([x.name for x in f.claims], f.pools, f.need, f.available) for f in found] == [
        (["a"], ("A",), 9, 8),
        (["b", "c"], ("B", "C"), 8, 6),
    ]


def test_many_pools_are_checked_without_enumerating_their_subsets() -> None:
    """2^40 pool subsets: the subset enumeration this replaced would never finish."""
    pools = {f"p{i}": 8 for i in range(40)}
    claims = [claim(f"t{i}", 8, f"p{i}", f"p{(i + 1) % 40}") for i in range(40)]
    assert c.shortfalls(claims, pools) == []
    found = c.shortfalls([*claims, claim("extra", 1, "p0")], pools)
    assert [(f.need, f.available, len(f.pools)) for f in found] == [(321, 320, 40)]


# An independent oracle: Hall's condition by enumeration. Claims fit exactly when every set of
# claims fits in the pools it may use (the supply-demand theorem, Gale 1957).
def hall_violations(claims: list[c.Claim], pools: dict[str, int]) -> list[frozenset[str]]:
    bad = []
    for size in range(1, len(claims) + 1):
        for chosen in itertools.combinations(claims, size):
            union = frozenset().union(*(x.pools for x in chosen)) & pools.keys()
            if sum(x.gpus for x in chosen) > sum(pools[p] for p in union):
                bad.append(frozenset(x.name for x in chosen))
    return bad


POOL_NAMES = ["A", "B", "C", "D"]
claims_strategy = st.lists(
    st.tuples(st.integers(0, 12), st.sets(st.sampled_from(POOL_NAMES), min_size=1)),
    min_size=1,
    max_size=6,
)
pools_strategy = st.fixed_dictionaries({p: st.integers(0, 16) for p in POOL_NAMES})


@settings(max_examples=400, deadline=None)
@given(claims_strategy, pools_strategy)
def test_shortfalls_agree_with_hall_by_enumeration(
    specs: list[tuple[int, set[str]]], pools: dict[str, int]
) -> None:
    claims = [claim(f"t{i}", g, *ps) for i, (g, ps) in enumerate(specs)]
    found = c.shortfalls(claims, pools)
    violations = hall_violations(claims, pools)
    assert bool(found) == bool(violations)
    used: set[str] = set()
    for short in found:
        # each is a genuine violation on exactly the pools its claims may use ...
        names = frozenset(x.name for x in short.claims)
        assert names in violations
        assert set(short.pools) == set().union(*(x.pools for x in short.claims)) & pools.keys()
        assert short.need > short.available == sum(pools[p] for p in short.pools)
        # ... and independent of the others
        assert not used & set(short.pools)
        used |= set(short.pools)
    # every violation involves some reported claim: none is hidden
    reported = {x.name for short in found for x in short.claims}
    assert all(v & reported for v in violations)


# -- through the loader, with groups and firm/elastic supply ------------------------------------

LOADER_POOLS = [
    pool("pa", {**RESERVATION, "instanceCount": 1}, max=2),  # 8 firm, 8 elastic
    pool("pb", {"type": "onDemand"}, min=1, max=2),  # 8 firm, 8 elastic
    pool("pc", {"type": "spot"}, max=1),  # 8 elastic
]
LOADER_FIRM, LOADER_TOTAL = {"pa": 8, "pb": 8, "pc": 0}, {"pa": 16, "pb": 16, "pc": 8}

registry_strategy = st.lists(
    st.tuples(
        st.integers(0, 10),  # guarantee
        st.integers(0, 6),  # deserved above it
        st.sets(st.sampled_from(["pa", "pb", "pc"]), min_size=1),
        st.sampled_from([None, "g"]),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=120, deadline=None)
@given(registry_strategy, st.integers(0, 6), st.integers(0, 6))
def test_the_loader_accepts_exactly_the_registries_that_fit(
    specs: list[tuple[int, int, set[str], str | None]], headroom: int, deserved_headroom: int
) -> None:
    """Guarantees and a group's headroom against firm capacity, deserved shares against all of
    it, compared with the enumeration oracle on claims the test builds itself."""
    teams = [
        {**team(f"t{i}", g, sorted(ps), deserved=g + extra), **({"group": grp} if grp else {})}
        for i, (g, extra, ps, grp) in enumerate(specs)
    ]
    members = [(g, extra, ps) for g, extra, ps, grp in specs if grp]
    groups = [{"name": "g", "owners": ["o@example.com"]}]
    guarantee_claims = [claim(f"t{i}", g, *ps) for i, (g, _, ps, _) in enumerate(specs)]
    deserved_claims = [claim(f"t{i}", g + x, *ps) for i, (g, x, ps, _) in enumerate(specs)]
    if members:
        member_guarantee = sum(g for g, _, _ in members)
        member_deserved = sum(g + x for g, x, _ in members)
        quota = member_guarantee + headroom
        deserved = max(quota, member_deserved) + deserved_headroom
        groups[0]["quota"] = {"gpus": quota, "deserved": deserved}
        union = set().union(*(ps for _, _, ps in members))
        if headroom:
            guarantee_claims.append(claim("group g headroom", headroom, *union))
        if deserved > member_deserved:
            deserved_claims.append(claim("group g headroom", deserved - member_deserved, *union))
    values = platform(LOADER_POOLS, teams, groups=groups)
    fits = not hall_violations(guarantee_claims, LOADER_FIRM) and not hall_violations(
        deserved_claims, LOADER_TOTAL
    )
    refused: list[str] = []
    try:
        load(values)
    except ConfigError as err:
        refused = [str(i) for i in err.issues]
    assert fits != bool(refused), refused


def test_a_guarantee_on_elastic_capacity_is_refused_with_firm_and_elastic_counts() -> None:
    values = platform(LOADER_POOLS, [team("a", 12, ["pa", "pc"]), team("b", 4, ["pb"])])
    assert errors(values) == [
        "trainstack:platform.registry.teams: guarantees exceed firm capacity: a (12) = 12 GPUs, "
        "but their pools provide 8 firm (pa 8: reservation of 1; pc 0: spot: EC2 can reclaim it) "
        "and 16 elastic, which cannot back a guarantee; lower the guarantees, raise the pools' "
        "minimum size, or declare the instanceCount of a reservation or the window of a "
        "capacity block"
    ]


def test_deserved_is_checked_on_the_pools_a_team_may_use() -> None:
    """Issue 16 #6: a team confined to a 16-GPU pool may not deserve 30."""
    values = platform(LOADER_POOLS, [team("a", 0, ["pa"], deserved=30)])
    assert errors(values) == [
        "trainstack:platform.registry.teams: deserved shares exceed capacity: a (30) = 30 GPUs, "
        "but pools pa provide 16 at their maximum size; fair shares could never be honoured",
        "trainstack:platform.registry.teams[0].quota.deserved: team a may use 30 GPUs "
        "(deserved + borrowLimit), but its pools pa provide 16; lower it to at most 16",
    ]


def test_a_group_quota_beyond_the_cluster_is_refused() -> None:
    """Issue 16 #7: a group quota of 10,000 on a small cluster was accepted."""
    groups = [{"name": "g", "owners": ["o@example.com"], "quota": {"gpus": 10_000}}]
    values = platform(LOADER_POOLS, [{**team("a", 4, ["pa"]), "group": "g"}], groups=groups)
    assert errors(values)[0] == (
        "trainstack:platform.registry.teams: guarantees exceed firm capacity: a (4) + group g "
        "headroom (9996) = 10000 GPUs, but their pools provide 8 firm (pa 8: reservation of 1) "
        "and 8 elastic, which cannot back a guarantee; lower the guarantees, raise the pools' "
        "minimum size, or declare the instanceCount of a reservation or the window of a "
        "capacity block"
    )


def test_a_capacity_block_backs_guarantees_only_inside_its_window() -> None:
    block = pool("blk", {**BLOCK, "window": WINDOW, "instanceCount": 2})
    cfg = load(platform([block], [team("a", 16)]))
    assert not c.capacity_issues(cfg, NOW)
    after = datetime(2026, 12, 14, 11, 30, tzinfo=UTC)
    assert [i.message for i in c.capacity_issues(cfg, after)] == [
        "guarantees exceed firm capacity: a (16) = 16 GPUs, but their pools provide 0 firm "
        "(blk 0: block outside 2026-11-30 11:30 to 2026-12-14 11:30 UTC) and 32 elastic, which "
        "cannot back a guarantee; lower the guarantees, raise the pools' minimum size, or "
        "declare the instanceCount of a reservation or the window of a capacity block"
    ]


# -- settings a queue mode ignores (issue 16 #9) ----------------------------------------------


@pytest.mark.parametrize(
    ("mode", "quota", "groups", "message"),
    [
        (
            "hierarchical",
            {"weight": 2},
            [],
            "registry.teams[0].quota.weight: has no effect with queueMode hierarchical: the "
            "capacity plugin shares by deserved, not weight; remove it and set deserved, or use "
            "queueMode flat",
        ),
        (
            "flat",
            {"deserved": 8},
            [],
            "registry.teams[0].quota.deserved: has no effect with queueMode flat: the proportion "
            "plugin derives fair shares from weight; remove it and set weight, or use queueMode "
            "hierarchical",
        ),
        (
            "flat",
            {},
            [{"name": "g", "owners": ["o@example.com"], "quota": {"gpus": 8}}],
            "registry.groups[0].quota: has no effect with queueMode flat: there are no group "
            "queues; remove it or use queueMode hierarchical",
        ),
    ],
)
def test_settings_the_queue_mode_ignores_are_refused(
    mode: str, quota: dict[str, Any], groups: list[dict[str, Any]], message: str
) -> None:
    values = platform(
        LOADER_POOLS,
        [team("a", 4, ["pa"], **quota)],
        groups=groups,
        scheduling={"queueMode": mode},
    )
    assert errors(values) == [f"trainstack:platform.{message}"]


def test_each_mode_takes_its_own_sharing_setting() -> None:
    flat = load(
        platform(LOADER_POOLS, [team("a", 4, ["pa"], weight=3)], scheduling={"queueMode": "flat"})
    )
    assert flat.registry.teams[0].quota.weight == 3
    load(platform(LOADER_POOLS, [team("a", 4, ["pa"], deserved=8)]))


# -- pool-blind reclaim (issue 46 #5) -----------------------------------------------------------

BLIND_POOLS = [
    pool("pa", {**RESERVATION, "instanceCount": 2}, max=2),  # 16 firm
    pool("pb", {**RESERVATION, "instanceCount": 2}, max=2),  # 16 firm
]
NARROW = team("narrow", 8, ["pa"])
WAIT = (
    "Volcano reclaims nothing from a queue within its share, whatever pool its pods sit on "
    '(docs/scheduling.md, "What a guarantee does not cover")'
)


def warnings(teams: list[dict[str, Any]], **extra: Any) -> list[str]:
    cfg = load(platform(BLIND_POOLS, teams, **extra))
    return [str(i) for i in c.pool_blind_warnings(cfg, NOW)]


@pytest.mark.parametrize(
    ("teams", "extra", "message"),
    [
        (  # the e2e scenario (tests/e2e/test_pool_blind.py): wide within 16 holds all of pa
            [team("wide", 8, deserved=16, borrowLimit=8), NARROW],
            {},
            "registry.teams[1].quota.gpus: team narrow's guarantee of 8 GPUs may wait for other "
            "teams' jobs to end: its pool pa has 16 firm GPUs, wide may keep 16 of them within "
            f"its fair share (deserved 16), leaving narrow 0; {WAIT}; lower wide's deserved to "
            "at most 8 (registry.teams[0].quota.deserved; raise its borrowLimit to keep its "
            "capability), so that what it holds above 8 is borrowed and reclaim returns it; or "
            "give wide pools without pa (registry.teams[0].pools)",
        ),
        (  # flat: a share follows demand, so the capability bounds what is kept
            [team("wide", 8, borrowLimit=16), NARROW],
            {"scheduling": {"queueMode": "flat"}},
            "registry.teams[1].quota.gpus: team narrow's guarantee of 8 GPUs may wait for other "
            "teams' jobs to end: its pool pa has 16 firm GPUs, wide may keep 16 of them within "
            "its fair share (queueMode flat: a share follows demand, up to its capability 24), "
            f"leaving narrow 0; {WAIT}; lower wide's borrowLimit to at most 0 "
            "(registry.teams[0].quota.borrowLimit), or use queueMode hierarchical with its "
            "deserved at most 8, so that what it holds above 8 is borrowed and reclaim returns "
            "it; or give wide pools without pa (registry.teams[0].pools)",
        ),
        (  # never a victim: up to its capability, whatever its deserved share
            [team("wide", 8, borrowLimit=16, reclaimable=False), NARROW],
            {},
            "registry.teams[1].quota.gpus: team narrow's guarantee of 8 GPUs may wait for other "
            "teams' jobs to end: its pool pa has 16 firm GPUs, wide may keep 16 of them within "
            "its fair share (reclaimable: false, up to its capability 24), leaving narrow 0; "
            f"{WAIT}; set wide's reclaimable: true (registry.teams[0].quota.reclaimable), so "
            "that what it holds above 8 is borrowed and reclaim returns it; or give wide pools "
            "without pa (registry.teams[0].pools)",
        ),
        (  # two keepers: a maximum flow of their shares onto pa
            [
                team("w1", 4, ["pa", "pb"], deserved=8),
                team("w2", 4, ["pa", "pb"], deserved=8),
                NARROW,
            ],
            {},
            "registry.teams[2].quota.gpus: team narrow's guarantee of 8 GPUs may wait for other "
            "teams' jobs to end: its pool pa has 16 firm GPUs, w1 and w2 may keep 16 of them "
            "within their fair shares (w1 8: deserved 8; w2 8: deserved 8), leaving narrow 0; "
            f"{WAIT}; lower the shares of w1, w2 so that they keep 8 fewer there (8 at most in "
            "all): what they hold above their shares is borrowed, and reclaim returns it; or "
            "give w1 pools without pa (registry.teams[0].pools); or give w2 pools without pa "
            "(registry.teams[1].pools)",
        ),
        (  # part of the guarantee is left: the fix lowers the keeper by the rest
            [team("wide", 8, deserved=12, borrowLimit=12), team("narrow", 8, ["pa"])],
            {},
            "registry.teams[1].quota.gpus: team narrow's guarantee of 8 GPUs may wait for other "
            "teams' jobs to end: its pool pa has 16 firm GPUs, wide may keep 12 of them within "
            f"its fair share (deserved 12), leaving narrow 4; {WAIT}; lower wide's deserved to "
            "at most 8 (registry.teams[0].quota.deserved; raise its borrowLimit to keep its "
            "capability), so that what it holds above 8 is borrowed and reclaim returns it; or "
            "give wide pools without pa (registry.teams[0].pools)",
        ),
    ],
)
def test_a_guarantee_other_teams_may_keep_within_their_shares_is_a_warning(
    teams: list[dict[str, Any]], extra: dict[str, Any], message: str
) -> None:
    """Issue 46 #5: Volcano reclaims only from a queue above its share, wherever its pods are;
    a confined team's guarantee can wait with GPUs free on other pools. Warned, not refused:
    the config loads."""
    assert warnings(teams, **extra) == [f"trainstack:platform.{message}"]


@pytest.mark.parametrize(
    ("teams", "extra"),
    [
        # wide deserves its guarantee: what it holds on pa above 8 is borrowed and reclaimed
        ([team("wide", 8, deserved=8, borrowLimit=16), NARROW], {}),
        # the scenario's guarantee fits beside wide's share on pa
        ([team("wide", 8, deserved=8, borrowLimit=8), team("narrow", 8, ["pa"])], {}),
        # two confined teams at their shares leave each other's guarantee
        ([team("a", 8, ["pa"]), team("b", 8, ["pa"])], {}),
        # nobody else may use pa
        ([team("wide", 8, ["pb"], deserved=16), NARROW], {}),
        # every team may use every pool: a wait is not a pool's
        ([team("wide", 8, deserved=16, borrowLimit=8), team("narrow", 8)], {}),
        # no guarantee, nothing promised
        ([team("wide", 8, deserved=24), team("narrow", 0, ["pa"], deserved=8)], {}),
    ],
)
def test_arrangements_reclaim_can_honour_are_not_warned(
    teams: list[dict[str, Any]], extra: dict[str, Any]
) -> None:
    assert warnings(teams, **extra) == []


def test_the_summary_carries_each_pool_blind_guarantee_with_its_warning() -> None:
    cfg = load(platform(BLIND_POOLS, [team("wide", 8, deserved=16, borrowLimit=8), NARROW]))
    [entry] = c.summary(cfg, NOW)["poolBlind"]
    [warning] = c.pool_blind_warnings(cfg, NOW)
    assert entry == {
        "team": "narrow",
        "guarantee": 8,
        "pools": ["pa"],
        "firm": 16,
        "kept": {"wide": 16},
        "left": 0,
        "warning": str(warning),
    }


def test_outside_a_blocks_window_no_keeper_means_no_pool_blind_warning() -> None:
    """Firm GPUs that vanish with a capacity block's window are the guarantee check's case,
    not a keeper's: nothing to reclaim from."""
    block = pool("blk", {**BLOCK, "window": WINDOW, "instanceCount": 2}, max=2)
    cfg = load(platform([block, BLIND_POOLS[1]], [team("a", 0), team("b", 8, ["blk"])]))
    after = datetime(2026, 12, 14, 11, 30, tzinfo=UTC)
    assert c.pool_blind(cfg, after) == []


# What the claims can hold together, by enumeration: a maximum flow equals a minimum cut, the
# least over sets X of claims of what the others claim plus what X's pools hold (König).
def most_held(claims: list[c.Claim], pools: dict[str, int]) -> int:
    best = sum(x.gpus for x in claims)
    for size in range(1, len(claims) + 1):
        for chosen in itertools.combinations(claims, size):
            union = frozenset().union(*(x.pools for x in chosen)) & pools.keys()
            rest = sum(x.gpus for x in claims if x not in chosen)
            best = min(best, rest + sum(pools[p] for p in union))
    return best


@settings(max_examples=300, deadline=None)
@given(claims_strategy, pools_strategy)
def test_what_claims_hold_together_agrees_with_a_minimum_cut(
    specs: list[tuple[int, set[str]]], pools: dict[str, int]
) -> None:
    claims = [claim(f"t{i}", g, *ps) for i, (g, ps) in enumerate(specs)]
    held = c.carried(claims, pools)
    assert sum(held.values()) == most_held(claims, pools)
    assert all(0 <= held.get(x.name, 0) <= x.gpus for x in claims)
