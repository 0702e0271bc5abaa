"""Which stacks a change touches, and `trainstack preview --changed-since REF`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.test_preview import make_project
from trainstack.cli import app
from trainstack.diff.changed import select_stacks
from trainstack.outputs import team_slices
from trainstack.preview.engine import Project

runner = CliRunner()
PROJECT = Project.find(ROOT)


@pytest.mark.parametrize(
    ("files", "stacks"),
    [
        ([], []),
        (["docs/diff.md", "README.md", "tests/test_preview.py", ".github/workflows/x.yml"], []),
        (["stacks/Pulumi.dev.yaml"], ["dev"]),
        (["stacks/Pulumi.prod.yaml"], ["prod", "vision"]),  # vision reads prod's outputs
        (["stacks/Pulumi.vision.yaml"], ["vision"]),
        (["job_specs/vision/demo-train.yaml"], ["vision"]),
        (["job_specs/nobody/x.yaml"], []),
        (["trainstack/builders/scheduling.py"], ["dev", "onprem", "prod", "vision"]),
        (["__main__.py"], ["dev", "onprem", "prod", "vision"]),
        # A stack's generated pack config concerns that stack's real preview only.
        (["policies/config/dev.json"], ["dev"]),
        (["policies/config/gone.json"], []),
        (["policies/__main__.py"], ["dev", "onprem", "prod", "vision"]),
    ],
)
def test_files_map_to_stacks(files: list[str], stacks: list[str]) -> None:
    assert select_stacks(PROJECT, files).stacks == stacks


def test_the_policy_config_folder_is_the_generators() -> None:
    from trainstack.diff.changed import POLICY_CONFIG_DIR  # noqa: PLC0415
    from trainstack.preview.policy_config import CONFIG_DIR  # noqa: PLC0415

    assert CONFIG_DIR.as_posix() == POLICY_CONFIG_DIR


def test_removed_stack_is_reported_not_previewed() -> None:
    selection = select_stacks(PROJECT, ["stacks/Pulumi.gone.yaml"])
    assert selection.stacks == []
    assert selection.removed == ["gone"]


def git(folder: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=folder,
        check=True,
        capture_output=True,
    )


def test_preview_changed_since_previews_only_touched_stacks(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    project = make_project(
        tmp_path / "repo",
        {
            "dev": ROOT / "stacks" / "Pulumi.dev.yaml",
            "onprem": ROOT / "stacks" / "Pulumi.onprem.yaml",
        },
    )
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "base")
    stack = project / "stacks" / "Pulumi.dev.yaml"
    stack.write_text(
        stack.read_text().replace("vision-lead@example.com", "vision-owner@example.com")
    )
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["preview", "--changed-since", "HEAD", "--out", str(out), "--project-dir", str(project)],
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["dev"]
    plan = json.loads((out / "dev" / "plan.json").read_text())
    teams = team_slices(plan["outputs"])
    assert teams["vision"]["owners"] == ["vision-owner@example.com"]
    listed = runner.invoke(app, ["changed-stacks", "HEAD", "--project-dir", str(project)])
    assert listed.exit_code == 0
    assert listed.output == "dev\n"
    # A nested checkout (CI's base) is not a change.
    nested = project / ".base"
    nested.mkdir()
    git(nested, "init", "-q")
    (nested / "x.py").write_text("x = 1\n")
    listed = runner.invoke(app, ["changed-stacks", "HEAD", "--project-dir", str(project)])
    assert listed.output == "dev\n"


def test_changed_since_unknown_ref_is_a_clean_error(tmp_path: Path) -> None:
    project = make_project(tmp_path, {"dev": ROOT / "stacks" / "Pulumi.dev.yaml"})
    git(project, "init", "-q")
    result = runner.invoke(
        app, ["preview", "--changed-since", "no-such-ref", "--project-dir", str(project)]
    )
    assert result.exit_code == 1
    assert "'no-such-ref' is not a commit" in result.output
    assert "no remote to fetch it from" in result.output
    assert "Traceback" not in result.output


def test_preview_needs_stacks_or_changed_since() -> None:
    result = runner.invoke(app, ["preview"])
    assert result.exit_code == 2
    assert "--changed-since" in result.output
