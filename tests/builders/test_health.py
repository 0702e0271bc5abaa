"""The health gate's platform side (issue 42): the catalog's all-reduce floors, the startup
taint and the autoscaler flag, the expectations the agent reads (checked with the image's own
readers), and the agent's DaemonSet and the repair Deployment."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainstack_health.expectations import parse
from trainstack_health.repair.decide import parse_settings

from trainstack.builders import autoscaler, device_plugins, health, health_netpol, netpol, pools
from trainstack.catalog import FLOOR_FRACTION, catalog
from trainstack.config import PlatformConfig, load_stack_file
from trainstack.config import model as m
from trainstack.contracts import health as contract

ROOT = Path(__file__).parents[2]


def _load(stack: str) -> PlatformConfig:
    cfg = load_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


@pytest.fixture(scope="module")
def prod() -> PlatformConfig:
    return _load("prod")


@pytest.fixture(scope="module")
def onprem() -> PlatformConfig:
    """The onprem example with the gate on (it runs 1.31; the gate needs 1.32)."""
    cfg = _load("onprem")
    return dataclasses.replace(
        cfg,
        kubernetes_version="1.33",
        health=m.HealthConfig(
            enabled=True,
            dcgm_level=3,
            repair=m.RepairConfig(mode="hook", hook_url="https://repair.example.com/nodes"),
        ),
    )


# --- catalog -------------------------------------------------------------------------------


def test_every_gpu_type_has_a_floor_with_its_source_or_a_reason() -> None:
    for name, instance in catalog().items():
        assert len(instance.busbw_source) >= 20, name
        if instance.gpus == 1:  # nothing to all-reduce with
            assert instance.busbw_floor_gbps is None, name
        if instance.busbw_floor_gbps is None:
            assert instance.busbw_published_gbps is None, name


def test_the_floor_is_the_stated_fraction_of_the_published_figure() -> None:
    p5 = catalog()["p5.48xlarge"]
    assert p5.busbw_published_gbps == 479.72
    assert p5.busbw_floor_gbps == round(479.72 * FLOOR_FRACTION, 1) == 383.8
    assert "vpbenchmarking" in p5.busbw_source
    # H200 shares H100's NVLink generation, so its figure is p5's, said so in its source.
    for name in ("p5e.48xlarge", "p5en.48xlarge"):
        assert catalog()[name].busbw_floor_gbps == p5.busbw_floor_gbps
        assert "NVLink" in catalog()[name].busbw_source


def test_the_data_file_lists_each_type_once_in_both_tables() -> None:
    text = (ROOT / "trainstack" / "data" / "instances.yaml").read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    assert set(document["allReduce"]) == set(document["instances"])


# --- the startup taint ---------------------------------------------------------------------


def test_aws_pools_register_with_the_health_taint_only_with_the_gate_on(
    prod: PlatformConfig,
) -> None:
    pool = prod.gpu_pools[0]
    assert pools.node_taints(prod, pool) == [
        pools.GPU_TAINT,
        {"key": contract.TAINT_KEY, "value": contract.TAINT_PENDING, "effect": "NoSchedule"},
    ]
    off = dataclasses.replace(prod, health=m.HealthConfig())
    assert pools.node_taints(off, pool) == [pools.GPU_TAINT]


def test_the_taint_is_not_in_the_user_data(prod: PlatformConfig) -> None:
    """A --register-with-taints of ours would be overridden by the one EKS appends for the
    node group's taints (pools.node_taints says why), so the user data must not carry one."""
    for pool in prod.gpu_pools:
        assert "register-with-taints" not in pools.node_user_data(pool, prod.storage.nvme_cache)


def test_the_autoscaler_treats_the_taint_as_a_startup_taint(prod: PlatformConfig) -> None:
    args = autoscaler.values(prod, "us-east-1")["extraArgs"]
    assert args["startup-taint"] == contract.TAINT_KEY
    off = dataclasses.replace(prod, health=m.HealthConfig())
    assert "startup-taint" not in autoscaler.values(off, "us-east-1")["extraArgs"]
    # Its scale-from-zero template is what pods must fit: CA drops startup taints from it.
    assert autoscaler.node_template(prod, prod.gpu_pools[0])["taints"] == [pools.GPU_TAINT]


# --- expectations --------------------------------------------------------------------------

POOL_KEYS = {"instanceType", "gpus", "gpuModel", "efaDevices", "ibPorts", "ibRateGbps",
             "busbwFloorGBps", "dcgmLevel", "prePullGateSeconds"}  # fmt: skip
REPAIR_KEYS = {"mode", "hookUrl", "delaySeconds", "region", "clusterName", "prometheusUrl",
               "stragglerAlerts"}  # fmt: skip


def _document(cfg: PlatformConfig) -> dict[str, Any]:
    config = health.configmap(cfg)
    assert config["metadata"]["name"] == contract.CONFIGMAP
    assert config["metadata"]["namespace"] == contract.SYSTEM_NAMESPACE
    document: dict[str, Any] = json.loads(config["data"]["expectations.json"])
    return document


