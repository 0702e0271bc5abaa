"""Why a Volcano Job is not running, in the platform's terms: pure functions over live objects.

The order of the checks is the order in which the platform stops a job: admission (its pods
never made), a finished job, the deadline, then the scheduler's view: the team's queue and its
parents (allocate skips a task whose queue has no room before it looks at nodes), the health
gate, then the nodes of the job's pool. Each check answers only from what it could read;
`Diagnosis.limits` says what it could not (a team member cannot list nodes or queues).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from trainstack.contracts.deadlines import MAX_DURATION_ANNOTATION
from trainstack.contracts.runtime import ExitCode
from trainstack.explain import volcano
from trainstack.explain.jobinfo import attempt, key, replicas
from trainstack.explain.model import Diagnosis, Live, Obj, Platform, Reason
from trainstack.explain.nodes import health_gate, pool_nodes
from trainstack.explain.queues import queue_room
from trainstack.explain.resources import span, timestamp
from trainstack.policy.admission import POLICY_PREFIX

DEADLINE_EXIT = ExitCode.DEADLINE_EXCEEDED.value
FINISHED = {"Completed", "Completing", "Failed", "Aborted", "Aborting"}
STOPPED = {"Terminating", "Terminated"}


NOWHERE = Platform()  # what is known without the platform's outputs


def diagnose(live: Live, platform: Platform = NOWHERE) -> Diagnosis:
    """The one reason that explains the job's state now."""
    job = live.job
    name = key(job)
    phase = str(job.get("status", {}).get("state", {}).get("phase", "") or "Pending")
    limits = tuple(live.unreadable)
    if phase == "Running":
        running = sum(1 for p in live.pods if p.get("status", {}).get("phase") == "Running")
        return Diagnosis(
            Reason.RUNNING,
            f"{name} is running ({running} of {replicas(job)} pods running, attempt "
            f"{attempt(job)})",
            limits=limits,
        )
    if phase in STOPPED:
        overdue = _past_max_duration(live, platform)
        if overdue is not None:
            return Diagnosis(Reason.MAX_DURATION, overdue[0], overdue[1], overdue[2], limits)
    if phase in FINISHED | STOPPED:
        message = str(job.get("status", {}).get("state", {}).get("message", "") or "")
        return Diagnosis(
            Reason.FINISHED,
            f"{name} is not running: it is {phase}" + (f" ({message})" if message else ""),
            fix="a finished job does not run again: submit it anew (a new name or after "
            "deleting it)",
            limits=limits,
        )
    checks: tuple[Callable[[], Diagnosis | None], ...] = (
        lambda: _admission(live),
        lambda: _starting(live),
        lambda: queue_room(live, platform),
        lambda: health_gate(live, platform),
        lambda: pool_nodes(live, platform),
    )
    for check in checks:  # in order: the first that holds is the answer
        found = check()
        if found is not None:
            return Diagnosis(found.reason, found.summary, found.details, found.fix, limits)
    message = volcano.unschedulable_message(live.podgroup, live.events)
    return Diagnosis(
        Reason.WAITING,
        f"{name} is {phase}: waiting for the scheduler",
        (f"scheduler: {message}",) if message else (),
        "wait a scheduling cycle; if it stays, run `trainstack explain` again as someone who "
        "may read nodes and queues",
        limits,
    )


# -- the job itself ----------------------------------------------------------------------


def _admission(live: Live) -> Diagnosis | None:
    """Volcano's controller could not create the job's pods and an admission policy said why."""
    for message in reversed(volcano.failed_creates(live.events)):
        refused = volcano.denials(message)
        if refused:
            return refusal(key(live.job), refused[0], pods=True)
    return None


def refusal(what: str, denial: volcano.Denial, *, pods: bool = False) -> Diagnosis:
    """A refusal by one of the platform's admission policies: its rule, the text and the fix
    (a rule's message is `<description>. Fix: <remediation>`, policy/admission.py)."""
    rule = denial.policy.removeprefix(POLICY_PREFIX)
    text, _, fix = denial.message.partition(". Fix: ")
    subject = f"the pods of {what} were" if pods else f"{what} was"
    return Diagnosis(
        Reason.ADMISSION_REFUSED,
        f"{subject} refused at admission by rule {rule}: {text.rstrip('.')}",
        (f"policy {denial.policy}",),
        fix or "change the job so the rule admits it (docs/policies.md lists the rules)",
    )


def _starting(live: Live) -> Diagnosis | None:
    pods = [p for p in live.pods if not p.get("metadata", {}).get("deletionTimestamp")]
    if pods and len(pods) >= replicas(live.job) and all(p["spec"].get("nodeName") for p in pods):
        return Diagnosis(
            Reason.STARTING,
            f"{key(live.job)} has a node for every pod; its containers are starting",
            fix="wait; `kubectl describe pod` shows image pulls and init containers",
        )
    return None


def _max_duration_s(job: Obj, platform: Platform) -> float | None:
    raw = job.get("metadata", {}).get("annotations", {}).get(MAX_DURATION_ANNOTATION)
    try:
        value = float(raw) if raw is not None else 0.0
    except ValueError:
        value = 0.0
    if value > 0:
        return value
    return platform.max_job_hours * 3600 if platform.max_job_hours else None


def _past_max_duration(live: Live, platform: Platform) -> tuple[str, tuple[str, ...], str] | None:
    """Stopped because it reached its maximum duration: by the runtime (exit 4, DEADLINE_
    EXCEEDED, contracts/runtime.py) or by the platform's enforcer (a TerminateJob Command,
    docs/deadlines.md), which Volcano deletes once acted on, leaving a `CommandIssued` event."""
    job = live.job
    limit = _max_duration_s(job, platform)
    name = key(job)
    runtime = any(
        (s.get("state", {}).get("terminated") or {}).get("exitCode") == DEADLINE_EXIT
        for p in live.pods
        for s in p.get("status", {}).get("containerStatuses") or []
    )
    started = [
        stamp
        for c in job.get("status", {}).get("conditions") or []
        if c.get("status") == "Running"
        and (stamp := timestamp(c.get("lastTransitionTime"))) is not None
    ]
    stopped = timestamp(job.get("status", {}).get("state", {}).get("lastTransitionTime"))
    hours = span(limit) if limit else "its maximum duration"
    fix = (
        "resume from its last checkpoint with a new job; if it needs longer, raise "
        "maxDurationHours in its spec, up to the team's maxJobHours (docs/deadlines.md)"
    )
    if runtime:
        return (
            f"{name} was stopped at its maximum duration of {hours}: its runtime checkpointed "
            "and exited (DEADLINE_EXCEEDED)",
            (),
            fix,
        )
    issued = any(
        e.get("reason") == "CommandIssued" and "TerminateJob" in str(e.get("message", ""))
        for e in live.events
    )
    if issued and limit and started and stopped is not None and stopped - min(started) >= limit:
        ran = span(stopped - min(started))
        return (
            f"{name} was stopped by the platform: it ran {ran}, past its maximum "
            f"duration of {hours}",
            (f"counted from its first Running; {MAX_DURATION_ANNOTATION} or the team's "
             "maxJobHours",),
            fix,
        )  # fmt: skip
    return None


def events_about(events: Iterable[Obj], names: set[str]) -> tuple[Obj, ...]:
    """The events whose object is one of `names` (the job, its PodGroup, its pods)."""
    return tuple(e for e in events if e.get("involvedObject", {}).get("name") in names)
