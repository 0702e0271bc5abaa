"""Volcano as data: capacity arithmetic, queues, priority classes, scheduler config and
HyperNodes. The admission policies on Volcano objects live in builders/admission.py.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from trainstack.builders import labels, topology
from trainstack.builders.fabric import GPU_RESOURCE, HUGEPAGES_RESOURCE
from trainstack.builders.pools import (
    PLACEMENT_GROUP,
    fabric_profile,
    gpus_per_node,
    instance_of,
    max_nodes,
    placement_group_name,
    pool_slices,
)
from trainstack.config.capacity import group_envelope, summary, supplies
from trainstack.config.model import PlatformConfig, Team

VOLCANO_CHART = {
    "chart": "volcano",
    "version": "1.15.1",
    "repo": "https://volcano-sh.github.io/helm-charts",
}
VOLCANO_NAMESPACE = "volcano-system"
ORG_QUEUE = "trainstack"
ROOT_QUEUE = "root"

# name -> (value, preemption policy, description). Values leave room above for system pods.
# What priority does in Volcano v1.15.1: the preempt action evicts lower-priority jobs of the
# same queue only ("Preemption between Jobs within Queue", actions/preempt/preempt.go); across
# teams GPUs move by reclaim, which follows queue shares (deserved, guarantee), not priority,
# and skips preemptors whose class is PreemptionPolicy Never (actions/reclaim/reclaim.go). So
# every class may preempt: with Never, a team running only preemptible work would never get
# its lent GPUs back. `preemptible` is the lowest value, so it preempts nothing in its queue.
PRIORITY_CLASSES: dict[str, tuple[int, str, str]] = {
    "critical": (
        100_000,
        "PreemptLowerPriority",
        "Deadline work; preempts lower-priority jobs of the same team's queue",
    ),
    "high": (
        10_000,
        "PreemptLowerPriority",
        "Important training; preempts normal and preemptible jobs of the same team's queue",
    ),
    "normal": (1_000, "PreemptLowerPriority", "Default; preempts preemptible jobs of its queue"),
    "preemptible": (
        100,
        "PreemptLowerPriority",
        "Opportunistic work; the first preempted in its queue, preempts nothing; reclaims "
        "the team's lent GPUs like any class",
    ),
}

# What Volcano v1.15 registers (pkg/scheduler/framework); the config may name nothing else.
VOLCANO_ACTIONS = frozenset(
    {
        "enqueue",
        "allocate",
        "backfill",
        "preempt",
        "reclaim",
        "gangpreempt",
        "gangreclaim",
        "shuffle",
    }
)
VOLCANO_PLUGINS = frozenset(
    {
        "drf", "gang", "deviceshare", "predicates", "priority", "nodeorder", "conformance",
        "binpack", "resource-strategy-fit", "tdm", "overcommit", "sla", "task-topology",
        "numa-aware", "cdp", "rescheduling", "usage", "pdb", "nodegroup",
        "network-topology-aware", "proportion", "capacity", "extender", "resourcequota",
    }
)  # fmt: skip


def priority_class_name(short: str) -> str:
    return f"trainstack-{short}"


# -- resource lists --------------------------------------------------------------------


def per_gpu_shape(cfg: PlatformConfig, team: Team) -> dict[str, float]:
    """The largest per-GPU amount of each resource a job may request on the team's pools.

    The capability in GPUs becomes a capability in every dimension with this shape, so no
    dimension a job requests is left without a limit (guarantee and deserved: team_quotas).
    """
    return pools_shape(cfg, team.pools)


def pools_shape(cfg: PlatformConfig, pool_names: tuple[str, ...] | list[str]) -> dict[str, float]:
    """The largest per-GPU amount of each resource over the named pools."""
    shape: dict[str, float] = {GPU_RESOURCE: 1.0}
    for name in pool_names:
        pool = cfg.pool(name)
        assert pool is not None, "the loader guarantees team pools exist"
        gpus = gpus_per_node(pool)
        if pool.aws is not None:
            instance = instance_of(pool)
            cpu, memory = instance.vcpu, instance.memory_gib
        else:
            assert pool.existing is not None
            cpu, memory = pool.existing.cpus_per_node, pool.existing.memory_gib_per_node
        profile = fabric_profile(pool)
        per = {"cpu": cpu / gpus, "memory": memory / gpus}
        per |= {k: v / gpus for k, v in profile.devices_per_node.items()}
        per |= dict.fromkeys(profile.shared_devices, 1.0)
        if profile.hugepages_mi_per_node:
            per[HUGEPAGES_RESOURCE] = profile.hugepages_mi_per_node / gpus
        # A GPU's worth of each slice (docs/gpu-sharing.md): a capability of N GPUs lets the
        # team hold N GPUs' worth of every slice its pools offer. Volcano caps each resource
        # on its own and leaves one the capability does not name unlimited (v1.15.1
        # plugins/capacity/capacity.go realCapability: MinDimensionResource with Infinity),
        # so every slice the pools advertise is named here.
        per |= {s.resource: float(s.per_gpu) for s in pool_slices(pool)}
        for key, value in per.items():
            shape[key] = max(shape.get(key, 0.0), value)
    return shape


def resource_list(shape: dict[str, float], gpus: int) -> dict[str, str]:
    """Kubernetes quantities for `gpus` GPUs of the given shape (rounded up)."""
    return quantities({key: per * gpus for key, per in shape.items()})


def quantities(amounts: dict[str, float]) -> dict[str, str]:
    """Kubernetes quantities, rounded up, in the units Volcano's queues use here."""
    out: dict[str, str] = {}
    for key, value in sorted(amounts.items()):
        amount = math.ceil(value - 1e-9)
        if key == "memory":
            out[key] = f"{amount}Gi"
        elif key == HUGEPAGES_RESOURCE:
            out[key] = f"{amount}Mi"
        else:
            out[key] = str(amount)
    return out


