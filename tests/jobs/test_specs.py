"""Job specs: typical mistakes each yield precise errors; valid specs load and render."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainstack.config import ConfigError
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import platform_issues
from trainstack.jobs.spec import load_job, parse_job
from trainstack.preview.plan import Plan

INVALID = sorted((Path(__file__).parent / "fixtures" / "invalid").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "job_specs").glob("*/*.yaml"))


def expected(path: Path) -> set[str]:
    return set(re.findall(r"^# expect: (.+)$", path.read_text(), re.MULTILINE))


def is_platform_case(path: Path) -> bool:
    return "# check: platform" in path.read_text()


def test_there_are_at_least_fifteen_typical_mistakes() -> None:
    assert len(INVALID) >= 15


def every_issue(path: Path, view: PlatformView) -> set[str]:
    """All a user is told in one run: schema, intrinsic and platform problems together."""
    try:
        spec, issues = parse_job(path)
    except ConfigError as err:  # not YAML
        return {str(i) for i in err.issues}
    if spec is not None:
        issues += platform_issues(spec, view, "vision")
    return {str(i) for i in issues}


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_mistake_is_reported_precisely(path: Path, example_plans: dict[str, Plan]) -> None:
    want = expected(path)
    assert want, f"{path.name} has no '# expect:' line"
    view = PlatformView(example_plans["prod"].outputs)
    assert every_issue(path, view) == want
    if is_platform_case(path):
        return
    with pytest.raises(ConfigError) as caught:  # found without a platform too
        load_job(path)
    assert {str(i) for i in caught.value.issues} == want


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_load_and_fit_their_platform(path: Path, example_plans: dict[str, Plan]) -> None:
    spec = load_job(path)
    view = PlatformView(example_plans["prod"].outputs)
    assert platform_issues(spec, view, spec.team) == []


def test_seed_example_is_expressible() -> None:
    spec = load_job(ROOT / "job_specs" / "vision" / "demo-train.yaml")
    assert (spec.workers.replicas, spec.workers.gpus) == (2, 1)
    assert (spec.workers.resources.cpu, spec.workers.resources.memory) == ("4", "16Gi")
    assert spec.workers.gpu_memory == "8Gi"
    assert (spec.checkpoint.interval_seconds, spec.checkpoint.keep) == (600, 3)
    assert "/demo-train:2025Q1@sha256:" in spec.image  # production takes digests
    assert spec.command == ("python", "-m", "train.main")
    assert spec.args == ("--epochs=20", "--batch-size=128")
    assert dict(spec.env) == {"LEARNING_RATE": "0.001"}
    assert spec.data is not None
    assert (spec.data.version, spec.data.mount_path) == ("v20250401", "/mnt/data")
    assert spec.max_retries == 3
