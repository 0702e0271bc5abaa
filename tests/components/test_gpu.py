"""GpuNodePool and GpuPlugins: exact EFA wiring, capacity, node bootstrap, plugin placement."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import kubernetes_validate
import pulumi
import pulumi_aws as aws
import pytest

from tests.conftest import ROOT, Recorded
from trainstack.components.gpu import GpuNodePool, GpuNodePoolArgs, GpuPlugins, GpuPluginsArgs
from trainstack.components.platform import Platform
from trainstack.config import PlatformConfig, load_stack_file, parse_stack_config

ZONES = ["us-east-1a", "us-east-1b"]
GROUP_ARN = "arn:aws:resource-groups:us-east-1:111122223333:group/g"


def platform(pools: list[dict[str, Any]], cloud: str = "aws") -> PlatformConfig:
    doc: dict[str, Any] = {
        "cloud": cloud,
        "kubernetesVersion": "1.33",
        "registry": {
            "teams": [{"name": "vision", "owners": ["a@example.com"], "quota": {"gpus": 0}}]
        },
        "gpuPools": pools,
    }
    if cloud == "aws":
        doc["aws"] = {
            "region": "us-east-1",
            "network": {"vpcCidr": "10.0.0.0/16", "availabilityZones": ZONES},
        }
    else:
        doc["existing"] = {"context": "lab"}
    config = parse_stack_config({"trainstack:platform": doc}, stack="t", source="test")
    assert isinstance(config, PlatformConfig)
    return config


def efa_pool(instance_type: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "gpu",
        "instanceType": instance_type,
        "fabric": "efa",
        "availabilityZone": "us-east-1a",
        "size": {"min": 0, "max": 2},
        **extra,
    }


def run_pool(
    run_program: Callable[..., Recorded],
    cfg: PlatformConfig,
    needs: Callable[[], tuple[pulumi.Resource, ...]] = tuple,
) -> Recorded:
    """One pool under the mocks; `needs` makes the resources its nodes depend on."""

    def program() -> None:
        provider = aws.Provider("aws", region="us-east-1")
        GpuNodePool(
            "pool",
            GpuNodePoolArgs(
                config=cfg,
                pool=cfg.gpu_pools[0],
                cluster_name="c",
                cluster_security_group_id="sg-cluster",
                node_role_arn="arn:aws:iam::000000000000:role/node",
                vpc_id="vpc-1",
                subnet_ids=[pulumi.Output.from_input("subnet-a")],
                provider=provider,
                node_dependencies=needs(),
            ),
        )

    return run_program(program)


def interfaces(rec: Recorded) -> list[tuple[int, int, str]]:
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    return [
        (i["networkCardIndex"], i["deviceIndex"], i["interfaceType"])
        for i in template.inputs["networkInterfaces"]
    ]


@pytest.mark.parametrize(
    ("instance_type", "cards"),
    [
        ("p4d.24xlarge", 4),
        ("p4de.24xlarge", 4),
        ("p5.48xlarge", 32),
        ("p5e.48xlarge", 32),
        ("p5en.48xlarge", 16),
        ("p6-b200.48xlarge", 8),
        ("g5.48xlarge", 1),
        ("g6e.48xlarge", 4),
    ],
)
def test_efa_interfaces_per_family(
    run_program: Callable[..., Recorded], instance_type: str, cards: int
) -> None:
    rec = run_pool(run_program, platform([efa_pool(instance_type)]))
    expected = [(0, 0, "interface"), (0, 1, "efa-only")] + [
        (card, 0, "efa-only") for card in range(1, cards)
    ]
    assert interfaces(rec) == expected
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    for interface in template.inputs["networkInterfaces"]:
        assert interface["securityGroups"] == ["pool-efa-id", "sg-cluster"]


def test_efa_security_group_allows_all_traffic_within_itself(
    run_program: Callable[..., Recorded],
) -> None:
    rec = run_pool(run_program, platform([efa_pool("p5.48xlarge")]))
    group = rec.one("aws:ec2/securityGroup:SecurityGroup", "pool-efa")
    assert group.inputs["vpcId"] == "vpc-1"
    for rtype, name in (
        ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "pool-efa-in"),
        ("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "pool-efa-out"),
    ):
        rule = rec.one(rtype, name)
        assert rule.inputs["securityGroupId"] == "pool-efa-id"
        assert rule.inputs["referencedSecurityGroupId"] == "pool-efa-id"
        assert rule.inputs["ipProtocol"] == "-1"


def test_placement_group_zone_and_subnets(run_program: Callable[..., Recorded]) -> None:
    rec = run_pool(run_program, platform([efa_pool("p5.48xlarge")]))
    group = rec.one("aws:ec2/placementGroup:PlacementGroup", "pool-pg")
    assert group.inputs == {"name": "trainstack-t-gpu", "strategy": "cluster"}
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    assert template.inputs["placement"] == {
        "groupName": "trainstack-t-gpu",
        "availabilityZone": "us-east-1a",
    }
    nodes = rec.one("aws:eks/nodeGroup:NodeGroup", "pool-nodes")
    assert nodes.inputs["subnetIds"] == ["subnet-a"]


@pytest.mark.parametrize(
    ("capacity", "placement", "group"),
    [
        ({"type": "reservation", "reservationId": "cr-0a1b2c3d4e5f60718"}, {}, None),
        (
            {"type": "capacityBlock", "reservationId": "cr-0a1b2c3d4e5f60718"},
            {},
            None,
        ),
        (
            {"type": "reservation", "reservationId": "cr-0a1b2c3d4e5f60718"},
            {"placementGroup": "odcr-group"},
            "odcr-group",
        ),
    ],
    ids=["reservation", "capacity-block", "reservation-in-its-group"],
)
def test_reserved_pools_launch_outside_a_new_placement_group(
    run_program: Callable[..., Recorded],
    capacity: dict[str, Any],
    placement: dict[str, Any],
    group: str | None,
) -> None:
    """Issue 39 #7: a placement group the reservation is not in can refuse launches the
    reservation has room for; a block is placed together by EC2. No group is created; a
    reservation's own group is used by name."""
    rec = run_pool(run_program, platform([efa_pool("p5.48xlarge", capacity=capacity, **placement)]))
    assert rec.of_type("aws:ec2/placementGroup:PlacementGroup") == []
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    expected = {"groupName": group, "availabilityZone": "us-east-1a"} if group else None
    assert template.inputs.get("placement") == expected
    labels = rec.one("aws:eks/nodeGroup:NodeGroup", "pool-nodes").inputs["labels"]
    assert labels.get("trainstack.io/placement-group") == group


