"""GPU node pools on EKS and the device plugins that expose GPUs and RDMA devices."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from trainstack.builders import autoscaler
from trainstack.builders import device_plugins as dp
from trainstack.builders import nodegroups as ng
from trainstack.builders import pools as b
from trainstack.builders.fabric import efa_network_interfaces
from trainstack.components.kube import addon_release, apply_manifest
from trainstack.components.nodes import (
    encrypted_root_volume,
    imdsv2_only,
    scaling,
    tag_specifications,
)
from trainstack.config.model import GpuPool, PlatformConfig

# Kubernetes' taint effects as the EKS API spells them (API_Taint: NO_SCHEDULE, ...).
_TAINT_EFFECTS = {
    "NoSchedule": "NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
}
_CAPACITY_TYPES = {
    "onDemand": "ON_DEMAND",
    "spot": "SPOT",
    "reservation": "ON_DEMAND",
    "capacityBlock": "CAPACITY_BLOCK",
}


@dataclass(frozen=True)
class GpuNodePoolArgs:
    config: PlatformConfig
    pool: GpuPool
    cluster_name: pulumi.Input[str]
    cluster_security_group_id: pulumi.Input[str]
    node_role_arn: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    subnet_ids: list[pulumi.Output[str]]
    provider: pulumi.ProviderResource
    # What nodes need before they can join and before their last instance is gone: the node
    # role's policy attachments and the early add-ons (vpc-cni) (EksCluster.node_dependencies).
    node_dependencies: tuple[pulumi.Resource, ...] = ()


class GpuNodePool(pulumi.ComponentResource):
    """An EKS managed node group whose EFA wiring is right by construction."""

    node_group: aws.eks.NodeGroup

    def __init__(
        self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:aws:GpuNodePool", name, None, opts)
        cfg, pool = args.config, args.pool
        assert pool.aws is not None, "GpuNodePool is for AWS pools"
        spec = pool.aws
        instance = b.instance_of(pool)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)

        interfaces = None
        if pool.fabric == "efa":
            # EFA traffic must be allowed to and from every interface of the pool.
            group = aws.ec2.SecurityGroup(
                f"{name}-efa",
                vpc_id=args.vpc_id,
                description=f"EFA traffic within GPU pool {pool.name}",
                tags={"Name": f"{cfg.cluster_name}-{pool.name}-efa"},
                opts=child,
            )
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-efa-in",
                security_group_id=group.id,
                referenced_security_group_id=group.id,
                ip_protocol="-1",
                description="all traffic from the pool itself",
                opts=child,
            )
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-efa-out",
                security_group_id=group.id,
                referenced_security_group_id=group.id,
                ip_protocol="-1",
                description="all traffic to the pool itself",
                opts=child,
            )
            interfaces = [
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=i["networkCardIndex"],
                    device_index=i["deviceIndex"],
                    interface_type=i["interfaceType"],
                    security_groups=i["securityGroups"],
                    delete_on_termination=i["deleteOnTermination"],
                )
                for i in efa_network_interfaces(
                    instance, [group.id, args.cluster_security_group_id]
                )
            ]

        placement = None
        if spec.placement_group_name is not None:
            # The group a reservation was created in: the operator's, not created here.
            placement = aws.ec2.LaunchTemplatePlacementArgs(
                group_name=spec.placement_group_name, availability_zone=spec.availability_zone
            )
        elif spec.placement_group:
            placement_group = aws.ec2.PlacementGroup(
                f"{name}-pg",
                name=b.placement_group_name(cfg.cluster_name, pool),
                strategy="cluster",
                opts=child,
            )
            # The group's output, not its name as a string: the template then waits for the
            # group, and the group outlives the template on deletion.
            placement = aws.ec2.LaunchTemplatePlacementArgs(
                group_name=placement_group.name, availability_zone=spec.availability_zone
            )

        reservation = None
        market = None
        if spec.capacity.type in ("reservation", "capacityBlock"):
            reservation = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                    capacity_reservation_id=spec.capacity.reservation_id,
                    capacity_reservation_resource_group_arn=spec.capacity.reservation_group_arn,
                )
            )
        if spec.capacity.type == "capacityBlock":
            market = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")

        user_data = b.node_user_data(
            pool,
            cfg.storage.nvme_cache,
            isolate_gpus=cfg.gpu_device_list_strategy == "volume-mounts",
            pre_pull=cfg.pre_pull,
        )
        template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"{cfg.cluster_name} GPU pool {pool.name} ({instance.name})",
            metadata_options=imdsv2_only(hop_limit=ng.GPU_IMDS_HOP_LIMIT),
            block_device_mappings=encrypted_root_volume(
                spec.disk_size_gib,
                throughput_mibps=b.FAST_PULL_ROOT_THROUGHPUT_MIBPS
                if cfg.pre_pull.soci == "parallel-pull-unpack"
                else None,
            ),
            instance_type=ng.launch_template_instance_type(pool),
            tag_specifications=tag_specifications(ng.launch_tags(cfg, pool), ng.TAGGED_RESOURCES),
            network_interfaces=interfaces,
            placement=placement,
            capacity_reservation_specification=reservation,
            instance_market_options=market,
            user_data=base64.b64encode(user_data.encode()).decode() if user_data else None,
            opts=child,
        )
        scaling_config, ignore = scaling(spec.size, cfg.cluster_name, pool.name, args.provider)
        self.node_group = aws.eks.NodeGroup(
            f"{name}-nodes",
            cluster_name=args.cluster_name,
            node_group_name=pool.name,
            node_role_arn=args.node_role_arn,
            subnet_ids=args.subnet_ids,
            instance_types=ng.node_group_instance_types(pool),
            # EKS-optimised accelerated AMI (NVIDIA driver, EFA) for the cluster's version.
            ami_type="AL2023_x86_64_NVIDIA",
            capacity_type=_CAPACITY_TYPES[spec.capacity.type],
            scaling_config=scaling_config,
            node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(enabled=True)
            if ng.node_repair(cfg)
            else None,
            update_config=aws.eks.NodeGroupUpdateConfigArgs(
                max_unavailable=1, update_strategy=ng.update_strategy(pool)
            ),
            labels={**b.node_labels(cfg, pool), **autoscaler.accelerator_label(pool)},
            # What Cluster Autoscaler cannot derive for this pool at zero (EFA, hugepages);
            # it reads the node group's tags through DescribeNodegroup.
            tags=autoscaler.node_group_tags(pool),
            # The GPU taint and, with the health gate on, its startup taint (b.node_taints
            # says why they belong here and not in the user data).
            taints=[
                aws.eks.NodeGroupTaintArgs(
                    key=t["key"], value=t["value"], effect=_TAINT_EFFECTS[t["effect"]]
                )
                for t in b.node_taints(cfg, pool)
            ],
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)
            ),
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    depends_on=list(args.node_dependencies),
                    # The autoscaler owns the current size between min and max; `pulumi up`
                    # must not reset it, nor send it below a new min (docs/aws.md).
                    ignore_changes=ignore,
                ),
            ),
        )
        self.register_outputs({"nodeGroup": self.node_group.node_group_name})


@dataclass(frozen=True)
class GpuPluginsArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource
    depends_on: list[pulumi.Resource]


class GpuPlugins(pulumi.ComponentResource):
    """Device plugins from upstream charts, each scheduled only where its device exists."""

    def __init__(
        self, name: str, args: GpuPluginsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:k8s:GpuPlugins", name, None, opts)
        cfg = self._config = args.config
        child = pulumi.ResourceOptions(
            parent=self, provider=args.k8s_provider, depends_on=args.depends_on
        )
        gpu_values = (
            dp.gpu_operator_values(cfg)
            if cfg.gpu_device_plugin == "gpu-operator"
            else dp.nvidia_device_plugin_values(cfg)
        )
        self._release(name, cfg.gpu_device_plugin, gpu_values, child)
        if any(p.fabric == "efa" for p in cfg.gpu_pools):
            self._release(
                name, "aws-efa-k8s-device-plugin", dp.efa_device_plugin_values(cfg), child
            )
        if dp.network_operator_enabled(cfg):
            operator = self._release(name, "network-operator", dp.network_operator_values(), child)
            apply_manifest(
                f"{name}-nic-policy",
                dp.nic_cluster_policy(cfg),
                pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[operator])),
            )
        self.register_outputs({})

    def _release(
        self, name: str, key: str, values: dict[str, object], opts: pulumi.ResourceOptions
    ) -> pulumi.Resource:
        return addon_release(f"{name}-{key}", key, self._config, values=values, opts=opts)
