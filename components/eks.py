"""The EKS cluster: control plane, OIDC, system nodes, core add-ons, Kubernetes provider."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from trainstack.builders import eks as b
from trainstack.builders import labels
from trainstack.builders.nodegroups import SYSTEM_NODE_GROUP
from trainstack.components.nodes import encrypted_root_volume, imdsv2_only, scaling
from trainstack.config.model import AwsSettings, PlatformConfig


@dataclass(frozen=True)
class EksClusterArgs:
    config: PlatformConfig
    aws: AwsSettings
    subnet_ids: list[pulumi.Output[str]]
    provider: pulumi.ProviderResource


def _policy_json(document: object) -> str:
    return json.dumps(document, sort_keys=True)


class EksCluster(pulumi.ComponentResource):
    """An EKS cluster ready for GPU pools: the rest of the platform builds on its outputs."""

    cluster: aws.eks.Cluster
    oidc_provider: aws.iam.OpenIdConnectProvider
    node_role: aws.iam.Role
    node_dependencies: tuple[pulumi.Resource, ...]
    k8s_provider: k8s.Provider
    kubeconfig: pulumi.Output[str]

    def __init__(
        self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:aws:EksCluster", name, None, opts)
        cfg, eks = args.config, args.aws.cluster
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)

        # The log group exists before the cluster so that retention applies from day one.
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=f"/aws/eks/{cfg.cluster_name}/cluster",
            retention_in_days=eks.log_retention_days,
            opts=child,
        )
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=_policy_json(b.service_assume_role_policy("eks.amazonaws.com")),
            opts=child,
        )
        attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-role-{arn.rsplit('/', 1)[-1]}", role=role.name, policy_arn=arn, opts=child
            )
            for arn in b.CLUSTER_POLICIES
        ]
        key_arn: pulumi.Input[str]
        if eks.secrets_kms_key_arn:
            key_arn = eks.secrets_kms_key_arn
        else:
            key = aws.kms.Key(
                f"{name}-secrets",
                description=f"EKS secrets envelope encryption for {cfg.cluster_name}",
                enable_key_rotation=True,
                deletion_window_in_days=30,
                opts=child,
            )
            key_arn = key.arn
        self.cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=cfg.cluster_name,
            version=cfg.kubernetes_version,
            role_arn=role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=args.subnet_ids,
                endpoint_public_access=eks.endpoint.public,
                endpoint_private_access=eks.endpoint.private,
                public_access_cidrs=list(eks.endpoint.public_cidrs) or None,
            ),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                resources=["secrets"],
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=key_arn),
            ),
            enabled_cluster_log_types=list(eks.logging),
            # API-mode access entries; the deployer keeps admin so Pulumi can manage objects.
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API", bootstrap_cluster_creator_admin_permissions=True
            ),
            # Core add-ons are managed below as EKS add-ons with pinned versions.
            bootstrap_self_managed_addons=False,
            deletion_protection=cfg.environment == "production",
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[log_group, *attachments])
            ),
        )
        issuer = self.cluster.identities.apply(lambda ids: ids[0].oidcs[0].issuer)  # type: ignore[index]
        self.oidc_provider = aws.iam.OpenIdConnectProvider(
            f"{name}-oidc", url=issuer, client_id_lists=[b.OIDC_AUDIENCE], opts=child
        )
        for index, principal in enumerate(eks.admin_principal_arns):
            entry = aws.eks.AccessEntry(
                f"{name}-admin-{index}",
                cluster_name=self.cluster.name,
                principal_arn=principal,
                opts=child,
            )
            aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{index}",
                cluster_name=self.cluster.name,
                principal_arn=principal,
                policy_arn=b.CLUSTER_ADMIN_ACCESS_POLICY,
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=[entry])
                ),
            )

        # The Pod Identity agent first: vpc-cni takes its role through it.
        early = sorted(
            (p for p in eks.addons if p.name not in b.ADDONS_AFTER_NODES),
            key=lambda p: p.name != b.POD_IDENTITY_AGENT,
        )
        early_addons: list[aws.eks.Addon] = []
        agent: list[pulumi.Resource] = []
        for pin in early:
            after = agent if pin.name in b.ADDON_SERVICE_ACCOUNTS else []
            early_addons.append(self._addon(name, pin.name, pin.version, child, after))
            if pin.name == b.POD_IDENTITY_AGENT:
                agent = [early_addons[-1]]
        nodes = self._system_nodes(name, args, child, early_addons)
        # GPU pools wait for the same: nodes without the CNI's role or the node role's
        # policies never join, and deleting the role first strands their instances.
        self.node_dependencies = (*self._node_attachments, *early_addons)
        for pin in eks.addons:
            if pin.name in b.ADDONS_AFTER_NODES:
                self._addon(name, pin.name, pin.version, child, depends_on=[nodes])

        self.kubeconfig = pulumi.Output.all(
            self.cluster.name, self.cluster.endpoint, self.cluster.certificate_authority
        ).apply(
            lambda parts: json.dumps(
                b.kubeconfig(parts[0], parts[1], parts[2]["data"], args.aws.region), sort_keys=True
            )
        )
        self.k8s_provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig.apply(pulumi.Output.secret),
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[nodes]),
        )
        self.register_outputs(
            {
                "clusterName": self.cluster.name,
                "endpoint": self.cluster.endpoint,
                "oidcProviderArn": self.oidc_provider.arn,
            }
        )

    def _addon(
        self,
        name: str,
        addon: str,
        version: str | None,
        child: pulumi.ResourceOptions,
        depends_on: list[pulumi.Resource] | None = None,
    ) -> aws.eks.Addon:
        associations = None
        if addon in b.ADDON_SERVICE_ACCOUNTS:
            role = aws.iam.Role(
                f"{name}-{addon}",
                assume_role_policy=_policy_json(b.pod_identity_assume_role_policy()),
                opts=child,
            )
            aws.iam.RolePolicyAttachment(
                f"{name}-{addon}", role=role.name, policy_arn=b.ADDON_POLICIES[addon], opts=child
            )
            associations = [
                aws.eks.AddonPodIdentityAssociationArgs(
                    role_arn=role.arn, service_account=b.ADDON_SERVICE_ACCOUNTS[addon]
                )
            ]
        return aws.eks.Addon(
            f"{name}-{addon}",
            cluster_name=self.cluster.name,
            addon_name=addon,
            addon_version=version,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            configuration_values=b.addon_configuration_values(addon),
            pod_identity_associations=associations,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=depends_on or [])
            ),
        )

    def _system_nodes(
        self,
        name: str,
        args: EksClusterArgs,
        child: pulumi.ResourceOptions,
        addons: list[aws.eks.Addon],
    ) -> aws.eks.NodeGroup:
        system = args.aws.cluster.system_node_group
        self.node_role = aws.iam.Role(
            f"{name}-node-role",
            assume_role_policy=_policy_json(b.service_assume_role_policy("ec2.amazonaws.com")),
            opts=child,
        )
        attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-role-{arn.rsplit('/', 1)[-1]}",
                role=self.node_role.name,
                policy_arn=arn,
                opts=child,
            )
            for arn in b.NODE_POLICIES
        ]
        self._node_attachments = attachments
        template = aws.ec2.LaunchTemplate(
            f"{name}-system-lt",
            description=f"{args.config.cluster_name} system nodes",
            metadata_options=imdsv2_only(hop_limit=2),
            block_device_mappings=encrypted_root_volume(system.disk_size_gib),
            opts=child,
        )
        # EKS tags managed node groups for the Cluster Autoscaler's auto-discovery, so it
        # scales this one too: `pulumi up` keeps its size like a GPU pool's (issue 39 #5).
        scaling_config, ignore = scaling(
            system.size, args.config.cluster_name, SYSTEM_NODE_GROUP, args.provider
        )
        return aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=self.cluster.name,
            node_group_name=SYSTEM_NODE_GROUP,
            node_role_arn=self.node_role.arn,
            subnet_ids=args.subnet_ids,
            instance_types=[system.instance_type],
            ami_type="AL2023_x86_64_STANDARD",
            capacity_type="ON_DEMAND",
            scaling_config=scaling_config,
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)
            ),
            labels={labels.ROLE: "system"},
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(depends_on=[*attachments, *addons], ignore_changes=ignore),
            ),
        )
