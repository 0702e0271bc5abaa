"""ValidatingAdmissionPolicy + Binding pairs for team namespaces: one shape for all."""

from __future__ import annotations

from typing import Any

from trainstack.builders import labels

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


def team_policy(
    name: str,
    stack: str,
    *,
    resource_rules: list[dict[str, Any]],
    validations: list[dict[str, str]],
    variables: list[dict[str, str]] | None = None,
    deny: bool = True,
    extra_labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A policy (failing closed) and its binding to namespaces labelled as teams'."""
    meta = {"name": name, "labels": {**labels.base_labels(stack), **(extra_labels or {})}}
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": resource_rules},
    }
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
