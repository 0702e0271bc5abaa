"""The `trainstack` command line.

Exit codes (a contract for CI): 0 success, 1 a user error in config (one clean message,
no traceback), 2 bad command-line usage, 3 mandatory policy violations in a preview.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import pulumi
import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainstack import yamlio
from trainstack.config import ConfigError, TeamStackConfig, load_stack_file
from trainstack.diff.cli import register as _register_diff
from trainstack.diff.cli import select_changed as _select_changed
from trainstack.documents import document_kind
from trainstack.jobs.spec import load_job
from trainstack.policy import config_files
from trainstack.preview.engine import Previewer, Project
from trainstack.preview.plan import Plan, normalise, write_plan
from trainstack.preview.summary import capacity_renderables

EXIT_OK = 0
EXIT_USER_ERROR = 1
EXIT_POLICY_VIOLATION = 3

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
# Markup and emoji codes off: user text (patterns like ^[a-z]([-a-z0-9]*[a-z0-9])?$, paths,
# values) prints verbatim; rich would take bracket groups for markup tags, and `:tea:` or a
# `:100:` line number for emoji codes.
console = Console(highlight=False, markup=False, emoji=False)
errors = Console(stderr=True, highlight=False, markup=False, emoji=False)


def _fail(message: str) -> typer.Exit:
    errors.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    return typer.Exit(EXIT_USER_ERROR)


def print_summary(plan: Plan, out_dir: Path, seconds: float) -> None:
    table = Table(title=f"{plan.kind} stack {plan.stack!r}: resources by component and type")
    table.add_column("component", overflow="fold")
    table.add_column("type", overflow="fold")
    table.add_column("count", justify="right")
    total = 0
    for component, counts in plan.counts_by_component().items():
        for index, (rtype, count) in enumerate(sorted(counts.items())):
            table.add_row(component if index == 0 else "", rtype, str(count))
            total += count
    console.print(table)
    console.print(
        f"{total} resources, {len(plan.kubernetes_objects())} Kubernetes objects, "
        f"{len(plan.outputs)} outputs -> {out_dir} ({seconds:.1f}s)"
    )
    # Platform stacks: firm vs elastic GPUs and what the queues promise (nothing for teams).
    for renderable in capacity_renderables(plan.outputs):
        console.print(renderable)


def print_policy_report(plan: Plan) -> None:
    if not plan.violations:
        console.print("policy: no violations")
        return
    table = Table(title=f"policy report for {plan.stack!r}")
    for column in ("rule", "level", "resource", "message and fix"):
        table.add_column(column, overflow="fold")
    for v in plan.violations:
        table.add_row(*(Text(v[key]) for key in ("rule", "level", "resource", "message")))
    console.print(table)


@app.command()
def preview(
    stacks: Annotated[
        list[str] | None, typer.Argument(help="Stack names (stacks/Pulumi.<stack>.yaml).")
    ] = None,
    out: Annotated[Path, typer.Option(help="Plans go to OUT/<stack>/.")] = Path("build"),
    project_dir: Annotated[Path, typer.Option(help="Folder with Pulumi.yaml.")] = Path("."),
    changed_since: Annotated[
        str | None, typer.Option(help="Only stacks the changes since this git ref touch.")
    ] = None,
) -> None:
    """Offline, credential-free plan of STACKS: the real program under Pulumi's mock engine."""
    if changed_since is None and not stacks:
        raise typer.BadParameter("name STACKS or pass --changed-since REF", param_hint="STACKS")
    try:
        if changed_since is not None:
            stacks = _select_changed(project_dir, changed_since, stacks)
        previewer = Previewer(Project.find(project_dir.resolve()))
        violating = []
        for stack in stacks or []:
            started = time.perf_counter()
            plan = previewer.preview(stack)
            write_plan(plan, out / stack)
            print_summary(plan, out / stack, time.perf_counter() - started)
            print_policy_report(plan)
            if plan.mandatory_violations:
                violating.append(stack)
    except (ConfigError, pulumi.RunError) as err:
        raise _fail(str(err)) from None
    if violating:
        errors.print(
            Text.assemble(
                ("policy: ", "bold red"), f"mandatory violations in {', '.join(violating)}"
            )
        )
        raise typer.Exit(EXIT_POLICY_VIOLATION)


