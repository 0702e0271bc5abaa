"""The health repair controller's IAM: the policy document exactly, that it grants nothing
beyond marking this cluster's node groups' instances Unhealthy and reading which group an
instance is in, and the Pod Identity trust. (That these are exactly the calls the controller
makes, on moto: tests/health/test_repair_aws.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from trainstack.builders import health_iam
from trainstack.builders.eks import pod_identity_assume_role_policy


def test_policy_document_exactly() -> None:
    assert health_iam.repair_policy("prod") == {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReplaceThisClustersNodes",
                "Effect": "Allow",
                "Action": ["autoscaling:SetInstanceHealth"],
                "Resource": "*",
                "Condition": {"StringEquals": {"autoscaling:ResourceTag/eks:cluster-name": "prod"}},
            },
            {
                "Sid": "FindTheInstancesGroup",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                ],
                "Resource": "*",
            },
        ],
    }


def _statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    statements = doc["Statement"]
    assert isinstance(statements, list)
    return statements


@pytest.mark.parametrize("cluster", ["prod", "team-gpu-us-west-2"])
def test_grants_nothing_else(cluster: str) -> None:
    doc = health_iam.repair_policy(cluster)
    assert set(doc) == {"Version", "Statement"}
    granted: set[str] = set()
    for statement in _statements(doc):
        # only Allow, only listed actions: no Not* inversions, no wildcards, no principals
        assert statement["Effect"] == "Allow"
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}
        actions = statement["Action"]
        assert all("*" not in a and a.startswith("autoscaling:") for a in actions)
        granted |= set(actions)
        writes = [a for a in actions if not a.startswith("autoscaling:Describe")]
        if writes:
            # every write carries the cluster's tag condition, and only that one
            assert statement["Condition"] == {
                "StringEquals": {"autoscaling:ResourceTag/eks:cluster-name": cluster}
            }
        else:
            assert "Condition" not in statement
    assert granted == {
        "autoscaling:SetInstanceHealth",
        "autoscaling:DescribeAutoScalingInstances",
        "autoscaling:DescribeAutoScalingGroups",
    }


def test_another_cluster_gets_another_condition() -> None:
    a = health_iam.repair_policy("a")["Statement"][0]["Condition"]
    b = health_iam.repair_policy("b")["Statement"][0]["Condition"]
    assert a != b


def test_empty_cluster_name_is_refused() -> None:
    with pytest.raises(ValueError, match="cluster_name is empty"):
        health_iam.repair_policy("")


def test_trust_is_eks_pod_identity() -> None:
    trust = health_iam.repair_trust_policy()
    assert trust == pod_identity_assume_role_policy()
    assert trust["Statement"] == [
        {
            "Effect": "Allow",
            "Principal": {"Service": "pods.eks.amazonaws.com"},
            "Action": ["sts:AssumeRole", "sts:TagSession"],
        }
    ]
