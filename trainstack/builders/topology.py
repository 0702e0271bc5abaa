"""Network topology as data: Volcano's HyperNode discovery from node labels, and the tiers a
job's `topology` names (docs/scheduling.md, "Topology").

With `scheduling.topology.source: labels` the platform writes no HyperNode. Volcano's
controller makes them from the nodes' labels (v1.15.1 `pkg/controllers/hypernode`, the `label`
discoverer), reading `volcano-controller.conf` from the ConfigMap its chart renders from
`custom.controller_config_override` (`controller_config` below). What the controller does with
it, read in its source:

- a label list is top tier first and ends with `kubernetes.io/hostname`, which is dropped: the
  label just above it makes tier 1, whose members are the nodes (by name), and each label
  above makes the next tier, whose members are the HyperNodes below (discovery/label/label.go
  parseCfg, generateHyperNodeInfo, getMemberType); `tierName` is the label's key, and each
  HyperNode carries its label (`<key>: <value>`) and `volcano.sh/network-topology-source:
  label` (buildHyperNodes);
- a node's chain stops at its first missing label, counted from the nearest: a node without
  the nearest label is in no HyperNode (generateHyperNodeInfo `break`);
- a node added or deleted, or whose listed labels change, re-runs the whole discovery
  (AddNode, UpdateNode, DeleteNode), as does a deleted HyperNode (DeleteHyperNode);
- each result is reconciled with the HyperNodes labelled with the source: new ones created,
  existing ones updated, the rest deleted; HyperNodes without that label are left alone
  (hypernode_controller.go reconcileTopology).

So the platform's own pool and zone HyperNodes (`builders/scheduling.hypernodes`) would survive
beside the discovered ones, and the scheduler would see two trees under its virtual root: a
job held to tier 1 could then take a pool HyperNode that spans several network nodes
(plugins/network-topology-aware hyperNodeGradientFn takes every HyperNode at or below the
allowed tier). With `labels` the platform writes none; the discovered tree is the only one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import yaml

from trainstack.config.model import PlatformConfig
from trainstack.config.topology import HOSTNAME_LABEL

# The label Volcano's controller puts on the HyperNodes a discovery source made, and lists
# them by (pkg/controllers/hypernode/api/types.go NetworkTopologySourceLabelKey).
SOURCE_LABEL: Final = "volcano.sh/network-topology-source"
LABEL_SOURCE: Final = "label"  # the label discoverer's name (discovery/label/label.go Name)
# The network topology type: part of every discovered HyperNode's name,
# `hypernode-<type>-tier<n>-<5 random characters>` (label.go buildHyperNodeName); Volcano
# skips a type whose name is longer than 20 characters (parseCfg, networkTopologyTypeLength).
TOPOLOGY_TYPE: Final = "trainstack"

# Where the controller reads its configuration: ConfigMap `$HELM_RELEASE_NAME-controller-
# configmap` in `$KUBE_POD_NAMESPACE`, key volcano-controller.conf (config/loader.go,
# configmap_handler.go setConfigMapNamespaceAndName); the chart sets both variables to the
# release's name and namespace (installer/helm/chart/volcano/templates/controllers.yaml).
# The platform installs the chart as release `volcano` (the add-on's key,
# components/kube.addon_release).
VOLCANO_RELEASE: Final = "volcano"
CONTROLLER_CONF_KEY: Final = "volcano-controller.conf"


def controller_configmap_name(release: str = VOLCANO_RELEASE) -> str:
    return f"{release}-controller-configmap"


# Job-facing tiers with `source: pools`: a pool's nodes, then a zone's pools
# (builders/scheduling.hypernodes).
POOL_TIERS: Final[Mapping[str, int]] = {"pool": 1, "zone": 2}


def discovers(cfg: PlatformConfig) -> bool:
    """Whether Volcano's controller makes the HyperNodes (from the nodes' labels)."""
    return cfg.scheduling.topology_aware and cfg.scheduling.topology.source == "labels"


def node_labels(cfg: PlatformConfig) -> list[str]:
    """The labels of the topology type, top tier first, ending with the node itself."""
    return [*cfg.scheduling.topology.labels, HOSTNAME_LABEL]


def tier_of(cfg: PlatformConfig, label: str) -> int:
    """The HyperNode tier Volcano gives `label`: 1 for the nearest, counting up."""
    labels = cfg.scheduling.topology.labels
    return len(labels) - labels.index(label)


def tiers(cfg: PlatformConfig) -> dict[str, int]:
    """The HyperNode tier each job-facing tier name stands for (a job spec's
    `topology.tier`, rendered as `highestTierAllowed`: jobs/render.py).

    `pool`: the nearest grouping the platform knows, tier 1: the pool with `source: pools`,
    the nodes under one network node of the nearest layer with `labels` (on EKS, "physically
    closest to each other"). `zone`: the broadest, the top tier: the zone with `pools` and
    with the EKS default (whose top label is the zone), the top label otherwise.
    """
    if not discovers(cfg):
        return dict(POOL_TIERS)
    return {"pool": 1, "zone": len(cfg.scheduling.topology.labels)}


def discovery(cfg: PlatformConfig) -> dict[str, Any]:
    """One `networkTopologyDiscovery` entry: the `label` source over the platform's labels
    (api/types.go DiscoveryConfig; discovery/label/label.go NetworkTopologyType). No
    `interval`: the label discoverer runs on node events, not on a timer."""
    return {
        "source": LABEL_SOURCE,
        "enabled": True,
        "config": {
            "networkTopologyTypes": {
                TOPOLOGY_TYPE: [{"nodeLabel": label} for label in node_labels(cfg)]
            }
        },
    }


def controller_config(cfg: PlatformConfig) -> dict[str, Any] | None:
    """`custom.controller_config_override`, or None when Volcano discovers nothing.

    A mapping, not YAML text as `scheduler_config_override` is: the chart writes it with
    `toYaml` (templates/controllers.yaml: `{{ toYaml .Values.custom.controller_config_override
    | nindent 4 }}`), which turns a string into a YAML string scalar (`|` and the text), and
    the controller then fails to read the file into its configuration (config/loader.go
    LoadConfig, yaml.Unmarshal). Rendered with Helm v3.18.6's engine, the version
    pulumi-kubernetes embeds: a mapping comes out as the mapping, a string as `|` and the
    string (docs/scheduling.md, "Topology")."""
    if not discovers(cfg):
        return None
    return {"networkTopologyDiscovery": [discovery(cfg)]}


def controller_conf(override: Mapping[str, Any] | None) -> str:
    """`volcano-controller.conf` as the chart renders it from the values: the override
    through `toYaml`, or empty (the controller then discovers nothing)."""
    return yaml.safe_dump(dict(override), sort_keys=False) if override else ""


def controller_conf_problem(
    cfg: PlatformConfig, namespace: str, name: str
) -> Callable[[Mapping[str, Any]], str | None]:
    """For a pre-installed Volcano (builders/addons.probes): its controller ConfigMap must
    enable the platform's label discovery, or no HyperNode is ever made and every job with a
    hard `topology` waits."""
    wanted = discovery(cfg)

    def problem(obj: Mapping[str, Any]) -> str | None:
        text = (obj.get("data") or {}).get(CONTROLLER_CONF_KEY)
        try:
            found = yaml.safe_load(text) if isinstance(text, str) else None
        except yaml.YAMLError:
            found = None
        entries = found.get("networkTopologyDiscovery") if isinstance(found, dict) else None
        if isinstance(entries, list) and wanted in entries:
            return None
        return (
            f"addons.volcano: ConfigMap {namespace}/{name} ({CONTROLLER_CONF_KEY}) does not "
            "enable the label network topology discovery over "
            f"{', '.join(node_labels(cfg))}, so Volcano makes no HyperNode and jobs with a "
            "hard topology wait: install Volcano with the values "
            f"`trainstack preview {cfg.stack}` writes to build/{cfg.stack}/helm/volcano.yaml "
            "(custom.controller_config_override)"
        )

    return problem
