"""Cluster Autoscaler as data: the pinned chart and its values, its IAM policy, and what it
must know of a GPU pool to scale it up from zero (issue 17 #2).

Sources (kubernetes/autoscaler at tags cluster-autoscaler-1.33.0 and
cluster-autoscaler-chart-9.51.0; docs/aws.md has the table):
- A node group at zero has no node to copy, so CA builds a template node
  (cloudprovider/aws/aws_manager.go buildNodeFromTemplate): GPUs from the instance type,
  labels and taints of an EKS managed node group from DescribeNodegroup, and any other
  resource from a `k8s.io/cluster-autoscaler/node-template/resources/<name>` tag, which CA
  1.28+ also reads from the managed node group's own tags (getManagedNodegroupTags). EFA
  devices and hugepages are never derived: without the tags a job requesting them never
  scales its pool up.
- CA counts a pending pod when PodScheduled is False with reason Unschedulable, whatever its
  scheduler (utils/kubernetes/listers.go); Volcano v1.15.1 sets that for a pod it cannot place
  (api/job_info.go TaskSchedulingReason). With the `enqueue` action and no GPU node, Volcano
  never creates the pods (volcano#3804, #3910): scale from zero needs `preemption: true`,
  whose actions have no enqueue (builders/scheduling.scheduler_config).
- Volcano Job pods count as replicated to CA (a controller of kind Job), so scale-down would
  evict them; `safe-to-evict: "false"` on the pod keeps its node while it runs and lapses when
  it ends (FAQ "What types of pods can prevent CA from removing a node?").
"""

from __future__ import annotations

from typing import Any

from trainstack.builders import labels
from trainstack.builders.fabric import HUGEPAGES_RESOURCE
from trainstack.builders.pools import (
    GPU_TAINT,
    fabric_profile,
    gpu_resources_per_node,
    instance_of,
    node_labels,
)
from trainstack.config.model import GpuPool, PlatformConfig
from trainstack.contracts import health as health_contract

CHART = {
    "chart": "cluster-autoscaler",
    # 9.51.0 is the last 1.33 chart (Chart.yaml appVersion 1.33.0; 9.52.0 moves to 1.34).
    "version": "9.51.0",
    "repo": "https://kubernetes.github.io/autoscaler",
}
RELEASE = "cluster-autoscaler"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"  # fixed, for the Pod Identity association
TEMPLATE_RESOURCE = "k8s.io/cluster-autoscaler/node-template/resources/"
# CA treats a node with this label and no allocatable GPU yet as unready, instead of scaling
# up again while the device plugin starts (aws README, "Special note on GPU instances").
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"


def accelerator_label(pool: GpuPool) -> dict[str, str]:
    return {ACCELERATOR_LABEL: f"nvidia-{instance_of(pool).gpu_model.lower()}"}


def node_group_tags(pool: GpuPool) -> dict[str, str]:
    """Resources CA cannot derive for a pool at zero, as node-template tags on the node group
    (units as in a pod's resources)."""
    tags = {
        f"{TEMPLATE_RESOURCE}{name}": str(count)
        for name, count in sorted(fabric_profile(pool).devices_per_node.items())
    }
    hugepages = fabric_profile(pool).hugepages_mi_per_node
    if hugepages:
        tags[f"{TEMPLATE_RESOURCE}{HUGEPAGES_RESOURCE}"] = f"{hugepages}Mi"
    # GPU slices: CA knows a type's GPUs from EC2, never how the MIG manager or the device
    # plugin will cut them (docs/gpu-sharing.md); without these a slice job could not scale
    # a pool up from zero.
    if pool.sharing is not None:
        tags |= {
            f"{TEMPLATE_RESOURCE}{name}": str(count)
            for name, count in sorted(gpu_resources_per_node(pool).items())
        }
    return tags


def node_template(cfg: PlatformConfig, pool: GpuPool) -> dict[str, Any]:
    """The node CA imagines for `pool` at zero, from the same data as its node group: what a
    pending job must fit for CA to scale the pool up (tests hold the job layer to it)."""
    instance = instance_of(pool)
    capacity: dict[str, str] = {
        "cpu": str(instance.vcpu),
        "memory": f"{instance.memory_gib}Gi",
        **{name: str(count) for name, count in gpu_resources_per_node(pool).items()},
        "pods": "110",
    }
    for key, value in node_group_tags(pool).items():
        capacity[key.removeprefix(TEMPLATE_RESOURCE)] = value
    return {
        "labels": {**node_labels(cfg, pool), **accelerator_label(pool)},
        "taints": [dict(GPU_TAINT)],
        "capacity": capacity,
    }


def iam_policy(cluster_name: str) -> dict[str, Any]:
    """The aws README's "Full Cluster Autoscaler Features Policy", writes limited to the
    cluster's node groups by the discovery tag EKS puts on their Auto Scaling groups."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": [
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                    "eks:DescribeNodegroup",
                ],
                "Resource": ["*"],
            },
            {
                "Effect": "Allow",
                "Action": [
                    "autoscaling:SetDesiredCapacity",
                    "autoscaling:TerminateInstanceInAutoScalingGroup",
                ],
                "Resource": ["*"],
                "Condition": {
                    "StringEquals": {
                        f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"
                    }
                },
            },
        ],
    }


def values(cfg: PlatformConfig, region: str) -> dict[str, Any]:
    """Keys of the chart's values.yaml at 9.51.0 only (tests check them when the chart's
    source is at hand)."""
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cfg.cluster_name},
        "rbac": {"serviceAccount": {"create": True, "name": SERVICE_ACCOUNT}},
        "nodeSelector": {labels.ROLE: "system"},
        "extraArgs": {
            "expander": "least-waste",
            # A gang must land in its own pool and zone, never be split to balance groups.
            "balance-similar-node-groups": False,
            # Training pods use emptyDir (/dev/shm); safe-to-evict protects the running ones.
            "skip-nodes-with-local-storage": False,
            "skip-nodes-with-system-pods": True,
            # GPU instances take a while to boot and start the device plugin.
            "max-node-provision-time": "20m0s",
            **startup_taints(cfg),
        },
    }


def startup_taints(cfg: PlatformConfig) -> dict[str, str]:
    """The health gate's taint as a startup taint (issue 42). The pools' node groups carry
    it (pools.node_taints), so CA's scale-from-zero template would have it and no pending
    pod would fit the pool; and a registered node holding it would look ready but unusable,
    so CA would scale up again. A startup taint is removed from templates and makes CA count
    the node as not yet started (kubernetes/autoscaler at cluster-autoscaler-1.33.0:
    cloudprovider/aws/aws_manager.go appends the node group's taints to the template,
    simulator/node_info_utils.go sanitizes it with utils/taints/taints.go SanitizeTaints, and
    FilterOutNodesWithStartupTaints marks such nodes unready; the flag `--startup-taint`,
    config/flags/flags.go). The chart renders each extraArgs entry as `--key=value`
    (cluster-autoscaler-chart-9.51.0 templates/deployment.yaml)."""
    if not cfg.health.enabled:
        return {}
    return {"startup-taint": health_contract.TAINT_KEY}
