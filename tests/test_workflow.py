"""The README's workflow for changing the platform, run as written (issue 41, "Done when").

The commands are read from the README's "Changing the platform" block, so the README cannot
drift from what runs: on a copy of the project, the base plan is previewed, the prod stack
gains a pool and a team (the `$EDITOR` line), then validate, preview and diff run in order.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.diff.test_diff import PROD, replace_once
from tests.diff.test_noise import POOL, REPORT_LIMIT, TEAM
from tests.test_preview import make_project
from trainstack.cli import app

runner = CliRunner()
CLI = ".venv/bin/trainstack"


def readme_steps() -> list[str]:
    """The commands of the README's "Changing the platform" block, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Changing the platform", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "no ```sh block under 'Changing the platform'"
    return [line.split("#", 1)[0].strip() for line in block[1].splitlines() if line.strip()]


def test_the_readmes_platform_change_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = readme_steps()
    assert [s.split()[0] for s in steps] == [CLI, "$EDITOR", CLI, CLI, CLI]
    project = make_project(tmp_path, {"prod": PROD})
    monkeypatch.chdir(project)
    outputs = []
    for step in steps:
        if step.startswith("$EDITOR"):
            stack = project / shlex.split(step)[1]
            text = stack.read_text()
            for old, new in (POOL, TEAM):
                text = replace_once(text, old, new)
            stack.write_text(text)
            continue
        result = runner.invoke(app, shlex.split(step.removeprefix(CLI)))
        assert result.exit_code == 0, f"{step}:\n{result.output}"
        outputs.append(result.output)
    base, validated, head, report = outputs
    assert "policy: no violations" in base
    assert "stacks/Pulumi.prod.yaml: ok (platform stack prod, previewed: " in validated
    assert "policy pack config: wrote policies/config/prod.json" in head
    assert len(report.encode()) < REPORT_LIMIT
    assert "| speech | added |" in report
    assert "deserved GPUs: 16, borrowLimit GPUs: 16" in report
