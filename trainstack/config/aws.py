"""The AWS settings (`aws:`): their cross-field checks (network, cluster, add-on pins) and the
typed model built from them. docs/aws.md lists every rule with its source and tests."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from trainstack.config import model as m
from trainstack.config.checks import dict_items, size_issues
from trainstack.config.errors import ConfigIssue, join_path
from trainstack.config.model import MAX_VPC_PREFIX


def aws_checks(aws: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    network = aws.get("network")
    if isinstance(network, Mapping):
        issues.extend(_network_checks(network, aws.get("region"), join_path(root, "network")))
    cluster = aws.get("cluster")
    if isinstance(cluster, Mapping):
        issues.extend(_cluster_checks(cluster, join_path(root, "cluster")))
    return issues


def addon_pin_checks(aws: Mapping[str, Any], storage: object, root: str) -> list[ConfigIssue]:
    """A stack that pins add-on versions pins every add-on it installs.

    EKS installs an add-on created without a version at its default for the cluster version
    (EKS API reference, CreateAddon `addonVersion`; `aws eks describe-addon-versions` marks the
    default), so the unpinned one would differ between two clusters built from one stack.
    """
    cluster = aws.get("cluster")
    pins = cluster.get("addons") if isinstance(cluster, Mapping) else None
    if not isinstance(pins, Mapping) or not pins:
        return []
    needed = _storage_addons(storage if isinstance(storage, Mapping) else {})
    why = dict.fromkeys(CORE_ADDONS, "every EKS cluster gets it") | {
        addon: f"storage.{key} needs it" for key, addon in STORAGE_ADDONS.items()
    }
    missing = [a for a in (*CORE_ADDONS, *needed) if a not in pins]
    return [
        ConfigIssue(
            join_path(root, "cluster", "addons"),
            f"pins {len(pins)} add-on versions but not {addon} ({why[addon]}), which EKS "
            "would install at its default version; pin it (aws eks describe-addon-versions "
            f"--addon-name {addon} --kubernetes-version <version>) or pin none",
        )
        for addon in missing
    ]


def _network_checks(network: Mapping[str, Any], region: object, net_path: str) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    creates = "vpcCidr" in network or "availabilityZones" in network
    existing = "existingVpc" in network
    if creates and existing:
        issues.append(
            ConfigIssue(
                net_path,
                "give either vpcCidr + availabilityZones (create a VPC) or existingVpc, not both",
            )
        )
    elif not creates and not existing:
        issues.append(ConfigIssue(net_path, "give vpcCidr + availabilityZones, or existingVpc"))
    elif creates:
        issues += [
            ConfigIssue(join_path(net_path, field), "required to create a VPC")
            for field in ("vpcCidr", "availabilityZones")
            if field not in network
        ]
    cidr = network.get("vpcCidr")
    if isinstance(cidr, str):
        issues += _cidr_checks(cidr, join_path(net_path, "vpcCidr"))
    zones: list[tuple[str, str]] = []
    if isinstance(network.get("availabilityZones"), list):
        zones = [
            (join_path(net_path, "availabilityZones", i), z)
            for i, z in enumerate(network["availabilityZones"])
            if isinstance(z, str)
        ]
    vpc = network.get("existingVpc")
    if isinstance(vpc, Mapping):
        subnets = list(dict_items(vpc.get("privateSubnets")))
        sub_path = join_path(net_path, "existingVpc", "privateSubnets")
        zones += [
            (join_path(sub_path, i, "availabilityZone"), s["availabilityZone"])
            for i, s in subnets
            if isinstance(s.get("availabilityZone"), str)
        ]
        distinct = {s.get("availabilityZone") for _, s in subnets}
        if len(subnets) >= 2 and len(distinct) < 2:
            issues.append(
                ConfigIssue(
                    sub_path,
                    "EKS needs subnets in at least two availability zones; "
                    f"all are in {distinct.pop()}",
                )
            )
    if isinstance(region, str):
        issues += [
            ConfigIssue(path, f"zone {zone!r} is not in region {region!r}")
            for path, zone in zones
            if not zone.startswith(region) or len(zone) != len(region) + 1
        ]
    return issues


def _cidr_checks(cidr: str, path: str) -> list[ConfigIssue]:
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError as err:
        return [ConfigIssue(path, f"{cidr!r} is not a network address ({err})")]
    if network.prefixlen > MAX_VPC_PREFIX or network.prefixlen < 16:
        return [
            ConfigIssue(
                path,
                f"{cidr!r} has prefix /{network.prefixlen}; use /16 to /{MAX_VPC_PREFIX} "
                "(pods take VPC addresses, so GPU clusters need room)",
            )
        ]
    return []


def _cluster_checks(cluster: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    endpoint = cluster.get("endpoint")
    if (
        isinstance(endpoint, Mapping)
        and endpoint.get("publicAccess") is False
        and endpoint.get("privateAccess") is False
    ):
        issues.append(
            ConfigIssue(
                join_path(root, "endpoint"),
                "publicAccess and privateAccess are both false: nothing could reach the API "
                "server; enable at least one",
            )
        )
    if (
        isinstance(endpoint, Mapping)
        and endpoint.get("publicAccess") is False
        and "publicAccessCidrs" in endpoint
    ):
        issues.append(
            ConfigIssue(
                join_path(root, "endpoint", "publicAccessCidrs"),
                "has no effect with publicAccess: false; remove it",
            )
        )
    system = cluster.get("systemNodeGroup")
    if isinstance(system, Mapping):
        issues += size_issues(
            system, join_path(root, "systemNodeGroup"), ("minSize", "desiredSize", "maxSize")
        )
    return issues


def build_aws(aws: dict[str, Any], storage: Mapping[str, Any]) -> m.AwsSettings:
    network = aws["network"]
    net: m.NewVpc | m.ExistingVpc
    if "existingVpc" in network:
        vpc = network["existingVpc"]
        net = m.ExistingVpc(
            vpc_id=vpc["vpcId"],
            private_subnets=tuple(
                m.Subnet(id=s["id"], availability_zone=s["availabilityZone"])
                for s in vpc["privateSubnets"]
            ),
        )
    else:
        net = m.NewVpc(
            cidr=network["vpcCidr"],
            availability_zones=tuple(network["availabilityZones"]),
            nat_gateways=network["natGateways"],
        )
    cluster = aws["cluster"]
    endpoint = cluster["endpoint"]
    system = cluster["systemNodeGroup"]
    return m.AwsSettings(
        region=aws["region"],
        network=net,
        cluster=m.EksSettings(
            endpoint=m.EndpointAccess(
                public=endpoint["publicAccess"],
                private=endpoint["privateAccess"],
                public_cidrs=tuple(endpoint["publicAccessCidrs"])
                if endpoint["publicAccess"]
                else (),
            ),
            logging=tuple(cluster["logging"]),
            log_retention_days=cluster["logRetentionDays"],
            secrets_kms_key_arn=cluster.get("secretsKmsKeyArn"),
            admin_principal_arns=tuple(cluster["adminPrincipalArns"]),
            system_node_group=m.SystemNodeGroup(
                instance_type=system["instanceType"],
                size=m.NodeGroupSize(
                    min=system["minSize"], desired=system["desiredSize"], max=system["maxSize"]
                ),
                disk_size_gib=system["diskSizeGiB"],
            ),
            addons=_addons(cluster["addons"], _storage_addons(storage)),
        ),
    )


# Installed on every EKS cluster; versions may be pinned in config.
CORE_ADDONS = ("vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent", "aws-ebs-csi-driver")


# The CSI driver each kind of storage needs, as an EKS add-on.
STORAGE_ADDONS = {"lustre": "aws-fsx-csi-driver", "efs": "aws-efs-csi-driver"}


def _storage_addons(storage: Mapping[str, Any]) -> tuple[str, ...]:
    """CSI drivers the configured storage needs, as EKS add-ons."""
    return tuple(addon for key, addon in STORAGE_ADDONS.items() if key in storage)


def _addons(pins: Mapping[str, str], needed: tuple[str, ...]) -> tuple[m.AddonPin, ...]:
    """Core add-ons, those the config's features need (FSx CSI), then any extra pins."""
    names = list(dict.fromkeys([*CORE_ADDONS, *needed, *sorted(pins)]))
    return tuple(m.AddonPin(name=n, version=pins.get(n)) for n in names)
