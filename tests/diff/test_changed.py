"""Which stacks a change touches, and `trainstack preview --changed-since REF`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.test_preview import make_project
from trainstack.cli import app
from trainstack.config.project import Project
from trainstack.diff.changed import select_stacks
from trainstack.outputs import team_slices

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
        # prod pre-pulls its team stacks' job images (docs/prepull.md): its plan changes too
        (["job_specs/vision/demo-train.yaml"], ["prod", "vision"]),
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
    assert listed.stdout == "dev\n"  # the list CI reads; why is on stderr
    # A nested checkout (CI's base) is not a change.
    nested = project / ".base"
    nested.mkdir()
    git(nested, "init", "-q")
    (nested / "x.py").write_text("x = 1\n")
    listed = runner.invoke(app, ["changed-stacks", "HEAD", "--project-dir", str(project)])
    assert listed.stdout == "dev\n"


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


# -- issue 41 #6: untracked files, why every stack, and refs of unknown remotes ------------

STACKS = ("dev", "prod", "vision")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed project of three stacks (vision on prod), with a package folder."""
    (tmp_path / "repo").mkdir()
    project = make_project(
        tmp_path / "repo", {s: ROOT / "stacks" / f"Pulumi.{s}.yaml" for s in STACKS}
    )
    (project / "trainstack").mkdir()
    (project / "trainstack" / "x.py").write_text("X = 1\n")
    (project / "Makefile").write_text("all:\n")
    (project / ".gitignore").write_text(".venv/\nbuild/\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "base")
    return project


def untracked_link(project: Path, name: str) -> None:
    """A link to a folder, as `make setup-preview` or a checkout of the pack's venv leave:
    `.venv/` in .gitignore matches folders, not a link."""
    (project / name).symlink_to(ROOT / ".venv", target_is_directory=True)


@pytest.mark.parametrize(
    ("change", "stdout", "stderr"),
    [
        # What the program does not read: no stack, and nothing to say.
        (lambda p: untracked_link(p, ".venv"), "", ""),
        (lambda p: untracked_link(p, "policies"), "", ""),
        (lambda p: (p / "scratch.txt").write_text("notes\n"), "", ""),
        (lambda p: (p / "build").mkdir() or (p / "build" / "plan.json").write_text("{}"), "", ""),
        # An untracked file the program reads selects every stack, and says so once.
        (lambda p: (p / "trainstack" / "new.py").write_text("Y = 2\n"), "dev\nprod\nvision\n",
         "every stack: trainstack/new.py changed (untracked, in trainstack/, which every "
         "preview reads)\n"),
        (lambda p: (p / "trainstack" / "x.py").write_text("X = 2\n"), "dev\nprod\nvision\n",
         "every stack: trainstack/x.py changed (in trainstack/, which every preview reads)\n"),
        (lambda p: (p / "__main__.py").write_text("# the program\n"), "dev\nprod\nvision\n",
         "every stack: __main__.py changed (which every preview reads)\n"),
        # A tracked file outside what the program reads still selects every stack (a missed
        # preview is worse than one too many), and says why.
        (lambda p: (p / "Makefile").write_text("all: x\n"), "dev\nprod\nvision\n",
         "every stack: Makefile changed (not a stack file, job spec, policy setting or "
         "document: any stack may change)\n"),
        # A stack file: its stack, and the team stacks that read its outputs.
        (lambda p: (p / "stacks" / "Pulumi.prod.yaml").write_text(
            (p / "stacks" / "Pulumi.prod.yaml").read_text() + "\n"), "prod\nvision\n",
         "prod: stacks/Pulumi.prod.yaml changed\nvision: its platform stack prod changed\n"),
    ],
    ids=["venv-link", "pack-venv-link", "scratch", "build-output", "untracked-module",
         "tracked-module", "program", "tracked-makefile", "stack-file"],
)  # fmt: skip
def test_changed_stacks_says_which_file_selects_every_stack(
    repo: Path, change: Any, stdout: str, stderr: str
) -> None:
    change(repo)
    result = runner.invoke(app, ["changed-stacks", "HEAD", "--project-dir", str(repo)])
    assert (result.exit_code, result.stdout, result.stderr) == (0, stdout, stderr)


def test_a_local_chart_touches_its_platform_stack_only(repo: Path) -> None:
    """A stack's `addons.<key>.path` is read by that stack's preview, not every stack's."""
    prod = repo / "stacks" / "Pulumi.prod.yaml"
    text = prod.read_text()
    anchor = "    gpuPools:\n"
    assert text.count(anchor) == 1
    prod.write_text(text.replace(anchor, "    addons:\n      volcano: {path: charts/volcano}\n"
                                 + anchor))  # fmt: skip
    git(repo, "commit", "-qam", "a local chart")
    (repo / "charts" / "volcano").mkdir(parents=True)
    (repo / "charts" / "volcano" / "Chart.yaml").write_text("name: volcano\n")
    result = runner.invoke(app, ["changed-stacks", "HEAD", "--project-dir", str(repo)])
    assert (result.exit_code, result.stdout, result.stderr) == (
        0,
        "prod\nvision\n",
        "prod: charts/volcano/Chart.yaml (its local chart) changed\n"
        "vision: its platform stack prod changed\n",
    )


@pytest.mark.parametrize(
    ("remotes", "ref", "problem"),
    [
        # Before: "to fetch it: git fetch origin upstream/main", a branch origin lacks.
        (["origin"], "upstream/main",
         "'upstream/main' is not a commit in this repository; this repository has no remote "
         "'upstream' (remotes: origin); to fetch from it, add it first: git remote add upstream "
         "URL, then git fetch upstream main"),
        (["origin", "upstream"], "upstream/main",
         "'upstream/main' is not a commit in this repository; to fetch it: git fetch upstream "
         "main"),
        (["origin", "upstream"], "upstrem/main",
         "'upstrem/main' is not a commit in this repository; this repository has no remote "
         "'upstrem' (remotes: origin, upstream); did you mean upstream/main? to fetch it: "
         "git fetch upstream main"),
    ],
    ids=["unknown-remote", "known-remote", "misspelt-remote"],
)  # fmt: skip
def test_a_ref_of_an_unknown_remote_gets_a_command_that_works(
    repo: Path, remotes: list[str], ref: str, problem: str
) -> None:
    for remote in remotes:
        git(repo, "remote", "add", remote, f"https://example.com/{remote}.git")
    result = runner.invoke(app, ["changed-stacks", ref, "--project-dir", str(repo)])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"error: --changed-since: 1 config error:\n  - ref: {problem}\n"


def test_a_job_spec_selects_its_platform_only_while_it_pre_pulls(tmp_path: Path) -> None:
    """The platform's pre-pull DaemonSets hold its team stacks' job images (jobs/prepull.py), so
    a changed job spec changes the platform's plan, and says why; without pre-pull it does not."""
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "stacks/Pulumi.vision.yaml").write_text(
        (ROOT / "stacks/Pulumi.vision.yaml").read_text()
    )
    prod = (ROOT / "stacks/Pulumi.prod.yaml").read_text()
    (tmp_path / "stacks/Pulumi.prod.yaml").write_text(prod)
    project = Project.find(tmp_path)
    selection = select_stacks(project, ["job_specs/vision/demo-train.yaml"])
    assert selection.stacks == ["prod", "vision"]
    assert selection.reasons["prod"] == [
        "job_specs/vision/demo-train.yaml changed (it pre-pulls its images)"
    ]
    assert "      enabled: true\n      images:" in prod
    off = prod.replace("      enabled: true\n      images:", "      enabled: false\n      images:")
    (tmp_path / "stacks/Pulumi.prod.yaml").write_text(off)
    assert select_stacks(project, ["job_specs/vision/demo-train.yaml"]).stacks == ["vision"]
