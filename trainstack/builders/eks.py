"""AWS inputs for the EKS cluster: IAM documents, managed policies, add-on configuration,
kubeconfig."""

from __future__ import annotations

import json
from typing import Any

AWS_MANAGED = "arn:aws:iam::aws:policy"
CLUSTER_POLICIES = (f"{AWS_MANAGED}/AmazonEKSClusterPolicy",)
# No AmazonEKS_CNI_Policy: on the node role every pod that reaches instance metadata could
# attach ENIs and assign addresses; the VPC CNI gets it on its own role (below). "If you ...
# assigned it to the aws-node Kubernetes service account, then we recommend that you remove
# the policy from your node role" (EKS user guide, "Configure the Amazon VPC CNI plugin to use
# IRSA"/cni-iam-role). AmazonEKSWorkerNodePolicy carries eks-auth:AssumeRoleForPodIdentity,
# which the Pod Identity agent needs.
NODE_POLICIES = (
    f"{AWS_MANAGED}/AmazonEKSWorkerNodePolicy",
    f"{AWS_MANAGED}/AmazonEC2ContainerRegistryReadOnly",
    f"{AWS_MANAGED}/AmazonSSMManagedInstanceCore",
)
CNI_POLICY = f"{AWS_MANAGED}/AmazonEKS_CNI_Policy"
EBS_CSI_POLICY = f"{AWS_MANAGED}/service-role/AmazonEBSCSIDriverPolicy"
CLUSTER_ADMIN_ACCESS_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
OIDC_AUDIENCE = "sts.amazonaws.com"
# Add-ons that need AWS permissions get them through EKS Pod Identity. Not the FSx CSI
# driver: its controller calls AWS only to create, delete or resize file systems for dynamic
# volumes (kubernetes-sigs/aws-fsx-csi-driver docs/install.md: the policy is for "dynamic
# provisioning"), and trainstack's Lustre volumes are static PVs of a file system Pulumi
# manages; AmazonFSxFullAccess would let it delete any file system in the account.
# aws-node supports Pod Identity from v1.15.5 (EKS best practices, IAM: "The aws-node
# daemonset supports EKS Pod Identities in versions v1.15.5 and later").
ADDON_SERVICE_ACCOUNTS = {
    "vpc-cni": "aws-node",
    "aws-ebs-csi-driver": "ebs-csi-controller-sa",
    "aws-efs-csi-driver": "efs-csi-controller-sa",
}
ADDON_POLICIES = {
    "vpc-cni": CNI_POLICY,
    "aws-ebs-csi-driver": EBS_CSI_POLICY,
    "aws-efs-csi-driver": f"{AWS_MANAGED}/service-role/AmazonEFSCSIDriverPolicy",
}
# EKS add-on configuration values (the add-on's configuration schema; `aws eks
# describe-addon-configuration`). vpc-cni: `enableNetworkPolicy` runs the network policy agent
# in aws-node and the controller that resolves NetworkPolicies; without it the team
# NetworkPolicies (builders/teams.py) are accepted and never enforced. The value is a string,
# as in the aws-vpc-cni chart values the schema mirrors (aws/amazon-vpc-cni-k8s
# charts/aws-vpc-cni/values.yaml `enableNetworkPolicy: "false"`; EKS user guide, "Restrict Pod
# network traffic with Kubernetes network policies").
ADDON_CONFIGURATION: dict[str, dict[str, Any]] = {
    "vpc-cni": {"enableNetworkPolicy": "true"},
}
# The agent that hands add-ons their Pod Identity roles: before the add-ons that use one.
POD_IDENTITY_AGENT = "eks-pod-identity-agent"
# coredns needs nodes to schedule on; the rest are node-level and install first.
ADDONS_AFTER_NODES = frozenset(
    {"coredns", "aws-ebs-csi-driver", "aws-fsx-csi-driver", "aws-efs-csi-driver"}
)


def addon_configuration_values(addon: str) -> str | None:
    """The add-on's `configurationValues` JSON, or None to keep EKS's defaults."""
    values = ADDON_CONFIGURATION.get(addon)
    return json.dumps(values, sort_keys=True) if values else None


def service_assume_role_policy(service: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": service},
                "Action": "sts:AssumeRole",
            }
        ],
    }


def pod_identity_assume_role_policy() -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "pods.eks.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"],
            }
        ],
    }


def kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> dict[str, Any]:
    """A kubeconfig that authenticates with `aws eks get-token` (no static secret)."""
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region],
        }
    }
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": endpoint, "certificate-authority-data": ca_data},
            }
        ],
        "users": [{"name": cluster_name, "user": user}],
        "contexts": [
            {"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}
        ],
        "current-context": cluster_name,
    }


def oidc_host(issuer_url: str) -> str:
    return issuer_url.removeprefix("https://")
