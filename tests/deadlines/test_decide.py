"""The enforcer's decision: which jobs to stop and what to remember, as a pure function.

Cases for each phase Volcano can report, then properties (hypothesis) over the arithmetic:
never before `first Running + maximum duration + grace + margin`, always after it while the job
is stoppable, at most one Command per job, and a first start that never moves later.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from trainstack_deadlines.decide import (
    DEFAULT_GRACE_S,
    FINISHED,
    RESTARTING,
    STOPPABLE,
    Decision,
    Job,
    Record,
    Settings,
    decide,
    parse_job,
    parse_time,
)

T0 = 1_800_000_000.0  # a Unix time
HOUR = 3600.0
S = Settings(margin_s=300, reissue_after_s=600)


def volcano_job(
    *,
    phase: str = "Running",
    running_at: str | None = "2027-01-15T08:00:00Z",
    max_duration: str | None = "3600",
    grace: int | None = 600,
) -> dict[str, Any]:
    """A Volcano Job as the API server lists it (status written by Volcano's controller)."""
    template: dict[str, Any] = {"spec": {"containers": [{"name": "trainer"}]}}
    if grace is not None:
        template["spec"]["terminationGracePeriodSeconds"] = grace
    conditions = [{"status": "Pending", "lastTransitionTime": "2027-01-15T07:59:00Z"}]
    if running_at is not None:
        conditions.append({"status": "Running", "lastTransitionTime": running_at})
    annotations = {"trainstack.io/checkpoint-interval-seconds": "600"}
    if max_duration is not None:
        annotations["trainstack.io/max-duration-seconds"] = max_duration
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {
            "name": "llm",
            "namespace": "vision",
            "uid": "0b5e3c52-7d0e-4a43-9f0a-4cf1c1f0d001",
            "labels": {"trainstack.io/team": "vision", "trainstack.io/job": "llm"},
            "annotations": annotations,
        },
        "spec": {
            "queue": "vision",
            "tasks": [
                {"name": "master", "replicas": 1, "template": template},
                {"name": "worker", "replicas": 3, "template": {"spec": {"containers": []}}},
            ],
        },
        "status": {
            "state": {"phase": phase, "lastTransitionTime": "2027-01-15T09:00:00Z"},
            "conditions": conditions,
        },
    }


def job(
    phase: str = "Running",
    running_since: float | None = T0,
    max_duration_s: float | None = HOUR,
    uid: str = "u1",
    namespace: str = "vision",
    grace_s: int = 600,
) -> Job:
    return Job(
        namespace, f"job-{uid}", uid, phase, "vision", running_since, max_duration_s, grace_s
    )


def run(
    jobs: list[Job],
    records: dict[str, Record] | None = None,
    *,
    now: float,
    stopping: frozenset[str] = frozenset(),
    team_max_h: float | None = 24,
    listed: frozenset[str] = frozenset({"vision"}),
) -> Decision:
    return decide(
        jobs,
        records or {},
        stopping=stopping,
        namespaces={"vision", "nlp"},
        listed=listed,
        team_max_s={} if team_max_h is None else {"vision": team_max_h * HOUR},
        now=now,
        settings=S,
    )


STOP_AT = T0 + HOUR + 600 + 300  # first Running + max duration + grace + margin


# -- reading a Volcano Job --------------------------------------------------------------------


def test_parse_reads_the_running_transition_annotation_and_grace() -> None:
    parsed = parse_job(volcano_job())
    assert parsed.key == "vision/llm"
    assert parsed.team == "vision"
    assert parsed.phase == "Running"
    assert parsed.running_since == parse_time("2027-01-15T08:00:00Z")
    assert parsed.max_duration_s == 3600
    assert parsed.grace_s == 600  # the largest of the tasks'; the worker's default is 30


def test_parse_a_job_that_never_ran() -> None:
    parsed = parse_job(volcano_job(phase="Pending", running_at=None))
    assert parsed.running_since is None


def test_parse_falls_back_to_the_state_time_of_a_running_job_without_conditions() -> None:
    obj = volcano_job()
    del obj["status"]["conditions"]
    assert parse_job(obj).running_since == parse_time("2027-01-15T09:00:00Z")


def test_parse_unusable_annotations_and_missing_grace() -> None:
    for raw in ("", "soon", "-5", "0", "nan", "inf"):
        assert parse_job(volcano_job(max_duration=raw)).max_duration_s is None, raw
    assert parse_job(volcano_job(max_duration=None)).max_duration_s is None
    assert parse_job(volcano_job(grace=None)).grace_s == DEFAULT_GRACE_S


def test_parse_survives_an_empty_object() -> None:
    assert parse_job({}) == Job("", "", "", "")


