"""The rules over AWS resources' inputs: launch templates, file systems, clusters, add-ons."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trainstack.policy.objects import ADDON, Config, Rule, as_map, as_seq


def imdsv2_required(props: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    if as_map(props.get("metadataOptions")).get("httpTokens") != "required":
        return ["metadataOptions.httpTokens must be 'required' (IMDSv2)"]
    return []


def ebs_encrypted(props: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    return [
        f"block device {as_map(d).get('deviceName')} is not encrypted"
        for d in as_seq(props.get("blockDeviceMappings"))
        if str(as_map(as_map(d).get("ebs")).get("encrypted")).lower() != "true"
    ]


def fsx_encrypted(props: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    # Scratch file systems are encrypted with an AWS-owned key; persistent ones need ours.
    if str(props.get("deploymentType", "")).startswith("PERSISTENT") and not props.get("kmsKeyId"):
        return ["a persistent FSx file system needs kmsKeyId (customer-managed encryption at rest)"]
    return []


def eks_endpoint_not_open(props: Mapping[str, Any], cfg: Config) -> list[str]:
    if not cfg.production:
        return []
    vpc = as_map(props.get("vpcConfig"))
    if vpc.get("endpointPublicAccess") is False:
        return []
    cidrs = [str(c) for c in as_seq(vpc.get("publicAccessCidrs"))]
    if not cidrs or "0.0.0.0/0" in cidrs:
        return ["production cluster: the public API endpoint is open to 0.0.0.0/0"]
    return []


def vpc_cni_network_policy(props: Mapping[str, Any], cfg: Config) -> list[str]:
    """The managed vpc-cni add-on enforces NetworkPolicy only with `enableNetworkPolicy`
    (a string in the add-on's configuration schema; see builders/eks.py)."""
    del cfg
    if props.get("addonName") != "vpc-cni":
        return []
    raw = props.get("configurationValues")
    try:
        values = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return ["the vpc-cni add-on's configurationValues are not JSON"]
    if as_map(values).get("enableNetworkPolicy") != "true":
        return [
            'the vpc-cni add-on does not set enableNetworkPolicy: "true", so NetworkPolicies '
            "are accepted but not enforced"
        ]
    return []


AWS_RULES: tuple[Rule, ...] = (
    Rule("imdsv2-required", "launch templates require IMDSv2",
         "set metadataOptions.httpTokens: required", ("aws:ec2/launchTemplate:LaunchTemplate",),
         imdsv2_required),
    Rule("ebs-encrypted", "EBS volumes are encrypted at rest",
         "set ebs.encrypted: 'true' on every block device",
         ("aws:ec2/launchTemplate:LaunchTemplate",),
         ebs_encrypted),
    Rule("fsx-encrypted", "persistent FSx file systems use a KMS key",
         "set kmsKeyId", ("aws:fsx/lustreFileSystem:LustreFileSystem",), fsx_encrypted),
    Rule("eks-endpoint-not-open", "production EKS endpoints are not open to the internet",
         "set publicAccessCidrs to your networks, or publicAccess: false",
         ("aws:eks/cluster:Cluster",), eks_endpoint_not_open),
    Rule("vpc-cni-network-policy", "the vpc-cni add-on enforces NetworkPolicies",
         'set configurationValues {"enableNetworkPolicy": "true"} (builders/eks.py)',
         (ADDON,), vpc_cni_network_policy),
)  # fmt: skip