def test_node_group_labels_taint_ami_and_hardening(run_program: Callable[..., Recorded]) -> None:
    rec = run_pool(run_program, platform([efa_pool("p5en.48xlarge")]))
    nodes = rec.one("aws:eks/nodeGroup:NodeGroup", "pool-nodes")
    assert nodes.inputs["amiType"] == "AL2023_x86_64_NVIDIA"
    assert nodes.inputs["instanceTypes"] == ["p5en.48xlarge"]
    assert nodes.inputs["taints"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
    ]
    assert nodes.inputs["labels"] == {
        "trainstack.io/pool": "gpu",
        "trainstack.io/fabric": "efa",
        "trainstack.io/gpu-model": "H200",
        "trainstack.io/capacity": "onDemand",
        "trainstack.io/placement-group": "trainstack-t-gpu",
        "nvidia.com/gpu.present": "true",
        # Cluster Autoscaler: no second scale-up while the device plugin starts
        "k8s.amazonaws.com/accelerator": "nvidia-h200",
    }
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    assert template.inputs["metadataOptions"]["httpTokens"] == "required"
    assert template.inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"


def test_team_pods_cannot_reach_the_node_role(run_program: Callable[..., Recorded]) -> None:
    """Issue 17 #4: with two hops a pod's network namespace reaches IMDS and the node role's
    credentials, whatever its IRSA role; one hop blocks it (EKS best practices, IAM)."""
    rec = run_pool(run_program, platform([efa_pool("p5.48xlarge")]))
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    assert template.inputs["metadataOptions"] == {
        "httpEndpoint": "enabled",
        "httpTokens": "required",
        "httpPutResponseHopLimit": 1,
    }


