"""A deployed job's life: updates, exit codes and their documented actions, retries.

Exit codes and actions are the runtime contract (images/runtime/trainstack_runtime/contract.py,
docs/runtime.md): retryable classes restart the job, fatal ones abort it, a passed deadline
terminates it; the renderer turns them into Volcano LifecyclePolicies (jobs/render.py,
EXIT_ACTIONS). A kwok stage makes the first container exit with the chosen code.
"""

from __future__ import annotations

import collections
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from trainstack_runtime.contract import ExitCode

from tests.e2e import jobs
from tests.e2e.conftest import Deployed
from trainstack.jobs.lifecycle import EXIT_ACTIONS, SIGNAL_EXITS, replacement_key
from trainstack.jobs.render import RETRY_COUNT_ANNOTATION
from trainstack.kube import ApiError, wait_for

# The phases each action leads to (Volcano pkg/controllers/job/state/*.go). Aborting and
# Terminating become Aborted and Terminated on the job's next sync once no pod is alive
# (state/aborting.go, terminating.go); when the exiting pod was the last event there may be
# no next sync, so the job can stay in the -ing phase: stopped all the same.
PHASE_AFTER = {
    "RestartJob": ("Restarting",),
    "AbortJob": ("Aborting", "Aborted"),
    "TerminateJob": ("Terminating", "Terminated"),
}


@pytest.fixture
def clean(prod: Deployed) -> Iterator[Deployed]:
    yield prod
    for job in prod.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(prod, job)


def _small(
    platform: Deployed,
    name: str,
    max_retries: int = 3,
    max_preemptions: int = 100,
    replicas: int = 1,
) -> dict[str, Any]:
    return jobs.rendered(
        platform,
        jobs.spec(
            "vision",
            name,
            pool="h100-reserved",
            gpus=1,
            replicas=replicas,
            max_retries=max_retries,
            max_preemptions=max_preemptions,
        ),
    )


