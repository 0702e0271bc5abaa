"""The queue-ownership policy and the writes Volcano itself makes to PodGroups (issue 15).

Volcano v1.15.1's PodGroup CRD declares no status subresource
(config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml: `subresources: {}`), so the
scheduler writes a PodGroup's status with a full-object Update of `podgroups`
(pkg/scheduler/cache/cache.go, defaultStatusUpdater.UpdatePodGroup) and the job controller
syncs its spec the same way (pkg/controllers/job/job_controller_actions.go,
createOrUpdatePodGroup). A ValidatingAdmissionPolicy matching UPDATE of `podgroups` therefore
judges every one of those writes, on the whole object. Job status, by contrast, goes to the
`jobs/status` subresource (the Job CRD has `subresources: {status: {}}`), which a rule on
`jobs` does not match.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import STACKS
from tests.policy.cel import evaluate
from trainstack.builders import labels
from trainstack.builders.admission import queue_ownership_policy
from trainstack.config import PlatformConfig, load_stack_file

NARROWED = (
    "issue 15: the queue-ownership policy re-judges the priority class on every UPDATE, so once "
    "a team's allowed classes are narrowed the scheduler's PodGroup status writes (full-object "
    "Updates: PodGroups have no status subresource) are refused (docs/scheduling.md)"
)


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    cfg = load_stack_file(STACKS / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    return next(m for m in queue_ownership_policy(cfg) if m["kind"] == "ValidatingAdmissionPolicy")


def namespace(classes: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "vision",
            "labels": {labels.TEAM: "vision", labels.ROLE: "team"},
            "annotations": {labels.TEAM_PRIORITY_ANNOTATION: classes},
        }
    }


# As Volcano's job controller creates it for a Job (createOrUpdatePodGroup): queue and
# priority class copied from the Job, which the policy admitted.
PODGROUP: dict[str, Any] = {
    "apiVersion": "scheduling.volcano.sh/v1beta1",
    "kind": "PodGroup",
    "metadata": {"name": "demo-train-0f4c", "namespace": "vision"},
    "spec": {
        "minMember": 2,
        "minTaskMember": {"master": 1, "worker": 1},
        "queue": "vision",
        "priorityClassName": "trainstack-normal",
    },
    "status": {"phase": "Inqueue"},
}


def status_write(old: dict[str, Any]) -> dict[str, Any]:
    """What the scheduler sends when the gang starts: the same object, a new status."""
    new = copy.deepcopy(old)
    new["status"] = {"phase": "Running", "running": 2}
    return new


def crd(reference: Path, name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        (reference / "volcano" / "crd-bases" / name).read_text(encoding="utf-8")
    )
    return loaded


def test_podgroups_have_no_status_subresource_and_the_policy_sees_their_updates(
    reference: Path, policy: dict[str, Any]
) -> None:
    podgroups = crd(reference, "scheduling.volcano.sh_podgroups.yaml")
    assert all(not v.get("subresources") for v in podgroups["spec"]["versions"])
    jobs = crd(reference, "batch.volcano.sh_jobs.yaml")
    assert all(v["subresources"] == {"status": {}} for v in jobs["spec"]["versions"])
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    podgroup_rule = next(r for r in rules if r["resources"] == ["podgroups"])
    assert "UPDATE" in podgroup_rule["operations"]


def test_a_status_write_is_admitted_while_the_class_is_allowed(policy: dict[str, Any]) -> None:
    assert evaluate(policy, status_write(PODGROUP), namespace("normal,preemptible"), old=PODGROUP)


def test_status_writes_survive_narrowing_the_teams_priority_classes(
    policy: dict[str, Any],
) -> None:
    """A platform change that drops `normal` from vision's classes must not stop Volcano from
    recording the state of PodGroups admitted before: Volcano logs the refused update and
    moves on (pkg/scheduler/framework/job_updater.go updateJob), so a PodGroup stays Pending
    for good, and its Job's pods are created only once the phase leaves Pending
    (job_controller_actions.go syncJob)."""
    assert evaluate(policy, status_write(PODGROUP), namespace("high"), old=PODGROUP)


def test_a_podgroup_still_cannot_move_to_another_teams_queue(policy: dict[str, Any]) -> None:
    moved = copy.deepcopy(PODGROUP)
    moved["spec"]["queue"] = "nlp"
    assert not evaluate(policy, moved, namespace("normal,preemptible"), old=PODGROUP)


def test_a_podgroup_still_cannot_take_a_class_the_team_may_not_use(
    policy: dict[str, Any],
) -> None:
    raised = copy.deepcopy(PODGROUP)
    raised["spec"]["priorityClassName"] = "trainstack-critical"
    assert not evaluate(policy, raised, namespace("normal,preemptible"), old=PODGROUP)
    created = copy.deepcopy(raised)
    del created["status"]
    assert not evaluate(policy, created, namespace("normal,preemptible"))
