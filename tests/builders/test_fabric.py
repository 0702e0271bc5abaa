"""EFA interface layouts and fabric profiles, per instance family."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainstack.builders.fabric import (
    EFA_RESOURCE,
    OBSOLETE_EFA_ENV,
    FabricProfile,
    divisors,
    efa_network_interfaces,
    efa_profile,
    rdma_profile,
    tcp_profile,
)
from trainstack.catalog import catalog, lookup
from trainstack.config.interfaces import pod_interfaces, socket_ifname_matches
from trainstack.jobs.platform import profile


def layout(name: str) -> list[tuple[int, int, str]]:
    return [
        (i["networkCardIndex"], i["deviceIndex"], i["interfaceType"])
        for i in efa_network_interfaces(lookup(name), ["sg-efa"])
    ]


def test_p5_interfaces_one_efa_per_card() -> None:
    interfaces = layout("p5.48xlarge")
    assert interfaces[:3] == [(0, 0, "interface"), (0, 1, "efa-only"), (1, 0, "efa-only")]
    assert interfaces[-1] == (31, 0, "efa-only")
    assert len(interfaces) == 33
    assert sum(1 for _, _, kind in interfaces if kind == "efa-only") == 32


def test_p4d_and_p5en_and_single_card_types() -> None:
    assert layout("p4d.24xlarge") == [
        (0, 0, "interface"),
        (0, 1, "efa-only"),
        (1, 0, "efa-only"),
        (2, 0, "efa-only"),
        (3, 0, "efa-only"),
    ]
    assert sum(1 for _, _, kind in layout("p5en.48xlarge") if kind == "efa-only") == 16
    assert layout("g5.48xlarge") == [(0, 0, "interface"), (0, 1, "efa-only")]


def test_every_interface_carries_the_security_group() -> None:
    for interface in efa_network_interfaces(lookup("p6-b200.48xlarge"), ["sg-1", "sg-2"]):
        assert interface["securityGroups"] == ["sg-1", "sg-2"]
        assert interface["deleteOnTermination"] == "true"


def test_efa_on_a_type_without_efa_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"g5\.xlarge has no EFA"):
        efa_network_interfaces(lookup("g5.xlarge"), [])
    with pytest.raises(ValueError, match=r"g5\.xlarge has no EFA"):
        efa_profile(lookup("g5.xlarge"))


@pytest.mark.parametrize(("name", "efa"), [("p5.48xlarge", 32), ("p5en.48xlarge", 16)])
def test_profile_devices(name: str, efa: int) -> None:
    profile = efa_profile(lookup(name))
    assert profile.gpus_per_node == 8
    assert profile.devices_per_node == {EFA_RESOURCE: efa}
    assert profile.resources_for(8) == {
        "nvidia.com/gpu": "8",
        EFA_RESOURCE: str(efa),
        "hugepages-2Mi": "5120Mi",
    }
    assert profile.resources_for(4)[EFA_RESOURCE] == str(efa // 2)


def test_profiles_never_emit_obsolete_efa_settings() -> None:
    for instance in catalog().values():
        if instance.supports_efa:
            assert not OBSOLETE_EFA_ENV & set(efa_profile(instance).env), instance.name


def _roce(**extra: Any) -> Any:
    return rdma_profile(
        "roce",
        gpus_per_node=8,
        resource="rdma/rdma_shared_device_a",
        hcas="mlx5_0,mlx5_1",
        socket_ifname="eth0",
        **extra,
    )


def test_roce_and_tcp_env() -> None:
    roce = _roce()
    assert roce.env["NCCL_IB_GID_INDEX"] == "3"
    assert roce.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    ib = rdma_profile(
        "infiniband",
        gpus_per_node=8,
        resource="rdma/ib",
        hcas="mlx5",
        socket_ifname="ib0",
    )
    assert "NCCL_IB_GID_INDEX" not in ib.env
    # one shared RDMA device per replica, whatever its GPU share
    assert roce.resources_for(2) == {"nvidia.com/gpu": "2", "rdma/rdma_shared_device_a": "1"}
    assert ib.resources_for(8) == {"nvidia.com/gpu": "8", "rdma/ib": "1"}
    assert tcp_profile(4, "eth0").env["NCCL_IB_DISABLE"] == "1"


def test_uneven_share_is_rejected_with_the_valid_choices() -> None:
    profile = efa_profile(lookup("p5.48xlarge"))
    with pytest.raises(ValueError, match="use one of 1, 2, 4, 8"):
        profile.resources_for(3)


@given(gpus=st.sampled_from([1, 2, 4, 8]))
def test_shares_add_up_to_the_node_or_are_refused(gpus: int) -> None:
    for name in ("p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"):
        profile = efa_profile(lookup(name))
        replicas = profile.gpus_per_node // gpus
        if profile.devices_per_node[EFA_RESOURCE] % replicas:
            # e.g. 4 EFA on an 8-GPU p4d cannot be split over eight 1-GPU replicas
            with pytest.raises(ValueError, match="cannot be split"):
                profile.resources_for(gpus)
            continue
        share = profile.resources_for(gpus)
        assert int(share[EFA_RESOURCE]) * replicas == profile.devices_per_node[EFA_RESOURCE]
        hugepages = int(share["hugepages-2Mi"].removesuffix("Mi"))
        assert hugepages * replicas == profile.hugepages_mi_per_node


def test_rdma_pods_join_the_secondary_network() -> None:
    """Issue 15: RoCE pods need the RDMA devices and an address on the fabric.

    What the NVIDIA Network Operator expects of a pod using the RDMA shared device plugin
    (Mellanox/network-operator v25.7.0 example/rdma-gpu-test-pod1.yml,
    Mellanox/network-operator-docs v25.7.0 docs/deployment-guide-kubernetes.rst): the
    `rdma/<resourceName>` resource and the `k8s.v1.cni.cncf.io/networks` annotation naming its
    secondary network (a MacvlanNetwork's NetworkAttachmentDefinition). Multus names that
    interface net1 (multus-cni v4.3.0 pkg/multus/multus.go getIfname); eth0 stays the cluster
    network. The example's IPC_LOCK is not carried over (issue 19 #10): the trainer is not
    root, so an added capability would never take effect (builders/fabric.py).
    """
    roce = _roce(secondary_network="default/roce-net")
    assert roce.pod_annotations() == {"k8s.v1.cni.cncf.io/networks": "default/roce-net"}
    assert roce.to_json()["secondaryNetwork"] == "default/roce-net"
    ib = rdma_profile(
        "infiniband", gpus_per_node=8, resource="rdma/ib", hcas="mlx5", socket_ifname="eth0"
    )
    assert ib.pod_annotations() == {}
    for each in (roce, ib, tcp_profile(4, "eth0"), efa_profile(lookup("p5.48xlarge"))):
        assert "capabilities" not in each.to_json()
    for other in (tcp_profile(4, "eth0"), efa_profile(lookup("p5.48xlarge"))):
        assert other.pod_annotations() == {}


@pytest.mark.parametrize(
    ("value", "network", "matches"),
    [
        ("eth0", None, True),
        ("eth", None, True),
        ("=eth0", None, True),
        ("^lo,docker", None, True),
        ("bond0", None, False),  # the onprem example's host bond: not in any pod
        ("bond0", "default/roce-net", False),
        ("ib0", None, False),
        ("net1", None, False),
        ("net1", "default/roce-net", True),
        ("=net", "default/roce-net", False),
        ("bond0,eth0", None, True),
    ],
)
def test_socket_ifname_must_name_a_pod_interface(
    value: str, network: str | None, matches: bool
) -> None:
    """NCCL_SOCKET_IFNAME is read inside the pod: NCCL v2.21.5 src/misc/socket.cc
    findInterfaces lists the pod's own interfaces (`^` excludes, `=` matches exactly,
    otherwise prefixes, src/misc/utils.cc matchIf)."""
    assert socket_ifname_matches(value, pod_interfaces(network)) is matches


# -- behaviours stated one at a time (issue 25) ------------------------------------------------

FABRICS = ("efa", "roce", "infiniband", "tcp")


def made(fabric: str) -> FabricProfile:
    """One profile per fabric, made inside the test that reads it (a module-level value would
    be made once, before `make mutation` activates a mutant)."""
    if fabric == "efa":
        return efa_profile(lookup("p5.48xlarge"))
    if fabric == "roce":
        return _roce(secondary_network="default/roce-net")
    if fabric == "infiniband":
        return rdma_profile(
            "infiniband", gpus_per_node=8, resource="rdma/ib", hcas="mlx5", socket_ifname="ib0"
        )
    return tcp_profile(4, "eth0")


@pytest.mark.parametrize("fabric", FABRICS)
def test_the_job_layer_reads_back_the_profile_the_pools_publish(fabric: str) -> None:
    """The platform stack publishes each pool's profile (to_json) and team stacks rebuild it
    (jobs/platform.py profile): a key written under another name than the one read would be
    dropped without a word, e.g. jobs losing their RDMA devices."""
    published = made(fabric)
    assert published.fabric == fabric
    assert profile({"profile": json.loads(json.dumps(published.to_json()))}) == published


@pytest.mark.parametrize("fabric", FABRICS)
def test_nccl_error_handling_is_torchs_own(fabric: str) -> None:
    """Every fabric dumps NCCL's flight recorder on a watchdog timeout, and none sets
    TORCH_NCCL_ASYNC_ERROR_HANDLING: 1 would make the watchdog abort the communicators, an
    abort known to hang (pytorch/pytorch#110723); torch's default, 3, tears down without it,
    and the runtime's supervisor passes that to its workers (docs/runtime.md)."""
    env = made(fabric).env
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env


NCCL_ENV = {
    "efa": {
        "NCCL_SOCKET_IFNAME": "^lo,docker0,veth_def_agent",
        "NCCL_TUNER_PLUGIN": "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-ofi-tuner.so",
    },
    "roce": {
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_GID_INDEX": "3",
    },
    "infiniband": {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "ib0"},
    "tcp": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"},
}


@pytest.mark.parametrize("fabric", FABRICS)
def test_each_fabrics_nccl_environment(fabric: str) -> None:
    """Bootstrap on the named (or not excluded) interface; EFA through aws-ofi-nccl's tuner;
    RDMA fabrics through their HCAs; TCP with verbs off, so NCCL never tries InfiniBand."""
    assert made(fabric).env == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", **NCCL_ENV[fabric]}


def test_roce_gid_index_and_tcp_shares() -> None:
    assert _roce(gid_index=5).env["NCCL_IB_GID_INDEX"] == "5"
    assert (made("tcp").gpus_per_node, made("tcp").shared_devices) == (4, ())
    assert made("tcp").resources_for(2) == {"nvidia.com/gpu": "2"}


def test_an_efa_profile_offers_every_efa_device_and_hugepages() -> None:
    p5 = lookup("p5.48xlarge")
    assert made("efa").to_json() == {
        "fabric": "efa",
        "gpusPerNode": 8,
        "devicesPerNode": {EFA_RESOURCE: p5.efa_devices},
        "hugepagesMiPerNode": 640 * 8,  # 5120Mi for an 8-GPU pod (awsome-distributed-training)
        "sharedDevices": [],
        "secondaryNetwork": None,
        "env": dict(sorted(made("efa").env.items())),
    }
    assert made("efa").resources_for(8) == {
        "nvidia.com/gpu": "8",
        EFA_RESOURCE: str(p5.efa_devices),
        "hugepages-2Mi": "5120Mi",
    }


@pytest.mark.parametrize("gpus", [0, -1, 9, 16])
def test_a_share_outside_the_node_is_refused(gpus: int) -> None:
    with pytest.raises(ValueError, match="does not divide a 8-GPU node"):
        made("roce").resources_for(gpus)


def test_divisors() -> None:
    assert divisors(8) == [1, 2, 4, 8]
    assert divisors(1) == [1]
    assert divisors(6) == [1, 2, 3, 6]


@pytest.mark.parametrize(
    ("value", "matches"), [("eth0:5000", True), ("=eth0:5000", True), ("=net1:5000", False)]
)
def test_socket_ifname_entries_may_carry_a_port(value: str, matches: bool) -> None:
    """NCCL reads each entry as `name[:port]` (v2.21.5 src/misc/utils.cc parseStringList)."""
    assert socket_ifname_matches(value, pod_interfaces(None)) is matches
