"""Per team on the platform: quota, defaults, RBAC, network policy, cluster access."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from trainstack.builders import teams as b
from trainstack.components.kube import apply_manifest
from trainstack.config.model import PlatformConfig, Team


@dataclass(frozen=True)
class TeamAccess:
    """On EKS: the cluster whose access entries map the team's IAM principals."""

    cluster_name: pulumi.Input[str]
    provider: pulumi.ProviderResource


@dataclass(frozen=True)
class TeamResourcesArgs:
    config: PlatformConfig
    team: Team
    k8s_provider: pulumi.ProviderResource
    depends_on: list[pulumi.Resource]
    access: TeamAccess | None = None


class TeamResources(pulumi.ComponentResource):
    """The fences of one team's namespace; its queue lives with Volcano."""

    def __init__(
        self, name: str, args: TeamResourcesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:team:TeamResources", name, None, opts)
        cfg, team = args.config, args.team
        kube = pulumi.ResourceOptions(
            parent=self, provider=args.k8s_provider, depends_on=args.depends_on
        )
        for manifest in b.team_manifests(cfg, team):
            role = f"{manifest['kind'].lower()}-{manifest['metadata']['name']}"
            apply_manifest(f"{name}-{role}", manifest, kube)
        if args.access is not None:
            child = pulumi.ResourceOptions(parent=self, provider=args.access.provider)
            for index, principal in enumerate(team.iam_principals):
                aws.eks.AccessEntry(
                    f"{name}-access-{index}",
                    cluster_name=args.access.cluster_name,
                    principal_arn=principal,
                    kubernetes_groups=[b.team_group(team)],
                    type="STANDARD",
                    opts=child,
                )
        self.register_outputs({"namespace": team.namespace})
