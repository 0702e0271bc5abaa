"""trainstack installs the way users install it (issue 20 #1, #2): `make packaging`, in CI.

From a copy of the checkout as a fresh clone has it (tracked and unignored files only):

- `python -m build` makes an sdist and a wheel without a warning, with an SPDX license
  expression, one top-level package and its package data;
- the wheel, installed alone in a virtualenv outside the checkout, previews and validates a
  copy of the example project (stacks/, job_specs/, Pulumi.yaml, __main__.py) without torch or
  any image package, and its plan is the golden one;
- `pulumi install` (the Python language host's InstallDependencies, performed step by step by
  tests/policy/language_host.py `install_commands`, with its upstream citations) makes the
  project's .venv with exactly the platform's distributions, in which the same preview runs.

Slow (two environments, a few minutes with a warm pip cache) and needs PyPI or that cache, so
deselected by default: `pytest -m packaging`.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.policy import language_host

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "tests" / "goldens"
EXAMPLE_PROJECT = ("stacks", "job_specs", "Pulumi.yaml", "__main__.py")
# Distributions that must never be in the platform's environment.
FORBIDDEN = {"torch", "trainstack-runtime", "trainstack-deadlines", "trainstack-prewarm"}
# What InstallDependencies adds to every environment it makes (pip.go InstallDependencies).
INSTALLER_TOOLS = {"pip", "setuptools", "wheel"}


def _environ() -> dict[str, str]:
    """The test's environment without what would leak the checkout into a child process."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(
    argv: Sequence[str | Path], cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=dict(env if env is not None else _environ()),
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, (
        f"{' '.join(map(str, argv))} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result


def _distributions(python: Path) -> dict[str, str]:
    listed = json.loads(_run([python, "-m", "pip", "list", "--format=json"], python.parent).stdout)
    return {re.sub(r"[-_.]+", "-", d["name"]).lower(): d["version"] for d in listed}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout as a fresh clone has it: tracked and unignored files, no .venv, no build/."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    target = tmp_path_factory.mktemp("clone") / "trainstack"
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_symlink():  # as git checks one out: a link (trainstack/components)
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).symlink_to(os.readlink(source))
        elif source.is_file():  # a file deleted but not yet committed is listed too
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def dist(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(sdist, wheel, build output) from `python -m build` in the clone."""
    out = tmp_path_factory.mktemp("dist")
    result = _run([sys.executable, "-m", "build", "--outdir", out, clone], clone)
    (sdist,) = out.glob("trainstack-*.tar.gz")
    (wheel,) = out.glob("trainstack-*-py3-none-any.whl")
    return sdist, wheel, result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel_env(dist: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv outside the checkout with the wheel alone installed; its python."""
    venv = tmp_path_factory.mktemp("wheel-env") / "venv"
    _run([sys.executable, "-m", "venv", venv], venv.parent)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", dist[1]], venv.parent)
    return python


def _example_project(target: Path) -> Path:
    for name in EXAMPLE_PROJECT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name)
        else:
            shutil.copy2(source, target / name)
    return target


def _preview_matches_golden(trainstack: Path, project: Path) -> None:
    """`trainstack preview dev` in `project` writes the golden plan; validate accepts all."""
    _run([trainstack, "preview", "dev"], project)
    plan = project / "build" / "dev" / "plan.json"
    assert plan.read_text(encoding="utf-8") == (GOLDENS / "dev.plan.json").read_text("utf-8")
    files = sorted(str(p.relative_to(project)) for p in project.glob("stacks/Pulumi.*.yaml"))
    files += sorted(str(p.relative_to(project)) for p in project.glob("job_specs/*/*.yaml"))
    assert len(files) > 4, files
    _run([trainstack, "validate", *files], project)


def test_build_is_clean(dist: tuple[Path, Path, str]) -> None:
    sdist, wheel, output = dist
    warnings = [line for line in output.splitlines() if re.search(r"(?i)warn|deprecat", line)]
    assert warnings == []
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"trainstack-{wheel.name.split('-')[1]}.dist-info"
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        top_level = archive.read(f"{info}/top_level.txt").decode().split()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License"] is None
    assert not [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    assert top_level == ["trainstack"]
    assert {n.split("/")[0] for n in names} == {"trainstack", info}
    # The top-level components/ folder, through the trainstack/components link (issue 38).
    components = {p.name for p in (ROOT / "components").glob("*.py")}
    assert components
    assert {f"trainstack/components/{name}" for name in components} <= set(names)
    data = {
        str(p.relative_to(ROOT))
        for pattern in ("trainstack/schemas/*.json", "trainstack/data/*")
        for p in ROOT.glob(pattern)
    }
    assert data
    assert data <= set(names)
    requires = metadata.get_all("Requires-Dist") or []
    assert not [r for r in requires if "extra ==" not in r and r.startswith("torch")]
    with tarfile.open(sdist) as archive:
        members = [m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name]
    assert "pyproject.toml" in members
    assert not [m for m in members if m.startswith("tests")]


def test_wheel_runs_alone_outside_the_checkout(
    wheel_env: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    installed = _distributions(wheel_env)
    assert "trainstack" in installed
    assert FORBIDDEN.isdisjoint(installed), sorted(FORBIDDEN & set(installed))
    _run([wheel_env, "-m", "pip", "check"], wheel_env.parent)
    where = _run(
        [
            wheel_env,
            "-c",
            "import importlib.util as u, trainstack;"
            "print(trainstack.__file__); print(u.find_spec('torch'))",
        ],
        wheel_env.parent,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(wheel_env.parent.parent), where
    assert where[1] == "None", "torch is importable in the platform's environment"
    project = _example_project(tmp_path_factory.mktemp("project"))
    _preview_matches_golden(wheel_env.parent / "trainstack", project)


def test_pulumi_install_makes_the_project_environment(clone: Path, wheel_env: Path) -> None:
    assert not (clone / ".venv").exists()
    for step in language_host.install_commands(clone, _environ()):
        _run(step.argv, step.cwd, step.env)
    python = clone / ".venv" / "bin" / "python"
    project_env = _distributions(python)
    platform = _distributions(wheel_env)
    # Exactly the platform's distributions at the same versions; only the installer's own
    # tools may differ (upgraded in place by InstallDependencies).
    assert {k: v for k, v in project_env.items() if k not in INSTALLER_TOOLS} == {
        k: v for k, v in platform.items() if k not in INSTALLER_TOOLS
    }
    _run([python, "-m", "pip", "check"], clone)
    # Editable: the program runs the clone's trainstack, as `pulumi up` would.
    origin = _run([python, "-c", "import trainstack; print(trainstack.__file__)"], Path("/"))
    assert Path(origin.stdout.strip()).is_relative_to(clone / "trainstack")
    _preview_matches_golden(clone / ".venv" / "bin" / "trainstack", clone)
