"""The enforcer's image and package: non-root, the standard library only, and the version the
platform deploys by default is the package's. (hadolint and the multi-stage, non-root, pinned
checks of every images/*/Dockerfile: tests/runtime/test_dockerfiles.py.)"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import trainstack_deadlines

from trainstack.config.model import Deadlines

IMAGE = Path(__file__).resolve().parents[2] / "images" / "deadlines"


def test_final_stage_is_non_root_and_runs_the_cli() -> None:
    dockerfile = (IMAGE / "Dockerfile").read_text()
    final = re.split(r"(?m)^FROM ", dockerfile)[-1]
    assert re.findall(r"(?m)^USER (\S+)", final)[-1] == "10001:10001"
    assert 'ENTRYPOINT ["trainstack-deadlines"]' in final
    assert "--constraint constraints.txt" in dockerfile


def test_standard_library_only_so_nothing_to_pin() -> None:
    project = tomllib.loads((IMAGE / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == []
    assert metadata.requires("trainstack-deadlines") is None
    assert project["scripts"] == {"trainstack-deadlines": "trainstack_deadlines.cli:main"}
    pins = [
        line
        for line in (IMAGE / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert pins == []


def test_the_default_image_is_this_version() -> None:
    version = tomllib.loads((IMAGE / "pyproject.toml").read_text())["project"]["version"]
    assert trainstack_deadlines.__version__ == version
    assert Deadlines().image.endswith(f"/deadlines:{version}")
