"""Volcano builders: queues (with property tests), scheduler config, HyperNodes. The capacity
arithmetic itself: tests/config/test_capacity.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from trainstack.builders import scheduling as s
from trainstack.builders.pools import fabric_profile
from trainstack.config import ConfigError, PlatformConfig, parse_stack_config

POOLS = [
    {
        "name": "h100",
        "instanceType": "p5.48xlarge",
        "fabric": "efa",
        "availabilityZone": "us-east-1a",
        "size": {"max": 2},
        "capacity": {
            "type": "reservation",
            "reservationId": "cr-0a1b2c3d4e5f60718",
            "instanceCount": 2,
        },
    },
    {
        "name": "h200",
        "instanceType": "p5en.48xlarge",
        "fabric": "efa",
        "availabilityZone": "us-east-1b",
        "size": {"min": 1, "max": 1},
    },
    {
        "name": "l40s",
        "instanceType": "g6e.12xlarge",
        "fabric": "tcp",
        "size": {"max": 4},
        "capacity": {"type": "spot"},
    },
]
FIRM = {"h100": 16, "h200": 8, "l40s": 0}


def config(
    teams: list[dict[str, Any]], groups: list[dict[str, Any]] | None = None, **sched: Any
) -> PlatformConfig:
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
        "gpuPools": POOLS,
        "registry": {"groups": groups or [], "teams": teams},
        "scheduling": sched,
    }
    cfg = parse_stack_config({"trainstack:platform": doc}, stack="t", source="test")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def team(name: str, gpus: int, pools: list[str], **quota: Any) -> dict[str, Any]:
    return {
        "name": name,
        "owners": ["o@example.com"],
        "quota": {"gpus": gpus, **quota},
        "pools": pools,
    }


def test_the_summary_counts_firm_and_elastic_gpus() -> None:
    cfg = config([team("a", 20, ["h100", "h200"]), team("b", 4, ["h200"])])
    out = s.scheduling_output(cfg)["capacity"]
    assert {k: out[k] for k in ("firm", "elastic", "total", "guaranteed", "deserved")} == {
        "firm": 24,
        "elastic": 16,
        "total": 40,
        "guaranteed": 24,
        "deserved": 24,
    }
    assert out["pools"]["l40s"] == {
        "kind": "spot",
        "firm": 0,
        "elastic": 16,
        "why": "spot: EC2 can reclaim it",
    }
    # per dimension: what the pools hold (p5 2 x 32 EFA + p5en 1 x 16), Σ capabilities
    assert out["dimensions"]["vpc.amazonaws.com/efa"] == {"cluster": "80", "capabilities": "88"}


def test_every_dimension_is_capped_and_shares_are_in_gpus() -> None:
    """Capability covers every dimension a job may request on the team's pools; guarantee and
    deserved name GPUs alone (issue 16 #1: Volcano's capacity plugin keeps a queue at its
    guarantee in every dimension the guarantee names, so a CPU or EFA guarantee real pods never
    reach made the queue unreclaimable; tests/e2e/test_scheduling.py shows reclaim working)."""
    cfg = config([team("a", 8, ["h100", "l40s"], deserved=10, borrowLimit=6)])
    quotas = s.team_quotas(cfg, cfg.registry.teams[0])
    for name in ("h100", "l40s"):
        pool = cfg.pool(name)
        assert pool is not None
        requested = set(fabric_profile(pool).resources_for(fabric_profile(pool).gpus_per_node))
        requested |= {"cpu", "memory"}
        assert requested <= set(quotas["capability"]), name
    # p5: 24 vCPU, 256 GiB, 4 EFA, 640 MiB hugepages per GPU (the larger shape wins)
    assert quotas["capability"] == {
        "cpu": "384",
        "hugepages-2Mi": "10240Mi",
        "memory": "4096Gi",
        "nvidia.com/gpu": "16",
        "vpc.amazonaws.com/efa": "64",
    }
    assert quotas["guarantee"] == {"nvidia.com/gpu": "8"}
    assert quotas["deserved"] == {"nvidia.com/gpu": "10"}


def test_hierarchy_carries_envelopes_and_links_parents() -> None:
    """Issue 15 #5: the organisation carries what the pools provide and a group its quota, so
    a team's quota change touches its own queue only (test_a_team_quota_change_...)."""
    groups = [
        {"name": "research", "owners": ["r@example.com"], "quota": {"gpus": 16}},
        {"name": "product", "owners": ["p@example.com"]},
    ]
    teams = [
        {**team("a", 8, ["h100"], deserved=10), "group": "research"},
        {**team("b", 4, ["h100"]), "group": "research"},
        team("c", 2, ["h200"]),
        {**team("d", 2, ["h200"], deserved=3), "group": "product"},
    ]
    queues = {q["metadata"]["name"]: q["spec"] for q in s.queues(config(teams, groups))}
    assert set(queues) == {"trainstack", "group-research", "group-product", "a", "b", "c", "d"}
    assert queues["trainstack"]["parent"] == "root"
    assert queues["group-research"]["parent"] == "trainstack"
    assert (queues["a"]["parent"], queues["c"]["parent"]) == ("group-research", "trainstack")

    def gpus(queue: str, level: str) -> int:
        spec = queues[queue]
        values = spec["guarantee"]["resource"] if level == "guarantee" else spec[level]
        return int(values["nvidia.com/gpu"])

    # research: its quota, 16 (teams: 12); deserved the larger of 16 and 10 + 4
    assert (gpus("group-research", "guarantee"), gpus("group-research", "deserved")) == (16, 16)
    # product has no quota: the sums of its one team
    assert (gpus("group-product", "guarantee"), gpus("group-product", "deserved")) == (2, 3)
    # the organisation: firm capacity (h100 16 + h200 8), all of it (with 16 spot l40s)
    assert (gpus("trainstack", "guarantee"), gpus("trainstack", "deserved")) == (24, 40)
    # capability: what the pools hold, not the sum of the children's (issue 16 #2: 168 GPUs on a
    # 128-GPU cluster never bounded a child's real capability)
    assert gpus("trainstack", "capability") == gpus("group-research", "capability") == 40
    assert queues["trainstack"]["capability"]["vpc.amazonaws.com/efa"] == str(2 * 32 + 16)