def _with_image(job: dict[str, Any], image: str) -> dict[str, Any]:
    changed = copy.deepcopy(job)
    for task in changed["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0]["image"] = image
    return changed


def _pulumi_up(platform: Deployed, old: dict[str, Any], new: dict[str, Any]) -> str:
    """What `pulumi up` does with TrainingJob's options: a changed replacementTrigger deletes
    the Job (deleteBeforeReplace, its name is fixed) and creates the new one; otherwise the
    provider updates it in place (server-side apply)."""
    if replacement_key(old["spec"]) != replacement_key(new["spec"]):
        jobs.delete(platform, old)
        platform.kube.apply(new)
        return "replace"
    platform.kube.apply(new)
    return "update"


# Production (the prod platform) takes digests only (pinned-images).
NEW_IMAGE = f"registry.example.com/vision/e2e:2.0@sha256:{'f' * 64}"


def test_changing_a_deployed_jobs_image_goes_through(clean: Deployed) -> None:
    """Issue 15 #4: the image change is a replacement, and the new Job runs the new image."""
    job = _small(clean, "update-image")
    clean.kube.apply(job)
    jobs.wait_running(clean, job)
    first = jobs.live(clean, job)["metadata"]["uid"]
    changed = _with_image(job, NEW_IMAGE)
    assert _pulumi_up(clean, job, changed) == "replace"
    pods = jobs.wait_running(clean, changed)
    live = jobs.live(clean, changed)
    assert live["metadata"]["uid"] != first
    images = {t["template"]["spec"]["containers"][0]["image"] for t in live["spec"]["tasks"]}
    assert images == {NEW_IMAGE}
    assert {p["spec"]["containers"][0]["image"] for p in pods} == images


def test_volcano_refuses_the_image_change_in_place(clean: Deployed) -> None:
    """Why the Job is replaced: the assumption jobs/lifecycle.fixed_part rests on."""
    job = _small(clean, "update-refused")
    clean.kube.apply(job)
    with pytest.raises(ApiError, match="job updates may not change fields"):
        clean.kube.apply(_with_image(job, NEW_IMAGE))


def test_what_volcano_updates_in_place_is_not_replaced(clean: Deployed) -> None:
    """Priority, minAvailable and replicas change in place: the key stays, Volcano accepts."""
    job = _small(clean, "update-in-place")
    clean.kube.apply(job)
    changed = copy.deepcopy(job)
    changed["spec"]["priorityClassName"] = "trainstack-high"
    task = changed["spec"]["tasks"][0]
    task["replicas"] += 1
    task["minAvailable"] += 1
    changed["spec"]["minAvailable"] += 1
    uid = jobs.live(clean, job)["metadata"]["uid"]
    assert _pulumi_up(clean, job, changed) == "update"
    live = jobs.live(clean, changed)
    assert live["metadata"]["uid"] == uid
    assert live["spec"]["priorityClassName"] == "trainstack-high"
    assert live["spec"]["minAvailable"] == changed["spec"]["minAvailable"]


def _classes() -> list[Any]:
    """One case per documented class: ok, each fatal code, the deadline, retryable codes."""
    cases = [pytest.param(0, ("Completed",), id="0-ok")]
    for code, action in sorted(EXIT_ACTIONS.items()):
        name = (SIGNAL_EXITS[code] if code in SIGNAL_EXITS else ExitCode(code).name).lower()
        name = name.replace("_", "-")
        cases.append(pytest.param(code, PHASE_AFTER[action], id=f"{code}-{name}-{action}"))
    return cases


@pytest.mark.parametrize(("code", "phase"), _classes())
def test_exit_code_triggers_the_documented_action(
    clean: Deployed, code: int, phase: tuple[str, ...]
) -> None:
    job = _small(clean, f"exit-{code}")
    jobs.exiting(job, code, after="1s")
    jobs.submit(clean, job)
    if phase == ("Restarting",):
        # Restarting lasts only until the pods are gone; the retry count is what stays.
        wait_for(
            f"job exiting {code} to be restarted",
            lambda: jobs.live(clean, job).get("status", {}).get("retryCount", 0) >= 1,
            timeout=60,
        )
    else:
        seen: list[str] = []

        def reached() -> bool:
            current = jobs.phase(clean, job)
            if not seen or seen[-1] != current:
                seen.append(current)
            return current in phase

        try:
            wait_for(f"job exiting {code} to reach {phase}", reached, timeout=60)
        except TimeoutError as error:
            raise AssertionError(f"{error}; phases seen: {seen}") from None
        # Stopped for good: no retry counted, no pod started again.
        time.sleep(2)
        assert jobs.live(clean, job).get("status", {}).get("retryCount", 0) == 0
        assert not jobs.running_pods(clean, job)


@pytest.mark.parametrize(("retries", "preemptions", "code"), [(2, 0, 200), (1, 2, 203)])
def test_volcanos_ceiling_is_max_retries_plus_max_preemptions(
    clean: Deployed, retries: int, preemptions: int, code: int
) -> None:
    """kwok's pods run no runtime, so nothing counts failures here: Volcano alone restarts
    the job 1 + maxRetries + maxPreemptions times, then fails it (issue 15 #7: before
    volcano_max_retry it ran N times; issue 40 #5: before maxPreemptions a job preempted
    maxRetries + 1 times failed). Every pod carries the run's retry count, the same for the
    pods of one run and one more each run: the runtime's count of failed runs
    (TRAINSTACK_JOB_RETRY, trainstack_runtime/crashes.py) rests on it."""
    job = _small(clean, f"ceiling-{retries}-{preemptions}", retries, preemptions, replicas=2)
    jobs.exiting(job, code, after="2s")
    jobs.submit(clean, job)
    runs: dict[str, str] = {}  # pod uid -> its retry-count annotation
    deadline = time.monotonic() + 30 + 15 * (retries + preemptions)
    while time.monotonic() < deadline:
        for pod in jobs.pods(clean, job):
            annotations = pod["metadata"].get("annotations", {})
            runs[pod["metadata"]["uid"]] = annotations.get(RETRY_COUNT_ANNOTATION, "")
        if jobs.phase(clean, job) == "Failed":
            break
        time.sleep(0.2)
    assert jobs.phase(clean, job) == "Failed"
    expected = 1 + retries + preemptions
    by_run = sorted(collections.Counter(runs.values()).items())
    assert by_run == [(str(n), 2) for n in range(expected)], by_run


def test_a_kubelet_eviction_restarts_the_job(clean: Deployed) -> None:
    """Issue 15 (also check): the kubelet evicts a pod for node pressure by failing it
    (phase Failed, reason Evicted), which Volcano reports as PodFailed, not PodEvicted, and
    with no terminated container as exit code 0 (job_controller_handler.go updatePod). Only
    the `PodFailed → RestartJob` policy acts on it; before it the job kept waiting."""
    job = _small(clean, "evicted")
    for task in job["spec"]["tasks"]:
        meta = task["template"].setdefault("metadata", {})
        meta.setdefault("annotations", {})[jobs.EVICT_AFTER] = "1s"
    jobs.submit(clean, job)
    wait_for(
        "the evicted job to be restarted",
        lambda: jobs.live(clean, job).get("status", {}).get("retryCount", 0) >= 1,
        timeout=60,
    )
