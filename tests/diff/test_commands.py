"""`trainstack diff` on folders that are not what they should be (issue 41 #3): exact lines
and exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.diff.conftest import as_doc
from tests.diff.test_diff import write_plan_doc
from trainstack.cli import app
from trainstack.preview.plan import Plan

runner = CliRunner()


def folders(tmp_path: Path, plans: dict[str, Plan], base: list[str], head: list[str]) -> None:
    for side, stacks in (("base", base), ("head", head)):
        (tmp_path / side).mkdir()
        for stack in stacks:
            write_plan_doc(tmp_path / side, as_doc(plans[stack]))


NO_BASE = (
    "error: {base}: no <stack>/plan.json here{found}; the head {head} holds plans of dev, "
    "which would all read as new stacks. Preview the base into it (`trainstack preview "
    "STACK --out {base}` on the base commit), or, when the change only adds stacks, pass "
    "--base-may-be-empty\n"
)


@pytest.mark.parametrize(
    ("base", "head", "args", "code", "stderr"),
    [
        # Before: every head stack read as new ("new stack: 133 to create").
        ([], ["dev"], [], 1, NO_BASE),
        # CI previews the touched stacks on the base; a change that only adds one has none.
        ([], ["dev"], ["--base-may-be-empty"], 0, ""),
        # A docs-only change: neither side has a plan, an empty report (issue 23 #2).
        ([], [], [], 0, "note: neither {base} nor {head} holds a <stack>/plan.json: no stack "
         "to compare\n"),
        (["dev"], ["dev"], ["--project-dir", "/"], 1,
         "error: /: 1 config error:\n  - Pulumi.yaml: no Pulumi project found here or above\n"),
    ],
    ids=["empty-base", "empty-base-allowed", "docs-only", "not-a-project"],
)  # fmt: skip
def test_a_base_without_plans_is_an_error(
    tmp_path: Path,
    example_plans: dict[str, Plan],
    base: list[str],
    head: list[str],
    args: list[str],
    code: int,
    stderr: str,
) -> None:
    folders(tmp_path, example_plans, base, head)
    b, h = tmp_path / "base", tmp_path / "head"
    where = [] if "--project-dir" in args else ["--project-dir", str(ROOT)]
    result = runner.invoke(app, ["diff", str(b), str(h), *where, *args])
    assert (result.exit_code, result.stderr) == (
        code,
        stderr.format(base=b, head=h, found=""),
    ), result.output


def test_plans_one_folder_too_deep_are_named(
    tmp_path: Path, example_plans: dict[str, Plan]
) -> None:
    """`preview --out build/base/dev` writes build/base/dev/dev/plan.json."""
    folders(tmp_path, example_plans, [], ["dev"])
    base, head = tmp_path / "base", tmp_path / "head"
    write_plan_doc(base / "dev", as_doc(example_plans["dev"]))
    result = runner.invoke(app, ["diff", str(base), str(head), "--project-dir", str(ROOT)])
    found = f"; it holds {base}/dev/dev/plan.json: pass {base}/dev"
    assert (result.exit_code, result.stderr) == (
        1,
        NO_BASE.format(base=base, head=head, found=found),
    )
