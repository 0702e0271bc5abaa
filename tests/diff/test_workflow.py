"""The pull-request workflow: valid (actionlint), secure (zizmor), and it runs only our commands."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e import toolchain

WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "plan-diff.yml"
ZIZMOR_CONFIG = ROOT / ".github" / "zizmor.yml"
# Shell glue allowed around the repository's own commands.
GLUE = {"mkdir", "tee", "echo", "while", "read", "done", "do", "code=0", "code=$?", "exit"}
# A step that only reports and sets the job's result runs no program at all.
VERDICT = {"echo", "exit"}
OURS = ("make", ".venv/bin/trainstack", "../.venv/bin/trainstack")


def tool(name: str) -> str:
    for candidate in (Path(sys.executable).parent / name, ROOT / ".venv" / "bin" / name):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed: `make setup` installs it")
    return found


def load() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return doc


def actionlint() -> str:
    """actionlint as `make e2e-tools` builds it from its Go module (tests/e2e/toolchain.py)."""
    try:
        return str(toolchain.locate("actionlint")["actionlint"])
    except toolchain.MissingTools as missing:
        pytest.skip(str(missing))


def test_actionlint_accepts_the_workflows() -> None:
    done = subprocess.run(
        [actionlint(), "-no-color", *map(str, sorted(WORKFLOWS.glob("*.yml")))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_finds_nothing() -> None:
    done = subprocess.run(
        [
            tool("zizmor"),
            "--offline",
            "--persona",
            "pedantic",
            "--config",
            str(ZIZMOR_CONFIG),
            "--format",
            "plain",
            str(WORKFLOWS),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings" in done.stdout + done.stderr


def commands(script: str) -> list[str]:
    """The program each simple command of a `run:` script starts with."""
    script = script.replace("\\\n", " ")
    programs: list[str] = []
    for line in script.splitlines():
        for part in re.split(r"\|\||&&|\||;|<|>", line):
            words = part.split()
            if words and not words[0].startswith(("$", '"', "../build", "build/")):
                programs.append(words[0])
    return programs


def test_steps_run_only_commands_the_repo_provides() -> None:
    for name, job in load()["jobs"].items():
        for step in job["steps"]:
            if "run" not in step:
                assert step["uses"].split("@")[0] in {
                    "actions/checkout",
                    "actions/upload-artifact",
                    "actions/download-artifact",
                    "actions/github-script",
                    "aws-actions/configure-aws-credentials",
                    "pulumi/actions",
                }, (name, step)
                continue
            programs = commands(step["run"])
            if not set(programs) <= VERDICT:
                assert any(p in OURS for p in programs), (name, step["name"], programs)
            assert set(programs) <= GLUE | set(OURS), (name, step["name"], programs)


def test_least_privilege_and_no_secrets_where_pull_request_code_runs() -> None:
    doc = load()
    assert doc["permissions"] == {}
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(triggers) == {"pull_request"}  # never pull_request_target
    offline = doc["jobs"]["offline"]
    assert offline["permissions"] == {"contents": "read"}
    text = yaml.safe_dump(offline)
    assert "secrets." not in text
    for step in offline["steps"]:
        if step.get("uses", "").startswith("actions/checkout"):
            assert step["with"]["persist-credentials"] is False
    comment = doc["jobs"]["comment"]
    assert comment["permissions"] == {"pull-requests": "write"}
    assert all("run" not in s for s in comment["steps"]), "the comment job runs no PR code"
    cloud = doc["jobs"]["cloud"]
    assert "vars.PULUMI_PREVIEW_ENABLED == 'true'" in cloud["if"]
    assert "head.repo.full_name == github.repository" in cloud["if"]
    [pulumi] = [s for s in cloud["steps"] if s.get("uses", "").startswith("pulumi/actions@")]
    assert pulumi["with"]["command"] == "preview"
    assert pulumi["with"]["diff"] is True
    assert pulumi["with"]["policyPacks"] == "policies"
    # Issue 19 #2: the CLI judges by the stack's generated settings, not the schema defaults.
    assert pulumi["with"]["policyPackConfigs"] == "policies/config/${{ matrix.stack }}.json"


def test_actions_are_pinned_by_commit() -> None:
    """Issue 23 #4: every action, the one that holds cloud credentials included."""
    for job in load()["jobs"].values():
        for step in job["steps"]:
            uses = step.get("uses")
            if uses:
                assert re.fullmatch(r"[\w./-]+@[0-9a-f]{40}", uses), uses


def test_the_cloud_preview_runs_the_cli_the_e2e_suite_tests() -> None:
    """The CLI version in the credentialed step is the one tests/e2e builds (its wrapper's
    go.mod requires pkg/v3 at it) and runs the policy pack with (tests/e2e/test_policy_pack.py)."""
    [pulumi] = [
        s for s in load()["jobs"]["cloud"]["steps"] if s.get("uses", "").startswith("pulumi/")
    ]
    [component] = [c for c in toolchain.COMPONENTS if c.name == "pulumi"]
    assert f"v{pulumi['with']['pulumi-version']}" == component.version
