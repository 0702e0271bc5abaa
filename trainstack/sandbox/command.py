"""`trainstack sandbox up|down|status`: the local sandbox's command line (see `local`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainstack.config import ConfigError
from trainstack.config.project import Project
from trainstack.preview.engine import Previewer
from trainstack.sandbox import local
from trainstack.sandbox.toolchain import MissingTools
from trainstack.terminal import err, fail, out

sandbox = typer.Typer(
    help="A local cluster to try trainstack on: a real kube-apiserver, Volcano and simulated "
    "GPU nodes on 127.0.0.1, with a platform stack and its team stacks deployed (the e2e "
    "suite's control plane).",
    no_args_is_help=True,
)


def _say(text: str) -> None:
    err.print(text, soft_wrap=True)


@sandbox.command("up")
def up_command(
    stack: Annotated[str, typer.Argument(help="The platform stack to deploy.")] = "prod",
    *,
    jobs: Annotated[
        bool, typer.Option("--jobs/--no-jobs", help="Also deploy its team stacks' jobs.")
    ] = True,
    project_dir: Annotated[
        Path, typer.Option(help="Folder with Pulumi.yaml, or a folder below it.")
    ] = Path(),
) -> None:
    """Start the control plane (building its tools on first use: about 15 minutes on 2
    cores, then cached), deploy STACK and the team stacks on it, and print the kubeconfig.
    The processes keep running until `trainstack sandbox down`."""
    try:
        previewer = Previewer(Project.find(project_dir))
        state = local.up(previewer, stack, _say, jobs=jobs)
    except (local.SandboxError, ConfigError, MissingTools) as error:
        raise fail(str(error)) from None
    for job in state.jobs:
        _say(f"  created job {job}")
    _say(f"sandbox of {state.stack} up at {state.server}; to use it:")
    # stdout is only the export line, so `eval "$(trainstack sandbox up)"` works.
    out.print(f"export KUBECONFIG={state.kubeconfig}", soft_wrap=True)


@sandbox.command("down")
def down_command() -> None:
    """Stop the sandbox's processes and remove its folder (its cluster's state with it)."""
    if local.down(_say):
        _say("sandbox down")
    else:
        _say(f"no sandbox is up (no state in {local.home()})")


@sandbox.command("status")
def status_command() -> None:
    """Whether a sandbox is up: its stack, API server, kubeconfig and processes."""
    state = local.State.read(local.home())
    if state is None:
        raise fail(f"no sandbox is up (no state in {local.home()}); `trainstack sandbox up`")
    alive = local.running(state)
    dead = sorted(set(state.pids) - set(alive))
    out.print(f"stack {state.stack}, API server {state.server}", soft_wrap=True)
    out.print(f"export KUBECONFIG={state.kubeconfig}", soft_wrap=True)
    if dead:
        raise fail(f"not running: {', '.join(dead)}; `trainstack sandbox down`, then up")


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox, name="sandbox")
