"""The real Pulumi engine, offline: the CLI and the Kubernetes provider that toolchain.py builds,
a file backend, a passphrase secrets provider, and a Python program in a project directory.

Nothing is fetched: `PULUMI_HOME` is a fresh directory, the provider is installed into it from
the built binary (`pulumi plugin install ... -f`), and automatic plugin acquisition is off, so a
missing plugin is an error, never a download. Every CLI call runs in its own process group under
a timeout; on expiry the whole group (CLI, provider, program) is killed and the call fails with
its output, so a run fails loudly instead of hanging.

The Python language host is the one piece not built: the module proxy reachable here refuses
`github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3` (403 for its version list,
`@latest` and every pseudo-version tried), so the CLI cannot start a `runtime: python` program
itself (see docs/testing.md, "The Pulumi engine (toolchain)"). `run` therefore drives the
project's `__main__.py` as the Python SDK's Automation API runs an inline program: the SDK serves
the LanguageRuntime protocol from the driver process and the CLI (`pulumi up --client=...`)
talks to it directly. The engine, the provider, the state and the CLI commands are the real
ones; only the language host's job (starting the interpreter) is done by the SDK instead.

    python -m tests.e2e.pulumi_engine PROJECT_DIR STACK up|preview|destroy [--expect-no-changes]

prints one JSON line (change counts, outputs) as its last line; run it with `Engine.env()`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto

from trainstack.sandbox import toolchain

PASSPHRASE = "trainstack-e2e"  # the file backend's secrets; the state lives in a temp dir
_CLI_ROOT = "TRAINSTACK_E2E_PULUMI_ROOT"


class EngineError(RuntimeError):
    """A CLI call that failed or timed out, with what it printed."""


def sdk_plugin_version(package: str = "pulumi_kubernetes") -> str:
    """The provider version a Python provider SDK asks the engine for (its pulumi-plugin.json)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise LookupError(f"{package} is not installed")
    info = json.loads((Path(spec.origin).parent / "pulumi-plugin.json").read_text())
    return str(info["version"])


