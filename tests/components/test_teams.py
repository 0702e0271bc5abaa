"""TeamResources: quota, defaults, RBAC, network policy and access entries per team."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, Recorded
from trainstack.builders import teams
from trainstack.components.platform import Platform
from trainstack.config import PlatformConfig, load_stack_file

STACKS = Path(__file__).parent.parent.parent / "stacks"


def prod(run_program: Callable[..., Recorded]) -> Recorded:
    cfg = load_stack_file(STACKS / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    return run_program(lambda: Platform("p", cfg), region="us-east-1")


def manifest(rec: Recorded, rtype: str, name: str) -> dict[str, Any]:
    inputs: dict[str, Any] = rec.one(f"kubernetes:{rtype}", name).inputs
    return inputs


def test_quota_leaves_compute_to_the_queue(run_program: Callable[..., Recorded]) -> None:
    """Issue 15 #6: a namespace quota on GPUs, devices, CPU or memory counts pending gang pods
    and deadlocks two jobs that together exceed it (tests/e2e/test_scheduling.py); Volcano's
    queue is the quota for those."""
    rec = prod(run_program)
    quota = manifest(rec, "core/v1:ResourceQuota", "p-team-vision-resourcequota-team-quota")
    assert quota["metadata"]["namespace"] == "vision"
    hard = quota["spec"]["hard"]
    compute = ("cpu", "memory", "nvidia.com/gpu", "vpc.amazonaws.com/efa", "hugepages-2Mi")
    assert not [k for k in hard if k.removeprefix("requests.").removeprefix("limits.") in compute]
    assert not [k for k in hard if k.startswith(("requests.rdma/", "count/pods", "pods"))]
    assert hard == {"services.loadbalancers": "0", "services.nodeports": "0"}
    limits = manifest(rec, "core/v1:LimitRange", "p-team-vision-limitrange-team-defaults")
    assert limits["spec"]["limits"][0]["maxLimitRequestRatio"] == {"cpu": "2", "memory": "1"}


def test_rbac_binds_the_team_group(run_program: Callable[..., Recorded]) -> None:
    rec = prod(run_program)
    binding = manifest(
        rec,
        "rbac.authorization.k8s.io/v1:RoleBinding",
        "p-team-vision-rolebinding-trainstack-team-member",
    )
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "trainstack:team:vision"}
    ]
    role = manifest(
        rec, "rbac.authorization.k8s.io/v1:Role", "p-team-vision-role-trainstack-team-member"
    )
    jobs = next(r for r in role["rules"] if r["resources"] == ["jobs"])
    assert jobs["apiGroups"] == ["batch.volcano.sh"]
    assert "create" in jobs["verbs"]
    assert not any("secrets" in r["resources"] for r in role["rules"])
    entry = rec.one("aws:eks/accessEntry:AccessEntry", "p-team-vision-access-0")
    assert entry.inputs["principalArn"] == "arn:aws:iam::111122223333:role/vision-ml-engineers"
    assert entry.inputs["kubernetesGroups"] == ["trainstack:team:vision"]
    assert entry.inputs["clusterName"] == "trainstack-prod"


def test_default_deny_with_training_allowances(run_program: Callable[..., Recorded]) -> None:
    rec = prod(run_program)
    deny = manifest(
        rec, "networking.k8s.io/v1:NetworkPolicy", "p-team-nlp-networkpolicy-default-deny"
    )
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    allow = manifest(
        rec, "networking.k8s.io/v1:NetworkPolicy", "p-team-nlp-networkpolicy-allow-training"
    )
    ingress = allow["spec"]["ingress"]
    assert {"from": [{"podSelector": {}}]} in ingress
    scrape = next(r for r in ingress if "ports" in r)
    assert scrape["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert scrape["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "trainstack-monitoring"
    }
    egress_ports = [p for rule in allow["spec"]["egress"] for p in rule.get("ports", [])]
    assert {"protocol": "UDP", "port": 53} in egress_ports
    # Issue 37: no pod speaks to the Lustre servers; the node's kernel client mounts. A pod
    # that could would bypass every volume boundary with a user-space LNet client.
    assert not [p for p in egress_ports if p["port"] in (988, 1018)]
    assert {"protocol": "TCP", "port": 443} in egress_ports
    # The node's dcgm-exporter (host network) for the runtime's GPU evidence: on EKS the
    # network policy agent allows a pod its own node's IP (aws-network-policy-agent#65), so
    # no rule opens 9400 on every node of the VPC, other teams' included (issue 39).
    assert not [p for p in egress_ports if p["port"] == 9400]


def test_gpu_evidence_egress_only_where_the_cni_does_not_allow_the_own_node() -> None:
    """Also check of issue 39. EKS (prod): the network policy agent allows a pod its own node's
    IP (aws/aws-network-policy-agent#65), so there is no 9400 rule, which on the VPC's CIDR let
    a team read every node's dcgm-exporter. An existing cluster (onprem), CNI unknown: the
    rule stays, to any address, since a NetworkPolicy cannot name "this pod's node"."""

    def dcgm_rules(stack: str) -> list[dict[str, Any]]:
        cfg = load_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
        assert isinstance(cfg, PlatformConfig)
        [_, allow] = teams.network_policies(cfg, cfg.registry.teams[0])
        return [
            r
            for r in allow["spec"]["egress"]
            if {"protocol": "TCP", "port": 9400} in r.get("ports", [])
        ]

    assert dcgm_rules("prod") == []
    assert dcgm_rules("onprem") == [
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 9400}]}
    ]
