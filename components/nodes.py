"""Launch-template settings every trainstack node gets, system and GPU alike."""

from __future__ import annotations

import pulumi_aws as aws


def imdsv2_only() -> aws.ec2.LaunchTemplateMetadataOptionsArgs:
    return aws.ec2.LaunchTemplateMetadataOptionsArgs(
        http_endpoint="enabled",
        http_tokens="required",
        # 2 hops: node-level add-ons in pods (EBS CSI) still read instance metadata.
        http_put_response_hop_limit=2,
    )


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
