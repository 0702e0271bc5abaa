"""Which jobs to stop, and what to remember: a pure function of what the API server reported.

**What the deadline counts from.** The training runtime counts a job's maximum duration from
the job's first start, across restarts: the first supervisor writes its start time into the
checkpoint directory and every later incarnation reads it
(images/runtime/trainstack_runtime/deadline.py `job_start`). No field of a Volcano Job keeps
that time: on every phase change Volcano's job controller sets `status.state.lastTransitionTime`
and `appendJobCondition` *replaces* the condition of the same phase (volcano v1.15.1
pkg/controllers/job/job_controller_actions.go), so the `Running` condition's
`lastTransitionTime` is the latest start, not the first; and `status.runningDuration` is
`state.lastTransitionTime - creationTimestamp` (`killPods`), queue time included. So the
enforcer remembers, per Job UID, the earliest `Running` transition it has seen (`Record`) and
counts from that. Volcano turns a job Running once `minAvailable` of its pods run
(state/pending.go), i.e. just after the runtime's first start, init containers (the dataset
pre-warm) included in both.

**When it stops a job.** At `started + maximum duration + the pods' termination grace period +
margin`: by then the runtime has had its whole checkpoint window to stop the job itself (at its
deadline it checkpoints and exits DEADLINE_EXCEEDED, which the job's policy maps to
TerminateJob). The platform is the backstop for jobs whose entrypoint is not the runtime.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from trainstack_deadlines.contract import MAX_DURATION_ANNOTATION, TEAM_LABEL

# Volcano acts on TerminateJob in these phases (pkg/controllers/job/state/pending.go and
# running.go: KillJob, phase Terminating).
STOPPABLE = frozenset({"Pending", "Running"})
# restartingState.Execute ignores the action (state/restarting.go): the Command would be
# consumed for nothing, so wait until the job is Pending again.
RESTARTING = frozenset({"Restarting"})
# finishedState kills what is left and never runs the job again (state/factory.go NewState):
# nothing to remember. Aborted is not here: a ResumeJob Command restarts it (state/aborted.go).
FINISHED = frozenset({"Completed", "Failed", "Terminated"})
# Kubernetes' default when a pod template sets none (k8s.io/api core/v1
# DefaultTerminationGracePeriodSeconds, applied by pkg/apis/core/v1/defaults.go).
DEFAULT_GRACE_S = 30


def parse_time(text: object) -> float | None:
    """An RFC 3339 timestamp as the API server writes it, as Unix seconds (None if absent)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _seconds(raw: object) -> float | None:
    """A positive, finite number of seconds, or None."""
    if isinstance(raw, bool):
        return None
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


