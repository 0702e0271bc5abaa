"""`trainstack explain` and `trainstack status` through the command line, against a fake API
server: one clean message for each user error (no kubeconfig, no such job, forbidden), the
answer for a job, the status table, and a team member's degraded read."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner, Result

from tests.explain import objects as o
from trainstack.explain import cli
from trainstack.kube import ApiError, Identity, Kube, Resource

runner = CliRunner()
app = typer.Typer()
cli.register(app)

PLURALS = {"Job": "jobs", "PodGroup": "podgroups", "Pod": "pods", "Event": "events",
           "Queue": "queues", "Node": "nodes"}  # fmt: skip
CLUSTER_SCOPED = {"Queue", "Node"}


class FakeKube(Kube):
    """GETs answered from a dict of path -> object, 403 for paths in `forbidden`: the real
    client's verbs over a stand-in transport and discovery."""

    def __init__(  # no connection pool: `request` below is the transport
        self, objects: Mapping[str, Any], forbidden: tuple[str, ...] = ()
    ) -> None:
        self.objects = objects
        self.forbidden = forbidden

    def resource(self, api_version: str, kind: str) -> Resource:
        return Resource(api_version, kind, PLURALS[kind], kind not in CLUSTER_SCOPED)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        as_: Identity | None = None,
    ) -> Any:
        del body, params, as_
        if any(path.endswith(f) for f in self.forbidden):
            raise ApiError(method, path, 403, {"reason": "Forbidden", "message": "forbidden"})
        if path in self.objects:
            return self.objects[path]
        if path.rsplit("/", 1)[-1] in PLURALS.values():
            return {"items": []}
        raise ApiError(method, path, 404, {"reason": "NotFound", "message": "not found"})


JOBS = "/apis/batch.volcano.sh/v1alpha1/namespaces/vision/jobs"


def run(*args: str, kube: FakeKube | None = None, monkeypatch: pytest.MonkeyPatch) -> Result:
    if kube is not None:
        monkeypatch.setattr(cli, "_kube", lambda *_: kube)
    result = runner.invoke(app, list(args))
    assert isinstance(result.exception, SystemExit | None), result.output
    assert "Traceback" not in result.output, result.output
    return result


def test_no_kubeconfig_is_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope"
    result = run("explain", "train", "--team", "vision", "--kubeconfig", str(missing),
                 monkeypatch=monkeypatch)  # fmt: skip
    assert result.exit_code == 1
    assert result.output.startswith(f"error: {missing}: no kubeconfig there"), result.output


def test_a_job_that_is_not_there(monkeypatch: pytest.MonkeyPatch) -> None:
    result = run("explain", "nope", "--team", "vision", kube=FakeKube({}), monkeypatch=monkeypatch)
    assert result.exit_code == 1
    assert "error: no Volcano Job nope in namespace vision" in result.output
    assert "--file" in result.output


def test_forbidden_to_read_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube({}, forbidden=(f"{JOBS}/train",))
    result = run("explain", "train", "--namespace", "vision", kube=kube, monkeypatch=monkeypatch)
    assert result.exit_code == 1
    assert "error: not allowed to read Volcano Jobs in namespace vision (403 Forbidden)" in (
        result.output
    )


def test_no_team_nor_namespace_is_one_message(monkeypatch: pytest.MonkeyPatch) -> None:
    result = run("explain", "train", kube=FakeKube({}), monkeypatch=monkeypatch)
    assert result.exit_code == 1
    assert "error: name the job's team (--team) or namespace (--namespace)" in result.output


def test_a_team_member_gets_an_answer_and_what_it_could_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = o.podgroup(o.GANG_INSUFFICIENT)
    kube = FakeKube(
        {
            f"{JOBS}/train": o.job(),
            "/apis/scheduling.volcano.sh/v1beta1/namespaces/vision/podgroups": {"items": [group]},
        },
        forbidden=("/queues", "/nodes"),
    )
    result = run("explain", "train", "--team", "vision", kube=kube, monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "vision/train waits: no node can take a gang member (short: nvidia.com/gpu on 8 nodes)"
    )
    assert lines[-1] == (
        "not checked, not readable with these credentials: queues (forbidden), nodes (forbidden)"
    )