def _children_fit(queues: list[dict[str, Any]]) -> list[str]:
    """What Volcano's queue webhook checks (v1.15.1 validate_queue.go): the children's sums of
    guarantee and deserved within the parent's, no child's capability above its parent's."""
    by_name = {q["metadata"]["name"]: q["spec"] for q in queues}
    found = []
    for name, parent in by_name.items():
        children = [c for c in by_name.values() if c.get("parent") == name]
        for level in ("guarantee", "deserved"):

            def values(spec: dict[str, Any], level: str = level) -> dict[str, str]:
                found_values: dict[str, str] = (
                    spec["guarantee"]["resource"] if level == "guarantee" else spec[level]
                )
                return found_values

            for dim in {d for c in children for d in values(c)}:
                total = sum(quantity(values(c).get(dim, "0")) for c in children)
                if total > quantity(values(parent).get(dim, "0")):
                    found.append(f"{name}: children's {level} {dim} {total}")
        for child in children:
            for dim, amount in child["capability"].items():
                if quantity(amount) > quantity(parent["capability"].get(dim, amount)):
                    found.append(f"{name}: a child's capability {dim}")
    return found


@pytest.mark.parametrize("group_quota", [None, 16])
@pytest.mark.parametrize("delta", [2, -2])
def test_a_team_quota_change_touches_only_its_queue(group_quota: int | None, delta: int) -> None:
    """Within its group's quota (or without a group), a team's guarantee and deserved change
    its own queue only, so the order the engine lands updates in cannot matter (issue 15 #5).
    Without a group quota the group carries its teams' sums and changes with them."""
    groups = [{"name": "research", "owners": ["r@example.com"]}]
    if group_quota is not None:
        groups[0]["quota"] = {"gpus": group_quota, "deserved": 20}

    def registry(change: int) -> list[dict[str, Any]]:
        return [
            {**team("a", 8 + change, ["h100"], deserved=10 + change), "group": "research"},
            {**team("b", 4, ["h100", "h200"]), "group": "research"},
            team("c", 4 + change, ["h200", "l40s"], deserved=6 + change),  # in no group
        ]

    before = s.queues(config(registry(0), groups))
    after = s.queues(config(registry(delta), groups))
    changed = {q["metadata"]["name"] for q in after if q not in before}
    expected = {"a", "c"} if group_quota is not None else {"a", "c", "group-research"}
    assert changed == expected
    assert not _children_fit(before)
    assert not _children_fit(after)


