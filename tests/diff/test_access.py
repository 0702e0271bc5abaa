"""The Access section's reading of each kind of grant, and what it flags (issue 23 #5)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from trainstack.diff.access import access_section

RBAC = "kubernetes:rbac.authorization.k8s.io/v1"


def plan(*resources: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "resources": [{"type": t, "name": n, "custom": True, "inputs": i} for t, n, i in resources]
    }


EXISTING = ("aws:eks/accessEntry:AccessEntry", "old", {"principalArn": "arn:aws:iam::1:role/a"})
OPEN_INGRESS = {
    "securityGroupId": "sg-1",
    "cidrIpv4": "0.0.0.0/0",
    "ipProtocol": "tcp",
    "fromPort": 22,
    "toPort": 22,
}
ADMIN_BINDING = {
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "ops"},
    "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"},
    "subjects": [{"kind": "Group", "name": "ops"}],
}
OPEN_POLICY = {
    "metadata": {"name": "web", "namespace": "vision"},
    "spec": {
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 80}]}],
    },
}
ATTACH = {"role": "ci", "policyArn": "arn:aws:iam::aws:policy/AdministratorAccess"}
WILDCARD = {
    "role": "ci",
    "policy": json.dumps({"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}),
}


@pytest.mark.parametrize(
    ("added", "row"),
    [
        (
            ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "ssh", OPEN_INGRESS),
            (
                "security group rule",
                "security group sg-1",
                "ingress from 0.0.0.0/0 (tcp 22)",
                ["public: the internet"],
            ),
        ),
        (
            (f"{RBAC}:ClusterRoleBinding", "ops", ADMIN_BINDING),
            (
                "RBAC ClusterRoleBinding",
                "Group ops",
                "ClusterRole cluster-admin cluster-wide",
                ["cluster admin"],
            ),
        ),
        (
            ("kubernetes:networking.k8s.io/v1:NetworkPolicy", "web", OPEN_POLICY),
            (
                "NetworkPolicy",
                "vision/web (pods app=web)",
                "ingress from 0.0.0.0/0 (TCP 80)",
                ["public: the internet"],
            ),
        ),
        (
            ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "ci-admin", ATTACH),
            ("IAM policy attachment", "ci", "AdministratorAccess", ["administrator"]),
        ),
        (
            ("aws:iam/rolePolicy:RolePolicy", "ci-s3", WILDCARD),
            ("IAM inline policy", "ci", "ci-s3: Allow s3:* on *", ["wildcard actions"]),
        ),
    ],
    ids=["open-ingress", "cluster-admin-binding", "open-networkpolicy", "admin-attach", "wildcard"],
)
def test_an_added_grant_names_who_and_what(
    added: tuple[str, str, dict[str, Any]], row: tuple[str, str, str, list[str]]
) -> None:
    [change] = access_section(plan(EXISTING), plan(EXISTING, added))
    assert (change.change, change.kind, change.subject, change.grant, change.flags) == (
        "added",
        *row,
    )


def test_the_endpoint_opened_to_the_internet_is_a_changed_grant() -> None:
    cluster = {
        "name": "prod",
        "version": "1.33",
        "vpcConfig": {"endpointPublicAccess": True, "publicAccessCidrs": ["203.0.113.0/24"]},
    }
    opened = copy.deepcopy(cluster)
    opened["vpcConfig"]["publicAccessCidrs"] = ["0.0.0.0/0"]
    upgraded = {**cluster, "version": "1.34"}
    kind = "aws:eks/cluster:Cluster"
    assert access_section(plan((kind, "eks", cluster)), plan((kind, "eks", upgraded))) == []
    [change] = access_section(plan((kind, "eks", cluster)), plan((kind, "eks", opened)))
    assert change.subject == "prod"
    assert change.grant.startswith("public endpoint from 0.0.0.0/0")
    assert change.flags == ["public: the internet"]
    assert [(c.field, c.before, c.after) for c in change.changes] == [
        ("vpcConfig.publicAccessCidrs[0]", "203.0.113.0/24", "0.0.0.0/0")
    ]


def test_a_team_losing_its_access_group_is_named() -> None:
    kind = "aws:eks/accessEntry:AccessEntry"
    entry = {"principalArn": "arn:aws:iam::1:role/vision", "kubernetesGroups": ["team:vision"]}
    moved = {**entry, "kubernetesGroups": ["team:nlp"]}
    [change] = access_section(plan((kind, "v", entry)), plan((kind, "v", moved)))
    assert (change.change, change.subject, change.grant) == (
        "changed",
        "arn:aws:iam::1:role/vision",
        "Kubernetes groups team:nlp",
    )
    assert [(c.field, c.before, c.after) for c in change.changes] == [
        ("kubernetesGroups[0]", "team:vision", "team:nlp")
    ]


ADMISSION = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
AGENT_BINDING = {
    "metadata": {"name": "trainstack-health-agent-own-node"},
    "spec": {"policyName": "trainstack-health-agent-own-node", "validationActions": ["Deny"]},
}


def test_an_admission_guard_removed_or_only_warning_is_flagged() -> None:
    """Issue 42: the health agent's least privilege rests on its admission policy; a change
    that drops the binding, or turns it into a warning, must stand out in review."""
    base = plan(EXISTING, (ADMISSION, "agent", AGENT_BINDING))
    [removed] = access_section(base, plan(EXISTING))
    assert (removed.change, removed.kind, removed.subject) == (
        "removed",
        "admission policy",
        "trainstack-health-agent-own-node",
    )
    assert removed.flags == ["admission guard removed"]
    warn = copy.deepcopy(AGENT_BINDING)
    warn["spec"]["validationActions"] = ["Warn", "Audit"]
    [changed] = access_section(base, plan(EXISTING, (ADMISSION, "agent", warn)))
    assert changed.change == "changed"
    assert changed.flags == ["admission not enforced"]
    assert changed.grant == "Warn, Audit on every object it matches"
    # Relabelled only: nothing to review.
    relabelled = copy.deepcopy(AGENT_BINDING)
    relabelled["metadata"]["labels"] = {"a": "b"}
    assert access_section(base, plan(EXISTING, (ADMISSION, "agent", relabelled))) == []