@dataclass(frozen=True)
class Job:
    """What the enforcer reads from a Volcano Job."""

    namespace: str
    name: str
    uid: str
    phase: str
    team: str = ""
    running_since: float | None = None  # the Running condition's lastTransitionTime
    max_duration_s: float | None = None  # the annotation, if a positive number
    grace_s: int = DEFAULT_GRACE_S  # the largest terminationGracePeriodSeconds of its tasks

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_job(obj: Mapping[str, Any]) -> Job:
    """A Volcano Job (as listed) → `Job`. Missing fields read as absent, never raise."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    state = status.get("state") or {}
    phase = str(state.get("phase") or "")
    running = [
        parse_time(c.get("lastTransitionTime"))
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("status") == "Running"
    ]
    since = min((t for t in running if t is not None), default=None)
    if since is None and phase == "Running":
        since = parse_time(state.get("lastTransitionTime"))
    graces = [
        (task.get("template") or {}).get("spec", {}).get("terminationGracePeriodSeconds")
        for task in (obj.get("spec") or {}).get("tasks") or []
        if isinstance(task, Mapping)
    ]
    grace = max(
        (int(g) for g in graces if isinstance(g, int) and not isinstance(g, bool) and g >= 0),
        default=DEFAULT_GRACE_S,
    )
    return Job(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        phase=phase,
        team=str((meta.get("labels") or {}).get(TEAM_LABEL, "")),
        running_since=since,
        max_duration_s=_seconds((meta.get("annotations") or {}).get(MAX_DURATION_ANNOTATION)),
        grace_s=grace,
    )


@dataclass(frozen=True)
class Record:
    """What the enforcer remembers of a job that has run (its state ConfigMap, by UID)."""

    namespace: str
    name: str
    started: float  # the earliest Running transition seen
    commanded: float | None = None  # when it last created a TerminateJob Command for it

    def to_json(self) -> str:
        data: dict[str, Any] = {"namespace": self.namespace, "name": self.name}
        data["started"] = self.started
        if self.commanded is not None:
            data["commanded"] = self.commanded
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Record | None:
        """None for anything that is not a record this program wrote."""
        try:
            data = json.loads(text)
            started = float(data["started"])
            commanded = data.get("commanded")
            record = cls(
                namespace=str(data["namespace"]),
                name=str(data["name"]),
                started=started,
                commanded=None if commanded is None else float(commanded),
            )
        except (ValueError, TypeError, KeyError):
            return None
        if not math.isfinite(record.started):
            return None
        return record


@dataclass(frozen=True)
class Settings:
    margin_s: float = 300.0  # after deadline + grace, before the platform acts
    reissue_after_s: float = 600.0  # no second Command for a job within this time


@dataclass(frozen=True)
class Stop:
    """Create a TerminateJob Command for this job."""

    job: Job
    started: float
    limit_s: float
    stop_at: float
    overdue_s: float


@dataclass(frozen=True)
class Decision:
    stops: tuple[Stop, ...]
    records: dict[str, Record]  # the state after this pass, by UID
    overdue: tuple[tuple[Job, float], ...]  # started, unfinished jobs past their stop time
    tracked: int  # started jobs that may still run
    unlimited: tuple[Job, ...]  # started, unfinished, and no usable maximum duration


def limit_for(job: Job, team_max_s: Mapping[str, float]) -> float | None:
    """The job's annotation; without one (or an unusable one), its team's maximum."""
    if job.max_duration_s is not None:
        return job.max_duration_s
    return team_max_s.get(job.namespace)


def stop_time(started: float, limit_s: float, job: Job, settings: Settings) -> float:
    return started + limit_s + job.grace_s + settings.margin_s


def decide(
    jobs: Sequence[Job],
    records: Mapping[str, Record],
    *,
    stopping: Set[str],
    namespaces: Set[str],
    listed: Set[str],
    team_max_s: Mapping[str, float],
    now: float,
    settings: Settings,
) -> Decision:
    """One pass.

    `jobs`: the Volcano Jobs of the namespaces in `listed`, the team namespaces (of
    `namespaces`) whose list succeeded; `records`: the state from the last pass; `stopping`:
    UIDs of jobs a pending Command already stops (not yet consumed by Volcano); `team_max_s`:
    namespace → the team's maximum job duration in seconds.

    Records of team namespaces not read this pass are kept as they were; records of jobs that
    are gone, finished, or in namespaces that are no longer a team's are dropped.
    """
    new: dict[str, Record] = {
        uid: r for uid, r in records.items() if r.namespace in namespaces - listed
    }
    stops: list[Stop] = []
    overdue: list[tuple[Job, float]] = []
    unlimited: list[Job] = []
    tracked = 0
    for job in jobs:
        old = records.get(job.uid)
        seen = [t for t in (old.started if old else None, job.running_since) if t is not None]
        if not seen or job.phase in FINISHED:
            continue  # never ran, or never runs again: nothing to remember
        record = Record(job.namespace, job.name, min(seen), old.commanded if old else None)
        tracked += 1
        limit = limit_for(job, team_max_s)
        if limit is None:
            unlimited.append(job)
            new[job.uid] = record
            continue
        at = stop_time(record.started, limit, job, settings)
        late = now - at
        if late >= 0 and job.phase in STOPPABLE | RESTARTING:
            overdue.append((job, late))
            recent = record.commanded is not None and (
                0 <= now - record.commanded < settings.reissue_after_s
            )
            if job.phase in STOPPABLE and job.uid not in stopping and not recent:
                stops.append(Stop(job, record.started, limit, at, late))
                record = replace(record, commanded=now)
        new[job.uid] = record
    return Decision(
        stops=tuple(stops),
        records=new,
        overdue=tuple(overdue),
        tracked=tracked,
        unlimited=tuple(unlimited),
    )
