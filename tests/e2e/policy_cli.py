"""The real Pulumi CLI runs the trainstack CrossGuard pack (issue 19 #1), offline.

Two things stand in for pieces this machine lacks (docs/testing.md, "The policy pack under
the real CLI"):

- **The language host.** `pulumi preview --policy-pack policies` makes the CLI ask the Python
  language host to start the pack (pkg/v3@v3.274.0 resource/plugin/plugin.go ExecPlugin), and
  no `pulumi-language-python` can be built here. The CLI has a second way to start a pack:
  given the path of an *executable file*, NewPolicyAnalyzer (resource/plugin/
  analyzer_plugin.go) launches it directly, as it launches a provider, with the engine's
  address as its argument, and reads its port from stdout. `launcher` writes such a file: a
  shell script that performs the language host's command for the pack folder, computed by
  the same code the fast test uses (tests/policy/language_host.py `command`): the
  virtualenv's python, `-u -m pulumi.policy <the CLI's arguments> <pack folder>`, run in the
  pack folder, the environment activated with the CLI's own values winning. What it does
  not do is what the host does around that command: its policy proxy, which adds
  PULUMI_PROJECT, PULUMI_STACK, PULUMI_DRY_RUN and PULUMI_CONFIG to the pack's environment
  (the pack reads none of them; its settings come through Configure) and relays the
  Analyzer calls. Everything after the launch is the CLI's own: GetAnalyzerInfo, the
  --policy-pack-config file reconciled with the pack's schema, Configure, Analyze per
  resource at step generation, AnalyzeStack at the end, the policy events and the failed
  preview on a mandatory finding.
- **The program.** A Python program runs under the Automation API's inline mode, as in
  tests/e2e/pulumi_engine.py (the language host again). It registers the Kubernetes
  resources of a trainstack preview plan, with their Pulumi names, types and inputs, through
  an explicit Kubernetes provider that renders YAML (`renderYamlToDirectory`), so no cluster
  is needed and the provider's Check still runs as it would.

    python -m tests.e2e.policy_cli PROJECT STACK PACK CONFIG

runs `pulumi preview --policy-pack PACK --policy-pack-config CONFIG` on PROJECT's stack and
prints one JSON line: {"failed": bool, "policy": [policy events], "error": str}.
"""

from __future__ import annotations

import json
import os
import runpy
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pulumi import automation as auto

from tests.e2e import pulumi_engine
from tests.e2e.pulumi_engine import Engine
from tests.policy import language_host

RESOURCES = "resources.json"  # beside the program: [type, name, inputs] per resource
PROGRAM = '''\
"""The resources of a trainstack plan, as they are, through a provider that renders YAML."""

import json
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

here = Path(__file__).resolve().parent
provider = k8s.Provider(
    "render", render_yaml_to_directory=str(here / "rendered")
)
for rtype, name, inputs in json.loads((here / "resources.json").read_text()):
    pulumi.CustomResource(
        rtype, name, inputs, opts=pulumi.ResourceOptions(provider=provider)
    )
'''
_ARGS = "\0args\0"  # where the CLI's arguments go in the host's command


def launcher(folder: Path, pack: Path) -> Path:
    """An executable that starts `pack` as the Python language host's RunPlugin would.

    PulumiPolicy.yaml is copied beside it: NewPolicyAnalyzer reads one next to a binary pack,
    when present, for the pack's version and description, as it does for a folder."""
    folder.mkdir(parents=True, exist_ok=True)
    host = language_host.command(pack, [_ARGS], {})
    argv = " ".join('"$@"' if a == _ARGS else shlex.quote(a) for a in host.argv)
    # The host appends the CLI's environment after the activated one and the last value
    # wins: a variable the CLI has keeps its value (PATH), one it lacks gets the host's.
    exports = "\n".join(
        f'export {key}="${{{key}:-{value}}}"' for key, value in sorted(host.env.items())
    )
    script = folder / "trainstack-policy-pack"
    script.write_text(
        "#!/bin/sh\n"
        "# The Python language host's command for the trainstack pack (tests/e2e/policy_cli.py)\n"
        f"{exports}\n"
        f"cd {shlex.quote(str(host.cwd))} || exit 1\n"
        f"exec {argv}\n"
    )
    script.chmod(0o755)
    shutil.copy(pack / "PulumiPolicy.yaml", folder / "PulumiPolicy.yaml")
    return script


def new_project(
    engine: Engine,
    directory: Path,
    stack: str,
    resources: Sequence[tuple[str, str, Mapping[str, Any]]],
) -> Path:
    project = engine.new_project(directory, "trainstack-policy-e2e", PROGRAM, stack, {})
    (project / RESOURCES).write_text(json.dumps([list(r) for r in resources]))
    return project


def preview(
    engine: Engine,
    project: Path,
    stack: str,
    pack: Path,
    config: Path,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`pulumi preview` of the project with the pack; the driver's result, and `log`."""
    argv = [sys.executable, "-m", "tests.e2e.policy_cli"]
    argv += [str(project), stack, str(pack), str(config)]
    repo = Path(__file__).resolve().parents[2]
    log = engine.root / "logs" / f"policy-{stack}.log"
    log.parent.mkdir(exist_ok=True)
    env = engine.env() | {"PYTHONPATH": str(repo), **(env or {})}
    out = pulumi_engine._run(argv, env, repo, timeout, log)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result | {"log": str(log)}


# -- the driver: run in its own process by `preview` --------------------------------------------


def _drive(project: Path, stack_name: str, pack: str, config: str) -> dict[str, Any]:
    def program() -> None:
        # As the language host runs a program: from its directory (trainstack's finds the
        # job specs there).
        os.chdir(project)
        runpy.run_path(str(project / "__main__.py"), run_name="__main__")

    # An inline program in the project directory's workspace: what auto.select_stack builds
    # from program, project_name and work_dir (pulumi_engine._drive), written out.
    workspace = auto.LocalWorkspace(
        work_dir=str(project),
        program=program,
        pulumi_home=os.environ["PULUMI_HOME"],
        pulumi_command=auto.PulumiCommand(os.environ["TRAINSTACK_E2E_PULUMI_ROOT"]),
    )
    stack = auto.Stack.select(stack_name, workspace)
    events: list[dict[str, Any]] = []

    def on_event(event: auto.EngineEvent) -> None:
        found = event.policy_event
        if found is not None:
            events.append(
                {
                    "policy": found.policy_name,
                    "pack": found.policy_pack_name,
                    "urn": found.resource_urn or "",
                    "level": found.enforcement_level,
                    "message": found.message,
                }
            )

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        stack.preview(
            policy_packs=[pack],
            policy_pack_configs=[config],
            on_event=on_event,
            on_output=echo,
        )
    except auto.CommandError as error:  # a mandatory finding fails the preview
        return {"failed": True, "policy": events, "error": str(error)}
    return {"failed": False, "policy": events, "error": ""}


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    project, stack, pack, config = argv
    print(json.dumps(_drive(Path(project).resolve(), stack, pack, config)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
