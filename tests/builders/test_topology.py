"""HyperNodes from the nodes' network labels (issue 46 #6, builders/topology.py): the
configuration Volcano's controller reads, checked against Volcano's own sources at the pinned
version (Go module cache; skipped without it), and the one-tree rule.

What the controller then does with it, on a real control plane: tests/e2e/test_topology.py."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders.test_scheduling import config, team
from tests.components.test_addons import onprem
from tests.conftest import ROOT
from tests.volcano_chart import CHART_DIR, volcano_source
from trainstack.builders import addons, scheduling, topology
from trainstack.config import PlatformConfig, load_stack_file, read_stack_file
from trainstack.config.k8s_syntax import qualified_name
from trainstack.config.topology import EKS_LAYER_LABELS, HOSTNAME_LABEL, ZONE_LABEL

HYPERNODE = Path("pkg/controllers/hypernode")
FABRIC = ["network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf"]


def prod() -> PlatformConfig:
    cfg = load_stack_file(ROOT / "stacks" / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def fabric_scheduling() -> dict[str, Any]:
    """onprem's `scheduling`, with its fabric's labels as the topology."""
    doc = read_stack_file(ROOT / "stacks" / "Pulumi.onprem.yaml")
    return {**doc["trainstack:platform"]["scheduling"], "topology": {"labels": FABRIC}}


def fabric_cluster() -> PlatformConfig:
    return onprem(scheduling=fabric_scheduling())


def volcano_tiers(entries: list[dict[str, str]]) -> dict[str, int]:
    """Volcano's numbering (discovery/label/label.go parseCfg): the last entry is dropped, the
    rest reversed, tier = position + 1; so tier 1 is the label above the hostname."""
    record = [e["nodeLabel"] for e in entries][-2::-1]
    return {label: index + 1 for index, label in enumerate(record)}


@pytest.mark.parametrize("make", [prod, fabric_cluster], ids=["eks", "fabric"])
def test_the_discovery_is_one_label_topology_type_volcano_accepts(make: Any) -> None:
    cfg = make()
    conf = topology.controller_config(cfg)
    assert conf is not None
    [entry] = conf["networkTopologyDiscovery"]
    assert (entry["source"], entry["enabled"]) == ("label", True)  # api/types.go, label.go Name
    [(name, entries)] = entry["config"]["networkTopologyTypes"].items()
    # label.go parseCfg: a type name over 20 characters is skipped; cleanString keeps lowercase
    # letters, digits, '.' and '-', so the HyperNode names stay DNS subdomains
    assert len(name) <= 20
    assert re.fullmatch(r"[a-z0-9.-]+", name)
    labels = [e["nodeLabel"] for e in entries]
    # the last entry is the node itself (dropped by parseCfg); no label twice (checkLabels
    # skips the whole type); every entry a label key the API server accepts
    assert labels[-1] == HOSTNAME_LABEL
    assert len(set(labels)) == len(labels)
    assert all(not qualified_name(label) for label in labels)
    # the tiers the platform publishes for jobs are Volcano's
    tiers = volcano_tiers(entries)
    assert topology.tiers(cfg) == {"pool": 1, "zone": max(tiers.values())}
    for label in cfg.scheduling.topology.labels:
        assert topology.tier_of(cfg, label) == tiers[label]


def test_eks_tiers_are_the_network_layers_nearest_first_and_the_zone_on_top() -> None:
    """EKS: layer 3 is "the bottom layer for most supported instance types", "physically
    closest"; layer 1 "the top of the network hierarchy" (ml-workload-topology)."""
    entries = topology.discovery(prod())["config"]["networkTopologyTypes"]["trainstack"]
    assert volcano_tiers(entries) == {
        EKS_LAYER_LABELS[2]: 1,
        EKS_LAYER_LABELS[1]: 2,
        EKS_LAYER_LABELS[0]: 3,
        ZONE_LABEL: 4,
    }


def test_one_tree_the_platform_writes_no_hypernode_volcano_discovers() -> None:
    """Volcano's reconcile leaves HyperNodes without its source label alone, and the scheduler
    takes every HyperNode at or below a job's tier: pool HyperNodes beside discovered ones
    would let a tier-1 job span network nodes (builders/topology.py)."""
    cfg = prod()
    assert topology.discovers(cfg)
    assert scheduling.hypernodes(cfg) == []
    assert scheduling.topology_enabled(cfg)  # the network-topology-aware plugin is on
    plugins = [p["name"] for t in scheduling.scheduler_config(cfg)["tiers"] for p in t["plugins"]]
    assert "network-topology-aware" in plugins
    pools = config([team("a", 0, ["h100"])], topology={"source": "pools"})
    assert scheduling.hypernodes(pools)
    assert topology.controller_config(pools) is None
    assert "controller_config_override" not in scheduling.volcano_values(pools)["custom"]