def test_group_envelopes_must_fit_the_pools() -> None:
    groups = [{"name": "research", "owners": ["r@example.com"], "quota": {"gpus": 24}}]
    teams = [{**team("a", 8, ["h100"]), "group": "research"}, team("c", 4, ["h200"])]
    with pytest.raises(ConfigError) as err:
        config(teams, groups)
    assert "a (8) + group research headroom (16) = 24 GPUs, but their pools provide 16" in str(
        err.value
    )
    groups[0]["quota"] = {"gpus": 8, "deserved": 6}
    with pytest.raises(ConfigError) as err:
        config(teams, groups)
    assert "group research deserves 6 GPUs but its guarantee is 8" in str(err.value)


def test_flat_mode_uses_proportion_and_no_parents() -> None:
    cfg = config([team("a", 8, ["h100"], weight=3)], queueMode="flat")
    queues = s.queues(cfg)
    assert [q["metadata"]["name"] for q in queues] == ["a"]
    assert "parent" not in queues[0]["spec"]
    # the proportion plugin shares by weight and never reads deserved (issue 16 #9); Volcano's
    # webhook still wants deserved >= guarantee (validate_queue.go, found by the flat-mode
    # scenarios of tests/e2e/test_guarantees.py), so it carries the guarantee
    assert queues[0]["spec"]["weight"] == 3
    assert queues[0]["spec"]["deserved"] == queues[0]["spec"]["guarantee"]["resource"]
    plugins = [p["name"] for tier in s.scheduler_config(cfg)["tiers"] for p in tier["plugins"]]
    assert "proportion" in plugins
    assert "capacity" not in plugins


def test_preemption_switches_actions_and_drops_enqueue() -> None:
    on = s.scheduler_config(config([team("a", 8, ["h100"])]))
    off = s.scheduler_config(config([team("a", 8, ["h100"])], preemption=False))
    assert on["actions"] == "allocate, preempt, reclaim, backfill"
    assert off["actions"] == "enqueue, allocate, backfill"
    # preemptible work goes first across nodes, not only on the first node that fits
    # (actions/preempt/preempt.go: pickOneNodeForPreemption only with this argument)
    assert on["configurations"] == [
        {"name": "preempt", "arguments": {"enableTopologyAwarePreemption": True}}
    ]
    assert "configurations" not in off
    plugins = [p["name"] for tier in on["tiers"] for p in tier["plugins"]]
    assert "capacity" in plugins
    assert "proportion" not in plugins
    assert "network-topology-aware" in plugins


def test_hypernodes_follow_placement_groups_and_zones() -> None:
    nodes = {
        n["metadata"]["name"]: n["spec"] for n in s.hypernodes(config([team("a", 0, ["h100"])]))
    }
    assert set(nodes) == {"pool-h100", "pool-h200", "zone-us-east-1a", "zone-us-east-1b"}
    member = nodes["pool-h100"]["members"][0]
    assert member == {
        "type": "Node",
        "selector": {
            "labelMatch": {"matchLabels": {"trainstack.io/placement-group": "trainstack-t-h100"}}
        },
    }
    assert nodes["zone-us-east-1a"]["tier"] == 2
    assert nodes["zone-us-east-1a"]["members"] == [
        {"type": "HyperNode", "selector": {"exactMatch": {"name": "pool-h100"}}}
    ]


# -- against Volcano's own sources in the reference folder ------------------------------------


def registered(reference: Path, what: str) -> set[str]:
    facts = (reference / "volcano" / "FACTS.md").read_text(encoding="utf-8")
    section = facts.split("## 6. Scheduler configuration", 1)[1].split("## 7.", 1)[0]
    if what == "actions":
        line = next(x for x in section.splitlines() if x.startswith("Registered actions"))
        return set(re.findall(r"`([a-z-]+)`", line))
    block = section.split("Registered plugins", 1)[1].split("Config schema", 1)[0]
    return {p.strip() for x in block.splitlines() if x.startswith("- ") for p in x[2:].split(",")}


@pytest.mark.parametrize("preemption", [True, False])
@pytest.mark.parametrize("mode", ["hierarchical", "flat"])
def test_scheduler_config_names_only_what_volcano_registers(
    reference: Path, preemption: bool, mode: str
) -> None:
    cfg = config([team("a", 8, ["h100"])], preemption=preemption, queueMode=mode)
    conf = s.scheduler_config(cfg)
    actions = {a.strip() for a in conf["actions"].split(",")}
    assert actions <= registered(reference, "actions")
    plugins = {p["name"] for tier in conf["tiers"] for p in tier["plugins"]}
    assert plugins <= registered(reference, "plugins")
    assert registered(reference, "plugins") == s.VOLCANO_PLUGINS
    assert registered(reference, "actions") == s.VOLCANO_ACTIONS


