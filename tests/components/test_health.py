"""NodeHealth (issue 42): what the platform registers for the health gate, under the recording
mocks: where it is deployed, its children and providers, the creation order, the startup taint
on the pools' node groups and the autoscaler's startup-taint flag, and on AWS the repair
controller's Pod Identity role."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.components.test_storage import load, run
from tests.conftest import Recorded
from trainstack.builders import health as b
from trainstack.builders.health_iam import repair_policy
from trainstack.components.health import child_name
from trainstack.components.platform import Platform
from trainstack.config import PlatformConfig
from trainstack.config import model as m
from trainstack.contracts import health as contract
from trainstack.preview.synth import run_mocked

COMPONENT = "trainstack:k8s:NodeHealth"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CONFIGMAP = "kubernetes:core/v1:ConfigMap"


@pytest.fixture(scope="module")
def prod() -> PlatformConfig:
    return load("prod")


def _off(cfg: PlatformConfig) -> PlatformConfig:
    return dataclasses.replace(cfg, health=dataclasses.replace(cfg.health, enabled=False))


@pytest.fixture(scope="module")
def prod_rec(prod: PlatformConfig) -> Recorded:
    """One recorded run of the prod example for the module (a run takes seconds)."""
    return Recorded(run_mocked(lambda: Platform("p", prod), "test", {}, region="us-east-1"))


def _autoscaler_values(rec: Recorded) -> dict[str, Any]:
    (release,) = [
        r
        for r in rec.of_type("kubernetes:helm.sh/v3:Release")
        if r.inputs.get("name") == "cluster-autoscaler"
    ]
    values: dict[str, Any] = release.inputs["values"]
    return values


def test_the_platform_deploys_the_gate_under_itself(prod_rec: Recorded) -> None:
    rec = prod_rec
    component = rec.one(COMPONENT, "p-health")
    assert rec.parent_of(component) == rec.one("trainstack:platform:Platform", "p")
    children = rec.children_of(component)
    assert children
    for child in children:
        assert child.name.startswith("p-health-"), child.name
        expected = "p-aws" if child.type.startswith("aws:") else "p-cluster"
        assert rec.provider_name(child).startswith(expected), child.name


def test_every_object_of_the_builder_is_registered_as_built(
    prod_rec: Recorded, prod: PlatformConfig
) -> None:
    component = prod_rec.one(COMPONENT, "p-health")
    children = prod_rec.children_of(component)
    by_name = {r.name: r for r in children}
    assert len(by_name) == len(children), "child names are URNs: they must be unique"
    manifests = b.objects(prod)
    # One evict RoleBinding of one name per team namespace: the names must still differ.
    assert len({child_name("p-health", m) for m in manifests}) == len(manifests)
    for manifest in manifests:
        name = child_name("p-health", manifest)
        assert name in by_name, name
        assert by_name[name].inputs["metadata"] == manifest["metadata"]


def test_the_workloads_start_after_what_holds_them(prod_rec: Recorded) -> None:
    """Namespace first; admission, RBAC, the expectations and (AWS) the Pod Identity
    association before the programs that rely on them."""
    rec = prod_rec
    namespace = rec.one("kubernetes:core/v1:Namespace", "p-services-system-ns")
    component = rec.one(COMPONENT, "p-health")
    for child in rec.children_of(component):
        if child.type.startswith("kubernetes:"):
            assert namespace.urn in child.dependencies, child.name
    config = rec.one(CONFIGMAP, f"p-health-configmap-{contract.CONFIGMAP}")
    policy = rec.one(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
        "p-health-validatingadmissionpolicy-trainstack-health-agent-own-node",
    )
    association = rec.one(
        "aws:eks/podIdentityAssociation:PodIdentityAssociation", "p-health-repair-identity"
    )
    for workload in (
        rec.one(DAEMONSET, f"p-health-daemonset-{contract.AGENT_SERVICE_ACCOUNT}"),
        rec.one(DEPLOYMENT, f"p-health-deployment-{contract.REPAIR_SERVICE_ACCOUNT}"),
    ):
        assert {config.urn, policy.urn, association.urn} <= set(workload.dependencies)


def test_the_repair_role_is_associated_with_the_repair_service_account(
    prod_rec: Recorded,
) -> None:
    rec = prod_rec
    association = rec.one(
        "aws:eks/podIdentityAssociation:PodIdentityAssociation", "p-health-repair-identity"
    )
    assert association.inputs["namespace"] == contract.SYSTEM_NAMESPACE
    assert association.inputs["serviceAccount"] == contract.REPAIR_SERVICE_ACCOUNT
    role = rec.one("aws:iam/role:Role", "p-health-repair-role")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    # H2's policy, for this cluster's tagged groups (builders/health_iam.py asserts its shape).
    policy = json.loads(rec.one("aws:iam/rolePolicy:RolePolicy", "p-health-repair-policy")
                        .inputs["policy"])  # fmt: skip
    assert policy == repair_policy("trainstack-prod")


def test_the_node_groups_register_with_the_startup_taint(prod_rec: Recorded) -> None:
    for group in prod_rec.of_type("aws:eks/nodeGroup:NodeGroup"):
        if not group.name.startswith("p-pool-"):
            continue
        taints = {(t["key"], t["value"], t["effect"]) for t in group.inputs["taints"]}
        assert (contract.TAINT_KEY, contract.TAINT_PENDING, "NO_SCHEDULE") in taints, group.name
        assert ("nvidia.com/gpu", "true", "NO_SCHEDULE") in taints


def test_the_autoscaler_counts_the_taint_as_a_startup_taint(prod_rec: Recorded) -> None:
    assert _autoscaler_values(prod_rec)["extraArgs"]["startup-taint"] == contract.TAINT_KEY


def test_with_the_gate_off_nothing_is_deployed_and_nothing_is_tainted(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    rec = run(run_program, _off(prod))
    assert not rec.of_type(COMPONENT)
    for group in rec.of_type("aws:eks/nodeGroup:NodeGroup"):
        keys = {t["key"] for t in group.inputs.get("taints", [])}
        assert contract.TAINT_KEY not in keys, group.name
    assert "startup-taint" not in _autoscaler_values(rec)["extraArgs"]


def test_on_an_existing_cluster_there_is_no_aws_identity(
    run_program: Callable[..., Recorded],
) -> None:
    """The onprem example runs Kubernetes 1.31, below what the gate needs; the gate is turned
    on here on a copy that says 1.33, with the owners' hook."""
    cfg = load("onprem")
    cfg = dataclasses.replace(
        cfg,
        kubernetes_version="1.33",
        health=m.HealthConfig(
            enabled=True,
            repair=m.RepairConfig(mode="hook", hook_url="https://repair.example.com/nodes"),
        ),
    )
    rec = run(run_program, cfg)
    component = rec.one(COMPONENT, "p-health")
    children = rec.children_of(component)
    assert not [c for c in children if c.type.startswith("aws:")]
    assert rec.one(DAEMONSET, f"p-health-daemonset-{contract.AGENT_SERVICE_ACCOUNT}")


def test_only_gpu_nodes_carry_the_pool_label_the_agent_selects(prod_rec: Recorded) -> None:
    """On AWS the agent's affinity is `trainstack.io/pool Exists`: it must match no system
    node."""
    groups = prod_rec.of_type("aws:eks/nodeGroup:NodeGroup")
    system = [g for g in groups if not g.name.startswith("p-pool-")]
    assert system
    for group in system:
        assert contract.POOL_LABEL not in group.inputs.get("labels", {}), group.name
    for group in groups:
        if group.name.startswith("p-pool-"):
            assert contract.POOL_LABEL in group.inputs["labels"], group.name
