"""Volcano as data: capacity arithmetic, queues, priority classes, scheduler config and
HyperNodes. The admission policies on Volcano objects live in builders/admission.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import yaml

from trainstack.builders import labels
from trainstack.builders.fabric import GPU_RESOURCE, HUGEPAGES_RESOURCE
from trainstack.builders.pools import (
    PLACEMENT_GROUP,
    fabric_profile,
    gpus_per_node,
    instance_of,
    max_nodes,
    placement_group_name,
)
from trainstack.config.errors import ConfigIssue
from trainstack.config.model import GpuPool, Group, PlatformConfig, Team

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


# -- capacity ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolCapacity:
    """GPUs a pool can provide at its maximum size, split by how they are bought."""

    name: str
    gpus: int
    kind: str  # reserved | onDemand | spot | existing

    @property
    def firm(self) -> bool:
        """Spot capacity can vanish at any time, so it cannot back a guarantee."""
        return self.kind != "spot"


def pool_capacity(pool: GpuPool) -> PoolCapacity:
    gpus = gpus_per_node(pool) * max_nodes(pool)
    if pool.aws is None:
        return PoolCapacity(pool.name, gpus, "existing")
    kind = pool.aws.capacity.type
    return PoolCapacity(
        pool.name, gpus, "reserved" if kind in ("reservation", "capacityBlock") else kind
    )


def firm_and_total(cfg: PlatformConfig) -> tuple[int, int]:
    """GPUs of all pools at their maximum size: those that can back a guarantee, and all."""
    caps = [pool_capacity(p) for p in cfg.gpu_pools]
    return sum(c.gpus for c in caps if c.firm), sum(c.gpus for c in caps)


def capacity_summary(cfg: PlatformConfig) -> dict[str, int]:
    caps = [pool_capacity(p) for p in cfg.gpu_pools]
    summary = {
        kind: sum(c.gpus for c in caps if c.kind == kind)
        for kind in ("reserved", "onDemand", "spot", "existing")
    }
    summary["total"] = sum(c.gpus for c in caps)
    summary["guaranteed"] = sum(t.quota.gpus for t in cfg.registry.teams)
    summary["deserved"] = sum(t.quota.deserved_gpus for t in cfg.registry.teams)
    return summary


def _teams_text(teams: list[Team], attr: str = "gpus") -> str:
    def amount(team: Team) -> int:
        return team.quota.gpus if attr == "gpus" else team.quota.deserved_gpus

    return " + ".join(f"{t.name} ({amount(t)})" for t in teams)


def capacity_issues(cfg: PlatformConfig) -> list[ConfigIssue]:
    """Quota arithmetic nobody else checks, with the teams and numbers in each message."""
    issues: list[ConfigIssue] = []
    teams = cfg.registry.teams
    caps = {p.name: pool_capacity(p) for p in cfg.gpu_pools}
    # Hall's condition: every set of teams must fit in the firm capacity of the union of
    # their pools. Checking each pool subset S against the teams confined to S covers it.
    names = sorted(caps)
    reported: list[frozenset[str]] = []
    for size in range(1, len(names) + 1):
        for subset in itertools.combinations(names, size):
            pools = frozenset(subset)
            if any(seen <= pools for seen in reported):
                continue  # a smaller violating set already explains this one
            confined = [t for t in teams if t.pools and set(t.pools) <= pools]
            need = sum(t.quota.gpus for t in confined)
            firm = sum(caps[p].gpus for p in pools if caps[p].firm)
            if need > firm:
                spot = sum(caps[p].gpus for p in pools if not caps[p].firm)
                spot_note = f"; spot ({spot}) cannot back a guarantee" if spot else ""
                issues.append(
                    ConfigIssue(
                        "trainstack:platform.registry.teams",
                        f"guarantees exceed capacity: {_teams_text(confined)} = {need} GPUs, "
                        f"but pools {', '.join(sorted(pools))} provide {firm} firm GPUs"
                        f"{spot_note}; lower the guarantees or grow the pools",
                    )
                )
                reported.append(pools)
    _, total = firm_and_total(cfg)
    deserved = sum(t.quota.deserved_gpus for t in teams)
    if caps and deserved > total:
        issues.append(
            ConfigIssue(
                "trainstack:platform.registry.teams",
                f"deserved shares exceed capacity: {_teams_text(list(teams), 'deserved')} = "
                f"{deserved} GPUs, but all pools provide {total}; fair shares could never "
                "be honoured",
            )
        )
    for index, group in enumerate(cfg.registry.groups):
        children = [t for t in teams if t.group == group.name]
        need = sum(t.quota.gpus for t in children)
        if group.quota_gpus is not None and group.quota_gpus < need:
            issues.append(
                ConfigIssue(
                    f"trainstack:platform.registry.groups[{index}].quota.gpus",
                    f"group {group.name} guarantees {group.quota_gpus} GPUs but its teams "
                    f"{_teams_text(children)} = {need}; a parent's guarantee must cover "
                    "its children's",
                )
            )
        guarantee, _ = group_envelope(cfg, group)
        members_deserved = sum(t.quota.deserved_gpus for t in children)
        if group.deserved_gpus is not None and group.deserved_gpus < max(
            guarantee, members_deserved
        ):
            issues.append(
                ConfigIssue(
                    f"trainstack:platform.registry.groups[{index}].quota.deserved",
                    f"group {group.name} deserves {group.deserved_gpus} GPUs but its guarantee "
                    f"is {guarantee} and its teams {_teams_text(children, 'deserved')} = "
                    f"{members_deserved}; raise it to at least "
                    f"{max(guarantee, members_deserved)}",
                )
            )
    if caps:
        issues += _envelope_issues(cfg)
    return issues


def _envelope_issues(cfg: PlatformConfig) -> list[ConfigIssue]:
    """Group quotas with headroom (more than their teams' sums) must still fit the pools: the
    organisation queue carries what the pools provide (queues), and Volcano's webhook refuses
    children whose sum exceeds it."""
    grouped = [g for g in cfg.registry.groups if any(t.group == g.name for t in cfg.registry.teams)]
    if not any(g.quota_gpus is not None for g in grouped):
        return []  # every group carries its teams' sums: the team checks above cover them
    envelopes = {g.name: group_envelope(cfg, g) for g in grouped}
    loose = [t for t in cfg.registry.teams if not t.group]
    firm, total = firm_and_total(cfg)
    issues = []
    for at, limit, what, kind in (
        (0, firm, "guarantees", "firm GPUs"),
        (1, total, "deserved shares", "GPUs"),
    ):
        amounts = {f"group {name}": pair[at] for name, pair in envelopes.items()}
        amounts |= {t.name: (t.quota.gpus, t.quota.deserved_gpus)[at] for t in loose}
        amount = sum(amounts.values())
        if amount > limit:
            parts = " + ".join(f"{name} ({gpus})" for name, gpus in amounts.items())
            issues.append(
                ConfigIssue(
                    "trainstack:platform.registry.groups",
                    f"group {what} exceed capacity: {parts} = {amount}, but all pools provide "
                    f"{limit} {kind}; lower the group quotas or grow the pools",
                )
            )
    return issues


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
        for key, value in per.items():
            shape[key] = max(shape.get(key, 0.0), value)
    return shape


def resource_list(shape: dict[str, float], gpus: int) -> dict[str, str]:
    """Kubernetes quantities for `gpus` GPUs of the given shape (rounded up)."""
    out: dict[str, str] = {}
    for key, per in sorted(shape.items()):
        amount = math.ceil(per * gpus)
        if key == "memory":
            out[key] = f"{amount}Gi"
        elif key == HUGEPAGES_RESOURCE:
            out[key] = f"{amount}Mi"
        else:
            out[key] = str(amount)
    return out


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
    shape = per_gpu_shape(cfg, team)
    return {
        "guarantee": share(team.quota.gpus),
        "deserved": share(team.quota.deserved_gpus),
        "capability": resource_list(shape, team.quota.capability_gpus),
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
            "weight": team.quota.weight,
            "reclaimable": team.quota.reclaimable,
            "deserved": quotas["deserved"],
            "guarantee": {"resource": quotas["guarantee"]},
            "capability": quotas["capability"],
        }
        if hierarchical:
            spec["parent"] = group_queue(team.group) if team.group else ORG_QUEUE
        team_specs[team.name] = spec
    result = []
    if hierarchical:
        shape = pools_shape(cfg, [p.name for p in cfg.gpu_pools])
        firm, total = firm_and_total(cfg)
        capability = _max_lists(
            [resource_list(shape, total), *(s["capability"] for s in team_specs.values())]
        )
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
                capability=capability,
            )
            group_specs.append((group.name, spec, {labels.ROLE: "group", labels.GROUP: group.name}))
        org_children = [g[1] for g in group_specs] + [
            team_specs[t.name] for t in cfg.registry.teams if not t.group
        ]
        org = _parent_spec(
            ROOT_QUEUE,
            org_children,
            guarantee=share(firm),
            deserved=share(total),
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
    return cfg.scheduling.topology_aware and bool(hypernodes(cfg))


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
    return {
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
        }
    }


def hypernodes(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Tier 1: one per pool (a placement group or the pool's nodes); tier 2: per zone."""
    result: list[dict[str, Any]] = []
    zones: dict[str, list[str]] = {}
    for pool in cfg.gpu_pools:
        if pool.aws is not None:
            if not pool.aws.placement_group:
                continue  # no topology guarantee inside a pool that spans zones
            match = {PLACEMENT_GROUP: placement_group_name(cfg.cluster_name, pool)}
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
        "capacity": capacity_summary(cfg),
    }


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
    }