# -- one pass ---------------------------------------------------------------------------------


def test_within_the_deadline_nothing_happens_but_the_start_is_remembered() -> None:
    d = run([job()], now=STOP_AT - 1)
    assert d.stops == ()
    assert d.overdue == ()
    assert d.records == {"u1": Record("vision", "job-u1", T0)}
    assert d.tracked == 1


def test_past_the_stop_time_a_running_job_is_stopped_once() -> None:
    d = run([job()], now=STOP_AT + 5)
    assert [s.job.uid for s in d.stops] == ["u1"]
    stop = d.stops[0]
    assert (stop.started, stop.limit_s, stop.stop_at, stop.overdue_s) == (T0, HOUR, STOP_AT, 5)
    assert d.records["u1"].commanded == STOP_AT + 5
    # The next pass, before Volcano wrote the new phase: no second Command.
    again = run([job()], d.records, now=STOP_AT + 65)
    assert again.stops == ()
    assert again.overdue == ((job(), 65.0),)  # still reported: the alert watches it


def test_a_pending_command_already_stops_the_job() -> None:
    d = run([job()], now=STOP_AT + 5, stopping=frozenset({"u1"}))
    assert d.stops == ()
    assert d.records["u1"].commanded is None


def test_the_deadline_counts_from_the_first_start_across_restarts() -> None:
    """Volcano replaces the Running condition on each restart; the record keeps the first."""
    first = run([job(running_since=T0)], now=T0 + 60)
    restarted = job(running_since=T0 + 2 * HOUR)
    d = run([restarted], first.records, now=STOP_AT + 1)
    assert [s.started for s in d.stops] == [T0]


def test_a_job_pending_again_after_a_restart_is_stopped_too() -> None:
    d = run([job(phase="Pending")], now=STOP_AT + 1)
    assert len(d.stops) == 1


def test_a_restarting_job_is_overdue_but_volcano_would_ignore_a_command() -> None:
    d = run([job(phase="Restarting")], now=STOP_AT + 1)
    assert d.stops == ()
    assert len(d.overdue) == 1


def test_stopping_and_stopped_jobs_are_neither_stopped_nor_overdue() -> None:
    for phase in ("Aborting", "Aborted", "Terminating", "Completing"):
        d = run([job(phase=phase)], now=STOP_AT + 1)
        assert (d.stops, d.overdue) == ((), ()), phase
        assert "u1" in d.records, phase  # Aborted may be resumed


def test_finished_jobs_and_jobs_gone_are_forgotten() -> None:
    records = {"u1": Record("vision", "job-u1", T0), "u2": Record("vision", "job-u2", T0)}
    d = run([job(phase="Completed", uid="u1")], records, now=T0 + 10)
    assert d.records == {}


def test_namespaces_not_read_keep_their_records_and_removed_teams_lose_them() -> None:
    records = {
        "u1": Record("nlp", "job-u1", T0),  # a team whose list failed this pass
        "u2": Record("retired", "job-u2", T0),  # no longer a team
    }
    d = run([], records, now=T0)
    assert set(d.records) == {"u1"}


def test_without_an_annotation_the_team_maximum_applies() -> None:
    d = run([job(max_duration_s=None)], now=T0 + 24 * HOUR + 900 + 1)
    assert [s.limit_s for s in d.stops] == [24 * HOUR]


def test_without_any_limit_a_job_is_counted_and_left_alone() -> None:
    d = run([job(max_duration_s=None)], now=T0 + 1000 * HOUR, team_max_h=None)
    assert d.stops == ()
    assert [j.uid for j in d.unlimited] == ["u1"]


def test_a_job_that_never_ran_is_not_tracked() -> None:
    d = run([job(phase="Pending", running_since=None)], now=T0 + 1000 * HOUR)
    assert (d.stops, d.records, d.tracked) == ((), {}, 0)


def test_records_round_trip_and_foreign_values_are_ignored() -> None:
    for record in (Record("a", "b", T0), Record("a", "b", T0, T0 + 1.5)):
        assert Record.from_json(record.to_json()) == record
    for text in ("", "{}", "[1]", '{"namespace":"a","name":"b","started":"x"}', "null"):
        assert Record.from_json(text) is None, text
    assert Record.from_json('{"namespace":"a","name":"b","started":NaN}') is None


# -- properties -------------------------------------------------------------------------------

