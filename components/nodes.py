"""Launch-template settings every trainstack node gets, system and GPU alike."""

from __future__ import annotations

import pulumi_aws as aws


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


def encrypted_root_volume(size_gib: int) -> list[aws.ec2.LaunchTemplateBlockDeviceMappingArgs]:
    return [
        aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
            device_name="/dev/xvda",
            ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                volume_size=size_gib,
                volume_type="gp3",
                encrypted="true",
                delete_on_termination="true",
            ),
        )
    ]
