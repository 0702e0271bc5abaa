"""How the Pulumi CLI starts a directory policy pack, as steps a test can perform.

No Python language host (`pulumi-language-python`) is built here (docs/testing.md, "The
Python language host"), so the CLI cannot do this itself; these are its steps, read from
upstream (not copied), so that a test can do exactly what it would do:

1. The CLI. pkg/v3@v3.274.0 resource/plugin/analyzer_plugin.go NewPolicyAnalyzer loads the
   folder's PulumiPolicy.yaml; resource/plugin/plugin.go ExecPlugin (an analyzer given as a
   folder) takes its `runtime`, builds NewProgramInfo(folder, folder, ".", runtime options)
   with the folder made absolute, and calls that runtime's language host RunPlugin with Args =
   buildPluginArguments(...) (the engine's address; logging flags only with --logflow), Env =
   the CLI's environment, Kind "analyzer".
2. The Python language host. pulumi/pulumi sdk/python/cmd/pulumi-language-python/main.go
   RunPlugin (read at 1b5949891b3c, v3.259.0+14; the module is refused by the proxy at any
   version): `isPlugin := req.Kind != "analyzer"` (l. 1540), so a policy pack gets no `venv`
   default (parseOptions, l. 233-291, default at l. 285); parseOptions reads `virtualenv` and
   `toolchain`; toolchain.ResolveToolchain (l. 1545; sdk/v3@v3.274.0 python/toolchain/
   toolchain.go) uses pip for `toolchain: pip`, and for "auto" uv or Poetry when a uv.lock or
   poetry.lock is found in the pack folder or any folder above (searchup), else pip; pip
   joins a relative `virtualenv` to the pack folder (pip.go resolveVirtualEnvironmentPath) and
   runs `<virtualenv>/bin/python` (pip.go Command) with an activated environment
   (ActivateVirtualEnv: `<virtualenv>/bin` first on PATH, VIRTUAL_ENV set, PYTHONHOME
   dropped). With a __main__.py in the folder the command is `-u -m pulumi.policy <Args...>
   <folder>` (l. 1615-1617), run in the pack folder (l. 1639), not the CLI's working
   directory. Before starting it, the host's policy proxy waits for the engine's
   ConfigureStack (l. 1649) and adds PULUMI_ORGANIZATION, PULUMI_PROJECT, PULUMI_STACK,
   PULUMI_DRY_RUN and PULUMI_CONFIG (l. 1665-1674); then the CLI's environment is appended
   (l. 1679), and os/exec keeps the last value of a repeated variable, so the CLI's PATH
   wins over the activated one.
3. The SDK. pulumi 3.272.0 `pulumi/policy/__main__.py` configures the runtime from those
   variables and runs the folder's __main__.py with runpy; constructing pulumi_policy's
   PolicyPack serves the Analyzer service on 127.0.0.1 and writes its port as the first line
   of stdout, which the CLI reads (plugin.go newPlugin).

A project's own environment (`pulumi install`, and the first `pulumi preview` when it is
missing) is the same host's InstallDependencies, emulated by `install_commands` below.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml


class HostError(RuntimeError):
    """What the language host would fail with, in its words where it has them."""


@dataclass(frozen=True)
class Toolchain:
    name: str  # pip, uv or poetry
    virtualenv: Path | None  # None: the ambient python


def _searchup(folder: Path, name: str) -> Path | None:
    for candidate in (folder, *folder.parents):
        if (candidate / name).exists():
            return candidate
    return None


def runtime(pack: Path, project_file: str = "PulumiPolicy.yaml") -> tuple[str, dict[str, object]]:
    """The project file's runtime: its name and options (a bare string is a name)."""
    project = yaml.safe_load((pack / project_file).read_text())
    value = project["runtime"]
    if isinstance(value, str):
        return value, {}
    return str(value["name"]), dict(value.get("options") or {})


def resolve(pack: Path, project_file: str = "PulumiPolicy.yaml") -> Toolchain:
    """parseOptions (isPlugin false: an analyzer, or a project) and ResolveToolchain."""
    pack = pack.resolve()
    name, options = runtime(pack, project_file)
    if name != "python":
        raise HostError(f"runtime {name!r}: not the Python language host")
    virtualenv = options.get("virtualenv", "")
    if not isinstance(virtualenv, str):
        raise HostError("virtualenv option must be a string")
    chosen = options.get("toolchain", "auto")
    if chosen not in ("auto", "pip", "uv", "poetry"):
        raise HostError(f"unsupported toolchain option: {chosen}")
    if chosen == "auto":
        if _searchup(pack, "uv.lock"):
            chosen = "uv"
        elif _searchup(pack, "poetry.lock"):
            chosen = "poetry"
        else:
            chosen = "pip"
    if chosen == "poetry":
        return Toolchain("poetry", None)  # Poetry's own environment; `virtualenv` ignored
    if not virtualenv:
        return Toolchain(str(chosen), None)
    path = Path(virtualenv)
    # filepath.Join cleans `..`; the result names the folder, not a symlink's target.
    return Toolchain(str(chosen), Path(os.path.normpath(pack / path)))


