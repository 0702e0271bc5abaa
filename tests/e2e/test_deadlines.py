"""Maximum duration, enforced by the platform (issue 19 #7).

One pass of the enforcer's own loop (`trainstack_deadlines.controller.run_once`), in process,
against the real API server, as the ServiceAccount the platform's Deployment runs as (a token
from the TokenRequest API, so every call goes through the RBAC the platform grants), with the
team registry the platform publishes. Its clock is set past one job's stop time (first Running
+ maximum duration + termination grace + margin) and within the other's; Volcano's job
controller then does the rest. Without the enforcer, nothing stops a job whose entrypoint is
not the trainstack runtime: here no container runs at all (kwok).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trainstack_deadlines import contract
from trainstack_deadlines.cli import main
from trainstack_deadlines.controller import (
    PassResult,
    StateStore,
    Team,
    commands_path,
    jobs_path,
    read_registry,
    run_once,
)
from trainstack_deadlines.decide import Settings, parse_job
from trainstack_deadlines.kube import Access
from trainstack_deadlines.kube import ApiError as EnforcerApiError
from trainstack_deadlines.kube import Kube as EnforcerKube
from trainstack_deadlines.metrics import Metrics

from tests.e2e import jobs
from tests.e2e.conftest import Deployed
from trainstack.builders.deadlines import args
from trainstack.kube import wait_for

LINGER = "e2e.trainstack.io/linger"  # kwok-stages.yaml: the pod stays Terminating
COMMAND = ("bus.volcano.sh/v1alpha1", "Command")
STATE = ("v1", "ConfigMap", contract.STATE_CONFIGMAP, contract.SYSTEM_NAMESPACE)


@pytest.fixture(scope="module")
def enforcer(prod: Deployed, tmp_path_factory: pytest.TempPathFactory) -> EnforcerKube:
    """The enforcer's client, authenticated as its ServiceAccount."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    answer = prod.kube.request(
        "POST",
        f"/api/v1/namespaces/{contract.SYSTEM_NAMESPACE}/serviceaccounts/"
        f"{contract.SERVICE_ACCOUNT}/token",
        request,
    )
    token = tmp_path_factory.mktemp("enforcer") / "token"
    token.write_text(answer["status"]["token"])
    return EnforcerKube(Access(prod.plane.server, Path(prod.plane.ca.cert), token))


