"""A pass against a fake API server: the Command it creates, the state it writes, what it does
when the server refuses, and the metrics it serves. The real API server and Volcano are in
tests/e2e/test_deadlines.py."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from trainstack_deadlines import contract
from trainstack_deadlines.controller import (
    StateStore,
    Team,
    command_for,
    read_registry,
    run_once,
    stopping_uids,
)
from trainstack_deadlines.decide import Settings, parse_job, parse_time
from trainstack_deadlines.errors import SetupError
from trainstack_deadlines.kube import ApiError
from trainstack_deadlines.metrics import Metrics, serve

from tests.deadlines.test_decide import volcano_job
from trainstack.builders.monitoring import MAX_DURATION_ANNOTATION

STATE = "/api/v1/namespaces/trainstack-system/configmaps/trainstack-deadlines-state"
JOBS = "/apis/batch.volcano.sh/v1alpha1/namespaces/{}/jobs"
COMMANDS = "/apis/bus.volcano.sh/v1alpha1/namespaces/{}/commands"
STARTED = parse_time("2027-01-15T08:00:00Z")
assert STARTED is not None
STOP_AT = STARTED + 3600 + 600 + 300


class FakeApi:
    """Collections by path; records every write; `refuse` maps (method, path) to an error."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {
            JOBS.format("vision"): jobs,
            JOBS.format("nlp"): [],
            COMMANDS.format("vision"): [],
            COMMANDS.format("nlp"): [],
        }
        self.state: dict[str, Any] = {"metadata": {"resourceVersion": "7"}}
        self.writes: list[tuple[str, str, Any]] = []
        self.refuse: dict[tuple[str, str], ApiError] = {}

    def _check(self, method: str, path: str) -> None:
        if (method, path) in self.refuse:
            raise self.refuse[method, path]

    def list(self, path: str) -> list[dict[str, Any]]:
        self._check("GET", path)
        return copy.deepcopy(self.objects[path])

    def get(self, path: str) -> Any:
        self._check("GET", path)
        assert path == STATE
        return copy.deepcopy(self.state)

    def create(self, path: str, obj: Mapping[str, Any]) -> Any:
        self._check("POST", path)
        self.writes.append(("POST", path, obj))
        self.objects[path].append(dict(obj))
        return obj

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        self._check("PATCH", path)
        assert path == STATE
        self.writes.append(("PATCH", path, patch))
        data = self.state.setdefault("data", {})
        for key, value in patch["data"].items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        version = int(self.state["metadata"]["resourceVersion"]) + 1
        self.state["metadata"]["resourceVersion"] = str(version)
        return self.state


TEAMS = (Team("vision", "vision", 24.0), Team("nlp", "nlp", 72.0))


def one_pass(api: FakeApi, now: float, metrics: Metrics | None = None) -> Any:
    logged: list[tuple[str, dict[str, object]]] = []
    result = run_once(
        api,
        TEAMS,
        StateStore(api, "trainstack-system", "trainstack-deadlines-state"),
        now=now,
        settings=Settings(margin_s=300, reissue_after_s=600),
        metrics=metrics or Metrics(),
        log=lambda event, **fields: logged.append((event, fields)),
        command_labels={"app.kubernetes.io/component": "deadlines"},
    )
    result.logged = logged
    return result


def test_the_annotation_is_the_one_the_job_layer_writes() -> None:
    assert contract.MAX_DURATION_ANNOTATION == MAX_DURATION_ANNOTATION


def test_a_job_past_its_stop_time_gets_one_terminate_command() -> None:
    api = FakeApi([volcano_job()])
    metrics = Metrics()
    result = one_pass(api, STOP_AT + 10, metrics)
    assert result.errors == []
    assert result.created == ["vision/llm"]
    method, path, cmd = api.writes[0]
    assert (method, path) == ("POST", COMMANDS.format("vision"))
    uid = "0b5e3c52-7d0e-4a43-9f0a-4cf1c1f0d001"
    target = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "llm", "uid": uid}
    assert cmd["apiVersion"] == "bus.volcano.sh/v1alpha1"
    assert cmd["kind"] == "Command"
    assert cmd["action"] == "TerminateJob"
    assert cmd["target"] == target
    assert cmd["metadata"]["name"] == f"trainstack-deadline-{uid}"
    assert cmd["metadata"]["ownerReferences"] == [{**target, "controller": True}]
    assert "blockOwnerDeletion" not in cmd["metadata"]["ownerReferences"][0]
    assert cmd["reason"] == "MaxDurationExceeded"
    assert "1h" in cmd["message"]
    # The state is written with the version read, so a concurrent writer fails instead.
    method, path, patch = api.writes[1]
    assert (method, path) == ("PATCH", STATE)
    assert patch["metadata"] == {"resourceVersion": "7"}
    record = json.loads(patch["data"][uid])
    assert record == {
        "namespace": "vision",
        "name": "llm",
        "started": STARTED,
        "commanded": STOP_AT + 10,
    }
    assert (
        metrics.value("trainstack_deadline_terminations_total", namespace="vision", team="vision")
        == 1
    )
    assert (
        metrics.value(
            "trainstack_deadline_job_overdue_seconds",
            namespace="vision",
            team="vision",
            job_name="llm",
        )
        == 10
    )
    assert metrics.value("trainstack_deadline_last_success_timestamp_seconds") == STOP_AT + 10
    # Next pass: the Command is pending (Volcano has not consumed it): nothing new.
    again = one_pass(api, STOP_AT + 70)
    assert again.created == []
    assert [w[0] for w in api.writes[2:]] == []


