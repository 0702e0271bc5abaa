"""DeadlineEnforcer: the Deployment runs the program with the stack's settings, as a restricted
pod; its RBAC is what the program calls, in team namespaces only; creation order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from trainstack_deadlines import contract
from trainstack_deadlines.cli import build_parser

from tests.components.test_storage import load, run
from tests.conftest import Recorded
from trainstack.builders import deadlines as b
from trainstack.builders.platform import registry_document
from trainstack.config import PlatformConfig

RBAC = "kubernetes:rbac.authorization.k8s.io/v1"


@pytest.fixture(scope="module")
def prod_cfg() -> PlatformConfig:
    return load("prod")


def test_the_platform_deploys_the_enforcer(
    run_program: Callable[..., Recorded], prod_cfg: PlatformConfig
) -> None:
    rec = run(run_program, prod_cfg)
    component = rec.one("trainstack:k8s:DeadlineEnforcer", "p-deadlines")
    assert rec.parent_of(component) == rec.one("trainstack:platform:Platform", "p")
    children = rec.children_of(component)
    for child in children:
        assert rec.provider_name(child).startswith("p-cluster"), child.name
    teams = [t.name for t in prod_cfg.registry.teams]
    bindings = {
        r.name: r for r in rec.of_type(f"{RBAC}:RoleBinding") if r.name.startswith("p-deadlines")
    }
    assert set(bindings) == {f"p-deadlines-binding-{t}" for t in teams} | {
        "p-deadlines-state-binding"
    }
    for team in teams:
        namespace = rec.one("kubernetes:core/v1:Namespace", f"p-services-ns-{team}")
        assert namespace.urn in bindings[f"p-deadlines-binding-{team}"].dependencies
    deployment = rec.one("kubernetes:apps/v1:Deployment", "p-deadlines-deployment")
    before = {
        rec.one("kubernetes:core/v1:ServiceAccount", "p-deadlines-sa").urn,
        rec.one("kubernetes:core/v1:ConfigMap", "p-deadlines-state").urn,
        *(r.urn for r in bindings.values()),
    }
    assert before <= set(deployment.dependencies)


def test_the_container_runs_the_program_with_the_stack_settings(prod_cfg: PlatformConfig) -> None:
    dep = b.deployment(prod_cfg)
    assert dep["metadata"]["namespace"] == contract.SYSTEM_NAMESPACE
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == contract.SERVICE_ACCOUNT
    (container,) = pod["containers"]
    assert container["image"] == prod_cfg.scheduling.deadlines.image
    args = build_parser().parse_args(container["args"])  # what the program will parse
    assert args.interval == prod_cfg.scheduling.deadlines.interval_seconds
    assert args.margin == prod_cfg.scheduling.deadlines.margin_seconds
    assert args.state == (contract.SYSTEM_NAMESPACE, contract.STATE_CONFIGMAP)
    assert str(args.registry) == contract.REGISTRY_PATH
    assert container["ports"] == [{"name": "metrics", "containerPort": args.port}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # The registry the platform publishes, mounted where the program reads it.
    (volume,) = pod["volumes"]
    (mount,) = container["volumeMounts"]
    assert volume["configMap"]["name"] == "trainstack-platform"
    item = volume["configMap"]["items"][0]
    assert f"{mount['mountPath']}/{item['path']}" == contract.REGISTRY_PATH
    assert item["key"] == "registry.json"
    assert {t["namespace"] for t in registry_document(prod_cfg)["teams"]} == {
        t.namespace for t in prod_cfg.registry.teams
    }
    assert pod["nodeSelector"] == {"trainstack.io/role": "system"}
    assert "nodeSelector" not in b.deployment(load("onprem"))["spec"]["template"]["spec"]


def test_the_pod_meets_the_restricted_profile(prod_cfg: PlatformConfig) -> None:
    """Pod Security `restricted` (k8s.io/pod-security-admission v0.37.2 policy/check_*.go)."""
    pod = b.deployment(prod_cfg)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctx = pod["containers"][0]["securityContext"]
    assert ctx == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert all("hostPath" not in v for v in pod["volumes"])


def _rules(objects: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    return {
        (group, resource, verb, ",".join(rule.get("resourceNames", [])))
        for obj in objects
        for rule in obj["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_is_what_the_program_calls_and_no_more(prod_cfg: PlatformConfig) -> None:
    """controller.py: list jobs and commands, create commands, get and patch its ConfigMap."""
    team = _rules([b.cluster_role(prod_cfg)])
    assert team == {
        ("batch.volcano.sh", "jobs", "get", ""),
        ("batch.volcano.sh", "jobs", "list", ""),
        ("bus.volcano.sh", "commands", "get", ""),
        ("bus.volcano.sh", "commands", "list", ""),
        ("bus.volcano.sh", "commands", "create", ""),
    }
    role, binding = b.state_role(prod_cfg)
    assert _rules([role]) == {
        ("", "configmaps", "get", contract.STATE_CONFIGMAP),
        ("", "configmaps", "patch", contract.STATE_CONFIGMAP),
    }
    subject = {
        "kind": "ServiceAccount",
        "name": contract.SERVICE_ACCOUNT,
        "namespace": contract.SYSTEM_NAMESPACE,
    }
    assert binding["subjects"] == [subject]
    # The ClusterRole is bound per team namespace, never cluster-wide.
    rb = b.team_binding(prod_cfg, "vision")
    assert rb["kind"] == "RoleBinding"
    assert rb["metadata"]["namespace"] == "vision"
    assert rb["roleRef"]["kind"] == "ClusterRole"
    assert rb["subjects"] == [subject]


def test_the_state_configmap_carries_no_data(prod_cfg: PlatformConfig) -> None:
    """So `pulumi up` (server-side apply) owns none of the enforcer's keys."""
    cm = b.state_configmap(prod_cfg)
    assert set(cm) == {"apiVersion", "kind", "metadata"}
    assert cm["metadata"]["name"] == contract.STATE_CONFIGMAP
