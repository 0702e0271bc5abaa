"""Job specs: typical mistakes each yield precise errors; valid specs load and render."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from trainstack.config import ConfigError
from trainstack.jobs.checks import platform_issues
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.spec import (
    advice,
    cpu_millis,
    intrinsic_issues,
    load_job,
    memory_bytes,
    parse_job,
)
from trainstack.preview.plan import Plan

INVALID = sorted((Path(__file__).parent / "fixtures" / "invalid").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "job_specs").glob("*/*.yaml"))
DEMO = ROOT / "job_specs" / "vision" / "demo-train.yaml"


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


# -- behaviours stated one at a time (issue 25) ------------------------------------------------


def demo_doc(**spec: Any) -> dict[str, Any]:
    """The seed example as a document, with `spec` keys replaced."""
    doc: dict[str, Any] = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    doc["spec"] |= copy.deepcopy(spec)
    return doc


def intrinsic(doc: dict[str, Any]) -> list[str]:
    return [str(i) for i in intrinsic_issues(doc)]


def test_the_seed_example_has_no_intrinsic_issue() -> None:
    assert intrinsic(demo_doc()) == []


@pytest.mark.parametrize(
    ("cpu", "memory", "limits", "problem"),
    [
        ("2", "16Gi", {"cpu": "2000m", "memory": "16Gi"}, None),
        ("2000m", "16Gi", {"cpu": "2"}, None),
        ("1.5", "16Gi", {"cpu": "1500m"}, None),
        ("2001m", "16Gi", {"cpu": "2"}, "limits.cpu: limit 2 is below the request 2001m"),
        ("2", "1Ti", {"memory": "1024Gi"}, None),
        ("2", "1024Gi", {"memory": "1Ti"}, None),
        ("2", "1Ti", {"memory": "1023Gi"}, "limits.memory: limit 1023Gi is below the request 1Ti"),
        ("2", "16Gi", {"memory": "16383Mi"}, "limits.memory: limit 16383Mi is below the request"),
    ],
    ids=[
        "cpu-m-limit",
        "cpu-m-request",
        "cpu-decimal",
        "cpu-below",
        "ti-request",
        "ti-limit",
        "gi-below-ti",
        "mi-below-gi",
    ],
)
def test_limits_compare_with_requests_in_any_unit(
    cpu: str, memory: str, limits: dict[str, str], problem: str | None
) -> None:
    """A limit equal to its request is the usual case, however each is written ("2" and
    "2000m" are one CPU count, 1Ti is 1024Gi); only a limit truly below its request is an
    error (Kubernetes refuses such a pod)."""
    workers = {**demo_doc()["spec"]["workers"], "cpu": cpu, "memory": memory, "limits": limits}
    found = intrinsic(demo_doc(workers=workers, sharedMemory="1Gi"))
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1
        assert found[0].startswith("job.spec.workers." + problem.split(":")[0]), found
        assert problem.split(": ", 1)[1] in found[0]


def test_quantities_are_read_exactly() -> None:
    assert cpu_millis("2") == cpu_millis("2000m") == 2000
    assert cpu_millis("0.5") == 500
    assert memory_bytes("1Ti") == memory_bytes("1024Gi") == 2**40
    assert memory_bytes("1Gi") == 1024 * memory_bytes("1Mi") == 2**30
    assert memory_bytes("1Ki") == 1024


@pytest.mark.parametrize(("interval", "ok"), [(86399, True), (86400, False), (86401, False)])
def test_the_first_checkpoint_comes_before_the_deadline(interval: int, ok: bool) -> None:
    """maxDurationHours 24 is 86,400 s: a checkpoint interval of that or more means the job is
    stopped before it ever checkpoints."""
    doc = demo_doc(checkpoint={"intervalSeconds": interval, "keep": 3}, maxDurationHours=24)
    found = intrinsic(doc)
    assert (found == []) is ok, found
    if not ok:
        assert found[0].startswith("job.spec.checkpoint.intervalSeconds: ")


@pytest.mark.parametrize("interval", [0, "0", 59])
def test_a_checkpoint_interval_under_a_minute_is_refused(interval: object, tmp_path: Path) -> None:
    """An interval of 0 (or "0") would ask for a checkpoint at every step: the schema wants an
    integer of at least 60 seconds."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(demo_doc(checkpoint={"intervalSeconds": interval})))
    spec, found = parse_job(path)
    assert spec is None
    assert [str(i).split(":")[0] for i in found] == ["job.spec.checkpoint.intervalSeconds"]


@pytest.mark.parametrize(("shm", "ok"), [("15Gi", True), ("16Gi", False), ("16384Mi", False)])
def test_shared_memory_must_fit_below_the_memory_limit(shm: str, ok: bool) -> None:
    """/dev/shm counts against the container's memory: all of it for shm leaves nothing for
    the trainer, so shm equal to the limit is refused like shm above it."""
    found = intrinsic(demo_doc(sharedMemory=shm))
    assert (found == []) is ok, found
    if not ok:
        assert found == [
            f"job.spec.sharedMemory: {shm} of /dev/shm does not fit in the workers' memory "
            "limit 16Gi (shared memory counts against it); lower it or raise the memory"
        ]


def test_job_labels_are_kept_and_sorted(tmp_path: Path) -> None:
    """A spec's own labels reach the typed spec (the renderer puts them on the Job and every
    pod, tests/jobs/test_render.py); trainstack's reserved ones are refused instead."""
    doc = demo_doc()
    doc["metadata"]["labels"] = {"project": "imagenet", "cost-centre": "cv"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    spec = load_job(path)
    assert spec.labels == (("cost-centre", "cv"), ("project", "imagenet"))
    doc["metadata"]["labels"] = {"trainstack.io/team": "nlp", "app.kubernetes.io/managed-by": "me"}
    assert intrinsic(doc) == [
        "job.metadata.labels.trainstack.io/team: is set by trainstack on every job and pod; a "
        "value here would be replaced, so remove it or use a key outside trainstack.io/",
        "job.metadata.labels.app.kubernetes.io/managed-by: is set by trainstack on every job "
        "and pod; a value here would be replaced, so remove it or use a key outside "
        "trainstack.io/",
    ]


@pytest.mark.parametrize(
    ("priority", "topology", "warned"),
    [
        ("high", {"mode": "hard", "tier": "pool"}, True),
        ("critical", {"mode": "soft", "tier": "zone"}, True),
        ("normal", {"mode": "hard", "tier": "pool"}, False),  # documented, not warned
        ("preemptible", {"mode": "hard", "tier": "pool"}, False),
        ("high", None, False),  # preempts as its class promises
    ],
)
def test_advice_warns_only_where_a_priority_meant_to_preempt_cannot(
    tmp_path: Path, priority: str, topology: dict[str, str] | None, warned: bool
) -> None:
    """issue 39 #4: Volcano v1.15.1 skips preemptors with networkTopology (preempt.go
    Execute); a high or critical job with one is valid but told so, nothing else is."""
    doc = yaml.safe_load((ROOT / "job_specs" / "vision" / "embeddings-ps.yaml").read_text())
    doc["spec"]["priority"] = priority
    doc["spec"].pop("topology", None)
    if topology is not None:
        doc["spec"]["topology"] = topology
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    notes = advice(load_job(path))
    if warned:
        [note] = notes
        assert note.startswith(f"spec.priority: {priority!r} with spec.topology: Volcano never")
        assert 'Drop spec.topology if it must preempt (docs/scheduling.md, "Topology")' in note
    else:
        assert notes == []