def test_status_lists_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    running = o.job("big", phase="Running", replicas=4, retries=2)
    kube = FakeKube({JOBS: {"items": [running, o.job("small", replicas=1, gpus=2)]}})
    result = run("status", "--team", "vision", kube=kube, monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output
    table = result.output.replace("┃", "│")  # rich draws the header with heavy lines
    rows = [line.split("│")[1:-1] for line in table.splitlines() if "│" in line]
    cells = [[c.strip() for c in row] for row in rows]
    assert cells[0] == ["name", "state", "age", "GPUs", "attempts"]
    assert [c[:2] + c[3:] for c in cells[1:]] == [
        ["big", "Running", "32", "3"],
        ["small", "Pending", "2", "1"],
    ]


def test_status_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube({}, forbidden=(JOBS,))
    result = run("status", "--namespace", "vision", kube=kube, monkeypatch=monkeypatch)
    assert result.exit_code == 1
    assert "error: not allowed to list Volcano Jobs in namespace vision" in result.output


class RefusingKube(FakeKube):
    """Admission refuses every create, as the API server words a policy's denial."""

    def create(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Any:
        assert dry_run, "explain only ever asks admission"
        assert obj["metadata"]["name"] == "train"
        raise ApiError(
            "POST",
            JOBS,
            403,
            {
                "reason": "Forbidden",
                "message": 'jobs.batch.volcano.sh "train" is forbidden: ValidatingAdmissionPolicy '
                "'trainstack-rule-max-duration' with binding 'trainstack-rule-max-duration' denied "
                "request: every training job has a maximum duration within its team's. Fix: set "
                "maxDurationHours at most the team's maxJobHours",
            },
        )


def test_a_refused_job_is_explained_from_its_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(o.job()), encoding="utf-8")
    result = run("explain", "train", "--team", "vision", "--file", str(manifest),
                 kube=RefusingKube({}), monkeypatch=monkeypatch)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "vision/train was refused at admission by rule max-duration: every training job has a "
        "maximum duration within its team's",
        "  policy trainstack-rule-max-duration",
        "what to do: set maxDurationHours at most the team's maxJobHours",
    ]


def test_a_manifest_that_is_not_a_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = tmp_path / "spec.yaml"
    manifest.write_text("kind: TrainingJob\n", encoding="utf-8")
    result = run("explain", "train", "--team", "vision", "--file", str(manifest),
                 kube=RefusingKube({}), monkeypatch=monkeypatch)  # fmt: skip
    assert result.exit_code == 1
    assert "not a Volcano Job manifest (`trainstack render-job` prints it)" in result.output


def test_json_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube({f"{JOBS}/train": o.job(phase="Running")})
    result = run(
        "explain", "train", "--team", "vision", "--json", kube=kube, monkeypatch=monkeypatch
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["reason"] == "running"
    assert answer["summary"].startswith("vision/train is running")


def test_an_unreachable_server_is_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = run("status", "--team", "vision", "--kubeconfig", str(path), monkeypatch=monkeypatch)
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot reach the API server:"), result.output


def test_a_team_stack_names_the_namespace_and_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--stack vision`: the team and, from its platform's outputs (prod, offline), the team's
    maximum duration: a stopped job past it is explained without an annotation."""
    job = o.job(
        phase="Terminated",
        annotations={},
        conditions=[{"status": "Running", "lastTransitionTime": "2026-11-01T00:00:00Z"}],
        state_time="2026-11-09T00:00:00Z",
    )
    issued = o.event("CommandIssued", "Start to execute command TerminateJob, and …")
    events = "/api/v1/namespaces/vision/events"
    kube = FakeKube({f"{JOBS}/train": job, events: {"items": [issued]}})
    root = Path(__file__).resolve().parents[2]
    result = run("explain", "train", "--stack", "vision", "--project-dir", str(root), kube=kube,
                 monkeypatch=monkeypatch)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (
        "vision/train was stopped by the platform: it ran 192h, past its maximum duration of 168h"
    )
