"""EksCluster: control plane, IAM, OIDC, system nodes, add-ons, Kubernetes provider."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pytest

from tests.conftest import Recorded, unsecret
from trainstack.components.eks import EksCluster, EksClusterArgs
from trainstack.config import PlatformConfig, load_stack_file

FIXTURES = Path(__file__).parent.parent / "config" / "fixtures" / "valid"


def platform(name: str = "minimal-aws.yaml") -> PlatformConfig:
    config = load_stack_file(FIXTURES / name)
    assert isinstance(config, PlatformConfig)
    assert config.aws is not None
    return config


def build(cfg: PlatformConfig) -> Callable[[], None]:
    def program() -> None:
        assert cfg.aws is not None
        provider = aws.Provider("aws", region=cfg.aws.region)
        subnets = [pulumi.Output.from_input("subnet-a"), pulumi.Output.from_input("subnet-b")]
        EksCluster("c", EksClusterArgs(cfg, cfg.aws, subnets, provider))

    return program


@pytest.fixture
def recorded(run_program: Callable[..., Recorded]) -> Recorded:
    return run_program(build(platform()), region="eu-west-1")


def test_every_aws_child_is_parented_and_uses_the_explicit_provider(recorded: Recorded) -> None:
    component = recorded.one("trainstack:aws:EksCluster", "c")
    children = recorded.children_of(component)
    assert children, "the component registered no children"
    for child in children:
        assert child.name.startswith("c-"), child.name
        if child.type.startswith("aws:"):
            assert recorded.provider_name(child) == "aws", child.name


def test_control_plane(recorded: Recorded) -> None:
    cluster = recorded.one("aws:eks/cluster:Cluster", "c-eks")
    inputs = cluster.inputs
    assert inputs["name"] == "trainstack-minimal-aws"
    assert inputs["version"] == "1.33"
    assert inputs["vpcConfig"] == {
        "subnetIds": ["subnet-a", "subnet-b"],
        "endpointPublicAccess": True,
        "endpointPrivateAccess": True,
        "publicAccessCidrs": ["0.0.0.0/0"],
    }
    assert inputs["encryptionConfig"]["resources"] == ["secrets"]
    key = recorded.one("aws:kms/key:Key", "c-secrets")
    assert key.inputs["enableKeyRotation"] is True
    assert inputs["encryptionConfig"]["provider"]["keyArn"].endswith(":key/c-secrets")
    assert inputs["enabledClusterLogTypes"] == ["api", "audit", "authenticator"]
    assert inputs["accessConfig"]["authenticationMode"] == "API"
    assert inputs["bootstrapSelfManagedAddons"] is False
    assert inputs["deletionProtection"] is False
    logs = recorded.one("aws:cloudwatch/logGroup:LogGroup", "c-logs")
    assert logs.inputs["name"] == "/aws/eks/trainstack-minimal-aws/cluster"
    assert logs.inputs["retentionInDays"] == 90
    assert logs.urn in cluster.dependencies


def test_iam_roles_trust_the_right_services(recorded: Recorded) -> None:
    def principal(name: str) -> object:
        role = recorded.one("aws:iam/role:Role", name)
        return json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"]

    assert principal("c-role") == {"Service": "eks.amazonaws.com"}
    assert principal("c-node-role") == {"Service": "ec2.amazonaws.com"}
    assert principal("c-aws-ebs-csi-driver") == {"Service": "pods.eks.amazonaws.com"}
    node_policies = {
        a.inputs["policyArn"].rsplit("/", 1)[-1]
        for a in recorded.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.name.startswith("c-node-role-")
    }
    # No AmazonEKS_CNI_Policy on the node role (issue 17 #4): any pod reaching instance
    # metadata could have attached ENIs with it. The CNI has its own role.
    assert node_policies == {
        "AmazonEKSWorkerNodePolicy",
        "AmazonEC2ContainerRegistryReadOnly",
        "AmazonSSMManagedInstanceCore",
    }


def test_the_vpc_cni_has_its_own_role_through_pod_identity(recorded: Recorded) -> None:
    """EKS user guide (cni-iam-role): put AmazonEKS_CNI_Policy on a role of the aws-node
    service account, then remove it from the node role; add-ons get roles by Pod Identity
    (add-ons-iam), so the agent add-on comes first."""
    addons = {a.inputs["addonName"]: a for a in recorded.of_type("aws:eks/addon:Addon")}
    assert addons["vpc-cni"].inputs["podIdentityAssociations"] == [
        {"roleArn": "arn:aws:iam::000000000000:role/c-vpc-cni", "serviceAccount": "aws-node"}
    ]
    policy = recorded.one("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "c-vpc-cni")
    assert policy.inputs["policyArn"] == "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"
    assert addons["eks-pod-identity-agent"].urn in addons["vpc-cni"].dependencies


def test_oidc_provider_for_irsa(recorded: Recorded) -> None:
    oidc = recorded.one("aws:iam/openIdConnectProvider:OpenIdConnectProvider", "c-oidc")
    assert oidc.inputs["clientIdLists"] == ["sts.amazonaws.com"]
    assert oidc.inputs["url"].startswith("https://oidc.eks.eu-west-1.amazonaws.com/id/")


def test_system_node_group_is_hardened(recorded: Recorded) -> None:
    template = recorded.one("aws:ec2/launchTemplate:LaunchTemplate", "c-system-lt")
    assert template.inputs["metadataOptions"]["httpTokens"] == "required"
    ebs = template.inputs["blockDeviceMappings"][0]["ebs"]
    assert ebs["encrypted"] == "true"
    assert ebs["volumeType"] == "gp3"
    assert ebs["volumeSize"] == 100
    group = recorded.one("aws:eks/nodeGroup:NodeGroup", "c-system")
    assert group.inputs["amiType"] == "AL2023_x86_64_STANDARD"
    assert group.inputs["instanceTypes"] == ["m6i.xlarge"]
    assert group.inputs["scalingConfig"] == {"minSize": 2, "desiredSize": 2, "maxSize": 4}
    assert group.inputs["launchTemplate"] == {"id": "c-system-lt-id", "version": "1"}
    assert group.inputs["labels"] == {"trainstack.io/role": "system"}


def test_core_addons_and_their_order(recorded: Recorded) -> None:
    addons = {a.inputs["addonName"]: a for a in recorded.of_type("aws:eks/addon:Addon")}
    assert set(addons) == {
        "vpc-cni",
        "kube-proxy",
        "coredns",
        "eks-pod-identity-agent",
        "aws-ebs-csi-driver",
    }
    nodes = recorded.one("aws:eks/nodeGroup:NodeGroup", "c-system")
    # networking first (nodes need the CNI to become Ready), workloads after nodes
    assert addons["vpc-cni"].urn in nodes.dependencies
    assert nodes.urn in addons["coredns"].dependencies
    assert nodes.urn in addons["aws-ebs-csi-driver"].dependencies
    ebs = addons["aws-ebs-csi-driver"].inputs["podIdentityAssociations"]
    assert ebs == [
        {
            "roleArn": "arn:aws:iam::000000000000:role/c-aws-ebs-csi-driver",
            "serviceAccount": "ebs-csi-controller-sa",
        }
    ]
    assert all(a.inputs["resolveConflictsOnUpdate"] == "OVERWRITE" for a in addons.values())


def test_vpc_cni_enforces_network_policies(recorded: Recorded) -> None:
    """Without `enableNetworkPolicy` the team NetworkPolicies are accepted and ignored.

    The key and its string value are the vpc-cni add-on's configuration schema, which mirrors
    the aws-vpc-cni chart values (aws/amazon-vpc-cni-k8s charts/aws-vpc-cni/values.yaml:
    `enableNetworkPolicy: "false"`, rendered into the aws-node `--enable-network-policy` flag
    and the `enable-network-policy-controller` ConfigMap key); EKS user guide, "Restrict Pod
    network traffic with Kubernetes network policies" (cni-network-policy-configure).
    """
    addons = {a.inputs["addonName"]: a for a in recorded.of_type("aws:eks/addon:Addon")}
    values = json.loads(addons["vpc-cni"].inputs["configurationValues"])
    assert values["enableNetworkPolicy"] == "true"
    # Add-ons trainstack does not configure keep EKS's defaults.
    assert all("configurationValues" not in a.inputs for n, a in addons.items() if n != "vpc-cni")


def test_kubernetes_provider_is_bound_to_the_cluster(recorded: Recorded) -> None:
    provider = recorded.one("pulumi:providers:kubernetes", "c-k8s")
    assert provider.inputs["enableServerSideApply"] == "true"
    kubeconfig = json.loads(unsecret(provider.inputs["kubeconfig"]))
    cluster = kubeconfig["clusters"][0]["cluster"]
    assert cluster["server"].endswith(".gr7.eu-west-1.eks.amazonaws.com")
    user = kubeconfig["users"][0]["user"]["exec"]
    assert user["args"] == [
        "eks",
        "get-token",
        "--cluster-name",
        "trainstack-minimal-aws",
        "--region",
        "eu-west-1",
    ]


def test_pinned_addons_extra_admins_and_production(run_program: Callable[..., Recorded]) -> None:
    cfg = platform()
    assert cfg.aws is not None
    pinned = replace(
        cfg,
        environment="production",
        aws=replace(
            cfg.aws,
            cluster=replace(
                cfg.aws.cluster,
                secrets_kms_key_arn="arn:aws:kms:eu-west-1:111122223333:key/abc",
                admin_principal_arns=("arn:aws:iam::111122223333:role/admins",),
                addons=(
                    *cfg.aws.cluster.addons[:1],
                    replace(cfg.aws.cluster.addons[1], version="v1.33.3-eksbuild.6"),
                ),
            ),
        ),
    )
    rec = run_program(build(pinned), region="eu-west-1")
    assert rec.of_type("aws:kms/key:Key") == []
    cluster = rec.one("aws:eks/cluster:Cluster")
    assert cluster.inputs["encryptionConfig"]["provider"]["keyArn"].endswith("key/abc")
    assert cluster.inputs["deletionProtection"] is True
    proxy = rec.one("aws:eks/addon:Addon", "c-kube-proxy")
    assert proxy.inputs["addonVersion"] == "v1.33.3-eksbuild.6"
    entry = rec.one("aws:eks/accessEntry:AccessEntry", "c-admin-0")
    assert entry.inputs["principalArn"] == "arn:aws:iam::111122223333:role/admins"
    association = rec.one("aws:eks/accessPolicyAssociation:AccessPolicyAssociation", "c-admin-0")
    assert association.inputs["policyArn"].endswith("/AmazonEKSClusterAdminPolicy")
    assert association.inputs["accessScope"] == {"type": "cluster"}
