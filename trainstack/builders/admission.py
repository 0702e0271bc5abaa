"""ValidatingAdmissionPolicy + Binding pairs for team namespaces: one shape for all, and the
policies on Volcano objects that RBAC alone cannot express (queue ownership, Commands)."""

from __future__ import annotations

from typing import Any

from trainstack.builders import labels
from trainstack.config.model import PlatformConfig

VOLCANO_JOBS = {
    "apiGroups": ["batch.volcano.sh"],
    "apiVersions": ["v1alpha1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["jobs"],
}
VOLCANO_PODGROUPS = {
    "apiGroups": ["scheduling.volcano.sh"],
    "apiVersions": ["v1beta1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["podgroups"],
}
VOLCANO_COMMANDS = {
    "apiGroups": ["bus.volcano.sh"],
    "apiVersions": ["v1alpha1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["commands"],
}


def team_policy(
    name: str,
    stack: str,
    *,
    resource_rules: list[dict[str, Any]],
    validations: list[dict[str, str]],
    variables: list[dict[str, str]] | None = None,
    match_conditions: list[dict[str, str]] | None = None,
    deny: bool = True,
    extra_labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A policy (failing closed) and its binding to namespaces labelled as teams'."""
    meta = {"name": name, "labels": {**labels.base_labels(stack), **(extra_labels or {})}}
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": resource_rules},
    }
    if match_conditions:
        spec["matchConditions"] = match_conditions
    if variables:
        spec["variables"] = variables
    spec["validations"] = validations
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": meta,
        "spec": spec,
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": meta,
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"] if deny else ["Warn", "Audit"],
            "matchResources": {"namespaceSelector": {"matchLabels": {labels.ROLE: "team"}}},
        },
    }
    return [policy, binding]


QUEUE_POLICY = "trainstack-queue-ownership"


def queue_ownership_policy(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """A team namespace may submit only to its own queue, at priorities it is allowed."""
    team_label = labels.TEAM
    ns = "namespaceObject.metadata"
    owns_queue = (
        f"has({ns}.labels) && '{team_label}' in {ns}.labels && "
        f"has(object.spec.queue) && object.spec.queue == {ns}.labels['{team_label}']"
    )
    # An UPDATE that keeps the class is not judged again: PodGroups have no status
    # subresource (v1.15.1 CRD `subresources: {}`), so every status write of the scheduler is
    # an UPDATE of the object, and a team whose allowed classes were narrowed would otherwise
    # freeze its PodGroups (docs/scheduling.md; tests/policy/test_podgroup_writes.py).
    unchanged_class = (
        "(request.operation == 'UPDATE' && "
        "(has(oldObject.spec.priorityClassName) ? oldObject.spec.priorityClassName : '') == "
        "(has(object.spec.priorityClassName) ? object.spec.priorityClassName : '')) || "
    )
    allowed_priority = unchanged_class + (
        "!has(object.spec.priorityClassName) || object.spec.priorityClassName == '' || "
        f"(has({ns}.annotations) && '{labels.TEAM_PRIORITY_ANNOTATION}' in {ns}.annotations && "
        f"{ns}.annotations['{labels.TEAM_PRIORITY_ANNOTATION}'].split(',')"
        ".exists(c, 'trainstack-' + c == object.spec.priorityClassName))"
    )
    return team_policy(
        QUEUE_POLICY,
        cfg.stack,
        resource_rules=[VOLCANO_JOBS, VOLCANO_PODGROUPS],
        validations=[
            {
                "expression": owns_queue,
                "messageExpression": (
                    "'queue ' + (has(object.spec.queue) ? object.spec.queue : 'default') + "
                    f"' is not this namespace\\'s queue; use ' + {ns}.labels['{team_label}']"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": allowed_priority,
                "message": "this team may not use that priority class",
                "reason": "Forbidden",
            },
        ],
    )


COMMAND_POLICY = "trainstack-job-commands"
# What Volcano's job controller acts on (v1.15.1 pkg/controllers/job/job_controller.go, the
# Command informer's FilterFunc): a Command whose target has this apiVersion and kind, applied
# to the Job of that name in the Command's own namespace. Its queue controller acts on any
# Command targeting a Queue, by name alone (pkg/controllers/queue/queue_controller.go
# handleCommand): closing the organisation queue closes every child. RBAC cannot look inside
# the object, so this policy keeps team namespaces to Commands on their own Jobs.
COMMAND_TARGET = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job"}


def command_policy(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Commands created in a team namespace may target only Jobs (of that namespace)."""
    targets_job = (
        "has(object.target) && "
        f"object.target.apiVersion == '{COMMAND_TARGET['apiVersion']}' && "
        f"object.target.kind == '{COMMAND_TARGET['kind']}'"
    )
    return team_policy(
        COMMAND_POLICY,
        cfg.stack,
        resource_rules=[VOLCANO_COMMANDS],
        validations=[
            {
                "expression": targets_job,
                "messageExpression": (
                    "'a team may issue Commands to its own Jobs only, not to ' + "
                    "(has(object.target) ? object.target.kind + ' ' + object.target.name : "
                    "'no target')"
                ),
                "reason": "Forbidden",
            },
        ],
    )