def test_what_a_node_group_launches_carries_the_cost_tags(
    run_program: Callable[..., Recorded],
) -> None:
    """Issue 17 #7: node group and provider default tags never reach the instances, volumes
    and ENIs EKS launches (EKS user guide, create-managed-node-group); the launch template's
    tag specifications do."""
    rec = run_pool(run_program, platform([efa_pool("p5.48xlarge")]))
    specs = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt").inputs["tagSpecifications"]
    assert [s["resourceType"] for s in specs] == ["instance", "volume", "network-interface"]
    for spec in specs:
        assert spec["tags"]["trainstack:stack"] == "t"
        assert spec["tags"]["trainstack.io/pool"] == "gpu"


def test_nodes_wait_for_what_they_need_and_keep_the_autoscalers_size(
    run_program: Callable[..., Recorded],
) -> None:
    """Issue 17 #3: the template waits for the placement group (its output, not the name as
    a string), the node group for the node role's policies and the CNI; and `pulumi up` leaves
    the desired size an autoscaler or operator set."""

    def needs() -> tuple[pulumi.Resource, ...]:
        return (aws.iam.RolePolicyAttachment("node-policy", role="node", policy_arn="arn:p"),)

    rec = run_pool(run_program, platform([efa_pool("p5.48xlarge")]), needs)
    group = rec.one("aws:ec2/placementGroup:PlacementGroup", "pool-pg")
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    assert group.urn in template.dependencies
    nodes = rec.one("aws:eks/nodeGroup:NodeGroup", "pool-nodes")
    assert rec.one("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "node-policy").urn in (
        nodes.dependencies
    )
    assert nodes.options["ignoreChanges"] == ["scalingConfig.desiredSize"]


def test_user_data_raid0_and_hugepages(run_program: Callable[..., Recorded]) -> None:
    rec = run_pool(run_program, platform([efa_pool("p5.48xlarge")]))
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    user_data = base64.b64decode(template.inputs["userData"]).decode()
    assert "Content-Type: application/node.eks.aws" in user_data
    assert '"strategy": "RAID0"' in user_data
    # 8 GPUs x 640 MiB = 5120 MiB = 2560 pages of 2 MiB
    assert "sysctl -w vm.nr_hugepages=2560" in user_data


@pytest.mark.parametrize("strategy", ["volume-mounts", "envvar"])
def test_the_toolkit_setting_follows_the_device_list_strategy(
    run_program: Callable[..., Recorded], strategy: str
) -> None:
    """Issue 37: the node's container toolkit refuses NVIDIA_VISIBLE_DEVICES from unprivileged
    containers exactly when the device plugin hands GPUs as mounts (both or neither:
    tests/builders/test_gpu_isolation.py says why)."""
    pool = {"name": "gpu", "instanceType": "g5.xlarge", "fabric": "tcp", "size": {"max": 2}}
    cfg = replace(platform([pool]), gpu_device_list_strategy=strategy)
    rec = run_pool(run_program, cfg)
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    user_data = base64.b64decode(template.inputs["userData"]).decode()
    expected = "accept-nvidia-visible-devices-envvar-when-unprivileged=false"
    assert (expected in user_data) is (strategy == "volume-mounts")


def test_tcp_pool_has_no_efa_wiring(run_program: Callable[..., Recorded]) -> None:
    pool = {"name": "gpu", "instanceType": "g5.xlarge", "fabric": "tcp", "size": {"max": 2}}
    rec = run_pool(run_program, platform([pool]))
    assert rec.of_type("aws:ec2/securityGroup:SecurityGroup") == []
    assert rec.of_type("aws:ec2/placementGroup:PlacementGroup") == []
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt")
    assert "networkInterfaces" not in template.inputs
    assert "userData" in template.inputs  # g5.xlarge has NVMe: RAID0, but no hugepages
    user_data = base64.b64decode(template.inputs["userData"]).decode()
    assert "nr_hugepages" not in user_data


