"""How the AWS resources trainstack generates must be shaped for AWS to accept and run them, for
every capacity type and for the whole platform (docs/aws.md). No config can break these rules;
each test asserts the shape AWS rejects is never emitted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.components.test_gpu import efa_pool, platform, run_pool
from tests.conftest import Recorded
from trainstack.builders import eks as eks_builder
from trainstack.components.platform import Platform
from trainstack.config import PlatformConfig, load_stack_file

STACKS = Path(__file__).parent.parent.parent / "stacks"
RESERVATION_ID = "cr-0123456789abcdef0"
CAPACITIES = [
    pytest.param({"type": "onDemand"}, id="onDemand"),
    pytest.param({"type": "spot"}, id="spot"),
    pytest.param({"type": "reservation", "reservationId": RESERVATION_ID}, id="reservation"),
    pytest.param({"type": "capacityBlock", "reservationId": RESERVATION_ID}, id="capacityBlock"),
]


def pool_config(capacity: dict[str, str]) -> PlatformConfig:
    return platform([efa_pool("p5.48xlarge", capacity=capacity)])


def launch_template(run_program: Callable[..., Recorded], cfg: PlatformConfig) -> dict[str, Any]:
    inputs: dict[str, Any] = (
        run_pool(run_program, cfg).one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt").inputs
    )
    return inputs


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_gpu_nodes_answer_instance_metadata_only_one_hop_away(
    run_program: Callable[..., Recorded], capacity: dict[str, str]
) -> None:
    """EKS best practices (IAM, "Restrict access to the instance profile assigned to the worker
    node"): IMDSv2 with a hop limit of 1, whatever the capacity; never the 2 that lets a pod's
    network namespace take the node role."""
    template = launch_template(run_program, pool_config(capacity))
    assert template["metadataOptions"] == {
        "httpEndpoint": "enabled",
        "httpTokens": "required",
        "httpPutResponseHopLimit": 1,
    }


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_launch_templates_tag_only_what_every_launch_creates(
    run_program: Callable[..., Recorded], capacity: dict[str, str]
) -> None:
    """EC2 LaunchTemplateTagSpecificationRequest: "If the instance does not include the resource
    type that you specify, the instance launch fails": no spot-instances-request, even on spot
    (EKS launches spot through the Auto Scaling group, not spot requests)."""
    template = launch_template(run_program, pool_config(capacity))
    kinds = [spec["resourceType"] for spec in template["tagSpecifications"]]
    assert kinds == ["instance", "volume", "network-interface"]


@pytest.fixture(scope="module")
def prod() -> PlatformConfig:
    cfg = load_stack_file(STACKS / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def test_system_nodes_keep_two_hops_for_the_add_ons_that_read_metadata(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    """The other side of the GPU rule: add-on pods on system nodes (EBS CSI node) read IMDS, and
    no team pod schedules there (components/nodes.imdsv2_only)."""
    rec = run_program(lambda: Platform("p", prod), region="us-east-1")
    system = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "p-cluster-system-lt")
    assert system.inputs["metadataOptions"]["httpPutResponseHopLimit"] == 2
    gpu = [t for t in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate") if "-pool-" in t.name]
    assert gpu
    assert {t.inputs["metadataOptions"]["httpPutResponseHopLimit"] for t in gpu} == {1}


def test_every_gpu_node_group_waits_for_the_node_role_and_the_cni(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    """Terraform/Pulumi aws_eks_node_group docs: the node role's policy attachments before the
    node group and deleted after it; the node role has no AmazonEKS_CNI_Policy, so the vpc-cni
    add-on with its own role (and the Pod Identity agent that hands it over) comes first, or
    nodes never become Ready. Add-ons that need nodes (coredns, CSI controllers) come after."""
    rec = run_program(lambda: Platform("p", prod), region="us-east-1")
    attachments = {
        a.urn
        for a in rec.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.name.startswith("p-cluster-node-role-")
    }
    assert len(attachments) == len(eks_builder.NODE_POLICIES)
    addons = {a.inputs["addonName"]: a for a in rec.of_type("aws:eks/addon:Addon")}
    early = {addons["vpc-cni"].urn, addons[eks_builder.POD_IDENTITY_AGENT].urn}
    groups = [g for g in rec.of_type("aws:eks/nodeGroup:NodeGroup") if "-pool-" in g.name]
    assert len(groups) == len(prod.gpu_pools)
    for group in groups:
        assert attachments | early <= set(group.dependencies), group.name
        assert group.options["ignoreChanges"] == ["scalingConfig.desiredSize"], group.name
        late = {addons[name].urn for name in eks_builder.ADDONS_AFTER_NODES if name in addons}
        assert not late & set(group.dependencies), group.name


def test_pod_identity_roles_trust_the_eks_pods_service_with_session_tags(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    """EKS user guide (pod-id-role): the trust policy allows pods.eks.amazonaws.com both
    sts:AssumeRole and sts:TagSession; without TagSession the association fails."""
    rec = run_program(lambda: Platform("p", prod), region="us-east-1")
    with_roles = [
        a.inputs["addonName"]
        for a in rec.of_type("aws:eks/addon:Addon")
        if a.inputs.get("podIdentityAssociations")
    ]
    assert "vpc-cni" in with_roles
    for addon in with_roles:
        role = rec.one("aws:iam/role:Role", f"p-cluster-{addon}")
        statement = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
        assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}, addon
        assert statement["Action"] == ["sts:AssumeRole", "sts:TagSession"], addon