@dataclass(frozen=True)
class Command:
    argv: list[str]
    cwd: Path
    env: dict[str, str]


def _activated(environ: Mapping[str, str], venv: Path) -> list[tuple[str, str]]:
    """ActivateVirtualEnv, in order (a list: the host appends, and the last value wins)."""
    result = [
        (k, f"{venv / 'bin'}{os.pathsep}{v}" if k.upper() == "PATH" else v)
        for k, v in environ.items()
        if k.upper() not in ("PYTHONHOME", "VIRTUAL_ENV")
    ]
    if not any(k.upper() == "PATH" for k, _ in result):
        result.append(("PATH", str(venv / "bin")))
    return [*result, ("VIRTUAL_ENV", str(venv))]


def command(
    pack: Path,
    args: Sequence[str],
    environ: Mapping[str, str],
    stack_configuration: Mapping[str, object] | None = None,
) -> Command:
    """The process RunPlugin starts for the pack: `args` are the CLI's (the engine address),
    `environ` the CLI's environment, `stack_configuration` what the engine's ConfigureStack
    tells the host's proxy (organization, project, stack, dry_run, config)."""
    pack = pack.resolve()
    if not (pack / "__main__.py").is_file():
        raise HostError("plugin is not runnable, it provides neither __main__.py nor ...")
    toolchain = resolve(pack)
    if toolchain.name != "pip":
        raise HostError(f"toolchain {toolchain.name}: not emulated here (the pack names pip)")
    if toolchain.virtualenv is None:
        python, env = "python3", list(environ.items())
    else:
        python = str(toolchain.virtualenv / "bin" / "python")
        env = _activated(environ, toolchain.virtualenv)
    given = stack_configuration or {}
    for key, name in (
        ("organization", "PULUMI_ORGANIZATION"),
        ("project", "PULUMI_PROJECT"),
        ("stack", "PULUMI_STACK"),
    ):
        if given.get(key):
            env.append((name, str(given[key])))
    if "dry_run" in given:
        env.append(("PULUMI_DRY_RUN", "true" if given["dry_run"] else "false"))
    if given.get("config") is not None:
        env.append(("PULUMI_CONFIG", json.dumps(given["config"])))
    env += list(environ.items())
    return Command([python, "-u", "-m", "pulumi.policy", *args, str(pack)], pack, dict(env))


def install_commands(project: Path, environ: Mapping[str, str]) -> list[Command]:
    """The processes InstallDependencies starts for a Pulumi project, in order.

    `pulumi install`, and GetRequiredPackages before the first preview or update (through
    EnsureVenv, when the `virtualenv` folder is missing or empty), call the Python language
    host's InstallDependencies (sdk/python/cmd/pulumi-language-python/main.go, read at
    1b5949891b3c) with the project's folder as both root and program directory and IsPlugin
    false. For `toolchain: pip` it calls sdk/v3@v3.274.0 python/toolchain/pip.go
    InstallDependencies(cwd = the program directory, venvDir = resolveVirtualEnvironmentPath,
    the `virtualenv` option joined to the root): `python -m venv <venvDir>` with the python that
    CommandPath finds (PULUMI_PYTHON_CMD, else python3 on PATH), then, in cwd with an activated
    environment, `<venvDir>/bin/python -m pip install --upgrade pip setuptools wheel`, and, only
    if cwd holds a requirements.txt, `... -m pip install -r requirements.txt`. pip reads paths
    in that file from its working directory, the program directory.
    """
    project = project.resolve()
    toolchain = resolve(project, "Pulumi.yaml")
    if toolchain.name != "pip":
        raise HostError(f"toolchain {toolchain.name}: not emulated here (Pulumi.yaml names pip)")
    if toolchain.virtualenv is None:
        raise HostError("no `virtualenv` option: pip would install into the ambient python")
    venv = toolchain.virtualenv
    python = environ.get("PULUMI_PYTHON_CMD") or "python3"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install"]
    activated = dict(_activated(environ, venv))
    steps = [Command([python, "-m", "venv", str(venv)], project, dict(environ))]
    steps.append(Command([*pip, "--upgrade", "pip", "setuptools", "wheel"], project, activated))
    if (project / "requirements.txt").is_file():
        steps.append(Command([*pip, "-r", "requirements.txt"], project, activated))
    return steps


def start(cmd: Command, timeout: float = 60) -> tuple[subprocess.Popen[str], int]:
    """Start the pack and read its port, as newPlugin does; the process is the caller's to end."""
    process = subprocess.Popen(
        cmd.argv,
        cwd=cmd.cwd,
        env=cmd.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        first = process.stdout.readline().strip()
    except Exception:
        process.kill()
        raise
    if not first.isdigit():
        process.kill()
        _, err = process.communicate(timeout=timeout)
        raise HostError(f"the pack printed {first!r}, not a port; stderr:\n{err}")
    return process, int(first)