@pytest.mark.parametrize(
    ("capacity", "capacity_type", "market", "target"),
    [
        ({"type": "onDemand"}, "ON_DEMAND", None, None),
        ({"type": "spot"}, "SPOT", None, None),
        (
            {"type": "reservation", "reservationId": "cr-0123456789abcdef0"},
            "ON_DEMAND",
            None,
            {"capacityReservationId": "cr-0123456789abcdef0"},
        ),
        (
            {"type": "reservation", "reservationGroupArn": GROUP_ARN},
            "ON_DEMAND",
            None,
            {"capacityReservationResourceGroupArn": GROUP_ARN},
        ),
        (
            {"type": "capacityBlock", "reservationId": "cr-0123456789abcdef0"},
            "CAPACITY_BLOCK",
            {"marketType": "capacity-block"},
            {"capacityReservationId": "cr-0123456789abcdef0"},
        ),
    ],
)
def test_capacity_options(
    run_program: Callable[..., Recorded],
    capacity: dict[str, str],
    capacity_type: str,
    market: dict[str, str] | None,
    target: dict[str, str] | None,
) -> None:
    rec = run_pool(run_program, platform([efa_pool("p5.48xlarge", capacity=capacity)]))
    nodes = rec.one("aws:eks/nodeGroup:NodeGroup", "pool-nodes")
    assert nodes.inputs["capacityType"] == capacity_type
    template = rec.one("aws:ec2/launchTemplate:LaunchTemplate", "pool-lt").inputs
    assert template.get("instanceMarketOptions") == market
    spec = template.get("capacityReservationSpecification")
    assert (spec["capacityReservationTarget"] if spec else None) == target
    # Issue 17 #1: for CAPACITY_BLOCK the template names the instance type and the node group
    # lists none, or EKS rejects it (EKS user guide, capacity-blocks-mng; launch-templates:
    # a type in the template forbids instanceTypes on the node group).
    block = capacity["type"] == "capacityBlock"
    assert template.get("instanceType") == ("p5.48xlarge" if block else None)
    assert nodes.inputs.get("instanceTypes") == (None if block else ["p5.48xlarge"])
    # Issue 17 #9: reserved capacity has no spare instance for DEFAULT's surge; MINIMAL
    # terminates first (EKS user guide, managed-node-update-behavior).
    reserved = capacity["type"] in ("reservation", "capacityBlock")
    assert nodes.inputs["updateConfig"] == {
        "maxUnavailable": 1,
        "updateStrategy": "MINIMAL" if reserved else "DEFAULT",
    }


def plugin_releases(rec: Recorded) -> dict[str, dict[str, Any]]:
    return {r.inputs["name"]: r.inputs for r in rec.of_type("kubernetes:helm.sh/v3:Release")}


def run_plugins(run_program: Callable[..., Recorded], cfg: PlatformConfig) -> Recorded:
    def program() -> None:
        import pulumi_kubernetes as k8s  # noqa: PLC0415 (only needed inside the program)

        provider = k8s.Provider("k8s")
        GpuPlugins("plugins", GpuPluginsArgs(cfg, provider, depends_on=[]))

    return run_program(program)


def test_device_plugins_select_only_nodes_with_the_device(
    run_program: Callable[..., Recorded],
) -> None:
    cfg = platform(
        [
            efa_pool("p5.48xlarge"),
            {"name": "l40s", "instanceType": "g6e.12xlarge", "fabric": "tcp", "size": {"max": 1}},
        ]
    )
    rec = run_plugins(run_program, cfg)
    releases = plugin_releases(rec)
    assert set(releases) == {"nvidia-device-plugin", "aws-efa-k8s-device-plugin"}
    nvidia = releases["nvidia-device-plugin"]
    assert nvidia["chart"] == "nvidia-device-plugin"
    assert nvidia["version"] == "0.18.2"
    assert nvidia["repositoryOpts"] == {"repo": "https://nvidia.github.io/k8s-device-plugin"}
    term = nvidia["values"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
            ]
        }
    ]
    # AWS pools label their own nodes (node_labels): no GPU Feature Discovery needed
    assert "gfd" not in nvidia["values"]
    efa = releases["aws-efa-k8s-device-plugin"]
    assert efa["version"] == "v0.5.30"
    assert efa["values"]["nodeSelector"] == {"trainstack.io/fabric": "efa"}
    # only the EFA pool's type: the tcp pool's g6e nodes never run the EFA plugin
    assert efa["values"]["supportedInstanceLabels"]["values"] == ["p5.48xlarge"]
    for release in releases.values():
        assert release["namespace"] == "trainstack-system"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in release[
            "values"
        ]["tolerations"]


