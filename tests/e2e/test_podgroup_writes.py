"""Volcano's own writes to PodGroups against the queue-ownership policy (issue 15).

PodGroups have no status subresource in Volcano v1.15.1, so the scheduler records a gang's
state with a full-object Update of `podgroups` (pkg/scheduler/cache/cache.go
defaultStatusUpdater.UpdatePodGroup), which the platform's queue-ownership policy matches.
The API server's verdict on exactly that request is asked with a dry run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import jobs
from tests.e2e.conftest import Deployed
from tests.e2e.defects import known
from trainstack.builders import labels
from trainstack.kube import ApiError, wait_for

PODGROUP = ("scheduling.volcano.sh/v1beta1", "PodGroup")
NARROWED = (
    "issue 15: once a team's allowed priority classes are narrowed, the queue-ownership "
    "policy refuses the scheduler's status writes to PodGroups admitted before "
    "(docs/scheduling.md)"
)


@pytest.fixture
def clean(prod: Deployed) -> Iterator[Deployed]:
    namespace = prod.kube.get("v1", "Namespace", "vision")
    classes = namespace["metadata"]["annotations"][labels.TEAM_PRIORITY_ANNOTATION]
    yield prod
    prod.kube.patch(
        namespace, {"metadata": {"annotations": {labels.TEAM_PRIORITY_ANNOTATION: classes}}}
    )
    for job in prod.kube.list(*jobs.VOLCANO_JOB, "vision"):
        jobs.delete(prod, job)


def _podgroup(platform: Deployed, job: dict[str, Any]) -> dict[str, Any] | None:
    uid = jobs.live(platform, job)["metadata"]["uid"]
    for group in platform.kube.list(*PODGROUP, job["metadata"]["namespace"]):
        if any(ref.get("uid") == uid for ref in group["metadata"].get("ownerReferences", [])):
            return dict(group)
    return None


def _update_verdict(platform: Deployed, obj: dict[str, Any]) -> str:
    """The API server's answer to a full-object Update of `obj` (dry run): '' if admitted."""
    path = platform.kube.resource(*PODGROUP).path(obj["metadata"]["name"], "vision")
    try:
        platform.kube.request("PUT", path, obj, params={"dryRun": "All"})
    except ApiError as error:
        return error.message
    return ""


def test_podgroups_have_no_status_subresource(prod: Deployed) -> None:
    names = {
        r["name"]
        for r in prod.kube.request("GET", "/apis/scheduling.volcano.sh/v1beta1")["resources"]
    }
    assert "podgroups" in names
    assert "podgroups/status" not in names
    batch = {
        r["name"] for r in prod.kube.request("GET", "/apis/batch.volcano.sh/v1alpha1")["resources"]
    }
    assert "jobs/status" in batch


def test_status_writes_survive_narrowing_priority_classes(clean: Deployed) -> None:
    job = jobs.rendered(clean, jobs.spec("vision", "pg-writes", pool="h100-reserved"))
    jobs.submit(clean, job)
    jobs.wait_running(clean, job)
    group = wait_for(
        "the scheduler recorded the gang Running",
        lambda: (
            g
            if (g := _podgroup(clean, job)) and g.get("status", {}).get("phase") == "Running"
            else None
        ),
        timeout=60,
    )
    write = copy.deepcopy(group)
    write["status"]["conditions"] = [
        *write["status"].get("conditions", []),
        {"type": "Scheduled", "status": "True", "reason": "e2e"},
    ]
    assert _update_verdict(clean, write) == ""  # admitted while `normal` is allowed

    namespace = clean.kube.get("v1", "Namespace", "vision")
    clean.kube.patch(
        namespace, {"metadata": {"annotations": {labels.TEAM_PRIORITY_ANNOTATION: "high"}}}
    )
    probe = copy.deepcopy(job)
    probe["metadata"]["name"] = "pg-writes-probe"

    def narrowed() -> bool:
        try:
            clean.kube.create(probe, as_=clean.member("vision"), dry_run=True)
        except ApiError as error:
            return "priority class" in error.message
        return False

    wait_for("the API server enforces the narrowed classes", narrowed, timeout=30)
    verdict = _update_verdict(clean, write)
    known(verdict == "", "the scheduler's status write was refused:", verdict)


def test_a_podgroup_cannot_be_moved_to_another_teams_queue(clean: Deployed) -> None:
    job = jobs.rendered(clean, jobs.spec("vision", "pg-move", pool="h100-reserved"))
    jobs.submit(clean, job)
    group = wait_for("the job's PodGroup", lambda: _podgroup(clean, job), timeout=60)
    moved = copy.deepcopy(group)
    moved["spec"]["queue"] = "nlp"
    assert "is not this namespace's queue" in _update_verdict(clean, moved)
