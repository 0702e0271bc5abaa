"""HyperNodes from the nodes' network labels (issue 46 #6; docs/scheduling.md, "Topology").

What runs for real: Volcano's controller manager, reading the network topology discovery the
prod stack's chart values give it (the ConfigMap the chart would render,
`stacks.deploy_platform`), its `label` discoverer turning node labels into HyperNodes and
reconciling them as nodes come, go and change; Volcano's scheduler placing a job with a hard
network topology over them. prod's pools are p5/p5en, which EKS labels with
`topology.k8s.aws/network-node-layer-1..3`; the simulated nodes carry such labels
(sandbox/nodes.py: one bottom network node per pool and zone). Here h100-block's 8 nodes are
relabelled into a wider fabric: 2 layer-1 nodes (spines), each over 2 layer-2 nodes, each over
one layer-3 node (a leaf) with 2 instances:

    zone us-east-1a
      spine-a: switch-a1: leaf-a1 {0, 1}   switch-a2: leaf-a2 {2, 3}
      spine-b: switch-b1: leaf-b1 {4, 5}   switch-b2: leaf-b2 {6, 7}

What cannot run here: EKS itself applying the labels (the values are EC2's format, the
layout is made up), and the chart's RBAC for the controller (it runs as the admin here).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import jobs
from tests.e2e.conftest import Deployed
from trainstack.builders import labels, topology
from trainstack.config.topology import EKS_LAYER_LABELS, ZONE_LABEL
from trainstack.kube import wait_for
from trainstack.sandbox import deploy, nodes

HYPERNODE = ("topology.volcano.sh/v1alpha1", "HyperNode")
POOL = "h100-block"
L1, L2, L3 = EKS_LAYER_LABELS[:3]
# node index -> (spine, switch, leaf)
FABRIC = {
    i: (f"nn-e2e-spine-{s}", f"nn-e2e-switch-{s}{w}", f"nn-e2e-leaf-{s}{w}")
    for i, (s, w) in enumerate(["a1", "a1", "a2", "a2", "b1", "b1", "b2", "b2"])
}

Key = tuple[str, str]  # a HyperNode by the label it stands for: (label key, value)


def _fabric_labels(spine: str, switch: str, leaf: str) -> dict[str, str]:
    return {L1: spine, L2: switch, L3: leaf}


def _node(index: int) -> str:
    return f"{POOL}-{index}"


def _relabel(platform: Deployed, name: str, values: dict[str, str]) -> None:
    platform.kube.patch({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
                        {"metadata": {"labels": values}})  # fmt: skip


def _cordon(platform: Deployed, names: list[str], on: bool) -> None:
    for name in names:
        platform.kube.patch({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
                            {"spec": {"unschedulable": on or None}})  # fmt: skip


def discovered(platform: Deployed) -> dict[Key, tuple[int, str, frozenset[Any]]]:
    """Every HyperNode Volcano's label discovery made, by the label it stands for: its tier,
    tierName and members (node names at tier 1, the members' own keys above)."""
    found = [
        h
        for h in platform.kube.list(*HYPERNODE)
        if h["metadata"].get("labels", {}).get(topology.SOURCE_LABEL) == topology.LABEL_SOURCE
    ]
    by_name: dict[str, Key] = {}
    for h in found:
        own = [(k, v) for k, v in h["metadata"]["labels"].items() if k != topology.SOURCE_LABEL]
        assert len(own) == 1, h["metadata"]
        by_name[h["metadata"]["name"]] = own[0]
    result: dict[Key, tuple[int, str, frozenset[Any]]] = {}
    for h in found:
        spec = h["spec"]
        members = []
        for m in spec.get("members", []):
            name = m["selector"]["exactMatch"]["name"]
            members.append(name if m["type"] == "Node" else by_name.get(name, name))
        result[by_name[h["metadata"]["name"]]] = (
            spec["tier"],
            spec.get("tierName", ""),
            frozenset(members),
        )
    return result


def expected(platform: Deployed, of: list[dict[str, Any]]) -> dict[Key, tuple[int, str, set[Any]]]:
    """The tree the platform's labels (top first) make of these nodes, in Volcano's numbering:
    tier 1 for the label nearest the node (builders/topology.py)."""
    chain = list(platform.cfg.scheduling.topology.labels)
    tree: dict[Key, tuple[int, str, set[Any]]] = {}
    for node in of:
        node_labels = node["metadata"]["labels"]
        member: Any = node["metadata"]["name"]
        for label in reversed(chain):
            if label not in node_labels:
                break
            key = (label, node_labels[label])
            tier = topology.tier_of(platform.cfg, label)
            tree.setdefault(key, (tier, label, set()))[2].add(member)
            member = key
    return tree


def matches(live: dict[Key, tuple[int, str, frozenset[Any]]], want: dict[Key, Any]) -> bool:
    """Every wanted HyperNode exists with its tier and members; the zone's may hold more (the
    other pools' network nodes)."""
    for key, (tier, name, members) in want.items():
        got = live.get(key)
        if got is None or got[:2] != (tier, name):
            return False
        if (got[2] != members) if key[0] != ZONE_LABEL else not (members <= got[2]):
            return False
    return True


def settled(
    platform: Deployed, want: dict[Key, Any], gone: tuple[Key, ...] = (), exact: bool = False
) -> dict[Key, Any]:
    """The discovered HyperNodes once they are `want`, and those of `gone` deleted; `exact`:
    and no others (a relabelled node's old leaf lingers until the controller's next pass)."""

    def probe() -> dict[Key, Any] | None:
        live = discovered(platform)
        if exact and set(live) != set(want):
            return None
        return live if matches(live, want) and not set(gone) & set(live) else None

    return wait_for("HyperNodes to follow the nodes' labels", probe, timeout=60)


def _pool_nodes(platform: Deployed, pool: str) -> list[dict[str, Any]]:
    return platform.kube.list("v1", "Node", labels=f"{labels.POOL}={pool}")


@pytest.fixture(scope="module")
def fabric(prod: Deployed) -> Iterator[Deployed]:
    assert topology.discovers(prod.cfg), "prod's default: Volcano discovers its HyperNodes"
    for index, values in FABRIC.items():
        _relabel(prod, _node(index), _fabric_labels(*values))
    settled(prod, expected(prod, _pool_nodes(prod, POOL)))
    yield prod
    for job in prod.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(prod, job)


def test_the_hypernodes_are_the_nodes_network_labels(fabric: Deployed) -> None:
    """One tree, Volcano's: tiers counted from the nearest label (tier 1: the leaves, whose
    members are the nodes), each HyperNode a member of the one above; the other pools' nodes
    under their own simulated leaf; no HyperNode of the platform's own beside them."""
    every = [n for pool in fabric.cfg.gpu_pools for n in _pool_nodes(fabric, pool.name)]
    want = expected(fabric, every)
    # exact: h100-block's own leaf, emptied by the relabelling, is deleted on the controller's
    # next pass; comparing before that raced it (15 HyperNodes listed, 16 discovered a moment
    # before)
    live = settled(fabric, want, exact=True)
    leaves = {k: v for k, v in live.items() if v[0] == 1}
    assert leaves[(L3, "nn-e2e-leaf-b2")][2] == {"h100-block-6", "h100-block-7"}
    assert live[(L1, "nn-e2e-spine-a")][:2] == (3, L1)
    assert live[(L1, "nn-e2e-spine-a")][2] == {(L2, "nn-e2e-switch-a1"), (L2, "nn-e2e-switch-a2")}
    assert live[(ZONE_LABEL, "us-east-1a")][0] == 4
    # each other pool's nodes share one leaf (sandbox/nodes.py network_labels)
    for pool in ("h100-reserved", "h200-burst"):
        names = {n["metadata"]["name"] for n in _pool_nodes(fabric, pool)}
        assert any(members == names for _, _, members in leaves.values()), pool
    # one tree: every HyperNode is discovered, none of the platform's own, and no HyperNode is
    # a member of two (the scheduler would refuse the tree: hyper_node_info.go addChild)
    assert not fabric.kube.list(*HYPERNODE, labels=deploy.MANAGED)
    undiscovered = [
        h["metadata"]["name"]
        for h in fabric.kube.list(*HYPERNODE)
        if h["metadata"].get("labels", {}).get(topology.SOURCE_LABEL) != topology.LABEL_SOURCE
    ]
    assert undiscovered == []
    parents: dict[Any, int] = {}
    for _, _, members in live.values():
        for member in members:
            parents[member] = parents.get(member, 0) + 1
    assert all(count == 1 for count in parents.values()), parents
    names = [h["metadata"]["name"] for h in fabric.kube.list(*HYPERNODE)]
    assert all(n.startswith(f"hypernode-{topology.TOPOLOGY_TYPE}-tier") for n in names), names


def test_a_hard_tier_1_job_runs_under_one_leaf_or_waits(fabric: Deployed) -> None:
    """`topology: {mode: hard, tier: pool}` renders highestTierAllowed 1: the gang lands under
    one leaf. With one free node in each leaf (four free nodes, the job needs two) the same gang
    without a topology runs across two leaves, and with it waits; a leaf with two free nodes
    then takes it whole."""
    leaf = topology.tier_of(fabric.cfg, L3)
    assert leaf == 1
    doc = jobs.spec("vision", "topo-leaf", pool=POOL, replicas=2, gpus=8)
    free = jobs.rendered(fabric, {**doc, "metadata": {**doc["metadata"], "name": "no-topo"}})
    assert "networkTopology" not in free["spec"]
    doc["spec"]["topology"] = {"mode": "hard", "tier": "pool"}
    job = jobs.rendered(fabric, doc)
    assert job["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": leaf}
    busy = [_node(i) for i in (0, 2, 4, 6)]  # one node of each leaf
    _cordon(fabric, busy, True)
    try:
        jobs.submit(fabric, free)
        spread = {p["spec"]["nodeName"] for p in jobs.wait_running(fabric, free, timeout=90)}
        assert len({FABRIC[int(n.rsplit("-", 1)[1])][2] for n in spread}) == 2, spread
        jobs.delete(fabric, free)
        jobs.submit(fabric, job)
        assert jobs.stays_unscheduled(fabric, job, seconds=10) == []
        _cordon(fabric, [_node(6)], False)  # leaf-b2 has two free nodes again
        pods = jobs.wait_running(fabric, job, timeout=90)
    finally:
        _cordon(fabric, busy, False)
    placed = {p["spec"]["nodeName"] for p in pods}
    assert placed == {_node(6), _node(7)}, placed
    jobs.delete(fabric, job)


def test_hypernodes_stay_current_as_nodes_come_change_and_go(fabric: Deployed) -> None:
    pool = fabric.cfg.pool(POOL)
    assert pool is not None
    template = nodes.pool_nodes(fabric.cfg, pool, 1)[0]

    def new_node(name: str, values: tuple[str, str, str]) -> dict[str, Any]:
        node = copy.deepcopy(template)
        node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        node["metadata"]["labels"].update(_fabric_labels(*values))
        return node

    def tree() -> dict[Key, Any]:
        return expected(fabric, _pool_nodes(fabric, POOL))

    # a node joins an existing leaf, another brings a new leaf under switch-b2
    joined = new_node("h100-block-joined", FABRIC[0])
    fresh = new_node("h100-block-fresh", ("nn-e2e-spine-b", "nn-e2e-switch-b2", "nn-e2e-leaf-b2x"))
    deploy.create_nodes(fabric.kube, [joined, fresh])
    live = settled(fabric, tree())
    assert "h100-block-joined" in live[(L3, "nn-e2e-leaf-a1")][2]
    assert live[(L3, "nn-e2e-leaf-b2x")][2] == {"h100-block-fresh"}
    assert (L3, "nn-e2e-leaf-b2x") in live[(L2, "nn-e2e-switch-b2")][2]
    # a node's labels change: it moves to another leaf
    _relabel(fabric, _node(7), _fabric_labels(*FABRIC[4]))
    live = settled(fabric, tree())
    assert live[(L3, "nn-e2e-leaf-b2")][2] == {_node(6)}
    assert _node(7) in live[(L3, "nn-e2e-leaf-b1")][2]
    # nodes leave: out of their leaf, and a leaf left empty is deleted with its place above
    for name in ("h100-block-joined", "h100-block-fresh"):
        fabric.kube.delete("v1", "Node", name)
    live = settled(fabric, tree(), gone=((L3, "nn-e2e-leaf-b2x"),))
    assert "h100-block-joined" not in live[(L3, "nn-e2e-leaf-a1")][2]
    assert (L3, "nn-e2e-leaf-b2x") not in live[(L2, "nn-e2e-switch-b2")][2]
    _relabel(fabric, _node(7), _fabric_labels(*FABRIC[7]))
    settled(fabric, tree())
