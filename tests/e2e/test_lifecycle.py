"""A deployed job's life: updates, exit codes and their documented actions, retries.

Exit codes and actions are the runtime contract (images/runtime/trainstack_runtime/contract.py,
docs/runtime.md): retryable classes restart the job, fatal ones abort it, a passed deadline
terminates it; the renderer turns them into Volcano LifecyclePolicies (jobs/render.py,
EXIT_ACTIONS). A kwok stage makes the first container exit with the chosen code.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from trainstack_runtime.contract import ExitCode

from tests.e2e import jobs
from tests.e2e.conftest import Deployed
from tests.e2e.defects import DefectSeen, known
from tests.e2e.kube import ApiError, wait_for
from trainstack.jobs.render import EXIT_ACTIONS

IN_PLACE_UPDATE = (
    "issue 15, defect 4: Volcano's webhook refuses updates of a Job's spec other than "
    "minAvailable, task replicas and priorityClassName (validateJobUpdate), and TrainingJob "
    "patches in place"
)
MAX_RETRY = (
    "issue 15, defect 7: Volcano fails the job once retryCount >= maxRetry "
    "(state/restarting.go), so maxRetries: N gives N-1 retries"
)
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


def _small(platform: Deployed, name: str, max_retries: int = 3) -> dict[str, Any]:
    return jobs.rendered(
        platform,
        jobs.spec("vision", name, pool="h100-reserved", gpus=1, max_retries=max_retries),
    )


@pytest.mark.xfail(strict=True, raises=DefectSeen, reason=IN_PLACE_UPDATE)
def test_changing_a_deployed_jobs_image_goes_through(clean: Deployed) -> None:
    """What `pulumi up` does after a spec change: server-side apply of the new object."""
    job = _small(clean, "update-image")
    clean.kube.apply(job)
    jobs.wait_running(clean, job)
    changed = copy.deepcopy(job)
    for task in changed["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0]["image"] = "registry.example.com/vision/e2e:2.0"
    try:
        clean.kube.apply(changed)
    except ApiError as error:
        known("job updates may not change fields" not in error.message, error.message)
        raise
    live = jobs.live(clean, changed)
    images = {t["template"]["spec"]["containers"][0]["image"] for t in live["spec"]["tasks"]}
    assert images == {"registry.example.com/vision/e2e:2.0"}


def _classes() -> list[Any]:
    """One case per documented class: ok, each fatal code, the deadline, retryable codes."""
    cases = [pytest.param(0, ("Completed",), id="0-ok")]
    for code, action in sorted(EXIT_ACTIONS.items()):
        name = ExitCode(code).name.lower().replace("_", "-")
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


@pytest.mark.xfail(strict=True, raises=DefectSeen, reason=MAX_RETRY)
@pytest.mark.parametrize("retries", [1, 2])
def test_max_retries_n_gives_n_retries(clean: Deployed, retries: int) -> None:
    """A job failing every run with a retryable code runs 1 + N times, then fails."""
    job = _small(clean, f"retries-{retries}", max_retries=retries)
    jobs.exiting(job, int(ExitCode.COMM_ERROR), after="2s")
    jobs.submit(clean, job)
    runs: set[str] = set()
    deadline = time.monotonic() + 30 + 15 * retries
    while time.monotonic() < deadline:
        runs |= {p["metadata"]["uid"] for p in jobs.pods(clean, job)}
        if jobs.phase(clean, job) == "Failed":
            break
        time.sleep(0.2)
    assert jobs.phase(clean, job) == "Failed"
    known(len(runs) != retries, f"{len(runs)} runs for maxRetries: {retries}")
    assert len(runs) == 1 + retries, f"{len(runs)} runs for maxRetries: {retries}"
