"""`trainstack diff` and `trainstack changed-stacks`, registered on the main Typer app."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from trainstack.config import ConfigError
from trainstack.config.project import Project
from trainstack.diff.changed import Selection, stacks_changed_since
from trainstack.diff.plans import PlanError, empty_plan, load_plan
from trainstack.diff.render import to_json, to_markdown
from trainstack.diff.report import DiffReport, diff_plans, not_previewed
from trainstack.terminal import fail

# Markup off: stack names, paths and messages print verbatim (see trainstack/cli.py).
out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)


class Format(StrEnum):
    markdown = "markdown"
    json = "json"


def _plans_in(folder: Path) -> dict[str, Path]:
    return {p.parent.name: p for p in sorted(folder.glob("*/plan.json"))}


def head_project(head: Path, project_dir: Path | None) -> Project | None:
    """The project the head plans were made from: `project_dir`, else the current folder's
    project, else the project holding the head folder, else none.

    The current project comes first: a head previewed from a copy into `--out /tmp/…` is in
    no project, and every stack it did not preview read as removed (issue 41 #3).
    """
    if project_dir is not None:
        return Project.find(project_dir.resolve())
    for start in (Path.cwd(), head.resolve()):
        try:
            return Project.find(start)
        except ConfigError:
            continue
    return None


def _no_base_plans(base: Path, head: Path, head_plans: dict[str, Path]) -> PlanError:
    """A base folder without plans, next to a head with some: every stack would read as new
    (issue 41 #3). Plans one folder too deep are named, with the folder to pass."""
    deeper = sorted(base.glob("*/*/plan.json"))[:3]
    found = (
        f"; it holds {', '.join(map(str, deeper))}: pass {deeper[0].parent.parent}"
        if deeper
        else ""
    )
    return PlanError(
        f"{base}: no <stack>/plan.json here{found}; the head {head} holds plans of "
        f"{', '.join(head_plans)}, which would all read as new stacks. Preview the base into "
        f"it (`trainstack preview STACK --out {base}` on the base commit), or, when the change "
        "only adds stacks, pass --base-may-be-empty"
    )


def diff_paths(
    base: Path, head: Path, project: Project | None = None, *, base_may_be_empty: bool = False
) -> DiffReport:
    """Diff two plan files, or two folders of `<stack>/plan.json` (stacks paired by name).

    A stack with a base plan and no head plan is removed only when its stack file is gone
    from the head's `project`: one that is still there was not in the head's changed set
    (`preview --changed-since`), and is unchanged, not previewed. Without a project, every
    such stack counts as removed. A base folder without plans next to a head with some is
    an error unless `base_may_be_empty` (a change that only adds stacks).
    """
    if base.is_file() or head.is_file() or (base / "plan.json").is_file():
        return DiffReport([diff_plans(load_plan(base), load_plan(head))])
    for side in (base, head):
        if not side.is_dir():
            raise PlanError(
                f"{side}: neither a plan file nor a folder of plans; pass build/STACK/plan.json "
                "or the --out folder of `trainstack preview`"
            )
    base_plans, head_plans = _plans_in(base), _plans_in(head)
    if not base_plans and not head_plans:
        # A change that touches no stack (docs only): an empty report, not an error, so the
        # pull request still gets its comment (issue 23 #2).
        err.print(f"note: neither {base} nor {head} holds a <stack>/plan.json: no stack to compare")
    elif not base_plans and not base_may_be_empty:
        raise _no_base_plans(base, head, head_plans)
    gone = [s for s in base_plans if s not in head_plans]
    if gone and project is None:
        err.print(
            f"note: no project around the current folder or {head} to look for their stack files: "
            f"{', '.join(gone)} read as removed (pass --project-dir if they were not previewed)"
        )
    stacks: list[Any] = []
    for stack in sorted(set(base_plans) | set(head_plans)):
        old = load_plan(base_plans[stack]) if stack in base_plans else None
        new = load_plan(head_plans[stack]) if stack in head_plans else None
        if old is not None and new is None and project and project.stack_file(stack).is_file():
            stacks.append(not_previewed(old))
            continue
        kind = str((new or old or {}).get("kind", "platform"))
        stacks.append(diff_plans(old or empty_plan(stack, kind), new or empty_plan(stack, kind)))
    return DiffReport(stacks)


def diff(
    base: Annotated[Path, typer.Argument(help="Base plan.json (or folder of <stack>/plan.json).")],
    head: Annotated[Path, typer.Argument(help="Head plan.json (or folder of <stack>/plan.json).")],
    *,
    format: Annotated[Format, typer.Option(help="Report format on stdout.")] = Format.markdown,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown-out", help="Also write the Markdown report here.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json-out", help="Also write the JSON report here.")
    ] = None,
    project_dir: Annotated[
        Path | None,
        typer.Option(
            help="The head's project: a stack without a head plan whose stack file is still "
            "here was not previewed, not removed (default: the current folder's project, "
            "else the one holding HEAD)."
        ),
    ] = None,
    base_may_be_empty: Annotated[
        bool,
        typer.Option(
            "--base-may-be-empty",
            help="A BASE folder without plans is not an error: every head stack is new "
            "(CI, for a change that only adds stacks).",
        ),
    ] = False,
) -> None:
    """What a change means: quotas, capacity, storage, jobs, access, policy, every resource."""
    try:
        report = diff_paths(
            base, head, head_project(head, project_dir), base_may_be_empty=base_may_be_empty
        )
    except (PlanError, ConfigError) as error:
        raise fail(str(error)) from None
    markdown, document = to_markdown(report), to_json(report)
    for path, text in ((markdown_out, markdown), (json_out, document)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    print(markdown if format is Format.markdown else document, end="")


def changed_stacks(
    since: Annotated[str, typer.Argument(help="Git ref to compare with (e.g. origin/main).")],
    project_dir: Annotated[Path, typer.Option(help="Folder with Pulumi.yaml.")] = Path("."),
) -> None:
    """Print the stacks a change since SINCE touches, one per line (for CI), removed ones too:
    CI previews those on the base, and the diff shows them as stacks to destroy."""
    try:
        selection = stacks_changed_since(project_dir, since)
    except ConfigError as error:
        raise fail(str(error)) from None
    explain(selection, selection.stacks)  # on stderr: stdout is the list CI reads
    for stack in sorted({*selection.stacks, *selection.removed}):
        print(stack)


MAX_EVERYWHERE = 3  # files named as selecting every stack; the rest are counted


def explain(selection: Selection, chosen: list[str]) -> None:
    """Why each chosen stack is touched, on stderr. A file that selects every stack is named
    once, with why: an untracked link selected every stack without a word (issue 41 #6)."""
    shown = selection.everywhere[:MAX_EVERYWHERE]
    for name, why in shown:
        err.print(f"every stack: {name} changed ({why})")
    if len(selection.everywhere) > len(shown):
        err.print(f"every stack: and {len(selection.everywhere) - len(shown)} more such files")
    for stack in chosen:
        reasons = [r for r in selection.reasons[stack] if not r.startswith("shared file ")]
        if not reasons:
            continue
        extra = f" (+{len(reasons) - 2} more)" if len(reasons) > 2 else ""
        err.print(f"{stack}: {'; '.join(reasons[:2])}{extra}")


def select_changed(project_dir: Path, ref: str, stacks: list[str] | None) -> list[str]:
    """For `preview --changed-since REF`: the touched stacks (within STACKS, when given).

    Raises ConfigError (the preview command reports it) for a ref git does not know.
    """
    selection: Selection = stacks_changed_since(project_dir, ref)
    chosen = [s for s in selection.stacks if not stacks or s in stacks]
    explain(selection, chosen)
    for stack in selection.removed:
        err.print(f"{stack}: stack file removed since {ref}; nothing to preview")
    if not chosen:
        err.print(f"no stack is touched by the changes since {ref}; nothing to preview")
    return chosen


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)
    app.command("changed-stacks")(changed_stacks)
