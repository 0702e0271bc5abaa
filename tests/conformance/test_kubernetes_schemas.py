"""Every Kubernetes object the example plans would apply validates in strict mode.

Strict mode rejects unknown fields: the API server would otherwise prune a misspelt
field silently. Custom resources are checked against the upstream CRDs elsewhere.
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.conftest import EXAMPLE_STACKS
from trainstack.preview.plan import Plan


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_objects_validate_strictly(stack: str, example_plans: dict[str, Plan]) -> None:
    plan = example_plans[stack]
    version = plan.outputs.get("kubernetesVersion") or example_plans_version(example_plans, plan)
    objects = [m for _, m in plan.kubernetes_objects()]
    failures = []
    for manifest in objects:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            name = f"{manifest['kind']}/{manifest['metadata']['name']}"
            failures.append(f"{name}: {'.'.join(map(str, err.path))}: {err.message}")
    assert not failures, "\n".join(failures)


def example_plans_version(example_plans: dict[str, Plan], plan: Plan) -> str:
    """A team stack runs on its platform's cluster version."""
    platform = str(plan.outputs["platformStack"]).rsplit("/", 1)[-1]
    return str(example_plans[platform].outputs["kubernetesVersion"])


def test_strict_validation_catches_a_misspelt_field() -> None:
    bad = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "lables": {}}}
    with pytest.raises(kubernetes_validate.ValidationError, match="lables"):
        kubernetes_validate.validate(bad, "1.33", strict=True)


def test_examples_have_kubernetes_objects(example_plans: dict[str, Plan]) -> None:
    assert all(example_plans[s].kubernetes_objects() for s in ("dev", "prod", "onprem"))
