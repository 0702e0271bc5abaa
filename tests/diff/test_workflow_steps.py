"""The pull-request workflow's offline job, run step by step in a temporary repository.

The shell steps are taken from .github/workflows/plan-diff.yml as written and run as GitHub
runs an explicit `shell: bash` step (`bash --noprofile --norc -eo pipefail {0}`, GitHub's
"Workflow syntax" docs, `jobs.<job_id>.steps[*].shell`), with `GITHUB_OUTPUT` and
`GITHUB_STEP_SUMMARY` files, in a git repository holding a base commit and a head commit. The
`uses:` steps are stood in for by what they do here: the head checkout is the repository,
the base checkout a `git worktree` at the base commit (`path: .base`), the artifact upload
nothing; `make setup-preview` is the test's own virtualenv. Conditions are evaluated for the
forms the workflow uses and no other (an unknown one fails the test), with GitHub's default
`success()` for a step without `if:`.

Issue 23 #1 (a head with violations still gets its base previewed, and the job still fails),
#2 (a docs-only change gets a report, and pipes do not hide failures), #5 (an access change
names the principal and its policy), #7 (a deleted stack is one to destroy).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.diff.test_workflow import load

PROJECT_FILES = ("Pulumi.yaml", "__main__.py", "README.md", ".gitignore", "stacks", "job_specs")
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class Run:
    """What the job did: each step's outcome, its outputs, and the files it left."""

    repo: Path
    outcomes: dict[str, str] = field(
        default_factory=dict
    )  # step name -> success | failure | skipped
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return "failure" not in self.outcomes.values()

    def report(self) -> str:
        return (self.repo / "build" / "pr" / "report.md").read_text(encoding="utf-8")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True,
        env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
             "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"},
    )  # fmt: skip
    return done.stdout.strip()


