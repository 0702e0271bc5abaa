"""Launch-template and node-group settings every trainstack node gets, system and GPU alike."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from trainstack.builders import nodegroups as ng
from trainstack.config.model import NodeGroupSize


def imdsv2_only(hop_limit: int) -> aws.ec2.LaunchTemplateMetadataOptionsArgs:
    """IMDSv2 only. GPU nodes: 1 hop, so team pods cannot take the node role
    (builders/nodegroups.GPU_IMDS_HOP_LIMIT). System nodes: 2, for the add-on pods that read
    instance metadata there (the EBS CSI node); no team pod schedules on them."""
    return aws.ec2.LaunchTemplateMetadataOptionsArgs(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=hop_limit
    )


def tag_specifications(
    tags: dict[str, str], resources: tuple[str, ...]
) -> list[aws.ec2.LaunchTemplateTagSpecificationArgs]:
    return [
        aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tags)
        for kind in resources
    ]


def encrypted_root_volume(
    size_gib: int, throughput_mibps: int | None = None
) -> list[aws.ec2.LaunchTemplateBlockDeviceMappingArgs]:
    """gp3 root volume; `throughput_mibps` None: gp3's baseline (125 MiB/s)."""
    return [
        aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
            device_name="/dev/xvda",
            ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                volume_size=size_gib,
                volume_type="gp3",
                throughput=throughput_mibps,
                encrypted="true",
                delete_on_termination="true",
            ),
        )
    ]


def live_desired_size(
    cluster_name: str, node_group_name: str, provider: pulumi.ProviderResource | None
) -> int | None:
    """The node group's current desired size, or None where there is none to read: a first
    deployment (no cluster or node group yet), the offline preview (its mocks answer no
    invoke), or an account the credentials cannot read. None keeps the old behaviour, which
    is right in all three: the configured size for a new group, the ignored one otherwise."""
    try:
        group = aws.eks.get_node_group(
            cluster_name=cluster_name,
            node_group_name=node_group_name,
            opts=pulumi.InvokeOptions(provider=provider),
        )
    except Exception as exc:  # any failure means "nothing live to keep"
        pulumi.log.debug(f"node group {cluster_name}/{node_group_name} not read: {exc}")
        return None
    configs = group.scaling_configs or []
    if not configs or configs[0].desired_size is None:
        return None
    return int(configs[0].desired_size)


def scaling(
    size: NodeGroupSize,
    cluster_name: str,
    node_group_name: str,
    provider: pulumi.ProviderResource | None,
) -> tuple[aws.eks.NodeGroupScalingConfigArgs, list[str]]:
    """The node group's scaling config and the properties to ignore (builders/nodegroups
    .desired_size): the live size kept, clamped into the bounds only when they exclude it."""
    desired, ignore = ng.desired_size(
        size, live_desired_size(cluster_name, node_group_name, provider)
    )
    args = aws.eks.NodeGroupScalingConfigArgs(
        min_size=size.min, desired_size=desired, max_size=size.max
    )
    return args, ignore
