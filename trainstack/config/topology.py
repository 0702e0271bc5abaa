"""`scheduling.topology`: where Volcano's HyperNodes come from (docs/scheduling.md, "Topology").

Two sources, one tree at a time:

- `labels`: Volcano's controller (v1.15.1, the `label` network topology discovery) turns node
  labels into HyperNodes and keeps them current as nodes come, go and change. The platform
  only says which labels, top tier first (builders/topology.py writes the controller's
  configuration). On AWS the default is the labels EKS puts on nodes of the instance types
  EC2 reports a network topology for.
- `pools`: the platform writes one HyperNode per pool and one per zone (builders/scheduling.py
  `hypernodes`), as before issue 46.

The defaults depend on the cloud and the pools' instance types, so they are filled here rather
than in the schema (as `health.repair.mode` is in config/health.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from trainstack.config import model as m
from trainstack.config.errors import ConfigIssue, join_path

# Volcano takes the node itself from this label: the last entry of a label topology type
# (pkg/controllers/hypernode/discovery/label/label.go parseCfg drops it, whatever it is, and
# makes tier-1 members of the nodes' names). trainstack appends it; users never list it.
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"

# What EKS labels nodes with (EKS user guide, "Place distributed AI/ML workloads with network
# topology labels", ml-workload-topology): layer 1 "the top of the network hierarchy, the
# broadest grouping", layer 2 "the middle layer", layer 3 "the bottom layer for most supported
# instance types ... nodes that share this value are physically closest to each other", layer
# 4 "present only on instance types whose topology has four layers", their bottom layer.
EKS_LAYER_LABELS: Final = tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3, 4))

# How many network nodes DescribeInstanceTopology returns per instance type, i.e. the layers
# EKS labels (EC2 user guide, "Prerequisites for Amazon EC2 topology", Instance types; "How
# Amazon EC2 topology works": "EC2 instances connect into the network at or below the third
# layer, depending on the instance type"). A type not listed gets no network labels.
EC2_TOPOLOGY_LAYERS: Final[Mapping[str, int]] = {
    **dict.fromkeys(
        [
            *(f"g6e.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge",
                                   "16xlarge", "24xlarge", "48xlarge")),
            *(f"g7e.{s}" for s in ("2xlarge", "4xlarge", "8xlarge", "12xlarge", "24xlarge",
                                   "48xlarge")),
            "hpc6a.48xlarge", "hpc6id.32xlarge", "hpc7g.4xlarge", "hpc7g.8xlarge",
            "hpc7g.16xlarge", "hpc7a.12xlarge", "hpc7a.24xlarge", "hpc7a.48xlarge",
            "hpc7a.96xlarge",
            "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge",
            "p5en.48xlarge", "p6e-gb200.36xlarge",
            "trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge",
        ],
        3,
    ),
    "p6-b200.48xlarge": 4,
    "p6-b300.48xlarge": 4,
}  # fmt: skip


def eks_labels(instance_types: Iterable[str]) -> tuple[str, ...] | None:
    """The default on AWS: the zone, then EKS's network layers, top first; None when no
    instance type has a network topology. Four layers only when every type that has one has
    four: a three-layer node has no layer-4 label, and Volcano leaves a node whose nearest
    label is missing out of every HyperNode (label.go generateHyperNodeInfo breaks at the
    first missing label, walking up from the nearest)."""
    layers = {EC2_TOPOLOGY_LAYERS[t] for t in instance_types if t in EC2_TOPOLOGY_LAYERS}
    if not layers:
        return None
    return (ZONE_LABEL, *EKS_LAYER_LABELS[: min(layers)])


def _instance_types(doc: Mapping[str, Any]) -> list[str]:
    pools = doc.get("gpuPools")
    if not isinstance(pools, list):
        return []
    return [
        str(p["instanceType"])
        for p in pools
        if isinstance(p, Mapping) and isinstance(p.get("instanceType"), str)
    ]


def topology_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    """What the schema cannot say about `scheduling.topology`; tolerant of wrong shapes."""
    scheduling = doc.get("scheduling")
    if not isinstance(scheduling, Mapping):
        return []
    section = scheduling.get("topology")
    if not isinstance(section, Mapping):
        return []
    path = join_path(root, "scheduling", "topology")
    issues: list[ConfigIssue] = []
    if scheduling.get("topologyAware") is False:
        issues.append(
            ConfigIssue(path, "topologyAware is false, so no HyperNode is made; remove topology")
        )
    source = section.get("source")
    labels = section.get("labels")
    if source == "pools" and labels is not None:
        issues.append(
            ConfigIssue(
                join_path(path, "labels"),
                "read only with source: labels (source pools makes HyperNodes from the pools); "
                "remove labels or set source: labels",
            )
        )
    if isinstance(labels, list) and HOSTNAME_LABEL in labels:
        issues.append(
            ConfigIssue(
                join_path(path, "labels", labels.index(HOSTNAME_LABEL)),
                f"{HOSTNAME_LABEL} is the node itself, which trainstack adds below the "
                "nearest label; list only the network's labels, top tier first",
            )
        )
    if source == "labels" and labels is None:
        cloud = doc.get("cloud")
        if cloud == "existing":
            issues.append(
                ConfigIssue(
                    join_path(path, "labels"),
                    "source labels on an existing cluster needs the node labels of its "
                    "network, top tier first (e.g. [network.topology.nvidia.com/spine, "
                    "network.topology.nvidia.com/leaf]; docs/scheduling.md, Topology)",
                )
            )
        elif cloud == "aws" and eks_labels(_instance_types(doc)) is None:
            issues.append(
                ConfigIssue(
                    join_path(path, "source"),
                    "no GPU pool's instance type has an EC2 network topology, so EKS labels "
                    "no node with one (EC2 topology prerequisites: "
                    f"{', '.join(sorted({t.split('.')[0] for t in EC2_TOPOLOGY_LAYERS}))}); "
                    "list the labels your nodes carry, or use source: pools",
                )
            )
    return issues


def build_topology(doc: Mapping[str, Any]) -> m.Topology:
    """The typed `scheduling.topology`, its defaults filled (the checks above passed)."""
    scheduling = doc["scheduling"]
    section: Mapping[str, Any] = scheduling.get("topology") or {}
    labels: Sequence[str] | None = section.get("labels")
    source = section.get("source") or ("labels" if labels is not None else None)
    if not scheduling["topologyAware"]:
        return m.Topology()
    if labels is None and doc["cloud"] == "aws" and source in ("labels", None):
        labels = eks_labels(_instance_types(doc))
    if source is None:
        source = "labels" if labels is not None else "pools"
    if source == "pools":
        return m.Topology()
    assert labels is not None
    return m.Topology(source="labels", labels=tuple(labels))