def test_the_values_carry_a_mapping_because_the_chart_writes_it_with_toyaml() -> None:
    """templates/controllers.yaml writes `toYaml .Values.custom.controller_config_override`
    into volcano-controller.conf (and scheduler.yaml writes its override as text). A string
    would reach the controller as a YAML string scalar; rendered with Helm v3.18.6's engine
    (pulumi-kubernetes' own), a mapping comes out as itself (docs/scheduling.md, Topology)."""
    template = (volcano_source() / CHART_DIR / "templates" / "controllers.yaml").read_text()
    assert "{{ toYaml .Values.custom.controller_config_override | nindent 4 }}" in template
    assert "name: {{ .Release.Name }}-controller-configmap" in template
    assert "  volcano-controller.conf: |" in template
    for variable, value in (
        ("KUBE_POD_NAMESPACE", "{{ .Release.Namespace }}"),
        ("HELM_RELEASE_NAME", "{{ .Release.Name }}"),
    ):
        assert f"- name: {variable}\n            value: {value}" in template
    scheduler = (volcano_source() / CHART_DIR / "templates" / "scheduler.yaml").read_text()
    assert "{{- .Values.custom.scheduler_config_override | nindent 4 }}" in scheduler
    custom = scheduling.volcano_values(prod())["custom"]
    assert isinstance(custom["controller_config_override"], dict)
    assert isinstance(custom["scheduler_config_override"], str)
    conf = topology.controller_conf(custom["controller_config_override"])
    assert yaml.safe_load(conf) == custom["controller_config_override"]
    assert topology.controller_conf(None) == ""


def test_names_and_labels_are_volcanos() -> None:
    """The constants the platform and the sandbox rely on, in Volcano's source."""
    source = volcano_source() / HYPERNODE
    loader = (source / "config" / "loader.go").read_text()
    assert 'NamespaceEnvKey    = "KUBE_POD_NAMESPACE"' in loader
    assert 'ReleaseNameEnvKey  = "HELM_RELEASE_NAME"' in loader
    assert f'DefaultConfigKey = "{topology.CONTROLLER_CONF_KEY}"' in loader
    handler = (source / "configmap_handler.go").read_text()
    assert 'releaseName + "-controller-configmap"' in handler
    assert topology.controller_configmap_name() == "volcano-controller-configmap"
    types = (source / "api" / "types.go").read_text()
    assert f'NetworkTopologySourceLabelKey = "{topology.SOURCE_LABEL}"' in types
    label = (source / "discovery" / "label" / "label.go").read_text()
    assert "networkTopologyTypeLength = 20" in label
    assert f'api.RegisterDiscoverer("{topology.LABEL_SOURCE}", NewLabelDiscoverer)' in label


def test_a_pre_installed_volcano_must_discover_the_platforms_labels() -> None:
    cfg = onprem({"volcano": {"preInstalled": True}}, scheduling=fabric_scheduling())
    [probe] = [
        p
        for p in addons.probes(cfg, "volcano")
        if p.kind == "ConfigMap" and p.name == "volcano-controller-configmap"
    ]
    assert probe.namespace == "volcano-system"
    conf = topology.controller_conf(topology.controller_config(cfg))
    assert probe.problem({"data": {"volcano-controller.conf": conf}}) is None
    # other sources beside it are the owners' business
    both: dict[str, Any] = copy.deepcopy(topology.controller_config(cfg)) or {}
    both["networkTopologyDiscovery"].insert(0, {"source": "ufm", "enabled": True})
    assert probe.problem({"data": {"volcano-controller.conf": yaml.safe_dump(both)}}) is None
    assert probe.problem({"data": {"volcano-controller.conf": ""}}) == (
        "addons.volcano: ConfigMap volcano-system/volcano-controller-configmap "
        "(volcano-controller.conf) does not enable the label network topology discovery over "
        "network.topology.nvidia.com/spine, network.topology.nvidia.com/leaf, "
        "kubernetes.io/hostname, so Volcano makes no HyperNode and jobs with a hard topology "
        "wait: install Volcano with the values `trainstack preview onprem` writes to "
        "build/onprem/helm/volcano.yaml (custom.controller_config_override)"
    )
    # with the pools' HyperNodes, nothing to check
    assert not [p for p in addons.probes(onprem({"volcano": {"preInstalled": True}}), "volcano")
                if p.name == "volcano-controller-configmap"]  # fmt: skip


def test_team_slices_publish_the_tiers() -> None:
    cfg = prod()
    for t in cfg.registry.teams:
        assert scheduling.team_scheduling(cfg, t)["topologyTiers"] == {"pool": 1, "zone": 4}
    pools = config([team("a", 0, ["h100"])], topology={"source": "pools"})
    assert scheduling.team_scheduling(pools, pools.registry.teams[0])["topologyTiers"] == {
        "pool": 1,
        "zone": 2,
    }
