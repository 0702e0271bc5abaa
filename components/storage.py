"""Datasets and checkpoints: FSx for Lustre linked to S3, the checkpoint bucket, per-team
access (IRSA), claims in team namespaces, and the node dataset cache agent (its DaemonSet,
CSIDriver, ServiceAccount, NetworkPolicy and, on AWS, its read-only IAM role).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any

import pulumi
import pulumi_aws as aws

from trainstack.builders import cache as cache_b
from trainstack.builders import layout as layout_b
from trainstack.builders import storage as b
from trainstack.components.kube import apply_manifest
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig, Team


def _trust_json(parts: list[str], namespace: str, account: str = b.TRAINING_SERVICE_ACCOUNT) -> str:
    oidc_arn, issuer_host = parts
    document = b.irsa_trust_policy(oidc_arn, issuer_host, namespace, account)
    return json.dumps(document, sort_keys=True)


def _policy_json(cfg: PlatformConfig, team: Team, key_arn: str) -> str:
    return json.dumps(b.team_s3_policy(cfg, team, key_arn), sort_keys=True)


@dataclass(frozen=True)
class AwsContext:
    """What the storage needs from the network and cluster on AWS."""

    provider: pulumi.ProviderResource
    vpc_id: pulumi.Input[str]
    subnets: list[tuple[str, pulumi.Output[str]]]  # (zone, subnet id)
    node_security_group_id: pulumi.Input[str]
    oidc_provider_arn: pulumi.Input[str]
    oidc_issuer_url: pulumi.Input[str]


@dataclass(frozen=True)
class PlatformStorageArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource
    namespaces: dict[str, pulumi.Resource]  # team -> its namespace, created first
    system_namespace: pulumi.Resource
    aws: AwsContext | None = None


class PlatformStorage(pulumi.ComponentResource):
    """Every team gets a dataset claim and a checkpoint claim; AWS adds durable S3 copies."""

    _key: aws.kms.Key  # encrypts the bucket, the persistent file systems and EFS

    def __init__(
        self, name: str, args: PlatformStorageArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:storage:PlatformStorage", name, None, opts)
        cfg = args.config
        storage = cfg.storage
        kube = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)
        # Manifests may carry Outputs (ARNs, file-system ids); Pulumi resolves them.
        # `csi_at(directory, role)`: a PV source rooted at that directory of the shared file
        # system, with a volume handle of its own.
        csi_at: b.CsiAt | None = None
        role_arns: dict[str, pulumi.Output[str]] = {}
        efs_handles: dict[str, pulumi.Output[str]] = {}
        agent_role: pulumi.Output[str] | None = None
        if args.aws is not None:
            csi_at, role_arns = self._aws(name, cfg, args.aws)
            if storage.nvme_cache is not None:
                agent_role = self._agent_role(name, cfg, args.aws)
            if storage.efs is not None:
                efs_handles = self._efs(name, cfg, args.aws)
        elif storage.existing_lustre is not None:
            csi_at = partial(b.existing_lustre_csi, cfg)
        layout: list[pulumi.Resource] = []
        if csi_at is not None:
            layout = self._layout(name, cfg, csi_at, kube, args.system_namespace)
        for team in cfg.registry.teams:
            in_team = pulumi.ResourceOptions.merge(
                kube, pulumi.ResourceOptions(depends_on=[args.namespaces[team.name]])
            )
            account = b.training_service_account(cfg, team, role_arns.get(team.name))
            apply_manifest(f"{name}-sa-{team.name}", account, in_team)
            if team.name in efs_handles:
                volumes = b.efs_checkpoint_volume(cfg, team, efs_handles[team.name])
            elif csi_at is not None:
                volumes = b.team_volumes(cfg, team, csi_at)
                # The team's directory exists before its volume is published (a fileset
                # mount of a missing directory fails).
                in_team = pulumi.ResourceOptions.merge(
                    in_team, pulumi.ResourceOptions(depends_on=layout)
                )
            else:
                continue
            for manifest in volumes:
                kind = "pv" if manifest["kind"] == "PersistentVolume" else "pvc"
                claim = manifest["metadata"]["name"].removeprefix(f"{team.name}-")
                apply_manifest(f"{name}-{team.name}-{claim}-{kind}", manifest, in_team)
        if storage.nvme_cache is not None:
            in_system = pulumi.ResourceOptions.merge(
                kube, pulumi.ResourceOptions(depends_on=[args.system_namespace])
            )
            driver = apply_manifest(f"{name}-cache-driver", cache_b.csi_driver(cfg), kube)
            agent_sa = apply_manifest(
                f"{name}-cache-sa", cache_b.service_account(cfg, agent_role), in_system
            )
            apply_manifest(f"{name}-cache-netpol", cache_b.network_policy(cfg), in_system)
            apply_manifest(
                f"{name}-cache-agent",
                cache_b.daemonset(cfg),
                pulumi.ResourceOptions.merge(
                    in_system, pulumi.ResourceOptions(depends_on=[driver, agent_sa])
                ),
            )
        self.register_outputs({})

    @property
    def key_arn(self) -> pulumi.Output[str]:
        """The KMS key that encrypts the bucket (AWS only): what writers to it need."""
        return self._key.arn

    def _layout(
        self,
        name: str,
        cfg: PlatformConfig,
        csi_at: b.CsiAt,
        kube: pulumi.ResourceOptions,
        system_namespace: pulumi.Resource,
    ) -> list[pulumi.Resource]:
        """The platform's claim on the whole file system, the Job that lays out the teams'
        directories on it and its NetworkPolicy (builders/layout.py); returns the Job."""
        in_system = pulumi.ResourceOptions.merge(
            kube, pulumi.ResourceOptions(depends_on=[system_namespace])
        )
        apply_manifest(f"{name}-layout-netpol", layout_b.network_policy(cfg), in_system)
        claim: list[pulumi.Resource] = []
        for manifest in b.root_volume(cfg, csi_at):
            kind = "pv" if manifest["kind"] == "PersistentVolume" else "pvc"
            claim.append(apply_manifest(f"{name}-root-{kind}", manifest, in_system))
        job = apply_manifest(
            f"{name}-layout",
            layout_b.layout_job(cfg),
            pulumi.ResourceOptions.merge(in_system, pulumi.ResourceOptions(depends_on=claim)),
        )
        return [job]

    def _agent_role(
        self, name: str, cfg: PlatformConfig, ctx: AwsContext
    ) -> pulumi.Output[str] | None:
        """IRSA for the cache agent: list and read its S3 sources, nothing else."""
        policy = cache_b.s3_read_policy(cfg)
        if policy is None:
            return None
        child = pulumi.ResourceOptions(parent=self, provider=ctx.provider)
        host = pulumi.Output.from_input(ctx.oidc_issuer_url).apply(
            lambda u: u.removeprefix("https://")
        )
        role = aws.iam.Role(
            f"{name}-cache-agent",
            assume_role_policy=pulumi.Output.all(ctx.oidc_provider_arn, host).apply(
                partial(_trust_json, namespace=SYSTEM_NAMESPACE, account=cache_b.NAME)
            ),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-cache-agent",
            role=role.name,
            policy=json.dumps(policy, sort_keys=True),
            opts=child,
        )
        return role.arn

    def _aws(
        self, name: str, cfg: PlatformConfig, ctx: AwsContext
    ) -> tuple[b.CsiAt | None, dict[str, pulumi.Output[str]]]:
        storage = cfg.storage
        child = pulumi.ResourceOptions(parent=self, provider=ctx.provider)
        key = self._key = aws.kms.Key(
            f"{name}-key",
            description=f"{cfg.cluster_name} datasets and checkpoints",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            opts=child,
        )
        csi_at: b.CsiAt | None = None
        lustre = storage.lustre
        if lustre is not None:
            group = aws.ec2.SecurityGroup(
                f"{name}-lustre-sg",
                vpc_id=ctx.vpc_id,
                description="FSx for Lustre: LNet from nodes and between file servers",
                tags={"Name": f"{cfg.cluster_name}-lustre"},
                opts=child,
            )
            # LNet from the nodes and between file servers; and back, since Lustre servers
            # open connections to their clients too, so the nodes' group admits the same ports
            # from the file system's (FSx Lustre guide, limit-access-security-groups).
            nodes = ctx.node_security_group_id
            for rule, target, peer in (
                ("nodes", group.id, nodes),
                ("self", group.id, group.id),
                ("to-nodes", nodes, group.id),
            ):
                for low, high in b.LUSTRE_PORTS:
                    aws.vpc.SecurityGroupIngressRule(
                        f"{name}-lustre-{rule}-{low}",
                        security_group_id=target,
                        referenced_security_group_id=peer,
                        ip_protocol="tcp",
                        from_port=low,
                        to_port=high,
                        opts=child,
                    )
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-lustre-out",
                security_group_id=group.id,
                cidr_ipv4="0.0.0.0/0",
                ip_protocol="-1",
                opts=child,
            )
            if lustre.efa:
                # FSx refuses an EFA-enabled file system whose group does not allow all
                # traffic within itself and from its clients ("Insufficient security group
                # permissions to create an EFA-enabled file system", FSx Lustre guide,
                # cannot-create-fs; efa-file-systems).
                for source, peer in (("nodes", nodes), ("self", group.id)):
                    aws.vpc.SecurityGroupIngressRule(
                        f"{name}-lustre-efa-{source}",
                        security_group_id=group.id,
                        referenced_security_group_id=peer,
                        ip_protocol="-1",
                        opts=child,
                    )
            subnet = next(s for zone, s in ctx.subnets if zone == lustre.availability_zone)
            persistent = lustre.deployment_type == "PERSISTENT_2"
            fs = aws.fsx.LustreFileSystem(
                f"{name}-lustre",
                storage_capacity=lustre.storage_capacity_gib,
                deployment_type=lustre.deployment_type,
                per_unit_storage_throughput=lustre.per_unit_storage_throughput,
                subnet_ids=subnet,
                security_group_ids=[group.id],
                data_compression_type="LZ4",
                file_system_type_version=b.LUSTRE_VERSION,
                efa_enabled=lustre.efa or None,
                # EFA needs a metadata configuration (pulumi-aws LustreFileSystem.efa_enabled:
                # "only supported when ... metadata_configuration is used").
                metadata_configuration=aws.fsx.LustreFileSystemMetadataConfigurationArgs(
                    mode="AUTOMATIC"
                )
                if lustre.efa
                else None,
                kms_key_id=key.arn if persistent else None,
                tags={"Name": f"{cfg.cluster_name}-lustre"},
                opts=child,
            )
            if lustre.data_repository is not None:
                repo = lustre.data_repository
                aws.fsx.DataRepositoryAssociation(
                    f"{name}-datasets",
                    file_system_id=fs.id,
                    file_system_path=b.DATASETS_PATH,
                    data_repository_path=f"s3://{repo.bucket}/{repo.prefix}",
                    batch_import_meta_data_on_create=True,
                    s3=aws.fsx.DataRepositoryAssociationS3Args(
                        auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(
                            events=list(repo.auto_import)
                        ),
                        auto_export_policy=aws.fsx.DataRepositoryAssociationS3AutoExportPolicyArgs(
                            events=list(repo.auto_export)
                        ),
                    ),
                    opts=child,
                )
            file_system = fs

            def fsx_csi(directory: str, role: str) -> dict[str, Any]:
                return {
                    "driver": b.FSX_CSI_DRIVER,
                    "volumeHandle": file_system.id.apply(partial(b.fsx_volume_handle, role=role)),
                    "volumeAttributes": {
                        "dnsname": file_system.dns_name,
                        "mountname": file_system.mount_name.apply(
                            partial(b.fsx_mount_name, directory=directory)
                        ),
                    },
                }

            csi_at = fsx_csi
        roles: dict[str, pulumi.Output[str]] = {}
        if storage.checkpoint_bucket is not None:
            self._bucket(name, cfg, storage.checkpoint_bucket, key, child)
            host = pulumi.Output.from_input(ctx.oidc_issuer_url).apply(
                lambda u: u.removeprefix("https://")
            )
            for team in cfg.registry.teams:
                role = aws.iam.Role(
                    f"{name}-team-{team.name}",
                    assume_role_policy=pulumi.Output.all(ctx.oidc_provider_arn, host).apply(
                        partial(_trust_json, namespace=team.namespace)
                    ),
                    opts=child,
                )
                aws.iam.RolePolicy(
                    f"{name}-team-{team.name}",
                    role=role.name,
                    policy=key.arn.apply(partial(_policy_json, cfg, team)),
                    opts=child,
                )
                roles[team.name] = role.arn
        return csi_at, roles

    def _efs(
        self, name: str, cfg: PlatformConfig, ctx: AwsContext
    ) -> dict[str, pulumi.Output[str]]:
        """EFS for checkpoints: encrypted, a mount target per zone, an access point per team."""
        assert cfg.storage.efs is not None
        child = pulumi.ResourceOptions(parent=self, provider=ctx.provider)
        group = aws.ec2.SecurityGroup(
            f"{name}-efs-sg",
            vpc_id=ctx.vpc_id,
            description="EFS: NFS from the cluster's nodes",
            tags={"Name": f"{cfg.cluster_name}-efs"},
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-efs-nfs",
            security_group_id=group.id,
            referenced_security_group_id=ctx.node_security_group_id,
            ip_protocol="tcp",
            from_port=b.NFS_PORT,
            to_port=b.NFS_PORT,
            opts=child,
        )
        fs = aws.efs.FileSystem(
            f"{name}-efs",
            encrypted=True,
            kms_key_id=self._key.arn,
            throughput_mode=cfg.storage.efs.throughput_mode,
            performance_mode="generalPurpose",
            tags={"Name": f"{cfg.cluster_name}-checkpoints"},
            opts=child,
        )
        for zone, subnet in ctx.subnets:
            aws.efs.MountTarget(
                f"{name}-efs-{zone}",
                file_system_id=fs.id,
                subnet_id=subnet,
                security_groups=[group.id],
                opts=child,
            )
        handles: dict[str, pulumi.Output[str]] = {}
        for team in cfg.registry.teams:
            point = aws.efs.AccessPoint(
                f"{name}-efs-{team.name}",
                file_system_id=fs.id,
                posix_user=aws.efs.AccessPointPosixUserArgs(uid=b.EFS_POSIX_ID, gid=b.EFS_POSIX_ID),
                root_directory=aws.efs.AccessPointRootDirectoryArgs(
                    path=b.efs_access_point_root(team),
                    creation_info=aws.efs.AccessPointRootDirectoryCreationInfoArgs(
                        owner_uid=b.EFS_POSIX_ID, owner_gid=b.EFS_POSIX_ID, permissions="0770"
                    ),
                ),
                tags={"Name": f"{cfg.cluster_name}-{team.name}", "trainstack:team": team.name},
                opts=child,
            )
            handles[team.name] = pulumi.Output.concat(fs.id, "::", point.id)
        return handles

    @staticmethod
    def _bucket(
        name: str,
        cfg: PlatformConfig,
        bucket_name: str,
        key: aws.kms.Key,
        child: pulumi.ResourceOptions,
    ) -> None:
        bucket = aws.s3.Bucket(
            f"{name}-checkpoints",
            bucket=bucket_name,
            force_destroy=False,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(protect=cfg.environment == "production")
            ),
        )
        access = aws.s3.BucketPublicAccessBlock(
            f"{name}-checkpoints",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketPolicy(
            f"{name}-checkpoints-tls",
            bucket=bucket.id,
            policy=bucket.arn.apply(lambda arn: json.dumps(b.checkpoint_bucket_policy(arn))),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[access])),
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-checkpoints",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        aws.s3.BucketVersioning(
            f"{name}-checkpoints",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(
                status="Enabled"
            ),
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-checkpoints",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="aws:kms", kms_master_key_id=key.arn
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-checkpoints",
            bucket=bucket.id,
            rules=b.checkpoint_lifecycle_rules(cfg),  # type: ignore[arg-type]
            opts=child,
        )