def test_expectations_have_exactly_the_contracts_keys(prod: PlatformConfig) -> None:
    document = _document(prod)
    assert set(document) == {"pools", "recheckSeconds", "repair"}
    assert set(document["pools"]) == {p.name for p in prod.gpu_pools}
    for entry in document["pools"].values():
        assert set(entry) == POOL_KEYS
    assert set(document["repair"]) == REPAIR_KEYS


def test_aws_pools_expect_what_the_catalog_says(prod: PlatformConfig) -> None:
    document = _document(prod)
    for pool in prod.gpu_pools:
        assert pool.aws is not None
        instance = catalog()[pool.aws.instance_type]
        assert document["pools"][pool.name] == {
            "instanceType": instance.name,
            "gpus": instance.gpus,
            "gpuModel": instance.gpu_model,
            "efaDevices": instance.efa_devices if pool.fabric == "efa" else 0,
            "ibPorts": 0,
            "ibRateGbps": None,
            "busbwFloorGBps": instance.busbw_floor_gbps,
            "dcgmLevel": contract.DEFAULT_DCGM_LEVEL,
            # prod pre-pulls with gateMinutes 20: a new node's check waits for its images
            "prePullGateSeconds": 20 * 60,
        }
    assert document["recheckSeconds"] == 3600
    assert document["repair"] == {
        "mode": "replace",
        "hookUrl": None,
        "delaySeconds": 600,
        "region": "us-east-1",
        "clusterName": "trainstack-prod",
        "prometheusUrl": "http://kube-prometheus-stack-prometheus.trainstack-monitoring.svc:9090",
        "stragglerAlerts": 3,
    }


def test_existing_pools_expect_their_declaration(onprem: PlatformConfig) -> None:
    document = _document(onprem)
    for pool in onprem.gpu_pools:
        assert pool.existing is not None
        entry = document["pools"][pool.name]
        assert entry["gpus"] == pool.existing.gpus_per_node
        assert entry["instanceType"] is entry["gpuModel"] is entry["busbwFloorGBps"] is None
        rdma = pool.existing.rdma
        assert entry["ibPorts"] == (len(rdma.interfaces) if rdma else 0)
        assert entry["dcgmLevel"] == 3
    assert document["repair"]["region"] is None
    assert document["repair"]["hookUrl"] == "https://repair.example.com/nodes"


@pytest.mark.parametrize("stack", ["prod", "onprem"])
def test_the_images_readers_accept_the_expectations(
    stack: str, prod: PlatformConfig, onprem: PlatformConfig
) -> None:
    """The agent's and the repair controller's own parsers (images/health) read the document
    the platform writes, with the values it meant."""
    cfg = prod if stack == "prod" else onprem
    text = health.configmap(cfg)["data"]["expectations.json"]
    parsed = parse(text, "expectations.json")
    assert set(parsed.pools) == {p.name for p in cfg.gpu_pools}
    assert parsed.recheck_seconds == cfg.health.recheck_minutes * 60
    settings = parse_settings(json.loads(text))
    assert settings.mode == cfg.health.repair.mode
    assert settings.cluster_name == cfg.cluster_name


# --- the agent and the repair controller -----------------------------------------------------


def _agent_pod(cfg: PlatformConfig) -> dict[str, Any]:
    pod: dict[str, Any] = health.agent_daemonset(cfg)["spec"]["template"]["spec"]
    return pod


def test_the_agent_runs_only_on_the_gpu_pools_nodes(
    prod: PlatformConfig, onprem: PlatformConfig
) -> None:
    terms = _agent_pod(prod)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # Every AWS GPU node, and only those, carries the pool label (the system nodes do not).
    assert terms == [{"matchExpressions": [{"key": "trainstack.io/pool", "operator": "Exists"}]}]
    assert all("trainstack.io/pool" in pools.node_labels(prod, p) for p in prod.gpu_pools)
    terms = _agent_pod(onprem)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == len({p.existing.node_selector for p in onprem.gpu_pools if p.existing})


