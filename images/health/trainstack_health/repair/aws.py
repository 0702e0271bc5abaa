"""Replacement of a failed node's EC2 instance through its Auto Scaling group (mode "replace").

`SetInstanceHealth(HealthStatus="Unhealthy")` makes EC2 Auto Scaling terminate the instance and
launch a replacement ("Amazon EC2 Auto Scaling terminates and replaces the unhealthy
instance": API reference, SetInstanceHealth; an Unhealthy from a custom health check "causes
Amazon EC2 Auto Scaling to immediately replace it": user guide, "Set up a custom health check
for your Auto Scaling group",
https://docs.aws.amazon.com/autoscaling/ec2/userguide/set-up-a-custom-health-check.html).
`ShouldRespectGracePeriod=False`: the grace period protects a booting instance from its own
health checks; this one has been up long enough to fail ours. The node was drained before
(decide.py), so nothing of a team's is on it.

Before that call, the instance's group must be one of this cluster's: DescribeAutoScalingInstances
names the group, DescribeAutoScalingGroups gives its tags, and EKS tags the Auto Scaling
group of a managed node group with `eks:cluster-name` (the AWS managed policy
AWSServiceRoleForAmazonEKSNodegroup v11 lets EKS create groups only with the tag keys `eks`,
`eks:cluster-name` and `eks:nodegroup-name`, statement AllowASGCreationByEKS). The IAM policy
(trainstack/builders/health_iam.py) enforces the same on AWS's side; this check gives the
refusal a readable reason, and a test on moto, which enforces no IAM.
"""

from __future__ import annotations

from typing import Any, Protocol

CLUSTER_TAG = "eks:cluster-name"


class ReplaceRefused(Exception):
    """The instance is not (or no longer) one this controller may replace."""


class AutoScaling(Protocol):
    """The three calls the controller makes (botocore's autoscaling client has them)."""

    def describe_auto_scaling_instances(self, **kwargs: Any) -> Any: ...
    def describe_auto_scaling_groups(self, **kwargs: Any) -> Any: ...
    def set_instance_health(self, **kwargs: Any) -> Any: ...


def client(region: str) -> AutoScaling:
    """A boto3 client with boto3's default credential chain (in the cluster: the role of the
    controller's EKS Pod Identity association). Imported here so the agent, which never
    replaces, never loads boto3."""
    import boto3  # noqa: PLC0415 - only mode "replace" needs it

    autoscaling: AutoScaling = boto3.client("autoscaling", region_name=region)
    return autoscaling


class Replacer:
    def __init__(self, autoscaling: AutoScaling, cluster_name: str) -> None:
        self.autoscaling = autoscaling
        self.cluster_name = cluster_name

    def group_of(self, instance_id: str) -> str:
        found = self.autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id])
        instances = found.get("AutoScalingInstances") or []
        if not instances:
            raise ReplaceRefused(f"instance {instance_id} is in no Auto Scaling group")
        group = str(instances[0]["AutoScalingGroupName"])
        groups = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        tags = {
            t.get("Key"): t.get("Value")
            for g in groups.get("AutoScalingGroups") or []
            for t in g.get("Tags") or []
        }
        owner = tags.get(CLUSTER_TAG)
        if owner != self.cluster_name:
            raise ReplaceRefused(
                f"instance {instance_id}'s Auto Scaling group {group} has {CLUSTER_TAG}="
                f"{owner!r}, not {self.cluster_name!r}: not this cluster's node group"
            )
        return group

    def replace(self, instance_id: str) -> str:
        """Mark the instance unhealthy; the name of its group."""
        group = self.group_of(instance_id)
        self.autoscaling.set_instance_health(
            InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
        )
        return group
