"""What an EKS managed node group of a GPU pool must look like for AWS to accept and run it:
where the instance type goes, how updates proceed, IMDS, tags. Each rule cites its source;
docs/aws.md lists them with their tests."""

from __future__ import annotations

from trainstack.builders import labels
from trainstack.builders.pools import instance_of
from trainstack.config.model import GpuPool, NodeGroupSize, PlatformConfig

# Pods must not reach the node role through instance metadata: with IMDSv2 and one hop, a
# request from a pod's network namespace never gets a token (EKS best practices, "Restrict
# access to the instance profile assigned to the worker node"). Host-network pods (aws-node,
# the device plugins) still can; the VPC CNI has its own role (builders/eks.ADDON_POLICIES).
GPU_IMDS_HOP_LIMIT = 1
# Tags the EC2 instances, their volumes and network interfaces carry: a managed node group's
# own tags "don't propagate to other resources in the node group, such as Auto Scaling groups
# or instances" (EKS user guide, create-managed-node-group), nor do provider default tags,
# which apply to the resources Pulumi creates. Only these types are valid in a launch
# template's TagSpecifications for on-demand and capacity-block launches (EC2
# LaunchTemplateTagSpecificationRequest; spot-instances-request fails non-spot launches).
TAGGED_RESOURCES = ("instance", "volume", "network-interface")


def launch_template_instance_type(pool: GpuPool) -> str | None:
    """Capacity blocks: the launch template must name the instance type ("InstanceType set to
    an instance type that supports Capacity Blocks", EKS user guide capacity-blocks-mng), or
    EKS rejects the node group."""
    assert pool.aws is not None
    return instance_of(pool).name if pool.aws.capacity.type == "capacityBlock" else None


def node_group_instance_types(pool: GpuPool) -> list[str] | None:
    """The node group's instanceTypes, absent when the launch template names the type: "If
    you specify an instance type in a launch template ... you can't specify any instance types
    ... using other tools that use the Amazon EKS API" (EKS user guide, launch-templates)."""
    if launch_template_instance_type(pool) is not None:
        return None
    return [instance_of(pool).name]


def update_strategy(pool: GpuPool) -> str:
    """MINIMAL for reserved capacity: DEFAULT launches replacements before it terminates old
    nodes, and a reservation or capacity block without a spare instance never gets one, so the
    update stalls. MINIMAL "terminates the old nodes before creating the new ones, so that
    total capacity never increases beyond your configured quantity" (EKS user guide,
    managed-node-update-behavior; API NodegroupUpdateConfig.updateStrategy)."""
    assert pool.aws is not None
    return "MINIMAL" if pool.aws.capacity.type in ("reservation", "capacityBlock") else "DEFAULT"


def launch_tags(cfg: PlatformConfig, pool: GpuPool) -> dict[str, str]:
    """Cost tags for what the node group launches: the stack's tags and the pool."""
    return {
        **labels.aws_tags(cfg.stack, cfg.tags),
        labels.POOL: pool.name,
        "Name": f"{cfg.cluster_name}-{pool.name}",
    }


NODE_MONITORING_AGENT = "eks-node-monitoring-agent"


def node_repair(cfg: PlatformConfig) -> bool:
    """Auto-repair GPU nodes when the node monitoring agent reports their health: without the
    agent, repair acts only on the kubelet's Ready condition and deleted nodes, not on GPU or
    EFA faults (EKS user guide, node-health, "Enable node auto repair"). A repaired
    node's jobs restart from their last checkpoint, as after any eviction."""
    if cfg.aws is None:
        return False
    return any(pin.name == NODE_MONITORING_AGENT for pin in cfg.aws.cluster.addons)


# The autoscaler (and an operator) own a node group's current size between min and max, so
# `pulumi up` ignores the desired size: the provider then sends the size from the stack's
# state with any new min or max. Raising min above it fails: EKS refuses "Minimum capacity N
# can't be greater than desired size M" (UpdateNodegroupConfig; hashicorp/
# terraform-provider-aws#18310, terraform-aws-modules/terraform-aws-eks#3306). So the
# program reads the live size and, only when the new bounds exclude it, sends the nearest
# size inside them (issue 39 #5, #6).
DESIRED_SIZE = "scalingConfig.desiredSize"
SYSTEM_NODE_GROUP = "system"


def desired_size(size: NodeGroupSize, live: int | None) -> tuple[int, list[str]]:
    """The desired size to send and the properties `pulumi up` must ignore.

    ``live`` is the node group's current desired size (None: it does not exist yet, or it
    could not be read, as in the offline preview). A new node group starts at the configured
    size; a live one keeps its size, which the update leaves alone, unless it lies outside
    the new [min, max], when the clamped size is sent so that EKS accepts the new bounds.
    """
    if live is None:
        return size.desired, [DESIRED_SIZE]
    clamped = min(max(live, size.min), size.max)
    if clamped == live:
        return size.desired, [DESIRED_SIZE]
    return clamped, []