def pools_resources(
    cfg: PlatformConfig, pool_names: tuple[str, ...] | list[str]
) -> dict[str, float]:
    """What the named pools hold at their maximum size, per dimension."""
    totals: dict[str, float] = {}
    for name in pool_names:
        pool = cfg.pool(name)
        assert pool is not None, "the loader guarantees team pools exist"
        gpus = gpus_per_node(pool) * max_nodes(pool)
        for key, per in pools_shape(cfg, [name]).items():
            totals[key] = totals.get(key, 0.0) + per * gpus
    return totals


def _capability(cfg: PlatformConfig, team: Team) -> dict[str, str]:
    """The team's capability at its pools' largest per-GPU shape, each dimension capped at
    what its pools hold: no queue may claim more than exists (issue 16 #2), and Volcano's
    webhook refuses a child whose capability exceeds its ancestor's in any dimension
    (validate_queue.go validateChildAgainstAncestor), the organisation holding every pool."""
    shape = per_gpu_shape(cfg, team)
    held = pools_resources(cfg, team.pools)
    gpus = team.quota.capability_gpus
    return quantities({k: min(per * gpus, held.get(k, per * gpus)) for k, per in shape.items()})


def share(gpus: int) -> dict[str, str]:
    """A guarantee or deserved share: GPUs alone (see team_quotas)."""
    return {GPU_RESOURCE: str(gpus)}


def team_quotas(cfg: PlatformConfig, team: Team) -> dict[str, dict[str, str]]:
    """Guarantee and deserved in GPUs alone; capability in every dimension.

    Volcano's capacity plugin (v1.15.1 plugins/capacity/capacity.go) takes a reclaim victim
    from a queue only if the queue stays at or above its guarantee in every dimension the
    guarantee names after the eviction (checkGuaranteeConstraint): a guarantee in CPU, memory
    and EFA at the pools' full per-GPU shape, which real pods never reach, made every team with
    a guarantee unreclaimable (issue 16 #1, tests/e2e/test_scheduling.py). A dimension missing
    from deserved is not compared. The capability keeps every dimension a job may request,
    so no dimension is left without a limit.
    """
    return {
        "guarantee": share(team.quota.gpus),
        "deserved": share(team.quota.deserved_gpus),
        "capability": _capability(cfg, team),
    }


def _split(quantity: str) -> tuple[int, str]:
    """`16384Gi` -> (16384, "Gi"): the whole numbers and units resource_list writes."""
    digits = quantity.rstrip("GiM")
    return int(digits), quantity[len(digits) :]


def _max_lists(lists: list[dict[str, str]]) -> dict[str, str]:
    """Per dimension, the largest of the lists (same units per dimension, as resource_list)."""
    best: dict[str, str] = {}
    for resources in lists:
        for key, quantity in resources.items():
            if key not in best or _split(quantity)[0] > _split(best[key])[0]:
                best[key] = quantity
    return {k: best[k] for k in sorted(best)}


