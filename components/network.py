"""The VPC for an EKS platform: private subnets for nodes and pods, public ones for NAT."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from trainstack.builders.network import plan_subnets, s3_gateway_service, subnet_tags
from trainstack.config.model import ExistingVpc, NewVpc


@dataclass(frozen=True)
class NetworkArgs:
    cluster_name: str
    network: NewVpc | ExistingVpc
    provider: pulumi.ProviderResource
    region: str


class Network(pulumi.ComponentResource):
    """Creates a VPC (or adopts an existing one) and exposes private subnets by zone."""

    vpc_id: pulumi.Output[str]
    # (availability zone, subnet id): GPU pools pick the subnets of their zone.
    private_subnets: list[tuple[str, pulumi.Output[str]]]

    def __init__(
        self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:aws:Network", name, None, opts)
        net = args.network
        if isinstance(net, ExistingVpc):
            self.vpc_id = pulumi.Output.from_input(net.vpc_id)
            self.private_subnets = [
                (s.availability_zone, pulumi.Output.from_input(s.id)) for s in net.private_subnets
            ]
        else:
            self._create(name, args, net)
        self.register_outputs({"vpcId": self.vpc_id, "privateSubnetIds": self.private_subnet_ids})

    @property
    def private_subnet_ids(self) -> list[pulumi.Output[str]]:
        return [subnet_id for _, subnet_id in self.private_subnets]

    def _create(self, name: str, args: NetworkArgs, net: NewVpc) -> None:
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=net.cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": f"{args.cluster_name}-vpc"},
            opts=child,
        )
        igw = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=vpc.id, tags={"Name": f"{args.cluster_name}-igw"}, opts=child
        )
        public_rt = aws.ec2.RouteTable(
            f"{name}-public-rt",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags={"Name": f"{args.cluster_name}-public"},
            opts=child,
        )
        self.vpc_id = vpc.id
        self.private_subnets = []
        nat_ids: list[pulumi.Output[str]] = []
        private_route_tables: list[pulumi.Output[str]] = []
        for plan in plan_subnets(net.cidr, net.availability_zones):
            zone = plan.availability_zone
            public = aws.ec2.Subnet(
                f"{name}-public-{zone}",
                vpc_id=vpc.id,
                cidr_block=plan.public_cidr,
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={
                    "Name": f"{args.cluster_name}-public-{zone}",
                    **subnet_tags(args.cluster_name, public=True),
                },
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{zone}",
                subnet_id=public.id,
                route_table_id=public_rt.id,
                opts=child,
            )
            if net.nat_gateways == "perAz" or not nat_ids:
                eip = aws.ec2.Eip(f"{name}-nat-{zone}", domain="vpc", opts=child)
                nat = aws.ec2.NatGateway(
                    f"{name}-nat-{zone}",
                    allocation_id=eip.id,
                    subnet_id=public.id,
                    tags={"Name": f"{args.cluster_name}-nat-{zone}"},
                    opts=child,
                )
                nat_ids.append(nat.id)
            private = aws.ec2.Subnet(
                f"{name}-private-{zone}",
                vpc_id=vpc.id,
                cidr_block=plan.private_cidr,
                availability_zone=zone,
                tags={
                    "Name": f"{args.cluster_name}-private-{zone}",
                    **subnet_tags(args.cluster_name, public=False),
                },
                opts=child,
            )
            private_rt = aws.ec2.RouteTable(
                f"{name}-private-rt-{zone}",
                vpc_id=vpc.id,
                routes=[
                    aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat_ids[-1])
                ],
                tags={"Name": f"{args.cluster_name}-private-{zone}"},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{zone}",
                subnet_id=private.id,
                route_table_id=private_rt.id,
                opts=child,
            )
            private_route_tables.append(private_rt.id)
            self.private_subnets.append((zone, private.id))
        # Checkpoints and image layers (ECR keeps them in S3) go to S3 by the gateway, not
        # through NAT, which bills per GB and caps bandwidth (issue 17 #6; docs/aws.md).
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=s3_gateway_service(args.region),
            vpc_endpoint_type="Gateway",
            route_table_ids=private_route_tables,
            tags={"Name": f"{args.cluster_name}-s3"},
            opts=child,
        )