@dataclass
class Engine:
    """One offline Pulumi installation: the built CLI, its own PULUMI_HOME, a file backend."""

    cli: Path
    root: Path  # holds home/ (PULUMI_HOME) and state/ (the file backend)

    @classmethod
    def create(cls, root: Path, tools: Mapping[str, Path] | None = None) -> Engine:
        tools = tools or toolchain.locate("pulumi")
        root.mkdir(parents=True, exist_ok=True)
        engine = cls(tools["pulumi"], root)
        engine.home.mkdir(exist_ok=True)
        engine.state.mkdir(exist_ok=True)
        return engine

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def backend_url(self) -> str:
        return f"file://{self.state}"

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            # Nothing from the developer's own Pulumi setup: no token, backend, home or plugins.
            if not k.startswith(("PULUMI_", "KUBECONFIG"))
        }
        env |= {
            "PULUMI_HOME": str(self.home),
            "PULUMI_BACKEND_URL": self.backend_url,
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            # Plugins only from PULUMI_HOME: not whatever `pulumi-resource-*` is on PATH.
            "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
            # Where the driver (`run`) finds the CLI: PulumiCommand(root=...) wants bin/pulumi.
            _CLI_ROOT: str(self._cli_root()),
        }
        return env

    def _cli_root(self) -> Path:
        link = self.root / "cli" / "bin" / "pulumi"
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(self.cli)
        return link.parent.parent

    def pulumi(self, *args: str, cwd: Path | None = None, timeout: float = 120) -> str:
        """Run the CLI non-interactively; its stdout, or EngineError with everything it said."""
        return _run([str(self.cli), *args, "--non-interactive"], self.env(), cwd, timeout)

    def install_plugin(self, kind: str, name: str, version: str, binary: Path) -> None:
        """Install a local binary as plugin `name` `version`, as if downloaded (no network)."""
        self.pulumi("plugin", "install", kind, name, version, "--file", str(binary))

    def plugins(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = json.loads(self.pulumi("plugin", "ls", "--json"))
        return listed

    def new_project(
        self, directory: Path, name: str, program: str, stack: str, config: Mapping[str, str]
    ) -> Path:
        """A Python project (Pulumi.yaml, __main__.py) and an initialised stack with `config`."""
        directory.mkdir(parents=True, exist_ok=True)
        project = {
            "name": name,
            # What a language host would read: the interpreter of this virtualenv. (Unused by
            # `run`, whose driver is already that interpreter; see the module docstring.)
            "runtime": {"name": "python", "options": {"virtualenv": sys.prefix}},
            "backend": {"url": self.backend_url},
        }
        (directory / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
        (directory / "__main__.py").write_text(program)
        self.pulumi("stack", "init", stack, cwd=directory)
        for key, value in config.items():
            self.pulumi("config", "set", "--stack", stack, key, value, cwd=directory)
        return directory

    def run(
        self,
        project: Path,
        stack: str,
        command: str,
        *,
        expect_no_changes: bool = False,
        timeout: float = 300,
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """`pulumi up|preview|destroy` of `project`'s program: the driver's JSON result, and
        `log`, the file with what the CLI printed."""
        argv = [sys.executable, "-m", "tests.e2e.pulumi_engine", str(project), stack, command]
        if expect_no_changes:
            argv.append("--expect-no-changes")
        repo = Path(__file__).resolve().parents[2]
        logs = self.root / "logs"  # the CLI's progress of each run, in order
        logs.mkdir(exist_ok=True)
        log = logs / f"{len(list(logs.iterdir())) + 1:02d}-{command}.log"
        out = _run(argv, self.env() | {"PYTHONPATH": str(repo), **(env or {})}, repo, timeout, log)
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result | {"log": str(log)}


def _run(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | None,
    timeout: float,
    log: Path | None = None,
) -> str:
    """`argv`'s stdout; its stderr (the CLI's progress, for `run`) also goes to `log`."""
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills the plugins too
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            if log:
                log.write_text(err)
            raise EngineError(
                f"`{' '.join(argv[:4])} ...` still running after {timeout:.0f} s; killed\n"
                f"stdout:\n{out}\nstderr:\n{err}"
            ) from None
    if log:
        log.write_text(err)
    if process.returncode:
        raise EngineError(
            f"`{' '.join(argv)}` exited {process.returncode}\nstdout:\n{out}\nstderr:\n{err}"
        )
    return out


# -- the driver: run in its own process by Engine.run ------------------------------------------


def _drive(project: Path, stack_name: str, command: str, expect_no_changes: bool) -> dict[str, Any]:
    def program() -> None:
        # As the language host runs a program: from its directory (trainstack's finds the
        # job specs there).
        os.chdir(project)
        runpy.run_path(str(project / "__main__.py"), run_name="__main__")

    # An inline program (program and project_name given) whose workspace is the project
    # directory: its Pulumi.yaml and stack settings are the ones read and written.
    stack = auto.select_stack(
        stack_name,
        project_name=yaml.safe_load((project / "Pulumi.yaml").read_text())["name"],
        program=program,
        opts=auto.LocalWorkspaceOptions(
            work_dir=str(project),
            pulumi_home=os.environ["PULUMI_HOME"],
            # Its version check runs `pulumi version`: the version ldflag at work.
            pulumi_command=auto.PulumiCommand(os.environ[_CLI_ROOT]),
        ),
    )

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if command == "up":
        up = stack.up(expect_no_changes=expect_no_changes or None, on_output=echo)
        return {
            "changes": up.summary.resource_changes or {},
            "outputs": {k: v.value for k, v in up.outputs.items()},
        }
    if command == "preview":
        preview = stack.preview(expect_no_changes=expect_no_changes or None, on_output=echo)
        return {"changes": dict(preview.change_summary)}
    if command == "destroy":
        destroy = stack.destroy(on_output=echo)
        return {"changes": destroy.summary.resource_changes or {}}
    raise SystemExit(f"unknown command {command!r}")


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--expect-no-changes"]
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    project, stack, command = args
    result = _drive(Path(project).resolve(), stack, command, "--expect-no-changes" in argv)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
