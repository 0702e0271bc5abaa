"""VPC layout arithmetic: subnet CIDRs per availability zone, and their EKS tags."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from trainstack.config.model import MAX_VPC_PREFIX


@dataclass(frozen=True)
class SubnetPlan:
    availability_zone: str
    private_cidr: str
    public_cidr: str


def plan_subnets(vpc_cidr: str, zones: tuple[str, ...]) -> tuple[SubnetPlan, ...]:
    """Split the VPC into one large private and one small public subnet per zone.

    The VPC is cut into 2^k equal blocks (k = bits for zones + 1 spare block); zone i
    gets private block i, and the spare last block is cut into the public subnets.
    """
    network = ipaddress.IPv4Network(vpc_cidr, strict=True)
    if network.prefixlen > MAX_VPC_PREFIX:
        raise ValueError(f"VPC {vpc_cidr} is too small; use a /16 to /{MAX_VPC_PREFIX}")
    bits = math.ceil(math.log2(len(zones) + 1))
    blocks = list(network.subnets(prefixlen_diff=bits))
    # At least 4 public subnets in the spare block: they only hold NAT gateways and
    # load balancers, so a quarter of a private subnet is plenty.
    public_bits = max(math.ceil(math.log2(len(zones))), 2)
    publics = list(blocks[-1].subnets(prefixlen_diff=public_bits))
    return tuple(SubnetPlan(zone, str(blocks[i]), str(publics[i])) for i, zone in enumerate(zones))


def subnet_tags(cluster_name: str, *, public: bool) -> dict[str, str]:
    """Tags the AWS load balancer controller and EKS use to discover subnets."""
    role = "kubernetes.io/role/elb" if public else "kubernetes.io/role/internal-elb"
    return {role: "1", f"kubernetes.io/cluster/{cluster_name}": "shared"}


def s3_gateway_service(region: str) -> str:
    """The S3 gateway endpoint's service name ("com.amazonaws.<region>.s3"; VPC user guide,
    "Gateway endpoints for Amazon S3"). Gateway endpoints cost nothing and carry S3 traffic
    from the route tables they are attached to."""
    return f"com.amazonaws.{region}.s3"


# Interface endpoints a fully private cluster (no route to the internet) needs, each
# `com.amazonaws.<region>.<service>`, with what calls it; docs/aws.md ("Private clusters")
# prints this table and a test keeps the two equal, and keeps every AWS service the
# platform's own controllers call in it. trainstack creates only the S3 gateway endpoint:
# the VPCs it makes have NAT gateways, so the list is for clusters it is pointed at.
PRIVATE_CLUSTER_ENDPOINTS: dict[str, str] = {
    "ec2": "nodes joining; the VPC CNI assigning ENIs and addresses",
    "ecr.api": "image pulls from ECR (the layers themselves come through the S3 gateway)",
    "ecr.dkr": "image pulls from ECR",
    "sts": "IRSA, and the Cluster Autoscaler",
    "logs": "CloudWatch Logs",
    "elasticloadbalancing": "load balancers created by the AWS Load Balancer Controller",
    "autoscaling": "the Cluster Autoscaler",
    "eks": (
        "the Cluster Autoscaler's DescribeNodegroup, which gives a pool at zero its labels, "
        "taints and node-template tags (EFA devices, hugepages): without it no EFA pool "
        "scales up from zero"
    ),
    "eks-auth": (
        "EKS Pod Identity: the VPC CNI, the CSI drivers and the autoscaler get their roles "
        "through it"
    ),
}