def keys_exist(values: dict[str, Any], chart: dict[str, Any], path: str = "") -> list[str]:
    missing = []
    for key, value in values.items():
        if key not in chart:
            missing.append(f"{path}{key}")
        elif isinstance(value, dict) and isinstance(chart[key], dict):
            missing += keys_exist(value, chart[key], f"{path}{key}.")
    return missing


def test_volcano_values_use_only_chart_keys(reference: Path) -> None:
    chart_values = yaml.safe_load((reference / "volcano" / "values.yaml").read_text())
    chart = yaml.safe_load((reference / "volcano" / "Chart.yaml").read_text())
    assert chart["version"] == s.VOLCANO_CHART["version"]
    values = s.volcano_values(config([team("a", 8, ["h100"])]))
    assert keys_exist(values, chart_values) == []
    assert keys_exist({"custom": {"no_such_key": 1}}, chart_values) == ["custom.no_such_key"]


# -- property tests ---------------------------------------------------------------------------

team_strategy = st.tuples(
    st.integers(min_value=0, max_value=20),  # guarantee
    st.integers(min_value=0, max_value=8),  # extra deserved
    st.integers(min_value=0, max_value=8),  # borrow limit
    st.sets(st.sampled_from(sorted(FIRM)), min_size=1),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(team_strategy, min_size=1, max_size=5))
def test_volcano_accepts_every_hierarchy_the_checks_accept(
    specs: list[tuple[int, int, int, set[str]]],
) -> None:
    """Which registries are accepted: tests/config/test_capacity.py (against an oracle). Here:
    every accepted one gives queues Volcano's webhook admits."""
    teams = [
        team(f"t{i}", g, sorted(pools), deserved=g + extra, borrowLimit=borrow)
        for i, (g, extra, borrow, pools) in enumerate(specs)
    ]
    try:
        cfg = config(teams)
    except ConfigError:
        return
    for queue in s.queues(cfg):
        spec = queue["spec"]
        for dim, amount in spec["guarantee"]["resource"].items():
            assert (
                quantity(amount)
                <= quantity(spec["deserved"][dim])
                <= quantity(spec["capability"][dim])
            )
    assert not _children_fit(s.queues(cfg))


def quantity(value: str) -> int:
    return int(value.rstrip("GiM"))


def test_every_priority_class_can_reclaim_lent_gpus() -> None:
    """Issue 15 #10: Volcano's reclaim skips a preemptor whose class has PreemptionPolicy
    Never (v1.15.1 pkg/scheduler/actions/reclaim/reclaim.go), so a team running only
    preemptible jobs would never get back the GPUs it lent. Priority acts only inside a queue
    (actions/preempt/preempt.go), which the descriptions must say rather than "everything"."""
    for name, (_, policy, description) in s.PRIORITY_CLASSES.items():
        assert policy == "PreemptLowerPriority", name
        assert "everything" not in description, name
    lowest = min(s.PRIORITY_CLASSES, key=lambda n: s.PRIORITY_CLASSES[n][0])
    assert lowest == "preemptible"
    assert "preempts nothing" in s.PRIORITY_CLASSES[lowest][2]


def test_no_capability_claims_more_of_a_dimension_than_its_pools_hold() -> None:
    """Issue 16 #8: at the largest per-GPU shape (p5: 4 EFA devices a GPU), 24 GPUs over h100
    (2 p5, 64 EFA) and h200 (1 p5en, 16 EFA) would claim 96 EFA devices where 80 exist; the
    organisation queue carries what exists, and Volcano refuses a child above its parent."""
    cfg = config([team("a", 8, ["h100", "h200"], deserved=16, borrowLimit=8)])
    quotas = s.team_quotas(cfg, cfg.registry.teams[0])
    assert quotas["capability"]["nvidia.com/gpu"] == "24"
    assert quotas["capability"]["vpc.amazonaws.com/efa"] == "80"
    org = next(q for q in s.queues(cfg) if q["metadata"]["name"] == "trainstack")
    assert org["spec"]["capability"]["vpc.amazonaws.com/efa"] == "80"
    assert not _children_fit(s.queues(cfg))
