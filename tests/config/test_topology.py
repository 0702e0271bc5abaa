"""`scheduling.topology` (issue 46 #6): the defaults the loader fills from the cloud and the
pools' instance types. Invalid settings are table-tested by the fixtures
(fixtures/invalid/topology-*.yaml, run by test_loader.py)."""

from __future__ import annotations

from typing import Any

import pytest

from trainstack.catalog import catalog
from trainstack.config import PlatformConfig, parse_stack_config
from trainstack.config import model as m
from trainstack.config.topology import EC2_TOPOLOGY_LAYERS, EKS_LAYER_LABELS, ZONE_LABEL, eks_labels

EKS3 = (ZONE_LABEL, *EKS_LAYER_LABELS[:3])


def _aws(types: list[str], **scheduling: Any) -> PlatformConfig:
    pools = [
        {
            "name": f"p{i}",
            "instanceType": t,
            "fabric": "tcp",
            "availabilityZone": "us-east-1a",
            "size": {"max": 2},
        }
        for i, t in enumerate(types)
    ]
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
        "registry": {
            "teams": [{"name": "vision", "owners": ["a@example.com"], "quota": {"gpus": 0}}]
        },
        "scheduling": scheduling,
    }
    cfg = parse_stack_config({"trainstack:platform": doc}, stack="t", source="test")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def _existing(**scheduling: Any) -> PlatformConfig:
    doc = {
        "cloud": "existing",
        "kubernetesVersion": "1.33",
        "existing": {"context": "lab"},
        "registry": {
            "teams": [{"name": "vision", "owners": ["a@example.com"], "quota": {"gpus": 0}}]
        },
        "scheduling": scheduling,
    }
    cfg = parse_stack_config({"trainstack:platform": doc}, stack="t", source="test")
    assert isinstance(cfg, PlatformConfig)
    return cfg


@pytest.mark.parametrize(
    ("types", "wanted"),
    [
        # EKS labels p5 and g6e nodes with layers 1 to 3, the zone above them
        (["p5.48xlarge"], m.Topology("labels", EKS3)),
        (["g6e.12xlarge", "p5en.48xlarge"], m.Topology("labels", EKS3)),
        # four layers only when every type with a topology has four (p6-b200)
        (["p6-b200.48xlarge"], m.Topology("labels", (ZONE_LABEL, *EKS_LAYER_LABELS))),
        (["p6-b200.48xlarge", "p5.48xlarge"], m.Topology("labels", EKS3)),
        # a type without one is in no HyperNode either way; the others decide
        (["g5.12xlarge", "p5.48xlarge"], m.Topology("labels", EKS3)),
        # no type with a network topology: the pools' HyperNodes, as before
        (["g5.12xlarge", "p5.4xlarge"], m.Topology("pools")),
    ],
)
def test_aws_defaults_to_the_eks_labels_its_instance_types_get(
    types: list[str], wanted: m.Topology
) -> None:
    assert _aws(types).scheduling.topology == wanted


def test_explicit_settings_win() -> None:
    assert _aws(["p5.48xlarge"], topology={"source": "pools"}).scheduling.topology == (
        m.Topology("pools")
    )
    own = ["example.com/spine", "example.com/leaf"]
    for topology in ({"labels": own}, {"source": "labels", "labels": own}):
        cfg = _aws(["p5.48xlarge"], topology=topology)
        assert cfg.scheduling.topology == m.Topology("labels", tuple(own))
    # source labels with g5 only and no labels is an error (fixtures); with labels it is fine
    assert _aws(["g5.12xlarge"], topology={"labels": own}).scheduling.topology.source == "labels"


def test_an_existing_cluster_uses_its_pools_unless_it_names_its_labels() -> None:
    assert _existing().scheduling.topology == m.Topology("pools")
    fabric = ["network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf"]
    assert _existing(topology={"labels": fabric}).scheduling.topology == m.Topology(
        "labels", tuple(fabric)
    )


def test_no_topology_without_topology_awareness() -> None:
    assert _aws(["p5.48xlarge"], topologyAware=False).scheduling.topology == m.Topology("pools")


def test_every_catalog_type_is_placed_for_its_network_labels() -> None:
    """A new type in the catalog needs a decision here: EC2's prerequisites page lists the
    types DescribeInstanceTopology covers (3 or 4 network nodes); p5.4xlarge and g5 are not
    listed, so EKS gives them no network labels."""
    without = {t for t in catalog() if t not in EC2_TOPOLOGY_LAYERS}
    assert without == {
        "p5.4xlarge",
        "g5.xlarge",
        "g5.2xlarge",
        "g5.8xlarge",
        "g5.12xlarge",
        "g5.24xlarge",
        "g5.48xlarge",
    }
    assert EC2_TOPOLOGY_LAYERS["p6-b200.48xlarge"] == 4
    assert EC2_TOPOLOGY_LAYERS["p5.48xlarge"] == 3
    assert eks_labels(["g5.xlarge"]) is None
