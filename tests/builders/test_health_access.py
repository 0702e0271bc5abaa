"""The health agent's and the repair controller's least privilege (builders/health_access.py),
evaluated offline with a CEL library: each row is a node change one of them might attempt,
with the verdict the admission policy must give. tests/e2e/test_health.py makes the same kind
of attempts against the real API server with tokens bound to a pod on a node.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.policy.cel import evaluate
from trainstack.builders import health_access as access
from trainstack.config import PlatformConfig, load_stack_file
from trainstack.contracts import health as contract

ROOT = Path(__file__).resolve().parent.parent.parent
NODE = "ip-10-0-1-5.ec2.internal"
KEY = contract.TAINT_KEY


@pytest.fixture(scope="module")
def cfg() -> PlatformConfig:
    loaded = load_stack_file(ROOT / "stacks" / "Pulumi.prod.yaml")
    assert isinstance(loaded, PlatformConfig)
    return loaded


def _policy(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name
    )


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {"trainstack.io/pool": "h100", "kubernetes.io/hostname": NODE},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "providerID": "aws:///us-east-1a/i-0123456789abcdef0",
            "taints": [
                {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
                {"key": KEY, "value": contract.TAINT_PENDING, "effect": "NoSchedule"},
            ],
        },
    }


def agent(node_name: str | None = NODE) -> dict[str, Any]:
    user: dict[str, Any] = {"username": access.username(access.AGENT)}
    if node_name is not None:
        user["extra"] = {contract.NODE_NAME_EXTRA: [node_name]}
    return user


def repair() -> dict[str, Any]:
    return {"username": access.username(access.REPAIR)}


def _labels(n: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = n["metadata"]["labels"]
    return labels


def passed(n: dict[str, Any]) -> None:
    n["spec"]["taints"] = [t for t in n["spec"]["taints"] if t["key"] != KEY]
    _labels(n)[contract.STATE_LABEL] = contract.STATE_PASSED


def failed(n: dict[str, Any]) -> None:
    n["spec"]["taints"][1]["value"] = contract.TAINT_FAILED
    _labels(n)[contract.STATE_LABEL] = contract.STATE_FAILED
    _labels(n)[contract.REASON_LABEL] = contract.CHECK_XID


Change = Callable[[dict[str, Any]], None]

AGENT_ROWS: list[tuple[str, Change, dict[str, Any], bool]] = [
    ("pass: remove the gate, label passed", passed, agent(), True),
    ("fail: gate failed, labels", failed, agent(), True),
    (
        "re-check: add the checking taint to a passed node",
        lambda n: n["spec"]["taints"].__setitem__(
            1, {"key": KEY, "value": contract.TAINT_CHECKING, "effect": "NoSchedule"}
        ),
        agent(),
        True,
    ),
    ("another node's token", passed, agent("ip-10-0-9-9.ec2.internal"), False),
    ("a token naming no node (a Secret-based token)", passed, agent(None), False),
    (
        "remove the GPU taint",
        lambda n: n["spec"].__setitem__("taints", [n["spec"]["taints"][1]]),
        agent(),
        False,
    ),
    (
        "the gate as NoExecute (evicts every pod)",
        lambda n: n["spec"]["taints"][1].__setitem__("effect", "NoExecute"),
        agent(),
        False,
    ),
    (
        "the gate with an unknown value",
        lambda n: n["spec"]["taints"][1].__setitem__("value", "ok"),
        agent(),
        False,
    ),
    (
        "a second gate taint",
        lambda n: n["spec"]["taints"].append(
            {"key": KEY, "value": contract.TAINT_FAILED, "effect": "PreferNoSchedule"}
        ),
        agent(),
        False,
    ),
    (
        "add another taint",
        lambda n: n["spec"]["taints"].append({"key": "x", "effect": "NoSchedule"}),
        agent(),
        False,
    ),
    ("cordon", lambda n: n["spec"].__setitem__("unschedulable", True), agent(), False),
    (
        "change the pool label",
        lambda n: _labels(n).__setitem__("trainstack.io/pool", "a100"),
        agent(),
        False,
    ),
    (
        "remove the hostname label",
        lambda n: _labels(n).pop("kubernetes.io/hostname"),
        agent(),
        False,
    ),
    (
        "set the repair label",
        lambda n: _labels(n).__setitem__(contract.REPAIR_LABEL, "requested"),
        agent(),
        False,
    ),
    (
        "a made-up health state",
        lambda n: _labels(n).__setitem__(contract.STATE_LABEL, "great"),
        agent(),
        False,
    ),
    (
        "add an annotation",
        lambda n: n["metadata"]["annotations"].__setitem__("a", "b"),
        agent(),
        False,
    ),
    (
        "change the provider id",
        lambda n: n["spec"].__setitem__("providerID", "aws:///x/i-1"),
        agent(),
        False,
    ),
    ("add a finalizer", lambda n: n["metadata"].__setitem__("finalizers", ["x"]), agent(), False),
]


@pytest.mark.parametrize(
    ("change", "user", "admitted"), [r[1:] for r in AGENT_ROWS], ids=[r[0] for r in AGENT_ROWS]
)
def test_agent_policy(
    cfg: PlatformConfig, change: Change, user: dict[str, Any], admitted: bool
) -> None:
    policy = _policy(access.access_objects(cfg), access.AGENT_POLICY)
    old = node()
    new = copy.deepcopy(old)
    change(new)
    assert evaluate(policy, new, {}, old=old, user=user) is admitted


def drained(n: dict[str, Any]) -> None:
    _labels(n)[contract.REPAIR_LABEL] = "drained"
    n["metadata"]["annotations"][contract.DRAINED_AT_ANNOTATION] = "1767225600"


REPAIR_ROWS: list[tuple[str, Change, bool]] = [
    ("drained: label and annotation", drained, True),
    (
        "request a re-check",
        lambda n: _labels(n).__setitem__(contract.RECHECK_LABEL, contract.RECHECK_STRAGGLER),
        True,
    ),
    ("remove the gate taint", passed, False),
    ("cordon", lambda n: n["spec"].__setitem__("unschedulable", True), False),
    (
        "mark the node passed",
        lambda n: _labels(n).__setitem__(contract.STATE_LABEL, "passed"),
        False,
    ),
    ("remove an annotation", lambda n: n["metadata"]["annotations"].clear(), False),
]


@pytest.mark.parametrize(
    ("change", "admitted"), [r[1:] for r in REPAIR_ROWS], ids=[r[0] for r in REPAIR_ROWS]
)
def test_repair_policy(cfg: PlatformConfig, change: Change, admitted: bool) -> None:
    policy = _policy(access.access_objects(cfg), access.REPAIR_POLICY)
    old = node()
    new = copy.deepcopy(old)
    change(new)
    assert evaluate(policy, new, {}, old=old, user=repair()) is admitted


def test_policies_judge_only_their_identity(cfg: PlatformConfig) -> None:
    """Anyone else (the kubelet, an administrator, the node lifecycle controller) is left to
    RBAC and the other admission plugins."""
    objects = access.access_objects(cfg)
    old = node()
    new = copy.deepcopy(old)
    new["spec"]["unschedulable"] = True
    admin = {"username": "kubernetes-admin"}
    for name in (access.AGENT_POLICY, access.REPAIR_POLICY):
        assert evaluate(_policy(objects, name), new, {}, old=old, user=admin)
        binding = next(
            o
            for o in objects
            if o["kind"] == "ValidatingAdmissionPolicyBinding" and o["metadata"]["name"] == name
        )
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        assert _policy(objects, name)["spec"]["failurePolicy"] == "Fail"


def test_rbac_is_what_the_programs_call(cfg: PlatformConfig) -> None:
    objects = access.access_objects(cfg)
    roles = {
        (o["kind"], o["metadata"]["name"]): o["rules"]
        for o in objects
        if o["kind"] in {"ClusterRole", "Role"}
    }
    for who in (access.AGENT, access.REPAIR):
        assert roles[("ClusterRole", who)] == [access.NODE_RULE, access.POD_READ]
        assert roles[("Role", f"{who}-events")] == [access.EVENT_RULE]
    assert roles[("ClusterRole", access.REPAIR_EVICT)] == [access.EVICT_RULE]
    # No verb that deletes, and no write outside nodes, events and evictions.
    for rules in roles.values():
        for rule in rules:
            assert not {"delete", "deletecollection", "update", "*"} & set(rule["verbs"])
    # Evictions only in team namespaces: one RoleBinding per team, no ClusterRoleBinding.
    evict = [o for o in objects if o.get("roleRef", {}).get("name") == access.REPAIR_EVICT]
    assert {o["kind"] for o in evict} == {"RoleBinding"}
    assert sorted(o["metadata"]["namespace"] for o in evict) == sorted(
        t.namespace for t in cfg.registry.teams
    )
