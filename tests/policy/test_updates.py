"""Issue 19 #8: an UPDATE is judged by the rules whose inputs it changes, nothing else.

Before, every admission policy judged every UPDATE as a new object: once a team's maximum
hours were lowered (or a registry dropped from the allowed list), no older job could be
labelled, scaled, or written by Volcano's own controller, which updates jobs it manages
(volcano v1.15.1 pkg/controllers/job/job_controller_actions.go syncJob, createOrUpdatePVC).
The decision is one definition in Python (rules.judged_on_update) and its CEL twin
(admission.judged, a matchCondition); both are held to the same answers here and in
tests/e2e/test_admission_updates.py against the real API server.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from tests.policy.cel import evaluate
from tests.policy.test_equivalence import CONFIG, NAMESPACE, demo_job, pinned_task, trainer
from trainstack.policy.admission import POLICY_PREFIX, admission_policies, judged
from trainstack.policy.rules import K8S_RULES, MAX_DURATION_ANNOTATION, judged_on_update
from trainstack.preview.plan import Plan

Change = Callable[[dict[str, Any]], None]
# The team's maximum lowered to 1 hour, and the job's registry no longer allowed.
TIGHTER = dataclasses.replace(
    CONFIG, team_max_duration_hours={"vision": 1}, allowed_registries=("other.example.com/",)
)
TIGHTER_NAMESPACE = {"metadata": {**NAMESPACE["metadata"], "annotations": {
    "trainstack.io/max-job-hours": "1"}}}  # fmt: skip


def label(j: dict[str, Any]) -> None:
    j["metadata"].setdefault("labels", {})["owner"] = "someone"


def scale(j: dict[str, Any]) -> None:
    j["spec"]["tasks"][-1]["replicas"] = 1
    j["spec"]["tasks"][-1]["minAvailable"] = 1


def longer(j: dict[str, Any]) -> None:
    j["metadata"]["annotations"][MAX_DURATION_ANNOTATION] = str(200 * 3600)


def new_image(j: dict[str, Any]) -> None:
    trainer(j)["image"] = "registry.example.com/a:2"


def requeue(j: dict[str, Any]) -> None:
    j["spec"]["queue"] = "nlp"


def reprioritise(j: dict[str, Any]) -> None:
    j["spec"]["priorityClassName"] = "trainstack-high"


def add_volume(j: dict[str, Any]) -> None:
    j["spec"]["volumes"] = [{"mountPath": "/v", "volumeClaimName": "datasets"}]


# scheduling-keys and shared-gpus judge every UPDATE: a member may patch a Job's metadata at any
# time (and resize an elastic job in place), and nothing they read depends on a setting that
# tightens (rules.UPDATE_READS).
ALWAYS = {"scheduling-keys", "shared-gpus"}
TEMPLATES = {r.name for r in K8S_RULES} - {"max-duration", "own-queue", "job-volumes",
                                           "job-plugins"}  # fmt: skip
CHANGES: dict[str, tuple[Change, set[str]]] = {
    # change: (mutation, the rules it re-judges)
    "a label": (label, ALWAYS),
    "replicas": (scale, ALWAYS),
    "the maximum duration": (longer, {"max-duration"} | ALWAYS),
    "an image": (new_image, TEMPLATES | ALWAYS),
    "the queue": (requeue, {"own-queue"} | ALWAYS),
    "the priority class": (reprioritise, {"volcano-scheduled"} | ALWAYS),
    "a job volume": (add_volume, {"job-volumes"} | ALWAYS),
}


def conditions(rule: str) -> list[dict[str, str]]:
    condition = judged(rule)
    return [] if condition is None else [condition]


@pytest.fixture(scope="module")
def job(example_plans: dict[str, Plan]) -> dict[str, Any]:
    return demo_job(example_plans["vision"])


@pytest.fixture(scope="module")
def tighter() -> dict[str, dict[str, Any]]:
    return {
        m["metadata"]["name"].removeprefix(POLICY_PREFIX): m
        for m in admission_policies(TIGHTER, "test")
        if m["kind"] == "ValidatingAdmissionPolicy"
    }


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_python_and_cel_judge_the_same_updates(
    change: str, job: dict[str, Any], tighter: dict[str, dict[str, Any]]
) -> None:
    mutate, rejudged = CHANGES[change]
    new = copy.deepcopy(job)
    mutate(new)
    assert {r.name for r in K8S_RULES if judged_on_update(r.name, job, new)} == rejudged
    for rule in K8S_RULES:
        condition = {"spec": {"matchConditions": conditions(rule.name), "validations": [
            {"expression": "false"}]}}  # fmt: skip
        # `false` fails every object the condition lets through: admitted = not judged.
        admitted = evaluate(condition, new, TIGHTER_NAMESPACE, old=job)
        assert admitted is (rule.name not in rejudged), (change, rule.name)
        assert tighter[rule.name]["spec"].get("matchConditions", []) == conditions(rule.name)


def test_an_older_job_stays_writable_after_the_rules_tighten(
    job: dict[str, Any], tighter: dict[str, dict[str, Any]]
) -> None:
    """The old job breaks the tightened max-duration and pinned-images rules: created today it
    is refused, yet labelling or scaling it is not."""
    assert not evaluate(tighter["max-duration"], job, TIGHTER_NAMESPACE)
    assert not evaluate(tighter["pinned-images"], job, TIGHTER_NAMESPACE)
    for mutate in (label, scale):
        new = copy.deepcopy(job)
        mutate(new)
        for rule in K8S_RULES:
            assert evaluate(tighter[rule.name], new, TIGHTER_NAMESPACE, old=job), rule.name


def test_an_update_of_what_a_rule_reads_is_judged(
    job: dict[str, Any], tighter: dict[str, dict[str, Any]]
) -> None:
    new = copy.deepcopy(job)
    longer(new)
    assert not evaluate(tighter["max-duration"], new, TIGHTER_NAMESPACE, old=job)
    new = copy.deepcopy(job)
    new_image(new)
    assert not evaluate(tighter["pinned-images"], new, TIGHTER_NAMESPACE, old=job)


def test_scaling_up_the_task_that_opts_out_of_preemption_is_refused(job: dict[str, Any]) -> None:
    """Issue 43: a job's one-replica CPU task may carry `volcano.sh/preemptable: "false"`
    (the rendezvous pod); Volcano lets an UPDATE change a task's replicas (admit_job.go
    validateJobUpdate), and scaling that task up would make many unreclaimable pods of it.
    Scaling the job's other tasks stays allowed."""
    policy = next(
        m
        for m in admission_policies(CONFIG, "test")
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"] == f"{POLICY_PREFIX}scheduling-keys"
    )
    rule = next(r for r in K8S_RULES if r.name == "scheduling-keys")
    old = copy.deepcopy(job)
    pinned_task()(old)
    assert not rule.check(old, CONFIG)
    assert evaluate(policy, old, NAMESPACE)
    for task, replicas, admitted in (("rendezvous", 2, False), ("master", 2, True)):
        new = copy.deepcopy(old)
        next(t for t in new["spec"]["tasks"] if t["name"] == task)["replicas"] = replicas
        assert (not rule.check(new, CONFIG)) is admitted, task
        assert judged_on_update(rule.name, old, new)
        assert evaluate(policy, new, NAMESPACE, old=old) is admitted, task
