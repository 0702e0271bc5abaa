"""Team isolation as the API server enforces it, acting as a team member (impersonation)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from tests.e2e.conftest import Deployed
from tests.e2e.defects import DefectSeen, known
from tests.e2e.kube import ApiError, Identity, becomes, wait_for
from tests.policy.test_equivalence import demo_job
from trainstack.builders.scheduling import ORG_QUEUE
from trainstack.preview.engine import Previewer

COMMANDS = (
    "issue 15, defect 3: team roles may create bus.volcano.sh Commands and Volcano's queue "
    "controller acts on a Command naming any Queue, so a member can close any queue"
)


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


def _command(namespace: str, action: str, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "bus.volcano.sh/v1alpha1",
        "kind": "Command",
        "metadata": {"name": f"e2e-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "action": action,
        "target": {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "name": queue,
            "uid": "",
        },
    }


def _queue_state(prod: Deployed, queue: str) -> str:
    live = prod.kube.get("scheduling.volcano.sh/v1beta1", "Queue", queue)
    return str(live.get("status", {}).get("state", ""))


@pytest.mark.xfail(strict=True, raises=DefectSeen, reason=COMMANDS)
@pytest.mark.parametrize("queue", ["nlp", ORG_QUEUE])
def test_member_cannot_close_a_queue_not_its_own(prod: Deployed, queue: str) -> None:
    """Either the API refuses the Command, or Volcano ignores it: the queue stays Open."""
    command = _command("vision", "CloseQueue", queue)
    refused = _try(lambda: prod.kube.create(command, as_=prod.member("vision")))
    try:
        if refused is None:
            # Volcano's queue controller acts within a second; give it ten.
            closed = becomes(lambda: _queue_state(prod, queue) in ("Closed", "Closing"), 10)
            known(not closed, f"a vision member closed queue {queue}")
        assert _queue_state(prod, queue) == "Open"
    finally:
        _reopen(prod, queue)


def _reopen(prod: Deployed, queue: str) -> None:
    if _queue_state(prod, queue) != "Open":
        prod.kube.create(_command("default", "OpenQueue", queue))
        wait_for(f"queue {queue} open again", lambda: _queue_state(prod, queue) == "Open")


@pytest.mark.xfail(strict=True, raises=DefectSeen, reason=COMMANDS)
def test_member_cannot_reopen_a_queue_the_platform_closed(prod: Deployed) -> None:
    prod.kube.create(_command("default", "CloseQueue", "nlp"))
    wait_for("nlp closed", lambda: _queue_state(prod, "nlp") in ("Closed", "Closing"))
    try:
        opened = _try(
            lambda: prod.kube.create(
                _command("vision", "OpenQueue", "nlp"), as_=prod.member("vision")
            )
        )
        if opened is None:
            reopened = becomes(lambda: _queue_state(prod, "nlp") == "Open", 10)
            known(not reopened, "a vision member reopened queue nlp")
        assert _queue_state(prod, "nlp") != "Open"
    finally:
        _reopen(prod, "nlp")