def test_no_efa_plugin_without_efa_pools_and_gpu_operator_option(
    run_program: Callable[..., Recorded],
) -> None:
    cfg = platform(
        [{"name": "l4", "instanceType": "g6e.12xlarge", "fabric": "tcp", "size": {"max": 1}}]
    )
    cfg = PlatformConfig(**{**cfg.__dict__, "gpu_device_plugin": "gpu-operator"})
    releases = plugin_releases(run_plugins(run_program, cfg))
    assert set(releases) == {"gpu-operator"}
    values = releases["gpu-operator"]["values"]
    assert values["driver"] == {"enabled": False}
    assert values["toolkit"] == {"enabled": False}


NFD_GPU = {
    "key": "feature.node.kubernetes.io/pci-10de.present",
    "operator": "In",
    "values": ["true"],
}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def existing_pool(selector: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "name": "a100",
        "fabric": "tcp",
        "nodeSelector": selector,
        "gpusPerNode": 8,
        "nodes": 4,
        "cpusPerNode": 128,
        "memoryGiBPerNode": 1024,
        **extra,
    }


def affinity_terms(values: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = values["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return terms


def test_existing_cluster_pools_get_the_labels_their_selectors_use(
    run_program: Callable[..., Recorded],
) -> None:
    """On an existing cluster nothing else sets the NVIDIA labels a pool or the plugin uses.

    NVIDIA/k8s-device-plugin v0.18.2 (the pinned chart): `nvidia.com/gpu.product` comes from
    GPU Feature Discovery (docs/gpu-feature-discovery/README.md), which the chart leaves off
    (values.yaml `gfd.enabled: false`; turning it on pulls in NFD, Chart.yaml condition
    `nfd.enabled,gfd.enabled`). GFD never sets `nvidia.com/gpu.present`: the chart's default
    affinity only lets it "force" a deployment; the GPU operator sets it (NVIDIA/gpu-operator
    controllers/state_manager.go `commonGPULabelKey`), and on AWS the pools' node groups do.
    GFD shares the plugin's affinity (templates/daemonset-gfd.yml), so the affinity must also
    accept NFD's PCI vendor label, or GFD could never label a node for the first time.
    """
    cfg = platform([existing_pool({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})], "existing")
    values = plugin_releases(run_plugins(run_program, cfg))["nvidia-device-plugin"]["values"]
    assert values["gfd"] == {"enabled": True}
    terms = affinity_terms(values)
    assert {"matchExpressions": [NFD_GPU]} in terms
    assert {
        "matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}
        ]
    } in terms
    # the NFD subchart is installed, and its workers reach tainted GPU nodes too
    assert values["nfd"].get("enabled", True) is True
    assert GPU_TOLERATION in values["nfd"]["worker"]["tolerations"]


def test_existing_rdma_pools_share_the_network_operators_nfd(
    run_program: Callable[..., Recorded],
) -> None:
    """The Network Operator already deploys NFD (network_operator_values); a second one from
    the device plugin chart would label the same nodes twice (its README: `nfd.enabled=false`
    "if you already have NFD deployed"). The operator's NFD serves GFD as well: it labels PCI
    classes 0300/0302 by vendor (so `pci-10de.present`), tolerates `nvidia.com/gpu` and allows
    the `nvidia.com` label namespace (Mellanox/network-operator v25.7.0, the pinned chart,
    deployment/network-operator/values.yaml `node-feature-discovery`)."""
    rdma = {"resourceName": "roce_a", "interfaces": ["ens1f0"], "hcas": "mlx5_0"}
    pool = existing_pool({"gpu": "a100"}, fabric="infiniband", rdma=rdma)
    releases = plugin_releases(run_plugins(run_program, platform([pool], cloud="existing")))
    assert releases["network-operator"]["values"]["nfd"] == {"enabled": True}
    values = releases["nvidia-device-plugin"]["values"]
    assert values["gfd"] == {"enabled": True}
    assert values["nfd"] == {"enabled": False}
    assert {"matchExpressions": [NFD_GPU]} in affinity_terms(values)


def test_existing_roce_pool_gets_network_operator_and_policy(
    run_program: Callable[..., Recorded],
) -> None:
    pool = {
        "name": "a100",
        "fabric": "roce",
        "nodeSelector": {"gpu": "a100"},
        "gpusPerNode": 8,
        "nodes": 4,
        "cpusPerNode": 128,
        "memoryGiBPerNode": 1024,
        "rdma": {
            "resourceName": "roce_a",
            "interfaces": ["ens1f0"],
            "hcas": "mlx5_0",
            "secondaryNetwork": "default/roce-net",  # required for roce (docs/fabrics.md)
        },
    }
    rec = run_plugins(run_program, platform([pool], cloud="existing"))
    assert set(plugin_releases(rec)) == {"nvidia-device-plugin", "network-operator"}
    policy = rec.one("kubernetes:mellanox.com/v1alpha1:NicClusterPolicy")
    spec = policy.inputs["spec"]
    assert spec["rdmaSharedDevicePlugin"]["config"] == (
        '{"configList": [{"rdmaHcaMax": 63, "resourceName": "roce_a", '
        '"selectors": {"ifNames": ["ens1f0"]}}]}'
    )
    terms = spec["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]
    operator = rec.one("kubernetes:helm.sh/v3:Release", "plugins-network-operator")
    assert operator.urn in policy.dependencies


def test_platform_exports_fabric_profiles(run_program: Callable[..., Recorded]) -> None:
    cfg = platform([efa_pool("p5.48xlarge"), {**efa_pool("p5en.48xlarge"), "name": "h200"}])

    def program() -> None:
        for key, value in Platform("p", cfg).outputs.exports().items():
            pulumi.export(key, value)

    rec = run_program(program)
    pools = {p["name"]: p for p in rec.result.outputs["gpuPools"]}
    assert pools["gpu"]["profile"]["gpusPerNode"] == 8
    assert pools["gpu"]["profile"]["devicesPerNode"] == {"vpc.amazonaws.com/efa": 32}
    assert pools["h200"]["profile"]["devicesPerNode"] == {"vpc.amazonaws.com/efa": 16}
    assert pools["gpu"]["nodeSelector"] == {"trainstack.io/pool": "gpu"}
    nodes = {r.name for r in rec.of_type("aws:eks/nodeGroup:NodeGroup")}
    assert nodes == {"p-cluster-system", "p-pool-gpu-nodes", "p-pool-h200-nodes"}
    pool_group = rec.one("aws:eks/nodeGroup:NodeGroup", "p-pool-gpu-nodes")
    assert pool_group.inputs["subnetIds"] == ["p-network-private-us-east-1a-id"]


@pytest.mark.parametrize("plugin", ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"])
def test_plugin_scheduling_values_are_valid_pod_fields(
    run_program: Callable[..., Recorded], plugin: str
) -> None:
    """The Kubernetes-typed parts of Helm values pass strict validation inside a Pod."""
    releases = plugin_releases(run_plugins(run_program, platform([efa_pool("p5.48xlarge")])))
    values = releases[plugin]["values"]
    spec: dict[str, Any] = {"containers": [{"name": "x", "image": "x"}]}
    for key in ("affinity", "tolerations", "nodeSelector", "priorityClassName"):
        if key in values:
            spec[key] = values[key]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}
    kubernetes_validate.validate(pod, "1.33", strict=True)


@pytest.mark.parametrize(("stack", "repair"), [("prod", True), ("dev", False)])
def test_gpu_nodes_are_repaired_where_their_health_is_watched(
    run_program: Callable[..., Recorded], stack: str, repair: bool
) -> None:
    """Issue 17 (also-check): prod installs the node monitoring agent, so EKS replaces a GPU
    node it finds unhealthy; dev has no agent, and repair would see only NotReady."""
    cfg = load_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    assert isinstance(cfg, PlatformConfig)
    rec = run_pool(run_program, cfg)
    nodes = rec.one("aws:eks/nodeGroup:NodeGroup", "pool-nodes")
    assert nodes.inputs.get("nodeRepairConfig") == ({"enabled": True} if repair else None)