def test_the_agent_tolerates_every_value_of_its_taint_and_the_gpu_taint(
    prod: PlatformConfig,
) -> None:
    tolerations = _agent_pod(prod)["tolerations"]
    assert {"key": contract.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert pools.GPU_TOLERATION in tolerations


def test_the_agent_sees_every_gpu_without_requesting_one(prod: PlatformConfig) -> None:
    pod = _agent_pod(prod)
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    assert pod["hostPID"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env[contract.NODE_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    for kind in ("requests", "limits"):
        assert not any(k.startswith("nvidia.com/") for k in container["resources"][kind])
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["serviceAccountName"] == contract.AGENT_SERVICE_ACCOUNT
    assert pod["automountServiceAccountToken"] is True
    assert container["ports"] == [{"name": "metrics", "containerPort": contract.METRICS_PORT}]
    from trainstack_health.cli import build_parser  # noqa: PLC0415

    args = build_parser().parse_args(container["args"])  # what the program will parse
    assert args.command == "agent"
    assert args.metrics_port == contract.METRICS_PORT
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_the_programs_read_the_expectations_where_the_contract_says(
    prod: PlatformConfig,
) -> None:
    for workload in (health.agent_daemonset(prod), health.repair_deployment(prod)):
        pod = workload["spec"]["template"]["spec"]
        (volume,) = pod["volumes"]
        (mount,) = pod["containers"][0]["volumeMounts"]
        (item,) = volume["configMap"]["items"]
        assert volume["configMap"]["name"] == contract.CONFIGMAP
        assert f"{mount['mountPath']}/{item['path']}" == contract.EXPECTATIONS_PATH


def test_the_pods_carry_the_names_monitoring_selects(prod: PlatformConfig) -> None:
    from trainstack.builders.monitoring.health import AGENT_APP, REPAIR_APP  # noqa: PLC0415

    for workload, app in (
        (health.agent_daemonset(prod), AGENT_APP),
        (health.repair_deployment(prod), REPAIR_APP),
    ):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == app
        assert workload["spec"]["selector"]["matchLabels"] == labels


def test_the_repair_controller_is_one_restricted_replica(prod: PlatformConfig) -> None:
    deployment = health.repair_deployment(prod)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == contract.REPAIR_SERVICE_ACCOUNT
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    from trainstack_health.repair.cli import build_parser  # noqa: PLC0415

    args = build_parser().parse_args(container["args"][1:])  # what the program will parse
    assert args.metrics_port == contract.METRICS_PORT


def test_the_repair_controller_reaches_what_its_mode_needs(
    prod: PlatformConfig, onprem: PlatformConfig
) -> None:
    def egress(cfg: PlatformConfig) -> list[dict[str, Any]]:
        rules: list[dict[str, Any]] = health_netpol.repair_network_policy(cfg)["spec"]["egress"]
        return rules

    url = prod.health.repair.prometheus_url
    assert url is not None
    assert url.endswith(":9090")
    own_prometheus = health_netpol.prometheus_egress(url)
    # replace: the AWS API over HTTPS and the Pod Identity agent's credentials.
    assert netpol.https_egress() in egress(prod)
    assert health_netpol.POD_IDENTITY_EGRESS in egress(prod)
    assert own_prometheus in egress(prod)
    assert own_prometheus["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "trainstack-monitoring"
    }
    # hook: HTTPS for the hook, no Pod Identity agent.
    assert netpol.https_egress() in egress(onprem)
    assert health_netpol.POD_IDENTITY_EGRESS not in egress(onprem)
    # none: nothing outside the cluster but the API server.
    none = dataclasses.replace(
        onprem, health=dataclasses.replace(onprem.health, repair=m.RepairConfig(mode="none"))
    )
    assert netpol.https_egress() not in egress(none)
    # Another Prometheus: its own port, wherever it is.
    other = health_netpol.prometheus_egress("https://prom.example.com")
    assert other["ports"] == [{"protocol": "TCP", "port": 443}]


def test_nothing_is_built_with_the_gate_off_or_without_gpu_pools(prod: PlatformConfig) -> None:
    assert health.objects(dataclasses.replace(prod, health=m.HealthConfig())) == []
    assert health.objects(dataclasses.replace(prod, gpu_pools=())) == []
    kinds = [o["kind"] for o in health.objects(prod)]
    # Admission and RBAC first, the workloads last.
    assert kinds.index("ValidatingAdmissionPolicy") < kinds.index("ConfigMap")
    assert kinds[-2:] == ["DaemonSet", "Deployment"]


def test_gpu_node_daemons_tolerate_the_gate_only_when_it_is_on(onprem: PlatformConfig) -> None:
    """An existing pool may select a label GPU Feature Discovery or NFD sets
    (nvidia.com/gpu.product): the labellers must run on a gated node, or its agent never
    comes (DaemonSets get no custom tolerations by themselves: k8s v1.37.2
    pkg/controller/daemon/util/daemonset_util.go)."""
    gate = {"key": contract.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    on = dataclasses.replace(onprem, health=dataclasses.replace(onprem.health, enabled=True))
    off = dataclasses.replace(onprem, health=dataclasses.replace(onprem.health, enabled=False))
    plugin_on, plugin_off = (device_plugins.nvidia_device_plugin_values(c) for c in (on, off))
    assert gate in plugin_on["tolerations"]  # the plugin's and GFD's (one list in the chart)
    assert gate not in plugin_off["tolerations"]
    assert pools.GPU_TOLERATION in plugin_on["tolerations"]
    # Without RDMA pools the device plugin chart brings NFD: its worker tolerates the gate too.
    plain = tuple(
        dataclasses.replace(p, existing=dataclasses.replace(p.existing, rdma=None))
        if p.existing is not None
        else p
        for p in on.gpu_pools
    )
    nfd_on, nfd_off = (
        device_plugins.nvidia_device_plugin_values(dataclasses.replace(c, gpu_pools=plain))["nfd"]
        for c in (on, off)
    )
    assert gate in nfd_on["worker"]["tolerations"]
    assert gate not in nfd_off["worker"]["tolerations"]