def _repository(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose first commit is the project as it is here: the base."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in PROJECT_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, repo / name)
        else:
            shutil.copy(source, repo / name)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    # `make setup-preview` stands here: the virtualenv the tests run in. A link is not a
    # folder, which is all `.venv/` in .gitignore matches, so the repository ignores it by name.
    (repo / ".venv").symlink_to(ROOT / ".venv")
    with (repo / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.write(".venv\n")
    return repo, _git(repo, "rev-parse", "HEAD")


def _condition(expression: str | None, run: Run) -> bool:
    """The step's `if:`, for the forms this workflow uses."""
    if expression is None:
        return run.succeeded  # success()
    text = EXPRESSION.sub(r"\1", expression).strip()
    if text == "!cancelled()":
        return True
    match = re.fullmatch(r"!cancelled\(\) && steps\.(\w+)\.outputs\.(\w+) != '(\w*)'", text)
    if match:
        step, key, value = match.groups()
        return run.outputs.get(step, {}).get(key, "") != value
    raise AssertionError(f"a condition this test does not know how to evaluate: {expression}")


def _expand(text: str, run: Run, base_sha: str) -> str:
    def value(match: re.Match[str]) -> str:
        expr = match.group(1)
        if expr == "github.workspace":
            return str(run.repo)
        if expr == "github.event.pull_request.base.sha":
            return base_sha
        step = re.fullmatch(r"steps\.(\w+)\.outputs\.(\w+)", expr)
        if step:
            return run.outputs.get(step.group(1), {}).get(step.group(2), "")
        raise AssertionError(f"an expression this test does not know: {expr}")

    return EXPRESSION.sub(value, text)


def _uses(step: dict[str, Any], run: Run, base_sha: str) -> None:
    action = step["uses"].split("@")[0]
    if action == "actions/checkout" and step.get("with", {}).get("path") == ".base":
        _git(run.repo, "worktree", "add", "-q", "--detach", ".base", base_sha)
    elif action not in ("actions/checkout", "actions/upload-artifact"):
        raise AssertionError(f"the offline job uses {action}, which this test cannot stand in for")


def run_offline_job(repo: Path, base_sha: str, tmp_path: Path) -> Run:
    job = load()["jobs"]["offline"]
    shell = load()["defaults"]["run"]["shell"]
    assert shell == "bash", "the steps must run with pipefail (issue 23 #2)"
    run = Run(repo)
    summary = tmp_path / "summary.md"
    for index, step in enumerate(job["steps"]):
        name = step.get("name", f"step {index}")
        if not _condition(step.get("if"), run):
            run.outcomes[name] = "skipped"
            continue
        if "uses" in step:
            _uses(step, run, base_sha)
            run.outcomes[name] = "success"
            continue
        if step["run"].split("#")[0].strip() == "make setup-preview":
            run.outcomes[name] = "success"  # the symlinked virtualenv
            continue
        outputs = tmp_path / f"output-{index}"
        outputs.touch()
        env = {
            **os.environ,
            **{k: _expand(str(v), run, base_sha) for k, v in job.get("env", {}).items()},
            **{k: _expand(str(v), run, base_sha) for k, v in step.get("env", {}).items()},
            "GITHUB_OUTPUT": str(outputs),
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_WORKSPACE": str(repo),
        }
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=repo / step.get("working-directory", "."), env=env, capture_output=True,
            text=True, timeout=600, check=False,
        )  # fmt: skip
        run.logs[name] = done.stdout + done.stderr
        run.outcomes[name] = "success" if done.returncode == 0 else "failure"
        if "id" in step:
            lines = outputs.read_text().splitlines()
            run.outputs[step["id"]] = dict(line.split("=", 1) for line in lines if "=" in line)
    return run


def _commit(repo: Path, message: str) -> None:
    _git(repo, "add", "-A", "--", *PROJECT_FILES)
    _git(repo, "commit", "-q", "-m", message)


def test_a_docs_only_change_gets_a_report_and_a_green_job(tmp_path: Path) -> None:
    """Before: `trainstack diff` of two empty folders failed, `| tee` hid it, and the comment
    job found no report."""
    repo, base = _repository(tmp_path)
    (repo / "README.md").write_text("A clearer sentence.\n", encoding="utf-8")
    _commit(repo, "docs only")
    run = run_offline_job(repo, base, tmp_path)
    assert run.succeeded, run.logs
    assert (repo / "build" / "pr" / "stacks.txt").read_text() == ""
    assert "This change touches no stack" in run.report()


@pytest.mark.slow
def test_violations_still_compare_with_the_base_and_fail_the_job(tmp_path: Path) -> None:
    """A head whose team jobs break a mandatory rule: before, the head step failed, the base
    preview was skipped, and the report compared against nothing."""
    repo, base = _repository(tmp_path)
    stack = repo / "stacks" / "Pulumi.prod.yaml"
    text = stack.read_text(encoding="utf-8")
    allowed = (  # prod's own list (issue 41), replaced by one the demo images are not from
        "      allowedRegistries:\n        - 111122223333.dkr.ecr.us-east-1.amazonaws.com/\n"
        "        - registry.example.com/\n"
    )
    assert allowed in text
    stack.write_text(
        text.replace(allowed, "      allowedRegistries: [other.example.com/]\n", 1),
        encoding="utf-8",
    )
    _commit(repo, "only another registry")
    run = run_offline_job(repo, base, tmp_path)
    assert run.outputs["head"] == {"code": "3"}
    assert run.outcomes["Preview the base"] == "success", run.logs
    assert (repo / "build" / "pr" / "base" / "vision" / "plan.json").is_file()
    assert run.outcomes["Semantic diff"] == "success", run.logs
    assert run.outcomes["The head preview's verdict"] == "failure"
    report = run.report()
    assert "pinned-images" in report
    assert "new stack" not in report.lower(), report


@pytest.mark.slow
def test_a_deleted_stack_is_reported_as_one_to_destroy(tmp_path: Path) -> None:
    """Issue 23 #7: before, a removed stack file was neither previewed nor diffed."""
    repo, base = _repository(tmp_path)
    (repo / "stacks" / "Pulumi.dev.yaml").unlink()
    _commit(repo, "retire the development platform")
    run = run_offline_job(repo, base, tmp_path)
    assert run.succeeded, run.logs
    assert (repo / "build" / "pr" / "stacks.txt").read_text().split() == ["dev"]
    assert (repo / "build" / "pr" / "base" / "dev" / "plan.json").is_file()
    assert "**dev** (platform) (stack removed)" in run.report()


@pytest.mark.slow
def test_a_new_stack_is_reported_as_new(tmp_path: Path) -> None:
    repo, base = _repository(tmp_path)
    shutil.copy(repo / "stacks" / "Pulumi.dev.yaml", repo / "stacks" / "Pulumi.dev2.yaml")
    _commit(repo, "a second development platform")
    run = run_offline_job(repo, base, tmp_path)
    assert run.succeeded, run.logs
    assert (repo / "build" / "pr" / "stacks.txt").read_text().split() == ["dev2"]
    assert "no base plan for dev2" in run.logs["Preview the base"]
    assert "dev2" in run.report()


@pytest.mark.slow
def test_an_access_change_names_the_principal_and_its_policy(tmp_path: Path) -> None:
    """Issue 23 #5: a cluster admin from another account, and one more principal in a team's
    access, showed as "3 to create" with no names."""
    repo, base = _repository(tmp_path)
    stack = repo / "stacks" / "Pulumi.prod.yaml"
    admin = "arn:aws:iam::444455556666:role/contractor-admin"
    intern = "arn:aws:iam::111122223333:role/vision-interns"
    text = stack.read_text(encoding="utf-8")
    engineers = '"arn:aws:iam::111122223333:role/vision-ml-engineers"'
    for old, new in (
        (
            "          - arn:aws:iam::111122223333:role/platform-ci\n",
            f"          - arn:aws:iam::111122223333:role/platform-ci\n          - {admin}\n",
        ),
        (f"iamPrincipalArns: [{engineers}]", f'iamPrincipalArns: [{engineers}, "{intern}"]'),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    stack.write_text(text, encoding="utf-8")
    _commit(repo, "a contractor administers the cluster, interns join vision")
    run = run_offline_job(repo, base, tmp_path)
    assert run.succeeded, run.logs
    lines = run.report().splitlines()
    flagged = "**⚠️ cluster admin; account 444455556666 new to this stack**"
    for line in (
        "#### Access",
        f"| added {flagged} | EKS access policy | {admin} | AmazonEKSClusterAdminPolicy "
        "(cluster-wide) |  |  |  |",
        f"| added | EKS access entry | {intern} | Kubernetes groups trainstack:team:vision "
        "|  |  |  |",
    ):
        assert line in lines, "\n".join(lines)
    [summary] = [line for line in lines if line.startswith("- **prod**")]
    assert summary.startswith("- **prod** (platform): 3 to create, 0 to update"), summary
    assert "🔑 3 access change(s), 2 flagged" in summary