def _validate_one(path: Path, previewer: Previewer | None, stack: str | None) -> str:
    """What `path` is, once it passed every check that applies to it (or ConfigError)."""
    if document_kind(yamlio.read(path), str(path)) == "job":
        if previewer is not None and stack is not None:
            # Schema, intrinsic, platform and mandatory policy checks, all in one report.
            manifest, issues = previewer.job_issues(stack, path)
            if issues or manifest is None:
                raise ConfigError(str(path), issues)
            return f"job {manifest['metadata']['name']}, fits stack {stack}"
        return f"job {load_job(path).name}"
    config = load_stack_file(path)
    return f"{'team' if isinstance(config, TeamStackConfig) else 'platform'} stack"


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Stack files and job specs to check.")],
    stack: Annotated[
        str | None,
        typer.Option(
            help="Also check job specs against this team stack's platform and its policies."
        ),
    ] = None,
    project_dir: Annotated[Path, typer.Option(help="Folder with Pulumi.yaml.")] = Path("."),
) -> None:
    """Check stack files and job specs against their schemas and rules; report every error."""
    failed = False
    previewer = None
    try:
        if stack is not None:
            previewer = Previewer(Project.find(project_dir.resolve()))
    except ConfigError as err:
        raise _fail(str(err)) from None
    for path in files:
        try:
            what = _validate_one(path, previewer, stack)
        except (ConfigError, pulumi.RunError) as err:
            errors.print(str(err), soft_wrap=True)
            failed = True
            continue
        console.print(f"{path}: ok ({what})", soft_wrap=True)
    if failed:
        raise typer.Exit(EXIT_USER_ERROR)


@app.command("render-job")
def render_job(
    spec: Annotated[Path, typer.Argument(help="A job spec (job_specs/<team>/<job>.yaml).")],
    stack: Annotated[str, typer.Option(help="The team stack the job belongs to.")],
    project_dir: Annotated[Path, typer.Option(help="Folder with Pulumi.yaml.")] = Path("."),
) -> None:
    """Print the exact Volcano Job the team stack would create, for use with kubectl."""
    try:
        manifest = Previewer(Project.find(project_dir.resolve())).render_job(stack, spec)
    except (ConfigError, pulumi.RunError) as err:
        raise _fail(str(err)) from None
    typer.echo(yaml.safe_dump(normalise(manifest), sort_keys=False), nl=False)


@app.command("policy-config")
def policy_config(
    stacks: Annotated[
        list[str] | None, typer.Argument(help="Stack names (default: every stack file).")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if a file is missing or stale.")
    ] = False,
    project_dir: Annotated[Path, typer.Option(help="Folder with Pulumi.yaml.")] = Path("."),
) -> None:
    """Write policies/config/STACK.json, the CrossGuard pack's --policy-pack-config, from the
    stack files (a team stack's from its platform stack)."""
    try:
        previewer = Previewer(Project.find(project_dir.resolve()))
        names = stacks or previewer.project.stacks()
        if check:
            stale = config_files.stale(previewer, names)
            orphans = [] if stacks else config_files.orphans(previewer)
            root = previewer.project.root
            for stack in stale:
                path = config_files.config_path(previewer, stack).relative_to(root)
                errors.print(f"{path}: missing or stale", soft_wrap=True)
            for path in orphans:
                errors.print(
                    f"{path.relative_to(root)}: no stack file {path.stem!r}", soft_wrap=True
                )
            if stale or orphans:
                raise _fail("policy pack config out of date; run `make policy-config`")
            console.print(f"policy pack config up to date ({len(names)} stacks)")
            return
        for path in config_files.write(previewer, names):
            console.print(f"wrote {path.relative_to(previewer.project.root)}")
        for path in [] if stacks else config_files.orphans(previewer):
            path.unlink()
            console.print(f"removed {path.relative_to(previewer.project.root)} (no stack file)")
    except (ConfigError, pulumi.RunError) as err:
        raise _fail(str(err)) from None


_register_diff(app)  # `trainstack diff`, `trainstack changed-stacks` (trainstack/diff/)


def main() -> None:
    app()
