"""The platform stack: network, cluster and shared services, composed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from trainstack import outputs as out
from trainstack.builders import labels
from trainstack.builders.health import pools_of as health_pools
from trainstack.builders.monitoring import monitoring_output
from trainstack.builders.platform import registry_groups, team_outputs
from trainstack.builders.pools import pool_output
from trainstack.builders.prepull import pools_of as prepull_pools
from trainstack.builders.scheduling import scheduling_output
from trainstack.builders.storage import storage_output
from trainstack.components.autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from trainstack.components.deadlines import DeadlineEnforcer, DeadlineEnforcerArgs
from trainstack.components.eks import EksCluster, EksClusterArgs
from trainstack.components.existing import ExistingCluster
from trainstack.components.gpu import GpuNodePool, GpuNodePoolArgs, GpuPlugins, GpuPluginsArgs
from trainstack.components.health import NodeHealth, NodeHealthArgs, NodeHealthAws
from trainstack.components.logs import AwsLogAccess, LogCollector, LogCollectorArgs
from trainstack.components.monitoring import Monitoring, MonitoringArgs
from trainstack.components.network import Network, NetworkArgs
from trainstack.components.policy import AdmissionPolicies, AdmissionPoliciesArgs
from trainstack.components.prepull import ImagePrePull, ImagePrePullArgs
from trainstack.components.scheduling import Volcano, VolcanoArgs
from trainstack.components.services import PlatformServices, PlatformServicesArgs
from trainstack.components.storage import AwsContext, PlatformStorage, PlatformStorageArgs
from trainstack.components.teams import TeamAccess, TeamResources, TeamResourcesArgs
from trainstack.config.model import PlatformConfig


@dataclass
class PlatformOutputs:
    """Values the platform stack exports; see trainstack.outputs for the contract."""

    cluster_name: pulumi.Input[str]
    kubernetes_version: str
    cloud: str
    environment: str
    kubeconfig: pulumi.Input[str] | None
    endpoint: pulumi.Input[str] | None = None
    oidc_provider_arn: pulumi.Input[str] | None = None
    oidc_issuer_url: pulumi.Input[str] | None = None
    vpc_id: pulumi.Input[str] | None = None
    private_subnet_ids: list[pulumi.Output[str]] = field(default_factory=list)
    region: str | None = None
    storage_classes: list[str] = field(default_factory=list)
    team_namespaces: dict[str, str] = field(default_factory=dict)
    registry: dict[str, object] = field(default_factory=dict)
    kube_context: str | None = None
    gpu_pools: list[dict[str, object]] = field(default_factory=list)
    scheduling: dict[str, object] = field(default_factory=dict)
    monitoring: dict[str, object] = field(default_factory=dict)
    storage: dict[str, object] = field(default_factory=dict)
    teams: dict[str, str] = field(default_factory=dict)  # team/<name> -> JSON slice

    def exports(self) -> dict[str, object]:
        """Stack exports by contract name; cloud-specific ones only where they exist."""
        values: dict[str, object] = {
            out.CLOUD: self.cloud,
            out.ENVIRONMENT: self.environment,
            out.CLUSTER_NAME: self.cluster_name,
            out.KUBERNETES_VERSION: self.kubernetes_version,
            out.STORAGE_CLASSES: self.storage_classes,
            out.TEAM_NAMESPACES: self.team_namespaces,
            out.REGISTRY: self.registry,
            out.GPU_POOLS: self.gpu_pools,
            out.SCHEDULING: self.scheduling,
            out.MONITORING: self.monitoring,
            out.STORAGE: self.storage,
            **self.teams,
        }
        if self.cloud == "aws":
            values |= {
                out.KUBECONFIG: pulumi.Output.secret(self.kubeconfig),
                out.ENDPOINT: self.endpoint,
                out.OIDC_PROVIDER_ARN: self.oidc_provider_arn,
                out.OIDC_ISSUER_URL: self.oidc_issuer_url,
                out.REGION: self.region,
                out.VPC_ID: self.vpc_id,
                out.PRIVATE_SUBNET_IDS: self.private_subnet_ids,
            }
        else:
            values[out.KUBE_CONTEXT] = self.kube_context
        return values


class Platform(pulumi.ComponentResource):
    """Everything the infra team owns, for `cloud: aws` or `cloud: existing`."""

    outputs: PlatformOutputs

    def __init__(
        self,
        name: str,
        args: PlatformConfig,
        opts: pulumi.ResourceOptions | None = None,
        team_images: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """`team_images`: per pool the images of the team stacks' jobs on it, which image
        pre-pull holds on the pool's nodes (jobs/prepull.py; the program reads them)."""
        super().__init__("trainstack:platform:Platform", name, None, opts)
        cfg = args
        if cfg.aws is not None:
            provider = aws.Provider(
                f"{name}-aws",
                region=cfg.aws.region,
                default_tags=aws.ProviderDefaultTagsArgs(tags=labels.aws_tags(cfg.stack, cfg.tags)),
                opts=pulumi.ResourceOptions(parent=self),
            )
            network = Network(
                f"{name}-network",
                NetworkArgs(cfg.cluster_name, cfg.aws.network, provider, cfg.aws.region),
                pulumi.ResourceOptions(parent=self),
            )
            cluster = EksCluster(
                f"{name}-cluster",
                EksClusterArgs(cfg, cfg.aws, network.private_subnet_ids, provider),
                pulumi.ResourceOptions(parent=self),
            )
            k8s_provider = cluster.k8s_provider
            aws_context: AwsContext | None = AwsContext(
                provider=provider,
                vpc_id=network.vpc_id,
                subnets=network.private_subnets,
                node_security_group_id=cluster.cluster.vpc_config.cluster_security_group_id,
                oidc_provider_arn=cluster.oidc_provider.arn,
                oidc_issuer_url=cluster.oidc_provider.url,
            )
            for pool in cfg.gpu_pools:
                assert pool.aws is not None
                zone = pool.aws.availability_zone
                GpuNodePool(
                    f"{name}-pool-{pool.name}",
                    GpuNodePoolArgs(
                        config=cfg,
                        pool=pool,
                        cluster_name=cluster.cluster.name,
                        cluster_security_group_id=cluster.cluster.vpc_config.cluster_security_group_id,
                        node_role_arn=cluster.node_role.arn,
                        vpc_id=network.vpc_id,
                        subnet_ids=[s for z, s in network.private_subnets if zone in (None, z)],
                        provider=provider,
                        node_dependencies=cluster.node_dependencies,
                    ),
                    pulumi.ResourceOptions(parent=self),
                )
            if cfg.gpu_pools:
                ClusterAutoscaler(
                    f"{name}-autoscaler",
                    ClusterAutoscalerArgs(
                        cfg, cfg.aws.region, cluster.cluster.name, provider, k8s_provider
                    ),
                    pulumi.ResourceOptions(parent=self),
                )
            self.outputs = PlatformOutputs(
                cluster_name=cluster.cluster.name,
                kubernetes_version=cfg.kubernetes_version,
                cloud=cfg.cloud,
                environment=cfg.environment,
                kubeconfig=cluster.kubeconfig,
                endpoint=cluster.cluster.endpoint,
                oidc_provider_arn=cluster.oidc_provider.arn,
                oidc_issuer_url=cluster.oidc_provider.url,
                vpc_id=network.vpc_id,
                private_subnet_ids=network.private_subnet_ids,
                region=cfg.aws.region,
            )
        else:
            assert cfg.existing is not None, "the loader guarantees existing for cloud: existing"
            existing = ExistingCluster(
                f"{name}-cluster", cfg.existing, pulumi.ResourceOptions(parent=self)
            )
            k8s_provider = existing.k8s_provider
            aws_context = None
            self.outputs = PlatformOutputs(
                cluster_name=cfg.cluster_name,
                kubernetes_version=cfg.kubernetes_version,
                cloud=cfg.cloud,
                environment=cfg.environment,
                kubeconfig=None,
                kube_context=cfg.existing.context,
            )
        services = PlatformServices(
            f"{name}-services",
            PlatformServicesArgs(cfg, k8s_provider),
            pulumi.ResourceOptions(parent=self),
        )
        volcano = Volcano(
            f"{name}-volcano",
            VolcanoArgs(cfg, k8s_provider),
            pulumi.ResourceOptions(parent=self),
        )
        self.outputs.scheduling = scheduling_output(cfg)
        DeadlineEnforcer(
            f"{name}-deadlines",
            DeadlineEnforcerArgs(
                cfg,
                k8s_provider,
                system_namespace=services.system_namespace,
                namespaces=services.namespace_resources,
            ),
            pulumi.ResourceOptions(parent=self),
        )
        Monitoring(
            f"{name}-monitoring",
            MonitoringArgs(cfg, k8s_provider, depends_on=[services.system_namespace, volcano]),
            pulumi.ResourceOptions(parent=self),
        )
        self.outputs.monitoring = monitoring_output(cfg)
        storage = PlatformStorage(
            f"{name}-storage",
            PlatformStorageArgs(
                cfg,
                k8s_provider,
                namespaces=services.namespace_resources,
                system_namespace=services.system_namespace,
                aws=aws_context,
            ),
            pulumi.ResourceOptions(parent=self),
        )
        self.outputs.storage = storage_output(cfg)
        bucket = cfg.storage.job_bucket
        if bucket is not None and cfg.storage.log_collector:
            LogCollector(
                f"{name}-logs",
                LogCollectorArgs(
                    cfg,
                    bucket,
                    _store_region(cfg),
                    k8s_provider,
                    aws=(
                        AwsLogAccess(
                            storage.key_arn,
                            aws_context.oidc_provider_arn,
                            aws_context.oidc_issuer_url,
                            aws_context.provider,
                        )
                        if aws_context is not None
                        else None
                    ),
                    depends_on=[services.system_namespace],
                ),
                pulumi.ResourceOptions(parent=self),
            )
        access = (
            TeamAccess(cluster_name=self.outputs.cluster_name, provider=aws_context.provider)
            if aws_context is not None
            else None
        )
        AdmissionPolicies(
            f"{name}-admission",
            AdmissionPoliciesArgs(cfg, k8s_provider),
            pulumi.ResourceOptions(parent=self),
        )
        for team in cfg.registry.teams:
            TeamResources(
                f"{name}-team-{team.name}",
                TeamResourcesArgs(
                    cfg,
                    team,
                    k8s_provider,
                    depends_on=[services.namespace_resources[team.name]],
                    access=access,
                ),
                pulumi.ResourceOptions(parent=self),
            )
        if cfg.gpu_pools:
            GpuPlugins(
                f"{name}-gpu-plugins",
                GpuPluginsArgs(cfg, k8s_provider, depends_on=[services.system_namespace]),
                pulumi.ResourceOptions(parent=self),
            )
        if health_pools(cfg):
            NodeHealth(
                f"{name}-health",
                NodeHealthArgs(
                    cfg,
                    k8s_provider,
                    system_namespace=services.system_namespace,
                    aws=NodeHealthAws(aws_context.provider, self.outputs.cluster_name)
                    if aws_context is not None
                    else None,
                ),
                pulumi.ResourceOptions(parent=self),
            )
        if prepull_pools(cfg):
            ImagePrePull(
                f"{name}-prepull",
                ImagePrePullArgs(
                    cfg,
                    k8s_provider,
                    system_namespace=services.system_namespace,
                    team_images=team_images or {},
                ),
                pulumi.ResourceOptions(parent=self),
            )
        self.outputs.gpu_pools = [pool_output(cfg, p) for p in cfg.gpu_pools]
        self.outputs.storage_classes = services.storage_classes
        self.outputs.team_namespaces = services.team_namespaces
        self.outputs.registry = {"groups": registry_groups(cfg)}
        self.outputs.teams = team_outputs(cfg)
        self.register_outputs({"clusterName": self.outputs.cluster_name})


def _store_region(cfg: PlatformConfig) -> str:
    """The job bucket's region: the cluster's on AWS, the object store's elsewhere."""
    if cfg.aws is not None:
        return cfg.aws.region
    assert cfg.storage.object_store is not None, "a job bucket is the platform's or the store's"
    return cfg.storage.object_store.region
