"""Issue 37: the platform's own workloads held to the standard of the job pods. The cache
agent, the deadline enforcer and the layout Job: each has a NetworkPolicy of its own (the
system namespace has none for the whole), what the scanner would flag is fixed where the work
allows, and every accepted finding is written on its object (builders/scanner.py; the scan
itself is tests/conformance/test_security_scan.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trainstack_deadlines import contract

from tests.components.test_storage import load, run
from tests.conftest import Recorded
from trainstack.builders import cache, deadlines, layout, netpol, scanner
from trainstack.config.model import SYSTEM_NAMESPACE
from trainstack.config.monitoring import MONITORING_NAMESPACE
from trainstack.jobs.render import SCANNER_EXCEPTIONS, job_metadata
from trainstack.jobs.spec import load_job

ROOT = Path(__file__).resolve().parents[2]
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
# workload resource, its NetworkPolicy resource and its component, per app
WORKLOADS = {
    deadlines.NAME: ("p-deadlines-deployment", "p-deadlines-netpol", "p-deadlines"),
    cache.NAME: ("p-storage-cache-agent", "p-storage-cache-netpol", "p-storage"),
    layout.APP: ("p-storage-layout", "p-storage-layout-netpol", "p-storage"),
}
DNS = {
    "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]
}


def _template_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _selects(policy: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    return all(pod_labels.get(k) == v for k, v in wanted.items())


@pytest.mark.parametrize("stack", ["dev", "onprem"])
def test_each_platform_workload_has_a_policy_of_its_own(
    run_program: Callable[..., Recorded], stack: str
) -> None:
    rec = run(run_program, load(stack))
    policies = [
        r for r in rec.of_type(NETPOL) if r.inputs["metadata"]["namespace"] == SYSTEM_NAMESPACE
    ]
    for app, (workload_name, policy_name, component) in WORKLOADS.items():
        workload = next(
            r for r in rec.records if r.name == workload_name and r.type.startswith("kubernetes:")
        )
        assert workload.inputs["metadata"]["namespace"] == SYSTEM_NAMESPACE
        pod_labels = _template_labels(workload.inputs)
        selecting = [p for p in policies if _selects(p.inputs, pod_labels)]
        assert [p.name for p in selecting] == [policy_name], app
        policy = selecting[0]
        assert rec.parent_of(policy) == rec.one(rec.parent_of(workload).type, component)
        assert rec.provider_name(policy).startswith("p-cluster")
        assert policy.inputs["metadata"]["name"] == app
        # Never the whole namespace: upstream charts run there too.
        assert policy.inputs["spec"]["podSelector"] == {
            "matchLabels": {"app.kubernetes.io/name": app}
        }
        assert policy.inputs["spec"]["policyTypes"] == ["Ingress", "Egress"]
    # Nothing but trainstack's own three: no default deny for the namespace.
    assert sorted(p.name for p in policies) == sorted(p for _, p, _ in WORKLOADS.values())


def test_the_enforcer_is_scraped_by_monitoring_and_calls_only_the_api_server(
    run_program: Callable[..., Recorded],
) -> None:
    rec = run(run_program, load("prod"))
    spec = rec.one(NETPOL, "p-deadlines-netpol").inputs["spec"]
    (monitor,) = [
        r
        for r in rec.of_type("kubernetes:monitoring.coreos.com/v1:PodMonitor")
        if r.inputs["spec"]["selector"] == {"matchLabels": deadlines.pod_labels()}
    ]
    assert monitor.inputs["metadata"]["namespace"] == MONITORING_NAMESPACE
    (endpoint,) = monitor.inputs["spec"]["podMetricsEndpoints"]
    (container,) = deadlines.deployment(load("prod"))["spec"]["template"]["spec"]["containers"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == endpoint["port"])
    assert port == contract.METRICS_PORT
    assert spec["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}
                    }
                }
            ],
            "ports": [{"protocol": "TCP", "port": port}],
        }
    ]
    dns, api = spec["egress"]
    assert dns["to"] == DNS["to"]
    assert api == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }


def test_on_an_existing_cluster_the_enforcer_may_reach_kubeadms_api_port_too() -> None:
    _, api = deadlines.network_policy(load("onprem"))["spec"]["egress"]
    assert [p["port"] for p in api["ports"]] == [443, 6443]


def test_the_cache_agent_reaches_the_network_only_for_s3_sources() -> None:
    dev = cache.network_policy(load("dev"))["spec"]  # nvmeCache.sources: s3://acme-datasets/
    assert "ingress" not in dev
    assert dev["egress"] == [netpol.dns_egress(), netpol.https_egress()]
    onprem = cache.network_policy(load("onprem"))["spec"]  # no source at all
    assert "ingress" not in onprem
    assert "egress" not in onprem  # isolated both ways: nothing allowed


def test_the_layout_job_reaches_nothing() -> None:
    spec = layout.network_policy(load("prod"))["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in spec
    assert "egress" not in spec


@pytest.mark.parametrize("stack", ["dev", "onprem"])
def test_the_cache_agent_is_hardened_as_far_as_a_csi_node_plugin_allows(stack: str) -> None:
    pod = cache.daemonset(load(stack))["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    agent, registrar = pod["containers"]
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert registrar["securityContext"]["readOnlyRootFilesystem"] is True
    # Every path the agent writes is a volume: the cache and the CSI socket's directory.
    mounts = {m["mountPath"] for m in agent["volumeMounts"] if not m.get("readOnly")}
    assert {cache.CACHE_ROOT, "/csi"} <= mounts
    # The registrar's liveness probe is its own health endpoint, where it listens.
    endpoint = next(a for a in registrar["args"] if a.startswith("--http-endpoint="))
    port = int(endpoint.rsplit(":", 1)[1])
    probe = registrar["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert {"name": probe["port"], "containerPort": port} in registrar["ports"]


def test_the_enforcer_is_ready_while_its_passes_are_current() -> None:
    (container,) = deadlines.deployment(load("prod"))["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]


def _excepted(metadata: dict[str, Any]) -> set[str]:
    annotations = metadata.get("annotations", {})
    return {
        k.removeprefix(scanner.ANNOTATION_PREFIX)
        for k in annotations
        if k.startswith(scanner.ANNOTATION_PREFIX)
    }


def test_image_exceptions_only_where_an_image_is_a_tag() -> None:
    digests = {"CKV_K8S_43", "CKV_K8S_15"}
    for stack, tagged in (("dev", True), ("onprem", False), ("prod", False)):
        cfg = load(stack)
        objects = [deadlines.deployment(cfg), layout.layout_job(cfg)]
        if cfg.storage.nvme_cache is not None:
            objects.append(cache.daemonset(cfg))
        for obj in objects:
            excepted = digests & _excepted(obj["metadata"])
            assert excepted == (digests if tagged else set()), (stack, obj["kind"])


def test_every_exception_is_on_the_object_never_its_pod_template() -> None:
    cfg = load("dev")
    for obj in (deadlines.deployment(cfg), layout.layout_job(cfg), cache.daemonset(cfg)):
        assert _excepted(obj["metadata"])
        assert "annotations" not in obj["spec"]["template"]["metadata"]


def test_team_jobs_except_only_what_batch_training_is() -> None:
    assert set(SCANNER_EXCEPTIONS) == {"CKV_K8S_9", "CKV_K8S_22"}  # readiness, writable root
    metadata = job_metadata(load_job(ROOT / "job_specs" / "vision" / "demo-train.yaml"))
    assert _excepted(metadata) == set(SCANNER_EXCEPTIONS)
    # Beside the annotations monitoring reads, which stay as they were.
    assert "trainstack.io/max-duration-seconds" in metadata["annotations"]
