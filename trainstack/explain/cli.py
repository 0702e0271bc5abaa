"""`trainstack explain JOB` and `trainstack status`: the thin part over a kubeconfig.

Exit codes as the rest of the CLI: 0 an answer (whatever the job's state), 1 a user error (no
kubeconfig, no such job, not allowed to read it), one clean message, no traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import pulumi
import typer
import yaml
from rich.console import Console
from rich.table import Table

from trainstack.config import ConfigError
from trainstack.config.model import TeamStackConfig
from trainstack.config.project import Project
from trainstack.explain.diagnose import diagnose, refusal
from trainstack.explain.model import Diagnosis, Platform
from trainstack.explain.read import (
    JOB,
    ExplainError,
    JobNotFound,
    Reader,
    platform_facts,
    read_live,
    team_namespace,
)
from trainstack.explain.status import job_rows
from trainstack.explain.volcano import denials
from trainstack.kube import ApiError, Kube, KubeconfigError
from trainstack.preview.engine import Previewer
from trainstack.terminal import fail

out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)

KUBECONFIG_HELP = "The kubeconfig (default: $KUBECONFIG, else ~/.kube/config)."
STACK_HELP = (
    "A platform or team stack of the project: its outputs (computed offline) give the team's "
    "namespace, queue, maximum duration and the pools' sizes."
)


def _outputs(stack: str | None, project_dir: Path) -> tuple[Mapping[str, Any], str | None]:
    """The platform's outputs and, for a team stack, its team; nothing without --stack."""
    if stack is None:
        return {}, None
    previewer = Previewer(Project.find(project_dir.resolve()))
    config, _ = previewer.load(stack)
    team = config.team if isinstance(config, TeamStackConfig) else None
    platform = config.platform_stack_name if isinstance(config, TeamStackConfig) else stack
    return previewer.preview(platform).outputs, team


def _where(
    team: str | None, namespace: str | None, stack: str | None, project_dir: Path
) -> tuple[str, Platform]:
    outputs, stack_team = _outputs(stack, project_dir)
    team = team or stack_team
    if namespace is None:
        if team is None:
            raise ExplainError("name the job's team (--team) or namespace (--namespace)")
        namespace = team_namespace(outputs, team)
    return namespace, platform_facts(outputs, team or namespace)


def _kube(kubeconfig: Path | None, context: str | None) -> Kube:
    return Kube.from_kubeconfig(kubeconfig, context)


# What a user can fix, each as one message: their input, their credentials, the cluster they
# named (an unreachable one is kube.Unreachable, an OSError).
USER_ERRORS = (
    ExplainError,
    KubeconfigError,
    ConfigError,
    pulumi.RunError,
    ApiError,
    LookupError,
    OSError,
)


def described(error: Exception) -> str:
    if isinstance(error, ApiError):
        return f"the API server answered {error.status} {error.reason}: {error.message}"
    if isinstance(error, LookupError):  # discovery: no Volcano on that cluster
        return f"{error}: is this the platform's cluster (Volcano installed)? check --context"
    if isinstance(error, OSError):
        return f"cannot reach the API server: {error}"
    return str(error)


def render(diagnosis: Diagnosis) -> list[str]:
    """The answer as the terminal shows it."""
    lines = [diagnosis.summary]
    lines += [f"  {d}" for d in diagnosis.details]
    if diagnosis.fix:
        lines.append(f"what to do: {diagnosis.fix}")
    if diagnosis.limits:
        unread = ", ".join(diagnosis.limits)
        lines.append(f"not checked, not readable with these credentials: {unread}")
    return lines


def explain(
    job: Annotated[str, typer.Argument(help="The Volcano Job's name (the training job's).")],
    *,
    team: Annotated[str | None, typer.Option(help="The job's team.")] = None,
    namespace: Annotated[
        str | None, typer.Option(help="The job's namespace (default: the team's).")
    ] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help=KUBECONFIG_HELP)] = None,
    context: Annotated[str | None, typer.Option(help="The kubeconfig context.")] = None,
    stack: Annotated[str | None, typer.Option(help=STACK_HELP)] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            help="The job's Volcano Job manifest (`trainstack render-job`): when the job is "
            "not in the cluster, a server-side dry run says whether admission refuses it."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    project_dir: Annotated[Path, typer.Option(help="Folder with Pulumi.yaml.")] = Path("."),
) -> None:
    """Why JOB is not running, in the platform's terms: its queue, the health gate, its pool's
    nodes, admission or its maximum duration (docs/explain.md)."""
    try:
        ns, platform = _where(team, namespace, stack, project_dir)
        reader = Reader(_kube(kubeconfig, context))
        try:
            diagnosis = diagnose(read_live(reader, ns, job), platform)
        except JobNotFound:
            if file is None:
                raise
            diagnosis = dry_run(reader.kube, file, ns, job)
    except USER_ERRORS as error:
        raise fail(described(error)) from None
    if as_json:
        out.print(json.dumps(asdict(diagnosis)))
    else:
        for line in render(diagnosis):
            out.print(line)


def dry_run(kube: Kube, file: Path, namespace: str, name: str) -> Diagnosis:
    """Create the manifest with dryRun=All: admission judges it, nothing is stored."""
    try:
        manifest = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ExplainError(f"{file}: cannot read a manifest: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != "Job":
        raise ExplainError(
            f"{file}: not a Volcano Job manifest (`trainstack render-job` prints it)"
        )
    manifest.setdefault("metadata", {}).update({"name": name, "namespace": namespace})
    try:
        kube.create(manifest, dry_run=True)
    except ApiError as error:
        refused = denials(error.message)
        if refused:
            return refusal(f"{namespace}/{name}", refused[0])
        raise
    raise ExplainError(
        f"no Volcano Job {name} in namespace {namespace}, and admission accepts {file}: it "
        "was never submitted (or was deleted); submit it"
    )


def status(
    *,
    team: Annotated[str | None, typer.Option(help="The team.")] = None,
    namespace: Annotated[
        str | None, typer.Option(help="The team's namespace (default: the team's).")
    ] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help=KUBECONFIG_HELP)] = None,
    context: Annotated[str | None, typer.Option(help="The kubeconfig context.")] = None,
    stack: Annotated[str | None, typer.Option(help=STACK_HELP)] = None,
    project_dir: Annotated[Path, typer.Option(help="Folder with Pulumi.yaml.")] = Path("."),
) -> None:
    """A team's jobs: state, age, GPUs and attempts."""
    try:
        ns, _ = _where(team, namespace, stack, project_dir)
        reader = Reader(_kube(kubeconfig, context))
        try:
            jobs = reader.list(*JOB, ns)
        except ApiError as error:
            if error.status in (401, 403):
                raise ExplainError(
                    f"not allowed to list Volcano Jobs in namespace {ns}: use a kubeconfig of "
                    "a member of the team"
                ) from None
            raise
    except USER_ERRORS as error:
        raise fail(described(error)) from None
    rows = job_rows(jobs, time.time())
    if not rows:
        out.print(f"no jobs in namespace {ns}")
        return
    table = Table(title=f"jobs in {ns}")
    for column in ("name", "state", "age", "GPUs", "attempts"):
        table.add_column(column, justify="right" if column in ("GPUs", "attempts") else "left")
    for row in rows:
        table.add_row(row.name, row.state, row.age, str(row.gpus), str(row.attempts))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("explain")(explain)
    app.command("status")(status)
