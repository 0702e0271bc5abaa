"""Issue 19 #8 on the real API server: tightened rules leave older jobs writable.

A member's job is created under the equivalence table's settings; then the team's maximum
hours drop to 1 and its registry leaves the allowed list (tests/policy/test_updates.py
TIGHTER). The job now breaks two rules, so creating it again is refused; labelling and
scaling it, which touch nothing those rules read, must still be admitted (before, every
policy judged every UPDATE as a new object and refused both), while lengthening its maximum
duration is judged and refused.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.e2e.conftest import Deployed
from tests.policy.test_equivalence import CONFIG, demo_job
from tests.policy.test_updates import TIGHTER
from trainstack.builders import labels
from trainstack.kube import ApiError, wait_for
from trainstack.policy.admission import admission_policies
from trainstack.policy.rules import MAX_DURATION_ANNOTATION
from trainstack.preview.engine import Previewer

JOBS = ("batch.volcano.sh/v1alpha1", "Job")
NAME = "older-job"


@pytest.fixture(scope="module")
def older(prod: Deployed, previewer: Previewer) -> tuple[Deployed, dict[str, Any]]:
    for manifest in admission_policies(CONFIG, prod.stack):
        prod.kube.apply(manifest)
    job = copy.deepcopy(demo_job(previewer.preview("vision")))
    job["metadata"]["name"] = NAME

    def created() -> Any:
        try:
            return prod.kube.create(job, as_=prod.member("vision"))
        except ApiError as error:
            if error.status == 409:
                return prod.kube.get(*JOBS, NAME, "vision")
            return None  # the table's policies are not enforced yet

    wait_for("the job admitted under the table's settings", created)
    # Tighten: the team's maximum (read from its namespace) and the allowed registries.
    prod.kube.patch(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vision"}},
        {"metadata": {"annotations": {labels.TEAM_MAX_JOB_HOURS_ANNOTATION: "1"}}},
    )
    for manifest in admission_policies(TIGHTER, prod.stack):
        prod.kube.apply(manifest)
    again = copy.deepcopy(job)
    again["metadata"]["name"] = "older-job-again"
    wait_for("the tightened policies enforced", lambda: _refusal(prod, again))
    return prod, job


def _refusal(platform: Deployed, job: dict[str, Any]) -> str | None:
    try:
        platform.kube.create(job, as_=platform.member("vision"), dry_run=True)
    except ApiError as error:
        return error.message
    return None


def _member_patch(platform: Deployed, patch: dict[str, Any]) -> Any:
    return platform.kube.request(
        "PATCH",
        platform.kube.resource(*JOBS).path(NAME, "vision"),
        patch,
        content_type="application/merge-patch+json",
        as_=platform.member("vision"),
    )


def test_the_older_job_would_be_refused_today(older: tuple[Deployed, dict[str, Any]]) -> None:
    platform, job = older
    again = copy.deepcopy(job)
    again["metadata"]["name"] = "older-job-again"
    message = _refusal(platform, again)
    assert message is not None
    assert "max-duration" in message or "pinned-images" in message, message


def test_labelling_the_older_job_is_admitted(older: tuple[Deployed, dict[str, Any]]) -> None:
    platform, _ = older
    updated = _member_patch(platform, {"metadata": {"labels": {"owner": "someone"}}})
    assert updated["metadata"]["labels"]["owner"] == "someone"


def test_lengthening_its_maximum_duration_is_refused(
    older: tuple[Deployed, dict[str, Any]],
) -> None:
    platform, _ = older
    with pytest.raises(ApiError) as refused:
        _member_patch(
            platform,
            {"metadata": {"annotations": {MAX_DURATION_ANNOTATION: str(200 * 3600)}}},
        )
    assert "trainstack-rule-max-duration" in refused.value.message