@pytest.fixture(scope="module")
def registry(prod: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The registry as the Deployment sees it: the platform's ConfigMap, key registry.json."""
    cm = prod.kube.get("v1", "ConfigMap", "trainstack-platform", contract.SYSTEM_NAMESPACE)
    path = tmp_path_factory.mktemp("registry") / "registry.json"
    path.write_text(cm["data"]["registry.json"])
    return path


@pytest.fixture(scope="module")
def teams(registry: Path) -> tuple[Team, ...]:
    return read_registry(registry)


@pytest.fixture
def clean(prod: Deployed) -> Iterator[Deployed]:
    yield prod
    for pod in prod.kube.list("v1", "Pod", "vision"):  # lingering pods: as a kubelet would
        prod.kube.delete("v1", "Pod", pod["metadata"]["name"], "vision", grace=0)
    for job in prod.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(prod, job)


def _job(platform: Deployed, name: str, hours: float) -> dict[str, Any]:
    doc = jobs.spec("vision", name, pool="h100-reserved", gpus=1)
    doc["spec"]["maxDurationHours"] = hours
    job = jobs.rendered(platform, doc)
    for task in job["spec"]["tasks"]:
        meta = task["template"].setdefault("metadata", {})
        meta.setdefault("annotations", {})[LINGER] = "true"
    return job


def _pass(kube: EnforcerKube, teams: tuple[Team, ...], now: float, metrics: Metrics) -> PassResult:
    return run_once(
        kube,
        teams,
        StateStore(kube, contract.SYSTEM_NAMESPACE, contract.STATE_CONFIGMAP),
        now=now,
        settings=Settings(margin_s=300, reissue_after_s=600),
        metrics=metrics,
        log=lambda event, **fields: print(event, fields),
    )


def test_a_job_past_its_deadline_is_terminated_and_one_within_is_not(
    clean: Deployed, enforcer: EnforcerKube, teams: tuple[Team, ...]
) -> None:
    over, within = _job(clean, "deadline-over", 1), _job(clean, "deadline-within", 24)
    for job in (over, within):
        jobs.submit(clean, job)
    for job in (over, within):
        jobs.wait_running(clean, job)
    wait_for(
        "both jobs Running", lambda: all(jobs.phase(clean, j) == "Running" for j in (over, within))
    )
    live_over = parse_job(jobs.live(clean, over))
    assert live_over.running_since is not None
    grace = over["spec"]["tasks"][0]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert live_over.grace_s == grace
    # One minute past the short job's stop time; the long job has 23 hours left.
    now = live_over.running_since + 3600 + grace + 300 + 60
    metrics = Metrics()

    result = _pass(enforcer, teams, now, metrics)
    assert result.errors == []
    assert result.created == ["vision/deadline-over"]

    # Volcano consumes the Command (deletes it, then acts: processNextCommand) ...
    command = contract.COMMAND_PREFIX + live_over.uid
    wait_for(
        "Volcano to consume the Command",
        lambda: clean.kube.get_or_none(*COMMAND, command, "vision") is None,
        timeout=30,
    )
    # ... terminates the job (state/running.go TerminateJob -> Terminating) ...
    wait_for("the job to be Terminating", lambda: jobs.phase(clean, over) == "Terminating")
    # ... and deletes its pods with their own grace period, so the runtime can checkpoint.
    pods = jobs.pods(clean, over)
    assert pods
    for pod in pods:
        assert pod["metadata"].get("deletionTimestamp"), pod["metadata"]["name"]
        assert pod["metadata"]["deletionGracePeriodSeconds"] == grace

    # The job within its deadline is untouched.
    assert jobs.phase(clean, within) == "Running"
    assert len(jobs.running_pods(clean, within)) == jobs.replicas(within)
    assert not clean.kube.list(*COMMAND, "vision")

    # Both first starts are remembered, by UID; the stopped one with its Command's time.
    data = clean.kube.get(*STATE)["data"]
    live_within = parse_job(jobs.live(clean, within))
    assert json.loads(data[live_over.uid])["started"] == live_over.running_since
    assert json.loads(data[live_over.uid])["commanded"] == now
    assert json.loads(data[live_within.uid])["started"] == live_within.running_since
    assert (
        metrics.value("trainstack_deadline_terminations_total", namespace="vision", team="vision")
        == 1
    )

    # The next pass (even much later) creates nothing: the job is stopping.
    again = _pass(enforcer, teams, now + 3600, metrics)
    assert again.errors == []
    assert again.created == []
    assert not clean.kube.list(*COMMAND, "vision")

    # Once its pods are gone (the kubelet, after the grace period), it is Terminated.
    for pod in pods:
        clean.kube.delete("v1", "Pod", pod["metadata"]["name"], "vision", grace=0)
    wait_for("the job to be Terminated", lambda: jobs.phase(clean, over) == "Terminated")
    assert jobs.phase(clean, within) == "Running"


def test_the_program_makes_a_pass_as_deployed(
    prod: Deployed, enforcer: EnforcerKube, registry: Path
) -> None:
    """`trainstack-deadlines --once` with the Deployment's arguments (but the port), outside
    the pod: credentials and registry from files, one clean pass."""
    argv = [*args(prod.cfg), "--once", "--port", "0", "--registry", str(registry),
            "--server", enforcer.access.server, "--token-file", str(enforcer.access.token_file),
            "--ca-file", str(enforcer.access.ca_file)]  # fmt: skip
    assert main(argv) == 0


def test_the_enforcer_may_do_nothing_else(prod: Deployed, enforcer: EnforcerKube) -> None:
    """Its RBAC, as the API server enforces it: read jobs and create Commands in team
    namespaces, read and patch its own ConfigMap; nothing else."""

    def status(method: str, path: str, body: Any = None) -> int:
        try:
            enforcer.request(method, path, body)
        except EnforcerApiError as error:
            return error.status
        return 200

    dry = "?dryRun=All"
    assert status("GET", jobs_path("vision")) == 200
    assert status("GET", commands_path("nlp")) == 200
    assert status("GET", f"/api/v1/namespaces/{contract.SYSTEM_NAMESPACE}/configmaps/"
                  f"{contract.STATE_CONFIGMAP}") == 200  # fmt: skip
    forbidden = [
        ("GET", jobs_path(contract.SYSTEM_NAMESPACE)),  # not a team namespace
        ("GET", jobs_path("default")),
        (
            "POST",
            commands_path("default") + dry,
            {
                "apiVersion": "bus.volcano.sh/v1alpha1",
                "kind": "Command",
                "metadata": {"name": "x"},
                "action": "AbortJob",
            },
        ),
        ("DELETE", jobs_path("vision") + "/any"),
        ("PATCH", jobs_path("vision") + "/any"),
        ("GET", "/api/v1/namespaces/vision/pods"),
        ("GET", "/api/v1/namespaces/vision/secrets"),
        ("GET", f"/api/v1/namespaces/{contract.SYSTEM_NAMESPACE}/configmaps/trainstack-platform"),
        ("GET", f"/api/v1/namespaces/{contract.SYSTEM_NAMESPACE}/configmaps"),
        ("GET", "/api/v1/namespaces"),
    ]
    for method, path, *body in forbidden:
        assert status(method, path, *body) == 403, (method, path)
