"""What the node health agent and its repair controller may do, and what holds them to it
(docs/health.md, "Least privilege"; docs/security.md).

RBAC cannot say "only your own node" or "only this taint": a `patch` on `nodes` is a patch of
any field of any node. So each identity gets the verbs its program calls, and a
ValidatingAdmissionPolicy, matched on the identity's user name, judges every node UPDATE it
makes (a PATCH is admitted as an UPDATE of the patched object):

- **agent** (a DaemonSet pod on every GPU node): only the Node whose name the API server bound
  into its token, and on it only the health taint (key `trainstack.io/health`, effect
  NoSchedule, one of the contract's values) and the agent's labels. Everything else about the
  node (other taints, other labels, annotations, `spec.unschedulable`, the other spec fields,
  finalizers, owner references) must stay as it was.
- **repair** (one Deployment replica): no spec change at all; only the repair labels and its
  drained-at annotation. It evicts pods only in team namespaces: the eviction verb comes by a
  RoleBinding in each team namespace, not cluster-wide.

The node name: a pod-bound service-account token carries its pod's node in
`request.userInfo.extra["authentication.kubernetes.io/node-name"]` (k8s.io/apiserver v0.37.2
pkg/authentication/serviceaccount/util.go, NodeNameKey, set for tokens bound to a pod on a
node; feature ServiceAccountTokenPodNodeInfo, GA since 1.32: k8s.io/kubernetes v1.37.2
pkg/features/kube_features.go). A legacy Secret-based token carries no extra: the policy then
refuses every node change (fail closed), so only tokens the kubelet projected into the agent's
own pod can move its node's gate.

Both programs also create Events (in "default", where the kubelet reports node events) and
read pods (to see what runs on a node). tests/builders/test_health_access.py states each rule;
tests/e2e/test_health.py proves them on the real API server with tokens bound to a pod.
"""

from __future__ import annotations

import json
from typing import Any, Final

from trainstack.builders import labels
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig
from trainstack.contracts import health as contract

RBAC: Final = "rbac.authorization.k8s.io/v1"
ADMISSION: Final = "admissionregistration.k8s.io/v1"
AGENT: Final = contract.AGENT_SERVICE_ACCOUNT
REPAIR: Final = contract.REPAIR_SERVICE_ACCOUNT
REPAIR_EVICT: Final = f"{REPAIR}-evict"
AGENT_POLICY: Final = f"{AGENT}-own-node"
REPAIR_POLICY: Final = f"{REPAIR}-node-fields"
assert contract.SYSTEM_NAMESPACE == SYSTEM_NAMESPACE


def username(service_account: str) -> str:
    """The user name the API server gives a service account's tokens."""
    return f"system:serviceaccount:{SYSTEM_NAMESPACE}:{service_account}"


def _lit(value: object) -> str:
    return json.dumps(value)  # a CEL literal: JSON strings, lists and numbers are valid CEL


