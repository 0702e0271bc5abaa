"""Team isolation as the API server enforces it, acting as a team member (impersonation)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from tests.e2e.conftest import Deployed
from tests.policy.test_equivalence import demo_job
from trainstack.builders.scheduling import ORG_QUEUE
from trainstack.kube import ApiError, Identity, becomes, wait_for
from trainstack.preview.engine import Previewer


@pytest.fixture(scope="module")
def demo(previewer: Previewer) -> dict[str, Any]:
    return demo_job(previewer.preview("vision"))


def _status(error: ApiError | None) -> int:
    return 0 if error is None else error.status


def _try(call: Any) -> ApiError | None:
    try:
        call()
    except ApiError as error:
        return error
    return None


def test_member_creates_a_job_in_its_own_namespace(prod: Deployed, demo: dict[str, Any]) -> None:
    job = copy.deepcopy(demo)
    job["metadata"]["name"] = "rbac-own"
    prod.kube.create(job, as_=prod.member("vision"), dry_run=True)


def test_member_cannot_create_a_job_in_another_team_namespace(
    prod: Deployed, demo: dict[str, Any]
) -> None:
    job = copy.deepcopy(demo)
    job["metadata"] |= {"name": "rbac-other", "namespace": "nlp"}
    job["spec"]["queue"] = "nlp"
    error = _try(lambda: prod.kube.create(job, as_=prod.member("vision"), dry_run=True))
    assert _status(error) == 403, error


def test_member_cannot_read_another_team_secrets(prod: Deployed) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "wandb", "namespace": "nlp"},
        "stringData": {"token": "nlp-only"},
    }
    prod.kube.apply(secret)
    vision = prod.member("vision")
    get = _try(lambda: prod.kube.get("v1", "Secret", "wandb", "nlp", as_=vision))
    assert _status(get) == 403, get
    listing = _try(lambda: prod.kube.request("GET", "/api/v1/namespaces/nlp/secrets", as_=vision))
    assert _status(listing) == 403, listing


def test_an_outsider_cannot_touch_team_namespaces(prod: Deployed, demo: dict[str, Any]) -> None:
    """Authenticated but in no team: nothing (the RoleBindings name team groups only)."""
    outsider = Identity("someone@example.com", ("system:authenticated",))
    job = copy.deepcopy(demo)
    error = _try(lambda: prod.kube.create(job, as_=outsider, dry_run=True))
    assert _status(error) == 403, error


def _command(
    namespace: str,
    action: str,
    queue: str,
    target: tuple[str, str] = ("scheduling.volcano.sh/v1beta1", "Queue"),
) -> dict[str, Any]:
    return {
        "apiVersion": "bus.volcano.sh/v1alpha1",
        "kind": "Command",
        "metadata": {"name": f"e2e-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "action": action,
        "target": {
            "apiVersion": target[0],
            "kind": target[1],
            "name": queue,
            "uid": "",
        },
    }


def _queue_state(prod: Deployed, queue: str) -> str:
    live = prod.kube.get("scheduling.volcano.sh/v1beta1", "Queue", queue)
    return str(live.get("status", {}).get("state", ""))


@pytest.mark.parametrize("queue", ["nlp", "vision", ORG_QUEUE])
def test_member_cannot_close_a_queue(prod: Deployed, queue: str) -> None:
    """Issue 15 #3: the API refuses the Command (builders/admission.command_policy), so the
    queue stays Open; without the policy Volcano's queue controller closes it within a second.
    Not even the team's own queue: closing it is the platform's decision."""
    command = _command("vision", "CloseQueue", queue)
    refused = _try(lambda: prod.kube.create(command, as_=prod.member("vision")))
    try:
        assert _status(refused) == 403, refused
        assert refused is not None
        assert "its own Jobs only" in refused.message
        # Volcano's queue controller acts within a second; give it five.
        assert not becomes(lambda: _queue_state(prod, queue) in ("Closed", "Closing"), 5)
    finally:
        _reopen(prod, queue)


def _reopen(prod: Deployed, queue: str) -> None:
    if _queue_state(prod, queue) != "Open":
        prod.kube.create(_command("default", "OpenQueue", queue))
        wait_for(f"queue {queue} open again", lambda: _queue_state(prod, queue) == "Open")


def test_member_cannot_reopen_a_queue_the_platform_closed(prod: Deployed) -> None:
    prod.kube.create(_command("default", "CloseQueue", "nlp"))
    wait_for("nlp closed", lambda: _queue_state(prod, "nlp") in ("Closed", "Closing"))
    try:
        opened = _try(
            lambda: prod.kube.create(
                _command("vision", "OpenQueue", "nlp"), as_=prod.member("vision")
            )
        )
        assert _status(opened) == 403, opened
        assert not becomes(lambda: _queue_state(prod, "nlp") == "Open", 5)
    finally:
        _reopen(prod, "nlp")


@pytest.mark.parametrize("action", ["AbortJob", "RestartJob", "ResumeJob", "TerminateJob"])
def test_member_may_command_its_own_jobs(prod: Deployed, action: str) -> None:
    """What `vcctl job suspend/resume` does: a Command on a Job, acted on in its namespace."""
    command = _command("vision", action, "some-job", ("batch.volcano.sh/v1alpha1", "Job"))
    prod.kube.create(command, as_=prod.member("vision"), dry_run=True)


def test_member_cannot_command_another_teams_jobs(prod: Deployed) -> None:
    command = _command("nlp", "AbortJob", "some-job", ("batch.volcano.sh/v1alpha1", "Job"))
    error = _try(lambda: prod.kube.create(command, as_=prod.member("vision"), dry_run=True))
    assert _status(error) == 403, error
