"""Network component and the subnet arithmetic behind it."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pulumi
import pulumi_aws as aws
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import Recorded
from trainstack.builders.network import plan_subnets
from trainstack.components.network import Network, NetworkArgs
from trainstack.config.model import ExistingVpc, NewVpc, Subnet


def test_new_vpc_layout_per_zone(run_program: Callable[..., Recorded]) -> None:
    zones = ("us-west-2a", "us-west-2b", "us-west-2c")

    def program() -> None:
        provider = aws.Provider("p", region="us-west-2")
        Network(
            "net", NetworkArgs("c1", NewVpc("10.0.0.0/16", zones, "single"), provider, "eu-west-1")
        )

    rec = run_program(program)
    component = rec.one("trainstack:aws:Network", "net")
    vpc = rec.one("aws:ec2/vpc:Vpc", "net-vpc")
    assert rec.parent_of(vpc) is component
    assert vpc.inputs["cidrBlock"] == "10.0.0.0/16"
    assert vpc.inputs["enableDnsHostnames"] is True
    subnets = rec.of_type("aws:ec2/subnet:Subnet")
    private = sorted(s.inputs["cidrBlock"] for s in subnets if "private" in s.name)
    public = sorted(s.inputs["cidrBlock"] for s in subnets if "public" in s.name)
    assert private == ["10.0.0.0/18", "10.0.128.0/18", "10.0.64.0/18"]
    assert public == ["10.0.192.0/20", "10.0.208.0/20", "10.0.224.0/20"]
    for s in subnets:
        role = "internal-elb" if "private" in s.name else "elb"
        assert s.inputs["tags"][f"kubernetes.io/role/{role}"] == "1"
        assert s.inputs["tags"]["kubernetes.io/cluster/c1"] == "shared"
        assert rec.provider_name(s) == "p"
        assert rec.parent_of(s) is component
    # single NAT: one gateway and one EIP for all zones
    assert len(rec.of_type("aws:ec2/natGateway:NatGateway")) == 1
    assert len(rec.of_type("aws:ec2/eip:Eip")) == 1
    private_routes = [
        r for r in rec.of_type("aws:ec2/routeTable:RouteTable") if "private" in r.name
    ]
    assert len(private_routes) == 3
    assert {r.inputs["routes"][0]["natGatewayId"] for r in private_routes} == {
        "net-nat-us-west-2a-id"
    }


def test_per_az_nat(run_program: Callable[..., Recorded]) -> None:
    zones = ("eu-west-1a", "eu-west-1b")

    def program() -> None:
        provider = aws.Provider("p", region="eu-west-1")
        Network(
            "net", NetworkArgs("c1", NewVpc("10.8.0.0/16", zones, "perAz"), provider, "eu-west-1")
        )

    rec = run_program(program)
    nats = rec.of_type("aws:ec2/natGateway:NatGateway")
    assert sorted(n.name for n in nats) == ["net-nat-eu-west-1a", "net-nat-eu-west-1b"]
    routes = {
        r.name: r.inputs["routes"][0]["natGatewayId"]
        for r in rec.of_type("aws:ec2/routeTable:RouteTable")
        if "private" in r.name
    }
    assert routes == {
        "net-private-rt-eu-west-1a": "net-nat-eu-west-1a-id",
        "net-private-rt-eu-west-1b": "net-nat-eu-west-1b-id",
    }


def test_s3_traffic_takes_the_gateway_endpoint(run_program: Callable[..., Recorded]) -> None:
    """Issue 17 #6: without an S3 gateway endpoint, checkpoint writes and image layer pulls
    (ECR serves layers from S3) went through NAT, billed per GB."""
    zones = ("eu-west-1a", "eu-west-1b")

    def program() -> None:
        provider = aws.Provider("p", region="eu-west-1")
        net = NewVpc("10.8.0.0/16", zones, "perAz")
        Network("net", NetworkArgs("c1", net, provider, "eu-west-1"))

    rec = run_program(program)
    endpoint = rec.one("aws:ec2/vpcEndpoint:VpcEndpoint", "net-s3")
    assert endpoint.inputs["serviceName"] == "com.amazonaws.eu-west-1.s3"
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert endpoint.inputs["routeTableIds"] == [
        "net-private-rt-eu-west-1a-id",
        "net-private-rt-eu-west-1b-id",
    ]


def test_existing_vpc_creates_nothing(run_program: Callable[..., Recorded]) -> None:
    existing = ExistingVpc(
        "vpc-0123456789abcdef0",
        (Subnet("subnet-01234567", "us-east-2a"), Subnet("subnet-89abcdef", "us-east-2b")),
    )
    seen: dict[str, object] = {}

    def program() -> None:
        provider = aws.Provider("p", region="us-east-2")
        net = Network("net", NetworkArgs("c1", existing, provider, "eu-west-1"))
        seen["zones"] = [zone for zone, _ in net.private_subnets]
        pulumi.export("ids", net.private_subnet_ids)

    rec = run_program(program)
    assert [r.type for r in rec.records if r.custom] == ["pulumi:providers:aws"]
    assert seen["zones"] == ["us-east-2a", "us-east-2b"]
    assert rec.result.outputs["ids"] == ["subnet-01234567", "subnet-89abcdef"]


@given(
    prefix=st.integers(min_value=16, max_value=20),
    zone_count=st.integers(min_value=2, max_value=6),
    base=st.integers(min_value=0, max_value=255),
)
def test_subnet_plan_is_disjoint_and_inside_the_vpc(
    prefix: int, zone_count: int, base: int
) -> None:
    vpc = ipaddress.IPv4Network(f"10.{base}.0.0/{prefix}", strict=False)
    zones = tuple(f"us-west-2{chr(ord('a') + i)}" for i in range(zone_count))
    plans = plan_subnets(str(vpc), zones)
    assert [p.availability_zone for p in plans] == list(zones)
    nets = [ipaddress.IPv4Network(c) for p in plans for c in (p.private_cidr, p.public_cidr)]
    assert all(n.subnet_of(vpc) for n in nets)
    for i, a in enumerate(nets):
        for b in nets[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    # private subnets hold the pods: each is at least 4x a public one
    for p in plans:
        private = ipaddress.IPv4Network(p.private_cidr)
        public = ipaddress.IPv4Network(p.public_cidr)
        assert private.num_addresses >= 4 * public.num_addresses
