"""Table tests: every valid fixture loads; every invalid one fails with exactly its messages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainstack.config import ConfigError, PlatformConfig, TeamStackConfig, load_stack_file
from trainstack.yamlio import YamlSyntaxError

FIXTURES = Path(__file__).parent / "fixtures"
VALID = sorted((FIXTURES / "valid").glob("*.yaml"))
INVALID = sorted((FIXTURES / "invalid").glob("*.yaml"))


def expected_messages(path: Path) -> set[str]:
    return set(re.findall(r"^# expect: (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE))


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_fixture_loads(path: Path) -> None:
    config = load_stack_file(path)
    assert isinstance(config, PlatformConfig | TeamStackConfig)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_fixture_reports_exactly_its_errors(path: Path) -> None:
    expected = expected_messages(path)
    assert expected, f"{path.name} declares no '# expect:' line"
    with pytest.raises(ConfigError) as caught:
        load_stack_file(path)
    assert {str(issue) for issue in caught.value.issues} == expected
    text = str(caught.value)
    assert "Traceback" not in text
    if isinstance(caught.value, YamlSyntaxError):  # one line: file, line, column, problem
        assert re.fullmatch(rf"{re.escape(str(path))}:\d+:\d+: .+", text), text
        return
    # One clean, user-facing message naming the file and the count.
    assert text.startswith(f"{path}: {len(expected)} config error")


def test_fixture_tables_are_not_empty() -> None:
    assert len(VALID) >= 4
    assert len(INVALID) >= 12


def test_defaults_come_from_the_schema() -> None:
    config = load_stack_file(FIXTURES / "valid" / "minimal-aws.yaml")
    assert isinstance(config, PlatformConfig)
    assert config.environment == "development"
    assert config.cluster_name == "trainstack-minimal-aws"
    assert config.aws is not None
    eks = config.aws.cluster
    assert eks.endpoint.public
    assert eks.endpoint.private
    assert eks.endpoint.public_cidrs == ("0.0.0.0/0",)
    assert eks.logging == ("api", "audit", "authenticator")
    assert eks.log_retention_days == 90
    assert eks.system_node_group.instance_type == "m6i.xlarge"
    assert (eks.system_node_group.size.min, eks.system_node_group.size.max) == (2, 4)
    assert [a.name for a in eks.addons] == [
        "vpc-cni",
        "kube-proxy",
        "coredns",
        "eks-pod-identity-agent",
        "aws-ebs-csi-driver",
    ]
    assert all(a.version is None for a in eks.addons)


def test_model_is_frozen() -> None:
    config = load_stack_file(FIXTURES / "valid" / "team.yaml")
    assert isinstance(config, TeamStackConfig)
    assert config.platform_stack_name == "prod"
    with pytest.raises(AttributeError):
        config.team = "other"  # type: ignore[misc]


def test_private_endpoint_drops_public_cidrs() -> None:
    config = load_stack_file(FIXTURES / "valid" / "existing-vpc.yaml")
    assert isinstance(config, PlatformConfig)
    assert config.aws is not None
    assert config.aws.cluster.endpoint.public is False
    assert config.aws.cluster.endpoint.public_cidrs == ()


def test_rdma_pool_secondary_network_and_pod_socket_interface() -> None:
    """`rdma.secondaryNetwork` reaches the model; socketIfname defaults to the pod's eth0."""
    config = load_stack_file(FIXTURES / "valid" / "existing-pools.yaml")
    assert isinstance(config, PlatformConfig)
    ib, tcp = config.gpu_pools
    assert ib.existing is not None
    assert ib.existing.rdma is not None
    assert ib.existing.rdma.secondary_network == "ipoib-net"
    assert ib.existing.socket_ifname == "net1"
    assert tcp.existing is not None
    assert tcp.existing.socket_ifname == "eth0"
    assert tcp.existing.rdma is None
