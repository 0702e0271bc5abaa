"""Cluster Autoscaler on EKS: GPU pools scale up from zero for pending gangs, and down when
idle, never from under a running training pod (builders/autoscaler.py has the why)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from trainstack.builders import autoscaler as b
from trainstack.builders.eks import pod_identity_assume_role_policy
from trainstack.components.kube import addon_release
from trainstack.config.model import PlatformConfig


@dataclass(frozen=True)
class ClusterAutoscalerArgs:
    config: PlatformConfig
    region: str
    cluster_name: pulumi.Input[str]
    aws_provider: pulumi.ProviderResource
    k8s_provider: pulumi.ProviderResource


class ClusterAutoscaler(pulumi.ComponentResource):
    """Its IAM role (by EKS Pod Identity) and the upstream chart, pinned."""

    def __init__(
        self, name: str, args: ClusterAutoscalerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:aws:ClusterAutoscaler", name, None, opts)
        cfg = args.config
        on_aws = pulumi.ResourceOptions(parent=self, provider=args.aws_provider)
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=json.dumps(pod_identity_assume_role_policy(), sort_keys=True),
            opts=on_aws,
        )
        policy = aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            policy=json.dumps(b.iam_policy(cfg.cluster_name), sort_keys=True),
            opts=on_aws,
        )
        association = aws.eks.PodIdentityAssociation(
            f"{name}-identity",
            cluster_name=args.cluster_name,
            namespace=b.NAMESPACE,
            service_account=b.SERVICE_ACCOUNT,
            role_arn=role.arn,
            opts=on_aws,
        )
        addon_release(
            f"{name}-release",
            b.RELEASE,
            cfg,
            values=b.values(cfg, args.region),
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.k8s_provider, depends_on=[policy, association]
            ),
        )
        self.register_outputs({})
