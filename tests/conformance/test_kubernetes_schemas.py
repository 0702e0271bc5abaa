"""Every Kubernetes object the example plans would apply validates in strict mode.

Built-in kinds: kubernetes-validate --strict for the cluster's version. Custom resources:
the upstream CRD schemas in the reference folder, made strict (tests/conformance/crds.py).
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest

from tests.conformance.crds import CRD_FOLDERS, UNVALIDATED, crd_errors, group_of, is_custom
from tests.conftest import EXAMPLE_STACKS
from trainstack.preview.plan import Plan


def cluster_version(example_plans: dict[str, Plan], plan: Plan) -> str:
    """A team stack runs on its platform's cluster version."""
    if "kubernetesVersion" in plan.outputs:
        return str(plan.outputs["kubernetesVersion"])
    platform = str(plan.outputs["platformStack"]).rsplit("/", 1)[-1]
    return str(example_plans[platform].outputs["kubernetesVersion"])


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_builtin_objects_validate_strictly(stack: str, example_plans: dict[str, Plan]) -> None:
    plan = example_plans[stack]
    version = cluster_version(example_plans, plan)
    failures = []
    for _, manifest in plan.kubernetes_objects():
        if is_custom(manifest["apiVersion"]):
            continue
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            name = f"{manifest['kind']}/{manifest['metadata']['name']}"
            failures.append(f"{name}: {'.'.join(map(str, err.path))}: {err.message}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_custom_resources_validate_against_upstream_crds(
    stack: str, example_plans: dict[str, Plan], reference: Path
) -> None:
    failures = []
    for _, manifest in example_plans[stack].kubernetes_objects():
        api_version = manifest["apiVersion"]
        if not is_custom(api_version) or group_of(api_version) in UNVALIDATED:
            continue
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        failures += [f"{name}: {e}" for e in crd_errors(reference, manifest)]
    assert not failures, "\n".join(failures)


def test_every_custom_resource_group_is_validated_or_explained(
    example_plans: dict[str, Plan],
) -> None:
    groups = {
        group_of(m["apiVersion"])
        for plan in example_plans.values()
        for _, m in plan.kubernetes_objects()
        if is_custom(m["apiVersion"])
    }
    assert groups <= set(CRD_FOLDERS) | set(UNVALIDATED)


def test_strict_validation_catches_a_misspelt_field() -> None:
    bad = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "lables": {}}}
    with pytest.raises(kubernetes_validate.ValidationError, match="lables"):
        kubernetes_validate.validate(bad, "1.33", strict=True)


def test_crd_validation_catches_a_misspelt_field(reference: Path) -> None:
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {"weight": 1, "capabilty": {"nvidia.com/gpu": "8"}},
    }
    errors = crd_errors(reference, queue)
    assert any("capabilty" in e for e in errors), errors


def test_examples_have_kubernetes_objects(example_plans: dict[str, Plan]) -> None:
    assert all(example_plans[s].kubernetes_objects() for s in ("dev", "prod", "onprem"))


POD_FIELDS = ("affinity", "tolerations", "nodeSelector", "priorityClassName")


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_helm_scheduling_values_are_valid_pod_fields(
    stack: str, example_plans: dict[str, Plan]
) -> None:
    """Charts copy these values into their pod specs; strictly typed there, so here too."""
    plan = example_plans[stack]
    version = cluster_version(example_plans, plan)
    for release in plan.helm_releases():
        values = release.inputs.get("values", {})
        nested = [values, *(v for v in values.values() if isinstance(v, dict))]
        for part in nested:
            spec = {k: part[k] for k in POD_FIELDS if k in part}
            if not spec:
                continue
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": release.name},
                "spec": {"containers": [{"name": "c", "image": "i"}], **spec},
            }
            kubernetes_validate.validate(pod, version, strict=True)
