"""Volcano builders: queues (with property tests), scheduler config, HyperNodes. The capacity
arithmetic itself: tests/config/test_capacity.py."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from trainstack.builders import scheduling as s
from trainstack.builders import topology
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
        # the reservation's own cluster placement group (a new one cannot hold reserved
        # capacity: issue 39 #7)
        "placementGroup": "odcr-h100",
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
# HyperNodes the platform writes per pool and zone (the default on an existing cluster, and on
# AWS without network topology labels; builders/topology.py has the labels' source)
POOL_TOPOLOGY = {"topology": {"source": "pools"}}


def config(
    teams: list[dict[str, Any]],
    groups: list[dict[str, Any]] | None = None,
    pools: list[dict[str, Any]] | None = None,
    **sched: Any,
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
        "gpuPools": POOLS if pools is None else pools,
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
    # (actions/preempt/preempt.go: pickOneNodeForPreemption only with this argument), among
    # every node the preemptor fits, not 10 % of them from a random offset (issue 39 #3)
    assert on["configurations"] == [
        {
            "name": "preempt",
            "arguments": {
                "enableTopologyAwarePreemption": True,
                "minCandidateNodesPercentage": 100,
                "maxCandidateNodesAbsolute": 100,
            },
        }
    ]
    assert "configurations" not in off
    plugins = [p["name"] for tier in on["tiers"] for p in tier["plugins"]]
    assert "capacity" in plugins
    assert "proportion" not in plugins
    assert "network-topology-aware" in plugins


def test_preemption_considers_every_gpu_node_at_any_scale() -> None:
    """Volcano's dry run covers min(n * percentage / 100, maxCandidateNodesAbsolute) of the n
    nodes a preemptor fits (v1.15.1 actions/preempt/preempt.go calculateNumCandidates); the
    cap grows with the pools so that 100 % stays 100 % on a large platform, and the values
    reach the scheduler as YAML integers (framework/arguments.go GetInt takes only Go ints)."""
    big = [{**POOLS[1], "size": {"min": 0, "max": 300}}, {**POOLS[2], "size": {"max": 40}}]
    cfg = config([team("a", 0, ["h200"])], pools=big)
    args = s.preempt_arguments(cfg)
    assert args["minCandidateNodesPercentage"] == 100
    assert args["maxCandidateNodesAbsolute"] == 340
    rendered = yaml.safe_load(s.volcano_values(cfg)["custom"]["scheduler_config_override"])
    [preempt] = rendered["configurations"]
    assert preempt["arguments"] == args
    assert all(type(v) is int for k, v in args.items() if k != "enableTopologyAwarePreemption")
    text = s.volcano_values(cfg)["custom"]["scheduler_config_override"]
    assert "minCandidateNodesPercentage: 100\n" in text


def test_hypernodes_follow_placement_groups_and_zones() -> None:
    nodes = {
        n["metadata"]["name"]: n["spec"]
        for n in s.hypernodes(config([team("a", 0, ["h100"])], **POOL_TOPOLOGY))
    }
    assert set(nodes) == {"pool-h100", "pool-h200", "zone-us-east-1a", "zone-us-east-1b"}
    member = nodes["pool-h100"]["members"][0]
    assert member == {
        "type": "Node",
        "selector": {"labelMatch": {"matchLabels": {"trainstack.io/placement-group": "odcr-h100"}}},
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


# -- behaviours stated one at a time (issue 25) ------------------------------------------------

BASE_LABELS = {
    "app.kubernetes.io/managed-by": "trainstack",
    "app.kubernetes.io/part-of": "trainstack",
    "trainstack.io/stack": "t",
}


def onprem() -> PlatformConfig:
    """The onprem example: an existing cluster, one RoCE pool (RDMA shared device)."""
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.onprem.yaml").read_text(encoding="utf-8"))
    cfg = parse_stack_config(doc["config"], stack="onprem", source="test")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def test_priority_classes_preempt_in_their_queue_and_are_never_the_default() -> None:
    """Every class may preempt (PreemptLowerPriority): Volcano's reclaim skips preemptors of
    class Never, and a team would not get its lent GPUs back (issue 15 #10). None is the
    cluster's global default: that would give every pod of every namespace, system pods
    included, a training priority (and a cluster allows only one)."""
    classes = s.priority_classes(config([team("a", 8, ["h100"])]))
    assert [
        (c["metadata"]["name"], c["value"], c["preemptionPolicy"], c["globalDefault"])
        for c in classes
    ] == [
        ("trainstack-critical", 100_000, "PreemptLowerPriority", False),
        ("trainstack-high", 10_000, "PreemptLowerPriority", False),
        ("trainstack-normal", 1_000, "PreemptLowerPriority", False),
        ("trainstack-preemptible", 100, "PreemptLowerPriority", False),
    ]
    for c in classes:
        assert (c["apiVersion"], c["kind"]) == ("scheduling.k8s.io/v1", "PriorityClass")
        assert c["metadata"]["labels"] == BASE_LABELS
        assert c["description"] == s.PRIORITY_CLASSES[c["metadata"]["name"].split("-")[1]][2]
        assert set(c) == {
            "apiVersion", "kind", "metadata", "value", "preemptionPolicy", "globalDefault",
            "description",
        }  # fmt: skip


def test_queues_are_reclaimable_as_configured_and_the_organisation_never() -> None:
    """A team's `reclaimable: false` keeps what it borrowed (Volcano's reclaim skips the queue);
    teams and groups are reclaimable by default. The organisation queue is never: it holds
    every pool, and reclaiming from it would take GPUs from all teams at once."""
    cfg = config(
        [{**team("a", 8, ["h100"], reclaimable=False), "group": "g"}, team("b", 0, ["l40s"])],
        groups=[{"name": "g", "owners": ["g@example.com"]}],
    )
    queues = {q["metadata"]["name"]: q for q in s.queues(cfg)}
    assert {n: q["spec"]["reclaimable"] for n, q in queues.items()} == {
        "trainstack": False,
        "group-g": True,
        "a": False,
        "b": True,
    }
    assert {n: q["metadata"]["labels"] for n, q in queues.items()} == {
        "trainstack": {**BASE_LABELS, "trainstack.io/role": "organisation"},
        "group-g": {**BASE_LABELS, "trainstack.io/role": "group", "trainstack.io/group": "g"},
        "a": {
            **BASE_LABELS,
            "trainstack.io/role": "team",
            "trainstack.io/team": "a",
            "trainstack.io/group": "g",
        },
        "b": {**BASE_LABELS, "trainstack.io/role": "team", "trainstack.io/team": "b"},
    }
    for q in queues.values():
        assert (q["apiVersion"], q["kind"]) == ("scheduling.volcano.sh/v1beta1", "Queue")
    assert queues["a"]["spec"] == {
        "weight": 1,  # Volcano's webhook default, emitted so the plan equals the live object
        "reclaimable": False,
        "deserved": {"nvidia.com/gpu": "8"},
        "guarantee": {"resource": {"nvidia.com/gpu": "8"}},
        "capability": {
            "cpu": "192",
            "hugepages-2Mi": "5120Mi",
            "memory": "2048Gi",
            "nvidia.com/gpu": "8",
            "vpc.amazonaws.com/efa": "32",
        },
        "parent": "group-g",
    }


def test_hypernodes_have_a_pool_tier_and_a_zone_tier() -> None:
    """Tier 1 is a pool (its placement group, or an existing pool's node selector), tier 2
    a zone holding its pools (`zone-cluster` on an existing cluster). A job's topology
    tier (`pool` or `zone`) is one of these (jobs/render.py TIERS)."""
    for cfg, pool, match, zone in [
        (
            config([team("a", 0, ["h100"])], **POOL_TOPOLOGY),
            "h100",
            {"trainstack.io/placement-group": "odcr-h100"},
            "zone-us-east-1a",
        ),
        (
            onprem(),
            "a100-roce",
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "zone-cluster",
        ),
    ]:
        nodes = {n["metadata"]["name"]: n for n in s.hypernodes(cfg)}
        assert nodes[f"pool-{pool}"]["spec"] == {
            "tier": 1,
            "tierName": "pool",
            "members": [{"type": "Node", "selector": {"labelMatch": {"matchLabels": match}}}],
        }
        assert nodes[zone]["spec"]["tier"] == 2
        assert nodes[zone]["spec"]["tierName"] == "zone"
        assert {"type": "HyperNode", "selector": {"exactMatch": {"name": f"pool-{pool}"}}} in (
            nodes[zone]["spec"]["members"]
        )
        for n in nodes.values():
            assert (n["apiVersion"], n["kind"]) == ("topology.volcano.sh/v1alpha1", "HyperNode")
            assert n["metadata"]["labels"]["trainstack.io/stack"] == cfg.stack
    # the spot pool without a placement group has no HyperNode (no topology inside it)
    assert "pool-l40s" not in {
        n["metadata"]["name"]
        for n in s.hypernodes(config([team("a", 0, ["h100"])], **POOL_TOPOLOGY))
    }


def test_an_rdma_pool_shares_one_device_per_replica_in_the_capability() -> None:
    """An existing RoCE pool: CPUs and memory from the pool's declared node size, and the
    RDMA shared device at most once per GPU (a replica requests it once, with >= 1 GPU)."""
    cfg = onprem()
    assert s.pools_shape(cfg, ["a100-roce"]) == {
        "nvidia.com/gpu": 1.0,
        "cpu": 240 / 8,
        "memory": 1900 / 8,
        "rdma/rdma_shared_device_a": 1.0,
    }
    assert s.team_quotas(cfg, cfg.registry.teams[0])["capability"] == {
        "cpu": "480",
        "memory": "3800Gi",
        "nvidia.com/gpu": "16",
        "rdma/rdma_shared_device_a": "16",
    }
    assert s.dimensions(cfg)["rdma/rdma_shared_device_a"] == {
        "cluster": "128",
        "capabilities": "16",
    }


def test_a_resource_no_team_can_use_sums_to_zero() -> None:
    cfg = config([team("a", 8, ["h100"])])
    dims = s.dimensions(cfg)
    assert dims["nvidia.com/gpu"] == {"cluster": "40", "capabilities": "8"}
    # every pool's resource is listed; the teams' capabilities sum to 0 where none reaches it
    assert set(dims) == {
        "cpu",
        "hugepages-2Mi",
        "memory",
        "nvidia.com/gpu",
        "vpc.amazonaws.com/efa",
    }
    cfg = config([team("a", 0, ["l40s"])])
    assert s.dimensions(cfg)["vpc.amazonaws.com/efa"] == {"cluster": "80", "capabilities": "0"}


def test_the_scheduler_configuration_in_full() -> None:
    """What docs/scheduling.md explains, pinned: gang and DRF never mark jobs preemptable
    (a gang is all or nothing), the share plugin per queue mode, binpack on GPUs, and
    the topology plugin only where HyperNodes exist."""
    cfg = config([team("a", 8, ["h100"])])
    conf = s.scheduler_config(cfg)
    assert conf == {
        "actions": "allocate, preempt, reclaim, backfill",
        "tiers": [
            {
                "plugins": [
                    {"name": "priority"},
                    {"name": "gang", "enablePreemptable": False},
                    {"name": "conformance"},
                ]
            },
            {
                "plugins": [
                    {"name": "drf", "enablePreemptable": False},
                    {"name": "predicates"},
                    {"name": "capacity", "enableHierarchy": True},
                    {"name": "nodeorder"},
                    {
                        "name": "binpack",
                        "arguments": {
                            "binpack.resources": "nvidia.com/gpu",
                            "binpack.resources.nvidia.com/gpu": 10,
                        },
                    },
                    {
                        "name": "network-topology-aware",
                        "arguments": {
                            "weight": 10,
                            "hypernode.binpack.resources": "nvidia.com/gpu",
                        },
                    },
                ]
            },
        ],
        "configurations": [{"name": "preempt", "arguments": s.preempt_arguments(cfg)}],
    }
    off = s.scheduler_config(
        config([team("a", 8, ["h100"])], preemption=False, queueMode="flat", topologyAware=False)
    )
    assert [p["name"] for p in off["tiers"][1]["plugins"]] == [
        "overcommit", "drf", "predicates", "proportion", "nodeorder", "binpack",
    ]  # fmt: skip
    assert not s.topology_enabled(config([team("a", 8, ["h100"])], topologyAware=False))
    # topology-aware, but no pool with a placement group: nothing to place by
    assert not s.topology_enabled(dataclasses.replace(onprem(), gpu_pools=()))


@pytest.mark.parametrize(("environment", "cloud"), [("production", "aws"), ("dev", "existing")])
def test_volcano_values(environment: str, cloud: str) -> None:
    """Two scheduler replicas (leader-elected) in production, one elsewhere; metrics on for
    the monitors; Volcano's default namespace labelled `system` on AWS only."""
    cfg = onprem() if cloud == "existing" else config([team("a", 8, ["h100"])])
    cfg = dataclasses.replace(cfg, environment=environment)
    custom = s.volcano_values(cfg)["custom"]
    assert yaml.safe_load(custom.pop("scheduler_config_override")) == s.scheduler_config(cfg)
    # Volcano discovers the HyperNodes from EKS's labels on AWS (builders/topology.py)
    assert custom.pop("controller_config_override", None) == topology.controller_config(cfg)
    assert (topology.controller_config(cfg) is not None) == (cloud == "aws")
    assert custom == {
        "scheduler_metrics_enable": True,
        "controller_metrics_enable": True,
        "default_ns": {"trainstack.io/role": "system"} if cloud == "aws" else None,
        "leader_elect_enable": True,
        "scheduler_replicas": 2 if environment == "production" else 1,
    }
    text = s.volcano_values(cfg)["custom"]["scheduler_config_override"]
    # in the order docs/scheduling.md and Volcano's own examples write it, not sorted
    assert [line.split(":")[0] for line in text.splitlines() if line[0].isalpha()] == [
        "actions",
        "tiers",
        *(["configurations"] if cfg.scheduling.preemption else []),
    ]
    assert "- name: gang\n    enablePreemptable: false\n" in text


def test_what_team_stacks_read() -> None:
    """The team slice and the scheduling output are the team stacks' and previews' only view
    of queues and classes: their keys are a contract (jobs/platform.py, diff/capacity.py)."""
    cfg = config([{**team("a", 8, ["h100"], deserved=10), "priorityClasses": ["high"]}])
    assert s.team_scheduling(cfg, cfg.registry.teams[0]) == {
        "queue": "a",
        "pools": ["h100"],
        "priorityClasses": ["trainstack-high"],
        "gpus": {"guarantee": 8, "deserved": 10, "capability": 10},
        "quota": s.team_quotas(cfg, cfg.registry.teams[0]),
        "topologyTiers": {"pool": 1, "zone": 4},
    }
    output = s.scheduling_output(cfg)
    assert output["queueMode"] == "hierarchical"
    assert output["priorityClasses"]["normal"] == {"className": "trainstack-normal", "value": 1000}
    assert set(output["priorityClasses"]) == set(s.PRIORITY_CLASSES)
    assert output["capacity"]["dimensions"] == s.dimensions(cfg)


def test_only_pools_in_a_placement_group_get_a_hypernode_in_any_order() -> None:
    """A pool without a placement group (l40s, spot across zones) has no topology to keep a
    job in; the pools listed after it still get theirs."""
    pools = [POOLS[2], POOLS[0], POOLS[1]]
    names = {
        n["metadata"]["name"]
        for n in s.hypernodes(config([team("a", 0, ["h100"])], pools=pools, **POOL_TOPOLOGY))
    }
    assert names == {"pool-h100", "pool-h200", "zone-us-east-1a", "zone-us-east-1b"}


def test_reserved_capacity_gets_a_pool_hypernode_only_where_ec2_keeps_it_together() -> None:
    """A reservation without a named placement group has no placement guarantee, so no
    tier-1 HyperNode; a Capacity Block is placed together by EC2 without a group, so its
    HyperNode selects the pool's nodes by their pool label (issue 39 #7)."""
    reserved = {**POOLS[0]}
    del reserved["placementGroup"]
    block = {
        **POOLS[0],
        "name": "block",
        "capacity": {"type": "capacityBlock", "reservationId": "cr-0123456789abcdef0"},
    }
    del block["placementGroup"]
    nodes = {
        n["metadata"]["name"]: n["spec"]
        for n in s.hypernodes(
            config([team("a", 0, ["h200"])], pools=[reserved, block, POOLS[1]], **POOL_TOPOLOGY)
        )
    }
    assert "pool-h100" not in nodes
    assert nodes["pool-block"]["members"] == [
        {
            "type": "Node",
            "selector": {"labelMatch": {"matchLabels": {"trainstack.io/pool": "block"}}},
        }
    ]
    assert nodes["zone-us-east-1a"]["members"] == [
        {"type": "HyperNode", "selector": {"exactMatch": {"name": "pool-block"}}}
    ]


def test_a_group_without_teams_has_no_queue_and_the_next_group_has_its_own() -> None:
    groups = [
        {"name": "empty", "owners": ["e@example.com"]},
        {"name": "g", "owners": ["g@example.com"]},
    ]
    cfg = config([{**team("a", 8, ["h100"]), "group": "g"}], groups=groups)
    assert [q["metadata"]["name"] for q in s.queues(cfg)] == ["trainstack", "group-g", "a"]


def test_a_resource_scarcer_than_gpus_keeps_its_fraction_per_gpu() -> None:
    """A p4d node has 4 EFA devices for 8 GPUs: half a device per GPU, so 8 GPUs of
    capability carry 4 EFA devices, not 8 (a queue may not claim what no node has)."""
    p4d = {
        "name": "a100",
        "instanceType": "p4d.24xlarge",
        "fabric": "efa",
        "availabilityZone": "us-east-1a",
        "size": {"min": 1, "max": 1},
    }
    cfg = config([team("a", 8, ["a100"])], pools=[p4d])
    assert s.pools_shape(cfg, ["a100"])["vpc.amazonaws.com/efa"] == 0.5
    assert s.team_quotas(cfg, cfg.registry.teams[0])["capability"]["vpc.amazonaws.com/efa"] == "4"
