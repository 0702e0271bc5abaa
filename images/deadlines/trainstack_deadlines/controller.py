"""One pass of the enforcer against the API server: read, decide (`decide.decide`), act, record.

Volcano's own mechanism stops the job: a `bus.volcano.sh/v1alpha1` Command, the object
`vcctl job suspend` creates (volcano v1.15.1 pkg/cli/util/util.go `CreateJobCommand`, with
AbortJob), here with action TerminateJob. The job controller deletes the Command first, so it
acts on it at most once, then runs the action (pkg/controllers/job/job_controller_handler.go
`processNextCommand`); from Pending or Running, TerminateJob kills the job's pods and moves it
to Terminating, then Terminated once none is alive (state/running.go, pending.go,
terminating.go). Pods are deleted with plain DeleteOptions (job_controller_actions.go
`deleteJobPod`), so each gets its own terminationGracePeriodSeconds (k8s v1.37.2
pkg/registry/core/pod/strategy.go `CheckGracefulDelete`): SIGTERM first, and the runtime
checkpoints before it exits. Succeeded and Failed pods are kept (PodRetainPhaseSoft).

No duplicate Commands: a Command's name is the job's UID (`contract.COMMAND_PREFIX`), so while
one is pending a second create is refused (AlreadyExists); a job whose pending Command already
stops it is skipped; and after a Command the job is not commanded again for
`Settings.reissue_after_s` (the moment between Volcano deleting the Command and writing the
job's new phase).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from trainstack_deadlines.contract import (
    ACTION,
    COMMAND_API_VERSION,
    COMMAND_PREFIX,
    JOB_API_VERSION,
    MAX_DURATION_ANNOTATION,
    REASON,
    STOPPING_ACTIONS,
)
from trainstack_deadlines.decide import Decision, Job, Record, Settings, Stop, decide, parse_job
from trainstack_deadlines.errors import SetupError
from trainstack_deadlines.kube import ApiError
from trainstack_deadlines.metrics import Labels, Metrics

Log = Callable[..., None]


class Api(Protocol):
    """What a pass needs of the API server (`kube.Kube`; tests may pass a fake)."""

    def list(self, path: str) -> list[dict[str, Any]]: ...
    def get(self, path: str) -> Any: ...
    def create(self, path: str, obj: Mapping[str, Any]) -> Any: ...
    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Any: ...


@dataclass(frozen=True)
class Team:
    name: str
    namespace: str
    max_job_hours: float | None


def read_registry(path: Path) -> tuple[Team, ...]:
    """The team registry the platform publishes (ConfigMap trainstack-platform, registry.json)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SetupError(
            f"{path}: no team registry; mount the trainstack-platform ConfigMap's registry.json "
            "there or pass --registry"
        ) from None
    except (OSError, ValueError) as err:
        raise SetupError(f"{path}: cannot read the team registry: {err}") from None
    teams = doc.get("teams") if isinstance(doc, dict) else None
    if not isinstance(teams, list):
        raise SetupError(f"{path}: no 'teams' list; is this the platform's registry.json?")
    result = []
    for i, t in enumerate(teams):
        if not isinstance(t, dict) or not isinstance(t.get("namespace"), str):
            raise SetupError(f"{path}: teams[{i}] has no namespace")
        hours = t.get("maxJobHours")
        ok = isinstance(hours, int | float) and not isinstance(hours, bool) and hours > 0
        result.append(
            Team(str(t.get("name", t["namespace"])), t["namespace"], hours if ok else None)
        )
    return tuple(result)


def jobs_path(namespace: str) -> str:
    return f"/apis/{JOB_API_VERSION}/namespaces/{namespace}/jobs"


def commands_path(namespace: str) -> str:
    return f"/apis/{COMMAND_API_VERSION}/namespaces/{namespace}/commands"


class StateStore:
    """The records, one key per Job UID in a ConfigMap the platform creates (empty) and only
    this program writes. Writes are JSON merge patches carrying the resourceVersion read, so a
    concurrent writer makes the patch fail (409) instead of losing records."""

    def __init__(self, kube: Api, namespace: str, name: str) -> None:
        self.kube = kube
        self.path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
        self.where = f"ConfigMap {namespace}/{name}"

    def load(self) -> tuple[dict[str, Record], str]:
        try:
            obj = self.kube.get(self.path)
        except ApiError as err:
            if err.status == 404:
                raise SetupError(
                    f"{self.where} does not exist: the platform stack creates it (run pulumi up)"
                ) from None
            raise
        records = {}
        for uid, text in (obj.get("data") or {}).items():
            record = Record.from_json(text)
            if record is not None:
                records[uid] = record
        return records, str(obj["metadata"].get("resourceVersion", ""))

    def save(self, old: Mapping[str, Record], new: Mapping[str, Record], version: str) -> None:
        data: dict[str, str | None] = {uid: None for uid in old if uid not in new}
        data |= {uid: r.to_json() for uid, r in new.items() if old.get(uid) != r}
        if data:
            patch = {"metadata": {"resourceVersion": version}, "data": data}
            self.kube.merge_patch(self.path, patch)


def stopping_uids(commands: list[dict[str, Any]]) -> set[str]:
    """Jobs that a pending Command (anyone's) already aborts, terminates or completes."""
    uids = set()
    for cmd in commands:
        target = cmd.get("target") or {}
        if (
            cmd.get("action") in STOPPING_ACTIONS
            and target.get("apiVersion") == JOB_API_VERSION
            and target.get("kind") == "Job"
        ):
            uids.add(str(target.get("uid", "")))
    return uids


