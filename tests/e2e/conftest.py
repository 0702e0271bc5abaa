"""Fixtures for the e2e suite: one real control plane per session, example stacks deployed on it.

Every test in this folder is marked `e2e`: `make test` leaves them out, `make e2e` runs them.
Without the tools they skip with a reason naming `make e2e-tools`; without the reference
folder (CRDs), with a reason naming it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, reference_dir
from trainstack.config.project import Project
from trainstack.kube import Kube
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan
from trainstack.sandbox import toolchain
from trainstack.sandbox.cluster import ControlPlane
from trainstack.sandbox.stacks import Deployed, deploy_platform, restore_platform

HERE = Path(__file__).resolve().parent


# Modules that deploy another stack or reset the control plane themselves: after one of them the
# next module's `prod` is a new deployment, so they run after the modules that share one.
OWN_DEPLOYMENTS = frozenset({
    "test_apply.py", "test_bench_engine.py", "test_guarantees.py", "test_pool_blind.py",
    "test_pulumi_stacks.py", "test_queues.py", "test_rdma.py", "test_sandbox.py", "test_slices.py",
})  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
    # The modules that only use prod first, one after another, so each restores the last one's
    # deployment instead of deploying anew (`prod`); the sort is stable, so each module's tests
    # keep their order and the rest keep theirs.
    on_prod = {
        item.path.name
        for item in items
        if "prod" in getattr(item, "fixturenames", ()) and item.path.name not in OWN_DEPLOYMENTS
    }
    items.sort(key=lambda item: item.path.name not in on_prod)


@pytest.fixture(scope="session")
def tools() -> dict[str, Path]:
    try:
        return toolchain.locate()
    except toolchain.MissingTools as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="session")
def control_plane(
    tools: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    reference = reference_dir()
    if not (reference / "volcano" / "crd-bases").is_dir():
        pytest.skip(f"reference folder {reference} is absent; set TRAINSTACK_REFERENCE to it")
    workdir = Path(os.environ.get("TRAINSTACK_E2E_WORKDIR") or tmp_path_factory.mktemp("cp"))
    plane = ControlPlane(tools, workdir, reference)
    try:
        plane.start()  # Volcano's own chart default until a stack brings its configuration
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Kube:
    return control_plane.kube


@pytest.fixture(scope="session")
def previewer() -> Previewer:
    return Previewer(Project.find(ROOT))


def deploy_stack(plane: ControlPlane, previewer: Previewer, stack: str) -> Deployed:
    """The platform stack `stack` on the session's control plane, as the sandbox deploys it."""
    return deploy_platform(plane, previewer, stack)


# The prod deployment the session made last, for the next module to restore (cheap) rather than
# deploy anew (a reset: about 20 s, most of it waiting for namespaces to be finalised).
_PROD: dict[int, Deployed] = {}  # id(control plane) -> its prod


@pytest.fixture(scope="module")
def prod(control_plane: ControlPlane, previewer: Previewer) -> Deployed:
    """prod as deployed, for each module: the previous module's deployment restored when the
    control plane still holds it (`stacks.restore_platform` says what that undoes and when it
    declines), else deployed anew."""
    last = _PROD.get(id(control_plane))
    if last is not None and last.plane is control_plane and restore_platform(last):
        return last
    _PROD[id(control_plane)] = deployed = deploy_stack(control_plane, previewer, "prod")
    return deployed


@pytest.fixture(scope="module")
def dev(control_plane: ControlPlane, previewer: Previewer) -> Deployed:
    return deploy_stack(control_plane, previewer, "dev")


def job_manifest(plan: Plan, name: str) -> dict[str, Any]:
    """A rendered Volcano Job of a team stack's plan, by job name."""
    for resource, obj in plan.kubernetes_objects():
        if obj["kind"] == "Job" and obj["metadata"]["name"] == name:
            del resource
            return obj
    raise LookupError(f"{plan.stack} renders no Job {name}")