def _meta(cfg: PlatformConfig, name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels.base_labels(cfg.stack)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _subject(service_account: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": service_account, "namespace": SYSTEM_NAMESPACE}


def _role_ref(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


# What each program calls (trainstack_health.kube), nothing more. Node writes are judged by
# the admission policies below; `update` is left out (the programs send patches only).
NODE_RULE: Final = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}
POD_READ: Final = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
EVENT_RULE: Final = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
EVICT_RULE: Final = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}


def _service_account(cfg: PlatformConfig, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(cfg, name, SYSTEM_NAMESPACE),
    }


def _cluster_role(cfg: PlatformConfig, name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": _meta(cfg, name), "rules": rules}


def _cluster_binding(cfg: PlatformConfig, name: str) -> dict[str, Any]:
    return {
        "apiVersion": RBAC,
        "kind": "ClusterRoleBinding",
        "metadata": _meta(cfg, name),
        "roleRef": _role_ref("ClusterRole", name),
        "subjects": [_subject(name)],
    }


def _event_role(cfg: PlatformConfig, name: str) -> list[dict[str, Any]]:
    """Events in the namespace node events go to, nowhere else."""
    ns = contract.EVENT_NAMESPACE
    return [
        {
            "apiVersion": RBAC,
            "kind": "Role",
            "metadata": _meta(cfg, f"{name}-events", ns),
            "rules": [EVENT_RULE],
        },
        {
            "apiVersion": RBAC,
            "kind": "RoleBinding",
            "metadata": _meta(cfg, f"{name}-events", ns),
            "roleRef": _role_ref("Role", f"{name}-events"),
            "subjects": [_subject(name)],
        },
    ]


def _evict_bindings(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The repair controller evicts training pods, which run only in team namespaces."""
    return [
        {
            "apiVersion": RBAC,
            "kind": "RoleBinding",
            "metadata": _meta(cfg, REPAIR_EVICT, team.namespace),
            "roleRef": _role_ref("ClusterRole", REPAIR_EVICT),
            "subjects": [_subject(REPAIR)],
        }
        for team in cfg.registry.teams
    ]


def rbac(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """ServiceAccounts, roles and bindings of the agent and the repair controller."""
    return [
        _service_account(cfg, AGENT),
        _cluster_role(cfg, AGENT, [NODE_RULE, POD_READ]),
        _cluster_binding(cfg, AGENT),
        *_event_role(cfg, AGENT),
        _service_account(cfg, REPAIR),
        _cluster_role(cfg, REPAIR, [NODE_RULE, POD_READ]),
        _cluster_binding(cfg, REPAIR),
        *_event_role(cfg, REPAIR),
        _cluster_role(cfg, REPAIR_EVICT, [EVICT_RULE]),
        *_evict_bindings(cfg),
    ]


# -- admission ---------------------------------------------------------------------------------

NODE_UPDATES: Final = {
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "operations": ["UPDATE"],
    "resources": ["nodes"],
}
# core/v1 NodeSpec's fields besides `taints` (k8s.io/api v0.37 core/v1 types.go NodeSpec):
# compared one by one, since CEL has no "the object without one field".
OTHER_SPEC_FIELDS: Final = (
    "podCIDR",
    "podCIDRs",
    "providerID",
    "unschedulable",
    "configSource",
    "externalID",
)
# metadata that a node's owner may rely on and neither program needs to change.
FIXED_METADATA: Final = ("finalizers", "ownerReferences")


def _same(path: str) -> str:
    """`path` (under object / oldObject) is absent in both, or present in both and equal.
    `has()` rather than CEL optionals: the same text then runs in the offline evaluator
    (tests/policy/cel.py) and in the API server."""
    return (
        f"has(object.{path}) == has(oldObject.{path}) && "
        f"(!has(object.{path}) || object.{path} == oldObject.{path})"
    )


def _only_keys_change(field: str, allowed: tuple[str, ...]) -> str:
    """Every key of `metadata.<field>` outside `allowed` is unchanged: none added, none
    removed, none given another value."""
    new, old = f"object.metadata.{field}", f"oldObject.metadata.{field}"
    free = f"k in {_lit(list(allowed))}"
    return (
        f"(!has({new}) || {new}.all(k, {free} || "
        f"(has({old}) && k in {old} && {old}[k] == {new}[k]))) && "
        f"(!has({old}) || {old}.all(k, {free} || (has({new}) && k in {new})))"
    )


def _fixed(fields: tuple[str, ...], prefix: str) -> list[str]:
    return [_same(f"{prefix}.{f}") for f in fields]


def _taints(obj: str) -> str:
    return f"has({obj}.spec.taints) ? {obj}.spec.taints : []"


def _validation(expression: str, message: str) -> dict[str, str]:
    return {"expression": expression, "message": message, "reason": "Forbidden"}


def _policy(
    cfg: PlatformConfig,
    name: str,
    service_account: str,
    validations: list[dict[str, str]],
    variables: list[dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """A policy judging one identity's node updates (failing closed), and its binding."""
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [NODE_UPDATES]},
        "matchConditions": [
            {
                "name": "is-" + service_account,
                "expression": f"request.userInfo.username == {_lit(username(service_account))}",
            }
        ],
    }
    if variables:
        spec["variables"] = variables
    spec["validations"] = validations
    return [
        {
            "apiVersion": ADMISSION,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": _meta(cfg, name),
            "spec": spec,
        },
        {
            "apiVersion": ADMISSION,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": _meta(cfg, name),
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    ]


def agent_policy(cfg: PlatformConfig) -> list[dict[str, Any]]:
    key = _lit(contract.TAINT_KEY)
    extra = _lit(contract.NODE_NAME_EXTRA)
    values = [contract.TAINT_PENDING, contract.TAINT_CHECKING, contract.TAINT_FAILED]
    states = [contract.STATE_PASSED, contract.STATE_FAILED, contract.STATE_CHECKING]
    state = _lit(contract.STATE_LABEL)
    others = "variables.{o}.filter(t, t.key != " + key + ")"
    return _policy(
        cfg,
        AGENT_POLICY,
        AGENT,
        variables=[
            {
                # The node the token was bound to; '' for a token that names none.
                "name": "boundNode",
                "expression": (
                    f"has(request.userInfo.extra) && {extra} in request.userInfo.extra && "
                    f"size(request.userInfo.extra[{extra}]) == 1 ? "
                    f"request.userInfo.extra[{extra}][0] : ''"
                ),
            },
            {"name": "taints", "expression": _taints("object")},
            {"name": "oldTaints", "expression": _taints("oldObject")},
            {"name": "gate", "expression": f"variables.taints.filter(t, t.key == {key})"},
        ],
        validations=[
            _validation(
                "variables.boundNode != '' && variables.boundNode == object.metadata.name",
                "the health agent may change only the node its pod runs on (its token is "
                "bound to another node, or to none)",
            ),
            _validation(
                f"{others.format(o='taints')} == {others.format(o='oldTaints')}",
                f"the health agent may add, change or remove only the {contract.TAINT_KEY} taint",
            ),
            _validation(
                "size(variables.gate) <= 1 && variables.gate.all(t, "
                f"t.effect == {_lit(contract.TAINT_EFFECT)} && has(t.value) && "
                f"t.value in {_lit(values)})",
                f"the {contract.TAINT_KEY} taint is one, {contract.TAINT_EFFECT}, with a value "
                f"of {', '.join(values)}",
            ),
            _validation(
                _only_keys_change("labels", contract.AGENT_LABELS),
                "the health agent may set or remove only the labels "
                + ", ".join(contract.AGENT_LABELS),
            ),
            _validation(
                f"!has(object.metadata.labels) || !({state} in object.metadata.labels) || "
                f"object.metadata.labels[{state}] in {_lit(states)}",
                f"the {contract.STATE_LABEL} label is one of {', '.join(states)}",
            ),
            _validation(
                " && ".join(
                    [
                        _same("metadata.annotations"),
                        *_fixed(FIXED_METADATA, "metadata"),
                        *_fixed(OTHER_SPEC_FIELDS, "spec"),
                    ]
                ),
                "the health agent may not change the node's annotations, finalizers, owners "
                "or any spec field but its taint",
            ),
        ],
    )


def repair_policy(cfg: PlatformConfig) -> list[dict[str, Any]]:
    return _policy(
        cfg,
        REPAIR_POLICY,
        REPAIR,
        validations=[
            _validation(
                " && ".join(
                    [
                        _same("spec.taints"),
                        *_fixed(OTHER_SPEC_FIELDS, "spec"),
                        *_fixed(FIXED_METADATA, "metadata"),
                    ]
                ),
                "the repair controller may not change a node's spec, finalizers or owners",
            ),
            _validation(
                _only_keys_change("labels", contract.REPAIR_LABELS),
                "the repair controller may set or remove only the labels "
                + ", ".join(contract.REPAIR_LABELS),
            ),
            _validation(
                _only_keys_change("annotations", (contract.DRAINED_AT_ANNOTATION,)),
                "the repair controller may set or remove only the annotation "
                + contract.DRAINED_AT_ANNOTATION,
            ),
        ],
    )


def access_objects(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Everything above, in the order to create it (admission before the identities that it
    judges can act)."""
    return [*agent_policy(cfg), *repair_policy(cfg), *rbac(cfg)]
