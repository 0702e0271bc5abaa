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
from trainstack.sandbox import toolchain

WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "plan-diff.yml"
FORK_COMMENT = WORKFLOWS / "plan-diff-comment.yml"
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


def load(path: Path = WORKFLOW) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def triggers(doc: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    return found


def actionlint() -> str:
    """actionlint as `make e2e-tools` builds it from its Go module
    (trainstack/sandbox/toolchain.py)."""
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
    assert set(triggers(doc)) == {"pull_request"}  # never pull_request_target
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
    """Issue 23 #4: every action of every workflow, the one that holds cloud credentials
    included; and zizmor's pinning rule is not relaxed for any of them."""
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for job in load(path)["jobs"].values():
            for step in job["steps"]:
                uses = step.get("uses")
                if uses:
                    assert re.fullmatch(r"[\w./-]+@[0-9a-f]{40}", uses), (path.name, uses)
    config = yaml.safe_load(ZIZMOR_CONFIG.read_text())
    assert config["rules"]["unpinned-uses"]["config"]["policies"] == {"*": "hash-pin"}
    assert "ignore" not in config["rules"]["unpinned-uses"]


def test_forks_get_their_comment_from_a_workflow_that_reads_the_report_as_data() -> None:
    """Issue 23 #10: a fork's pull_request run cannot comment; a workflow_run workflow posts
    its report. It checks out nothing, runs nothing, and does not let the artifact choose
    the pull request."""
    doc = load(FORK_COMMENT)
    assert triggers(doc) == {
        "workflow_run": {"workflows": [load()["name"]], "types": ["completed"]}
    }
    assert doc["permissions"] == {}
    [job] = doc["jobs"].values()
    assert job["permissions"] == {"actions": "read", "pull-requests": "write"}
    # forks only: same-repository pull requests have plan-diff.yml's comment job
    assert "head_repository.full_name != github.repository" in job["if"]
    assert "workflow_run.event == 'pull_request'" in job["if"]
    assert [s["uses"].split("@")[0] for s in job["steps"]] == [
        "actions/download-artifact",
        "actions/github-script",
    ]
    download, script = job["steps"]
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    code = script["with"]["script"]
    for never in ("eval(", "Function(", "child_process", "exec", 'require("./', "JSON.parse"):
        assert never not in code, never
    assert 'readFileSync("report/report.md", "utf8")' in code  # the only thing read from it
    assert "p.head.sha === run.head_sha" in code
    assert "const issue_number = pr.number;" in code
    # The one zizmor finding ignored in this repository, with its reason on the line.
    ignores = [
        (path.name, line.strip())
        for path in sorted(WORKFLOWS.glob("*.yml"))
        for line in path.read_text().splitlines()
        if "zizmor: ignore" in line
    ]
    assert [(name, line.split("# ", 1)[1]) for name, line in ignores] == [
        (
            FORK_COMMENT.name,
            "zizmor: ignore[dangerous-triggers] data-only use, reviewed (issue 23 #10)",
        )
    ]


def test_the_cloud_preview_runs_the_cli_the_e2e_suite_tests() -> None:
    """The CLI version in the credentialed step is the one tests/e2e builds (its wrapper's
    go.mod requires pkg/v3 at it) and runs the policy pack with (tests/e2e/test_policy_pack.py)."""
    [pulumi] = [
        s for s in load()["jobs"]["cloud"]["steps"] if s.get("uses", "").startswith("pulumi/")
    ]
    [component] = [c for c in toolchain.COMPONENTS if c.name == "pulumi"]
    assert f"v{pulumi['with']['pulumi-version']}" == component.version
