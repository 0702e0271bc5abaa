"""Fixtures shared by the diff tests: real previews of projects made of given stack files."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.test_preview import make_project
from trainstack.config.project import Project
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan

Preview = Callable[..., dict[str, Any]]


def as_doc(plan: Plan) -> dict[str, Any]:
    """The plan exactly as `plan.json` holds it."""
    doc: dict[str, Any] = json.loads(json.dumps(plan.to_json(), sort_keys=True))
    return doc


@pytest.fixture
def preview(tmp_path: Path) -> Preview:
    """Preview `stack` of a project made of the given stack files; returns the plan document."""
    count = 0

    def run(stack: str, **stacks: str) -> dict[str, Any]:
        nonlocal count
        count += 1
        folder = tmp_path / f"project{count}"
        folder.mkdir()
        # The real project's team stacks and job specs too: a platform that pre-pulls its team
        # stacks' job images (docs/prepull.md) would otherwise differ from the example's plan
        # in every pool's image list.
        teams = {
            p.name[len("Pulumi.") : -len(".yaml")]: p
            for p in (ROOT / "stacks").glob("Pulumi.*.yaml")
            if "trainstack:team:" in p.read_text()
        }
        project = make_project(folder, {**teams, **stacks})
        shutil.copytree(ROOT / "job_specs", folder / "job_specs")
        return as_doc(Previewer(Project.find(project)).preview(stack))

    return run