def test_a_job_within_its_deadline_is_left_alone_and_its_start_recorded() -> None:
    api = FakeApi([volcano_job()])
    result = one_pass(api, STOP_AT - 1)
    assert result.created == []
    assert [w[0] for w in api.writes] == ["PATCH"]
    # Nothing changed since: nothing to write.
    one_pass(api, STOP_AT - 1)
    assert len(api.writes) == 1


def test_a_name_taken_by_our_pending_command_is_not_an_error() -> None:
    api = FakeApi([volcano_job()])
    conflict = ApiError("POST", COMMANDS.format("vision"), 409, "AlreadyExists", "exists")
    api.refuse["POST", COMMANDS.format("vision")] = conflict
    result = one_pass(api, STOP_AT + 10)
    assert result.errors == []
    assert result.created == []
    assert ("pending", {"job": "vision/llm", "uid": parse_job(volcano_job()).uid}) in result.logged


def test_a_refused_command_is_retried_next_pass() -> None:
    api = FakeApi([volcano_job()])
    denied = ApiError("POST", COMMANDS.format("vision"), 403, "Forbidden", "no")
    api.refuse["POST", COMMANDS.format("vision")] = denied
    metrics = Metrics()
    result = one_pass(api, STOP_AT + 10, metrics)
    assert result.created == []
    assert len(result.errors) == 1
    assert metrics.value("trainstack_deadline_errors_total", operation="create_command") == 1
    assert metrics.value("trainstack_deadline_last_success_timestamp_seconds") is None
    del api.refuse["POST", COMMANDS.format("vision")]
    assert one_pass(api, STOP_AT + 70).created == ["vision/llm"]


def test_a_namespace_that_cannot_be_listed_keeps_its_records() -> None:
    api = FakeApi([volcano_job()])
    one_pass(api, STOP_AT - 100)
    uid = parse_job(volcano_job()).uid
    api.refuse["GET", JOBS.format("vision")] = ApiError("GET", "x", 403, "Forbidden", "no")
    result = one_pass(api, STOP_AT + 100)
    assert result.created == []
    assert uid in api.state["data"]
    assert "vision" not in {j.namespace for j, _ in result.decision.overdue}


def test_a_missing_state_configmap_is_reported_with_the_fix() -> None:
    api = FakeApi([volcano_job()])
    api.refuse["GET", STATE] = ApiError("GET", STATE, 404, "NotFound", "gone")
    result = one_pass(api, STOP_AT + 10)
    assert result.created == []
    assert result.errors == [
        "ConfigMap trainstack-system/trainstack-deadlines-state does not exist: the platform "
        "stack creates it (run pulumi up)"
    ]


def test_pending_stops_of_anyone_count() -> None:
    target = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "a", "uid": "1"}
    commands = [
        {"action": "AbortJob", "target": target},  # `vcctl job suspend`
        {"action": "ResumeJob", "target": {**target, "uid": "2"}},
        {"action": "CloseQueue", "target": {"kind": "Queue", "uid": "3"}},
    ]
    assert stopping_uids(commands) == {"1"}


def test_command_names_fit_kubernetes() -> None:
    """DNS subdomain: at most 253 characters; a UID is 36."""
    cmd = command_for(one_pass(FakeApi([volcano_job()]), STOP_AT + 1).decision.stops[0], {})
    assert len(cmd["metadata"]["name"]) == len(contract.COMMAND_PREFIX) + 36 <= 63


def test_registry_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    with pytest.raises(SetupError, match="no team registry; mount the trainstack-platform"):
        read_registry(path)
    path.write_text("{")
    with pytest.raises(SetupError, match="cannot read the team registry"):
        read_registry(path)
    path.write_text('{"groups": []}')
    with pytest.raises(SetupError, match="no 'teams' list"):
        read_registry(path)
    path.write_text('{"teams": [{"name": "a"}]}')
    with pytest.raises(SetupError, match=r"teams\[0\] has no namespace"):
        read_registry(path)
    path.write_text('{"teams": [{"name": "a", "namespace": "a", "maxJobHours": 12}]}')
    assert read_registry(path) == (Team("a", "a", 12),)


def test_metrics_are_served_in_the_text_format() -> None:
    metrics = Metrics()
    metrics.inc("trainstack_deadline_terminations_total", namespace="vision", team="vision")
    metrics.set_gauges(
        {"trainstack_deadline_job_overdue_seconds": {
            (("job_name", 'we"ird'), ("namespace", "vision"), ("team", "vision")): 12.5}}
    )  # fmt: skip
    text = metrics.render()
    for name, (kind, _) in contract.METRICS.items():
        assert f"# TYPE {name} {kind}\n" in text
    assert 'trainstack_deadline_terminations_total{namespace="vision",team="vision"} 1\n' in text
    assert (
        'trainstack_deadline_job_overdue_seconds{job_name="we\\"ird",namespace="vision",'
        'team="vision"} 12.5\n' in text
    )
    assert "trainstack_deadline_passes_total 0\n" in text
    with pytest.raises(KeyError):
        metrics.inc("trainstack_deadline_terminations_total", namespace="vision")
    server = serve(metrics, 0, lambda: False)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert resp.read().decode() == metrics.render()
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz")
    finally:
        server.shutdown()