def _sum_lists(lists: list[dict[str, str]]) -> dict[str, str]:
    totals: dict[str, int] = {}
    units: dict[str, str] = {}
    for resources in lists:
        for key, quantity in resources.items():
            amount, units[key] = _split(quantity)
            totals[key] = totals.get(key, 0) + amount
    return {k: f"{totals[k]}{units[k]}" for k in sorted(totals)}


# -- manifests -------------------------------------------------------------------------------


def group_queue(name: str) -> str:
    return f"group-{name}"


def _queue(
    cfg: PlatformConfig, name: str, spec: dict[str, Any], extra_labels: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name, "labels": {**labels.base_labels(cfg.stack), **extra_labels}},
        "spec": spec,
    }


def queues(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Organisation → group → team queues (hierarchical), or team queues alone (flat).

    Parents carry envelopes, not the sums of their children: Volcano's webhook checks a child
    against its parent's current guarantee and deserved, and a parent against its children's
    (validate_queue.go, validateSiblingsSum / validateChildrenConstraints), so with exact sums
    raising a quota needs the parent to land first and lowering it the children, and no
    dependency order serves both (issue 15 #5). With envelopes a team's quota changes only
    its own queue. The organisation carries what the pools provide (firm capacity for the
    guarantee, all of it for deserved and capability; the capacity checks keep the teams
    within it); a group carries its configured quota, or the sums when it has none. Each
    envelope is raised to the children's sum in a dimension where the sum is larger, so the
    webhook never refuses a hierarchy the checks accepted.
    """
    hierarchical = cfg.scheduling.queue_mode == "hierarchical"
    team_specs: dict[str, dict[str, Any]] = {}
    for team in cfg.registry.teams:
        quotas = team_quotas(cfg, team)
        spec: dict[str, Any] = {
            # Volcano's mutating webhook sets an absent weight to 1; emitting it keeps the
            # plan equal to the live object. Only the proportion plugin (flat) reads it.
            "weight": team.quota.weight or 1,
            "reclaimable": team.quota.reclaimable,
            # Flat mode's proportion plugin derives deserved from weight and never reads it,
            # but Volcano's webhook refuses a guarantee without a deserved at least as large
            # (v1.15.1 validate_queue.go validateResourceQuantityOfQueue), so it carries the
            # guarantee there (team.quota.deserved is None: the loader refuses it in flat).
            "deserved": quotas["deserved"],
            "guarantee": {"resource": quotas["guarantee"]},
            "capability": quotas["capability"],
        }
        if hierarchical:
            spec["parent"] = group_queue(team.group) if team.group else ORG_QUEUE
        team_specs[team.name] = spec
    result = []
    if hierarchical:
        pools = supplies(cfg)
        capability = quantities(pools_resources(cfg, [p.name for p in cfg.gpu_pools]))
        group_specs: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        for group in cfg.registry.groups:
            members = [t for t in cfg.registry.teams if t.group == group.name]
            if not members:
                continue
            member_specs = [team_specs[t.name] for t in members]
            guarantee_gpus, deserved_gpus = group_envelope(cfg, group)
            spec = _parent_spec(
                ORG_QUEUE,
                member_specs,
                guarantee=share(guarantee_gpus),
                deserved=share(deserved_gpus),
                # The organisation's: what bounds a group is its real capability, the
                # parent's minus its siblings' guarantees (v1.15.1 capacity.go
                # checkHierarchicalQueue), which keeps every other group's guarantee free. A
                # capability from its teams' would change with every team quota and so undo
                # the envelopes (issue 15 #5).
                capability=capability,
            )
            group_specs.append((group.name, spec, {labels.ROLE: "group", labels.GROUP: group.name}))
        org_children = [g[1] for g in group_specs] + [
            team_specs[t.name] for t in cfg.registry.teams if not t.group
        ]
        org = _parent_spec(
            ROOT_QUEUE,
            org_children,
            guarantee=share(sum(p.firm for p in pools.values())),
            deserved=share(sum(p.total for p in pools.values())),
            capability=capability,
        )
        org["reclaimable"] = False
        result.append(_queue(cfg, ORG_QUEUE, org, {labels.ROLE: "organisation"}))
        for name, spec, extra in group_specs:
            result.append(_queue(cfg, group_queue(name), spec, extra))
    for team in cfg.registry.teams:
        extra = {labels.ROLE: "team", labels.TEAM: team.name}
        if team.group:
            extra[labels.GROUP] = team.group
        result.append(_queue(cfg, team.queue, team_specs[team.name], extra))
    return result


def _parent_spec(
    parent: str,
    children: list[dict[str, Any]],
    *,
    guarantee: dict[str, str],
    deserved: dict[str, str],
    capability: dict[str, str],
) -> dict[str, Any]:
    """A parent queue's envelope, raised to its children's sum where that is larger."""
    return {
        "parent": parent,
        "reclaimable": True,
        "deserved": _max_lists([deserved, _sum_lists([c["deserved"] for c in children])]),
        "guarantee": {
            "resource": _max_lists(
                [guarantee, _sum_lists([c["guarantee"]["resource"] for c in children])]
            )
        },
        "capability": capability,
    }


def priority_classes(cfg: PlatformConfig) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {
                "name": priority_class_name(name),
                "labels": labels.base_labels(cfg.stack),
            },
            "value": value,
            "preemptionPolicy": policy,
            "globalDefault": False,
            "description": description,
        }
        for name, (value, policy, description) in PRIORITY_CLASSES.items()
    ]


def topology_enabled(cfg: PlatformConfig) -> bool:
    """HyperNodes the platform writes, or Volcano discovers (builders/topology.py)."""
    return topology.discovers(cfg) or (cfg.scheduling.topology_aware and bool(hypernodes(cfg)))


def scheduler_config(cfg: PlatformConfig) -> dict[str, Any]:
    """The scheduler configuration for training, explained in docs/scheduling.md."""
    preempt = cfg.scheduling.preemption
    # enqueue conflicts with preempt/reclaim (volcano#4756) and hides gang pods from
    # cluster autoscalers, so it is used only when nothing is preempted.
    actions = (
        ["allocate", "preempt", "reclaim", "backfill"]
        if preempt
        else ["enqueue", "allocate", "backfill"]
    )
    share = (
        {"name": "capacity", "enableHierarchy": True}
        if cfg.scheduling.queue_mode == "hierarchical"
        else {"name": "proportion"}
    )
    tier2: list[dict[str, Any]] = [
        {"name": "drf", "enablePreemptable": False},
        {"name": "predicates"},
        share,
        {"name": "nodeorder"},
        {
            "name": "binpack",
            "arguments": {
                "binpack.resources": GPU_RESOURCE,
                f"binpack.resources.{GPU_RESOURCE}": 10,
            },
        },
    ]
    if not preempt:
        tier2.insert(0, {"name": "overcommit"})
    if topology_enabled(cfg):
        tier2.append(
            {
                "name": "network-topology-aware",
                "arguments": {"weight": 10, "hypernode.binpack.resources": GPU_RESOURCE},
            }
        )
    conf: dict[str, Any] = {
        "actions": ", ".join(actions),
        "tiers": [
            {
                "plugins": [
                    {"name": "priority"},
                    {"name": "gang", "enablePreemptable": False},
                    {"name": "conformance"},
                ]
            },
            {"plugins": tier2},
        ],
    }
    if preempt:
        conf["configurations"] = [{"name": "preempt", "arguments": preempt_arguments(cfg)}]
    return conf


# Volcano v1.15.1's default cap on the nodes a preemptor's dry run considers
# (actions/preempt/preempt.go New: maxCandidateNodesAbsolute 100).
VOLCANO_MAX_CANDIDATES = 100


def preempt_arguments(cfg: PlatformConfig) -> dict[str, Any]:
    """Which node a preemptor takes (docs/scheduling.md, "Priority classes").

    By default Volcano walks nodes in score order and evicts the lowest-priority victims of
    the first node that fits, so a normal job can go while a preemptible one elsewhere keeps
    running (v1.15.1 actions/preempt/preempt.go normalPreempt). enableTopologyAwarePreemption
    picks, like kube-scheduler, the node whose highest-priority victim is lowest
    (SelectCandidate, pickOneNodeForPreemption) — but only among the candidates of a dry run
    over ``minCandidateNodesPercentage`` (default 10) % of the nodes the preemptor fits, at
    least 1, from a random offset (calculateNumCandidates, GetOffsetAndNumCandidates): on a
    pool of four nodes that is one node at random, and a normal job went while a preemptible
    one ran (issue 39 #3). 100 % of them, capped no lower than every GPU node the platform can
    run, makes the choice the documented one. Integers, unquoted: the scheduler reads the
    configuration with gopkg.in/yaml.v2 and takes only Go ints (framework/arguments.go GetInt).
    """
    gpu_nodes = sum(max_nodes(pool) for pool in cfg.gpu_pools)
    return {
        "enableTopologyAwarePreemption": True,
        "minCandidateNodesPercentage": 100,
        "maxCandidateNodesAbsolute": max(VOLCANO_MAX_CANDIDATES, gpu_nodes),
    }


def volcano_values(cfg: PlatformConfig) -> dict[str, Any]:
    """Only keys that exist in the chart's values.yaml (checked in tests)."""
    return {
        "custom": {
            "scheduler_config_override": yaml.safe_dump(scheduler_config(cfg), sort_keys=False),
            "scheduler_metrics_enable": True,
            "controller_metrics_enable": True,
            "default_ns": {labels.ROLE: "system"} if cfg.cloud == "aws" else None,
            "leader_elect_enable": True,
            "scheduler_replicas": 2 if cfg.environment == "production" else 1,
            **(
                {"controller_config_override": conf}
                if (conf := topology.controller_config(cfg))
                else {}
            ),
        }
    }


def hypernodes(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Tier 1: one per pool (a placement group or the pool's nodes); tier 2: per zone. None
    when Volcano discovers the topology from node labels: one tree (builders/topology.py)."""
    if topology.discovers(cfg):
        return []
    result: list[dict[str, Any]] = []
    zones: dict[str, list[str]] = {}
    for pool in cfg.gpu_pools:
        if pool.aws is not None:
            if pool.aws.placement_group:
                match = {PLACEMENT_GROUP: placement_group_name(cfg.cluster_name, pool)}
            elif pool.aws.capacity.type == "capacityBlock":
                # EC2 places a block's instances together (in an UltraCluster) without a
                # placement group (EC2 user guide, ec2-capacity-blocks; issue 39 #7).
                match = {labels.POOL: pool.name}
            else:
                continue  # no placement guarantee among the pool's nodes
            zones.setdefault(str(pool.aws.availability_zone), []).append(pool.name)
        else:
            assert pool.existing is not None
            match = dict(pool.existing.node_selector)
            zones.setdefault("cluster", []).append(pool.name)
        result.append(
            _hypernode(cfg, f"pool-{pool.name}", 1, "pool", [
                {"type": "Node", "selector": {"labelMatch": {"matchLabels": match}}}
            ])
        )  # fmt: skip
    for zone, pools in sorted(zones.items()):
        members = [
            {"type": "HyperNode", "selector": {"exactMatch": {"name": f"pool-{p}"}}}
            for p in sorted(pools)
        ]
        result.append(_hypernode(cfg, f"zone-{zone}", 2, "zone", members))
    return result


def _hypernode(
    cfg: PlatformConfig, name: str, tier: int, tier_name: str, members: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "labels": labels.base_labels(cfg.stack)},
        "spec": {"tier": tier, "tierName": tier_name, "members": members},
    }


# The svc job plugin otherwise creates an ingress-only NetworkPolicy per job that blocks
# Prometheus from scraping trainers; team namespaces get their own policy instead.
SVC_PLUGIN_ARGS = ("--disable-network-policy=true",)


def scheduling_output(cfg: PlatformConfig) -> dict[str, Any]:
    """Queue mode, priority classes and capacity, for team stacks and PR previews."""
    return {
        "queueMode": cfg.scheduling.queue_mode,
        "priorityClasses": {
            name: {"className": priority_class_name(name), "value": value}
            for name, (value, _, _) in PRIORITY_CLASSES.items()
        },
        "capacity": {**summary(cfg), "dimensions": dimensions(cfg)},
    }


def dimensions(cfg: PlatformConfig) -> dict[str, dict[str, str]]:
    """Per resource: what all pools hold at their maximum size, and the teams' capabilities
    summed (borrowing is bounded per team, so the sum may exceed what exists)."""
    cluster = quantities(pools_resources(cfg, [p.name for p in cfg.gpu_pools]))
    summed = _sum_lists([_capability(cfg, t) for t in cfg.registry.teams])
    return {k: {"cluster": v, "capabilities": summed.get(k, "0")} for k, v in cluster.items()}


def team_scheduling(cfg: PlatformConfig, team: Team) -> dict[str, Any]:
    """A team's queue, pools, priority classes and derived quotas (its `team/<name>` slice)."""
    return {
        "queue": team.queue,
        "pools": list(team.pools),
        "priorityClasses": [priority_class_name(p) for p in team.priority_classes],
        "gpus": {
            "guarantee": team.quota.gpus,
            "deserved": team.quota.deserved_gpus,
            "capability": team.quota.capability_gpus,
        },
        "quota": team_quotas(cfg, team),
        # What a job spec's `topology.tier` names, in HyperNode tiers (jobs/render.py).
        "topologyTiers": topology.tiers(cfg),
    }
