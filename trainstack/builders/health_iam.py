"""The AWS role of the health repair controller (`trainstack-health repair`, mode "replace"):
what it may do to EC2 Auto Scaling, and who may assume it. Pure: documents as dicts.

The controller marks a failed node's instance Unhealthy (SetInstanceHealth), after reading
which group the instance is in (DescribeAutoScalingInstances) and that group's tags
(DescribeAutoScalingGroups): images/health/trainstack_health/repair/aws.py.

From the Service Authorization Reference for Amazon EC2 Auto Scaling
(https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2autoscaling.html,
as recorded in iann0036/iam-dataset aws/iam_definition.json at 08eff2d7):
- `autoscaling:SetInstanceHealth` requires the resource type `autoScalingGroup`
  (arn:${Partition}:autoscaling:${Region}:${Account}:autoScalingGroup:${GroupId}:
  autoScalingGroupName/${GroupFriendlyName}) and supports the condition keys
  `autoscaling:ResourceTag/${TagKey}` and `aws:ResourceTag/${TagKey}`: the grant is limited to
  groups tagged `eks:cluster-name` = the cluster, the tag EKS puts on the Auto Scaling group of
  every managed node group (AWS managed policy AWSServiceRoleForAmazonEKSNodegroup v11,
  statement AllowASGCreationByEKS: EKS creates groups only with the tag keys `eks`,
  `eks:cluster-name`, `eks:nodegroup-name`). A group of another cluster in the same account,
  or one that is no EKS node group's, is refused by AWS whatever the controller asks.
- `autoscaling:DescribeAutoScalingInstances` and `autoscaling:DescribeAutoScalingGroups` (access
  level List) name no resource type: they take only "*", and no condition narrows them.
  They read; they change nothing.
"""

from __future__ import annotations

from typing import Any

from trainstack.builders.eks import pod_identity_assume_role_policy

CLUSTER_TAG = "eks:cluster-name"
WRITE_ACTIONS = ("autoscaling:SetInstanceHealth",)
READ_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
)


def repair_policy(cluster_name: str) -> dict[str, Any]:
    """The repair role's permissions. The write's Resource stays "*" as in the Cluster
    Autoscaler's policy (builders/autoscaler.iam_policy): SetInstanceHealth acts only on
    autoScalingGroup resources, and the tag condition is what limits them to the cluster's."""
    if not cluster_name:
        raise ValueError("cluster_name is empty: the tag condition would match nothing useful")
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReplaceThisClustersNodes",
                "Effect": "Allow",
                "Action": list(WRITE_ACTIONS),
                "Resource": "*",
                "Condition": {
                    "StringEquals": {f"autoscaling:ResourceTag/{CLUSTER_TAG}": cluster_name}
                },
            },
            {
                "Sid": "FindTheInstancesGroup",
                "Effect": "Allow",
                "Action": list(READ_ACTIONS),
                "Resource": "*",
            },
        ],
    }


def repair_trust_policy() -> dict[str, Any]:
    """EKS Pod Identity assumes the role for the controller's ServiceAccount (the association
    names the cluster, namespace and ServiceAccount; the trust is the same for every
    Pod Identity role, builders/eks.pod_identity_assume_role_policy)."""
    return pod_identity_assume_role_policy()