PHASES = sorted(
    STOPPABLE | RESTARTING | FINISHED | {"Aborting", "Aborted", "Terminating", "Completing"}
)
times = st.floats(min_value=T0 - 1e7, max_value=T0 + 1e7, allow_nan=False)
durations = st.one_of(st.none(), st.floats(min_value=1, max_value=1e7, allow_nan=False))


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[Job], dict[str, Record], float, frozenset[str]]:
    count = draw(st.integers(0, 6))
    jobs: list[Job] = []
    records: dict[str, Record] = {}
    for i in range(count):
        uid = f"u{i}"
        jobs.append(
            Job(
                namespace=draw(st.sampled_from(["vision", "nlp"])),
                name=f"j{i}",
                uid=uid,
                phase=draw(st.sampled_from(PHASES)),
                running_since=draw(st.one_of(st.none(), times)),
                max_duration_s=draw(durations),
                grace_s=draw(st.integers(0, 7200)),
            )
        )
        if draw(st.booleans()):
            commanded = draw(st.one_of(st.none(), times))
            records[uid] = Record(jobs[-1].namespace, f"j{i}", draw(times), commanded)
    stopping = frozenset(draw(st.lists(st.sampled_from([f"u{i}" for i in range(8)]))))
    return jobs, records, draw(times), stopping


def _decide(
    jobs: list[Job], records: dict[str, Record], now: float, stopping: frozenset[str]
) -> Decision:
    return decide(
        jobs,
        records,
        stopping=stopping,
        namespaces={"vision", "nlp"},
        listed={"vision", "nlp"},
        team_max_s={"vision": 24 * HOUR},
        now=now,
        settings=S,
    )


def _first_start(job: Job, records: dict[str, Record]) -> float | None:
    seen = [t for t in (records.get(job.uid), job.running_since) if t is not None]
    starts = [t.started if isinstance(t, Record) else t for t in seen]
    return min(starts) if starts else None


@settings(max_examples=400, deadline=None)
@given(situations())
def test_never_before_the_stop_time_and_only_stoppable_phases(
    case: tuple[list[Job], dict[str, Record], float, frozenset[str]],
) -> None:
    jobs, records, now, stopping = case
    for stop in _decide(jobs, records, now, stopping).stops:
        started = _first_start(stop.job, records)
        assert started is not None
        assert stop.started == started
        assert now >= started + stop.limit_s + stop.job.grace_s + S.margin_s
        assert stop.job.phase in STOPPABLE
        assert stop.job.uid not in stopping


@settings(max_examples=400, deadline=None)
@given(situations())
def test_always_once_past_the_stop_time(
    case: tuple[list[Job], dict[str, Record], float, frozenset[str]],
) -> None:
    """A stoppable, started job past its stop time, with no pending Command and none recent,
    is stopped."""
    jobs, records, now, stopping = case
    stopped = {s.job.uid for s in _decide(jobs, records, now, stopping).stops}
    for job in jobs:
        started = _first_start(job, records)
        limit = job.max_duration_s or (24 * HOUR if job.namespace == "vision" else None)
        old = records.get(job.uid)
        recent = old is not None and old.commanded is not None and 0 <= now - old.commanded < 600
        due = (
            started is not None
            and limit is not None
            and now >= started + limit + job.grace_s + S.margin_s
            and job.phase in STOPPABLE
            and job.uid not in stopping
            and not recent
        )
        assert (job.uid in stopped) == due, job


@settings(max_examples=400, deadline=None)
@given(situations(), st.floats(min_value=0, max_value=599, allow_nan=False))
def test_no_second_command_while_the_first_is_pending_or_recent(
    case: tuple[list[Job], dict[str, Record], float, frozenset[str]], later: float
) -> None:
    jobs, records, now, stopping = case
    first = _decide(jobs, records, now, stopping)
    commanded = {s.job.uid for s in first.stops}
    # Volcano has not consumed the Commands yet ...
    pending = _decide(jobs, first.records, now + later, stopping | commanded)
    assert not {s.job.uid for s in pending.stops} & commanded
    # ... or it has, and the jobs' new phase is not written yet.
    consumed = _decide(jobs, first.records, now + later, stopping)
    assert not {s.job.uid for s in consumed.stops} & commanded


@settings(max_examples=400, deadline=None)
@given(situations(), times)
def test_the_first_start_never_moves_later(
    case: tuple[list[Job], dict[str, Record], float, frozenset[str]], restart: float
) -> None:
    jobs, records, now, stopping = case
    first = _decide(jobs, records, now, stopping)
    restarted = [replace(j, running_since=restart) for j in jobs]
    second = _decide(restarted, first.records, now, stopping)
    for uid, record in second.records.items():
        if uid in first.records:
            assert record.started <= first.records[uid].started
        assert math.isfinite(record.started)
    for uid in first.records:
        job = next(j for j in jobs if j.uid == uid)
        assert job.phase not in FINISHED
