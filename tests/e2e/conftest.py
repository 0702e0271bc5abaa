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
from trainstack.sandbox.stacks import Deployed, deploy_platform

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)


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


@pytest.fixture(scope="module")
def prod(control_plane: ControlPlane, previewer: Previewer) -> Deployed:
    return deploy_stack(control_plane, previewer, "prod")


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
