"""The third column of the rule/CEL equivalence table: the real API server's verdict.

tests/policy/test_equivalence.py holds, for every Kubernetes rule, objects that the Python rule
and its CEL (evaluated with cel-python) must admit or reject. Here the same objects go to
kube-apiserver as a member of the team (impersonated, never as an admin), with the platform's
admission policies generated from the same settings (`CONFIG`) and bound the way a platform
stack binds them, so all three enforcers are held to one verdict per row.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.e2e.conftest import Deployed
from tests.e2e.kube import ApiError
from tests.policy.test_equivalence import CASES, CONFIG, RULES, Mutation, demo_job
from trainstack.builders.scheduling import QUEUE_POLICY
from trainstack.policy.admission import POLICY_PREFIX, admission_policies
from trainstack.preview.engine import Previewer


@pytest.fixture(scope="module")
def platform(prod: Deployed) -> Deployed:
    # The equivalence table's settings, so the server judges by the same rules the other two
    # columns do; bindings and namespaces are the platform stack's own.
    for manifest in admission_policies(CONFIG, prod.stack):
        prod.kube.apply(manifest)
    return prod


@pytest.fixture(scope="module")
def demo(previewer: Previewer) -> dict[str, Any]:
    return demo_job(previewer.preview("vision"))


def _policies_for(rule: str) -> tuple[str, ...]:
    """Policies that may report a rule's refusal. The queue-ownership policy of the Volcano
    component (builders/scheduling.queue_ownership_policy) checks the queue too, and the API
    server names whichever denying policy it evaluated first."""
    own = (f"{POLICY_PREFIX}{rule}",)
    return (*own, QUEUE_POLICY) if rule == "own-queue" else own


def _verdict(platform: Deployed, job: dict[str, Any]) -> tuple[bool, str]:
    try:
        platform.kube.create(job, as_=platform.member("vision"), dry_run=True)
    except ApiError as error:
        return False, error.message
    return True, ""


@pytest.mark.parametrize(
    ("rule", "case", "mutate", "admitted"), CASES, ids=[f"{r}: {c}" for r, c, _, _ in CASES]
)
def test_api_server_agrees(
    rule: str,
    case: str,
    mutate: Mutation | None,
    admitted: bool,
    platform: Deployed,
    demo: dict[str, Any],
) -> None:
    del case
    job = copy.deepcopy(demo)
    if mutate is not None:
        mutate(job)
    ok, message = _verdict(platform, job)
    assert ok is admitted, (
        message or f"admitted, but {rule} rejects: {RULES[rule].check(job, CONFIG)}"
    )
    if not ok:
        # Refused by this rule's policy, not by something else in the admission chain.
        assert any(f"'{name}'" in message for name in _policies_for(rule)), message


def test_a_member_may_submit_the_valid_job_for_real(
    platform: Deployed, demo: dict[str, Any]
) -> None:
    """Not only a dry run: the object is stored, and the queue-ownership policy lets it in."""
    job = copy.deepcopy(demo)
    job["metadata"]["name"] = "admission-real"
    created = platform.kube.create(job, as_=platform.member("vision"))
    assert created["metadata"]["uid"]
    platform.kube.delete("batch.volcano.sh/v1alpha1", "Job", "admission-real", "vision")