def command_for(stop: Stop, labels: Mapping[str, str]) -> dict[str, Any]:
    """The TerminateJob Command for a job: `CreateJobCommand`'s object, named by the job's UID,
    owned by the job (the garbage collector removes it with the job if Volcano never did)."""
    job = stop.job
    ref = {"apiVersion": JOB_API_VERSION, "kind": "Job", "name": job.name, "uid": job.uid}
    hours = stop.limit_s / 3600
    return {
        "apiVersion": COMMAND_API_VERSION,
        "kind": "Command",
        "metadata": {
            "name": COMMAND_PREFIX + job.uid,
            "namespace": job.namespace,
            "labels": dict(labels),
            "ownerReferences": [{**ref, "controller": True}],
        },
        "target": ref,
        "action": ACTION,
        "reason": REASON,
        "message": (
            f"{job.key} ran past its maximum duration of {hours:g}h "
            f"({MAX_DURATION_ANNOTATION} or its team's maximum), counted from its first "
            f"Running at {stop.started:.0f} (Unix time); stopped by the platform "
            f"{stop.overdue_s:.0f}s after its deadline, termination grace and margin"
        ),
    }


@dataclass
class PassResult:
    decision: Decision | None = None
    created: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class _Read:
    jobs: list[Job] = field(default_factory=list)
    stopping: set[str] = field(default_factory=set)
    listed: set[str] = field(default_factory=set)


class _Pass:
    def __init__(self, kube: Api, metrics: Metrics, log: Log) -> None:
        self.kube, self.metrics, self.log = kube, metrics, log
        self.result = PassResult()

    def failed(self, operation: str, err: ApiError | SetupError, **where: object) -> None:
        self.metrics.inc("trainstack_deadline_errors_total", operation=operation)
        if isinstance(err, SetupError):
            self.log("setup_error", operation=operation, message=err.message)
        else:
            self.log("api_error", operation=operation, status=err.status, reason=err.reason,
                     message=err.message, **where)  # fmt: skip
        self.result.errors.append(str(err))

    def read(self, teams: tuple[Team, ...]) -> _Read:
        seen = _Read()
        for team in teams:
            try:
                items = self.kube.list(jobs_path(team.namespace))
                commands = self.kube.list(commands_path(team.namespace))
            except ApiError as err:
                self.failed("list", err, namespace=team.namespace)
                continue
            seen.listed.add(team.namespace)
            seen.jobs += [parse_job(item) for item in items]
            seen.stopping |= stopping_uids(commands)
        return seen

    def command(self, stop: Stop, labels: Mapping[str, str], team: str) -> bool:
        """Create the job's Command; False if it was not created and is not pending."""
        job = stop.job
        try:
            self.kube.create(commands_path(job.namespace), command_for(stop, labels))
        except ApiError as err:
            if err.status == 409:  # ours, by name: still pending, Volcano has not consumed it
                self.log("pending", job=job.key, uid=job.uid)
                return True
            self.failed("create_command", err, job=job.key)
            return False
        self.result.created.append(job.key)
        self.metrics.inc(
            "trainstack_deadline_terminations_total", namespace=job.namespace, team=team
        )
        self.log("terminate", job=job.key, uid=job.uid, started=stop.started,
                 limit_s=stop.limit_s, stop_at=stop.stop_at,
                 overdue_s=round(stop.overdue_s, 1))  # fmt: skip
        return True


def run_once(
    kube: Api,
    teams: tuple[Team, ...],
    store: StateStore,
    *,
    now: float,
    settings: Settings,
    metrics: Metrics,
    log: Log,
    command_labels: Mapping[str, str] | None = None,
) -> PassResult:
    """One pass over the team namespaces. Errors are logged and counted, never raised: the
    next pass tries again, and `last_success` tells monitoring that passes fail."""
    run = _Pass(kube, metrics, log)
    metrics.inc("trainstack_deadline_passes_total")
    for team in teams:  # a series from 0, so the first Command is an increase() too
        metrics.inc(
            "trainstack_deadline_terminations_total", 0, namespace=team.namespace, team=team.name
        )
    seen = run.read(teams)
    try:
        records, version = store.load()
    except (ApiError, SetupError) as err:  # SetupError: the ConfigMap is gone
        run.failed("load_state", err)
        return run.result
    decision = decide(
        seen.jobs,
        records,
        stopping=seen.stopping,
        namespaces={t.namespace for t in teams},
        listed=seen.listed,
        team_max_s={t.namespace: t.max_job_hours * 3600 for t in teams if t.max_job_hours},
        now=now,
        settings=settings,
    )
    run.result.decision = decision
    new = dict(decision.records)
    team_of = {t.namespace: t.name for t in teams}
    for stop in decision.stops:
        job = stop.job
        if not run.command(stop, command_labels or {}, team_of.get(job.namespace, job.team)):
            old = records.get(job.uid)  # not commanded after all
            new[job.uid] = replace(new[job.uid], commanded=old.commanded if old else None)
    try:
        store.save(records, new, version)
    except ApiError as err:
        run.failed("save_state", err)
    overdue: dict[Labels, float] = {
        (("job_name", job.name), ("namespace", job.namespace),
         ("team", team_of.get(job.namespace, job.team))): late
        for job, late in decision.overdue
    }  # fmt: skip
    gauges: dict[str, dict[Labels, float]] = {
        "trainstack_deadline_job_overdue_seconds": overdue,
        "trainstack_deadline_jobs_tracked": {(): float(decision.tracked)},
        "trainstack_deadline_jobs_unlimited": {(): float(len(decision.unlimited))},
    }
    if not run.result.errors:
        gauges["trainstack_deadline_last_success_timestamp_seconds"] = {(): now}
    metrics.set_gauges(gauges)
    return run.result
