"""Elastic jobs (issue 43): the spec's range, the Volcano Job it renders, what updates in place
and what the diff shows. Volcano's behaviour behind each rendered field is cited in
trainstack/jobs/elastic.py and proved on the real scheduler by tests/e2e/test_elastic.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from trainstack_runtime.contract import ExitCode
from trainstack_runtime.topology import node_plan, restartable

from tests.conftest import ROOT
from tests.jobs.test_topology import _gpus, volcano_env
from trainstack.diff.sections import jobs_section
from trainstack.jobs.checks import platform_issues
from trainstack.jobs.elastic import WorkerRange, worker_range
from trainstack.jobs.lifecycle import replacement_key
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import JobSpec, load_job
from trainstack.preview.plan import Plan

ELASTIC = ROOT / "job_specs" / "vision" / "elastic-pretrain.yaml"
DEMO = ROOT / "job_specs" / "vision" / "demo-train.yaml"


@pytest.fixture
def view(example_plans: dict[str, Plan]) -> PlatformView:
    return PlatformView(example_plans["prod"].outputs)


def resized(spec: JobSpec, lo: int, hi: int, size: int | None = None) -> JobSpec:
    scale = WorkerRange(lo, hi, hi if size is None else size)
    return dataclasses.replace(
        spec, workers=dataclasses.replace(spec.workers, replicas=scale.size, scale=scale)
    )


def tasks(manifest: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {t["name"]: (t["replicas"], t["minAvailable"]) for t in manifest["spec"]["tasks"]}


def env(manifest: dict[str, Any], task: str) -> dict[str, str]:
    t = next(t for t in manifest["spec"]["tasks"] if t["name"] == task)
    return {e["name"]: e["value"] for e in t["template"]["spec"]["containers"][0]["env"]
            if "value" in e}  # fmt: skip


def test_a_number_is_a_fixed_gang() -> None:
    scale = worker_range(3)
    assert (scale.min, scale.max, scale.size, scale.elastic) == (3, 3, 3, False)
    assert worker_range({"min": 2, "max": 8}) == WorkerRange(2, 8, 8)  # size: max by default
    assert worker_range({"min": 2, "max": 8, "size": 4}) == WorkerRange(2, 8, 4)


def test_the_gang_is_the_minimum_and_the_job_asks_for_its_size(view: PlatformView) -> None:
    spec = load_job(ELASTIC)
    assert spec.workers.scale == WorkerRange(2, 4, 4)
    manifest = render(spec, view, "vision")
    # Volcano starts the job once minAvailable pods fit; the master's pod is one of them, and
    # the worker task's own minimum keeps the rest of the gang (min - 1) among its pods.
    assert manifest["spec"]["minAvailable"] == 2
    assert tasks(manifest) == {"master": (1, 1), "worker": (3, 1)}
    smaller = render(resized(spec, 2, 4, size=3), view, "vision")
    assert tasks(smaller) == {"master": (1, 1), "worker": (2, 1)}
    assert smaller["spec"]["minAvailable"] == 2


def test_a_size_of_one_keeps_the_worker_task(view: PlatformView) -> None:
    """Adding a task later would be refused by Volcano's update webhook: resizing from one
    worker must stay an in-place update."""
    spec = resized(load_job(ELASTIC), 1, 4, size=1)
    manifest = render(spec, view, "vision")
    assert tasks(manifest) == {"master": (1, 1), "worker": (0, 0)}
    assert manifest["spec"]["minAvailable"] == 1


def test_the_rendezvous_is_elastic_and_hosted_by_the_master(view: PlatformView) -> None:
    spec = load_job(ELASTIC)
    manifest = render(spec, view, "vision")
    master, worker = env(manifest, "master"), env(manifest, "worker")
    for pod in (master, worker):
        assert pod["PET_NNODES"] == "2:4"
        assert pod["PET_RDZV_BACKEND"] == "c10d"
        assert pod["PET_RDZV_ENDPOINT"] == "elastic-pretrain-master-0.elastic-pretrain:23456"
        # A lost worker restarts the others in their pods: the spec's failures and
        # preemptions are the budget.
        assert pod["TRAINSTACK_MAX_RESTARTS"] == str(spec.max_retries + spec.max_preemptions)
    assert (master["TRAINSTACK_RDZV_STORE_HOST"], worker["TRAINSTACK_RDZV_STORE_HOST"]) == (
        "1",
        "0",
    )


def test_the_authors_env_cannot_break_the_rendezvous(view: PlatformView) -> None:
    spec = load_job(ELASTIC)
    spec = dataclasses.replace(spec, env=(("PET_NNODES", "4"), ("PET_RDZV_BACKEND", "static")))
    pod = env(render(spec, view, "vision"), "worker")
    assert (pod["PET_NNODES"], pod["PET_RDZV_BACKEND"]) == ("2:4", "c10d")


def test_a_fixed_job_renders_as_before(view: PlatformView) -> None:
    manifest = render(load_job(DEMO), view, "vision")
    assert tasks(manifest) == {"master": (1, 1), "worker": (1, 1)}
    assert manifest["spec"]["minAvailable"] == 2
    assert not any(k.startswith("PET_") for k in env(manifest, "worker"))


def test_size_changes_in_place_and_the_range_replaces(view: PlatformView) -> None:
    spec = load_job(ELASTIC)
    key = replacement_key(render(spec, view, "vision")["spec"])
    assert replacement_key(render(resized(spec, 2, 4, size=3), view, "vision")["spec"]) == key
    # min and max are torchrun's --nnodes in the pods' environment, which Volcano never
    # updates in place.
    assert replacement_key(render(resized(spec, 3, 4), view, "vision")["spec"]) != key
    assert replacement_key(render(resized(spec, 2, 3), view, "vision")["spec"]) != key


def test_the_maximum_must_fit_the_teams_capability(view: PlatformView) -> None:
    spec = load_job(ELASTIC)
    small = dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, gpus=1))
    issues = {str(i) for i in platform_issues(resized(small, 2, 70), view, "vision")}
    assert (
        "job.spec.workers: max 70 x 1 = 70 GPUs exceeds team vision's capability of 64 GPUs "
        "(quota deserved + borrowLimit of vision in the platform stack's registry); the "
        "workers above it could never start: set max to at most 64, or ask the platform team "
        "to raise the quota"
    ) in issues


def _plan(manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "resources": [
            {"type": "kubernetes:batch.volcano.sh/v1alpha1:Job", "name": "j", "inputs": manifest}
        ]
    }


def test_the_diff_shows_a_range_and_a_resize(view: PlatformView) -> None:
    spec = load_job(ELASTIC)
    before = render(resized(spec, 2, 4, size=3), view, "vision")
    after = render(spec, view, "vision")
    (added,) = jobs_section({"resources": []}, _plan(after))
    assert added.summary["GPUs"] == "16..32"  # the gang's minimum to what it asks for
    (changed,) = jobs_section(_plan(before), _plan(after))
    gpus = next(c for c in changed.changes if c.field == "GPUs")
    assert (gpus.before, gpus.after) == ("16..24", "16..32")


def test_every_pod_plans_the_same_elastic_world_hosted_by_the_master(
    view: PlatformView,
) -> None:
    """The runtime's own planning (trainstack_runtime topology.node_plan), run on each pod's
    environment as Volcano's plugins complete it: the PET_* range wins over the pytorch
    plugin's WORLD_SIZE and RANK, which count the pods of one size."""
    manifest = render(load_job(ELASTIC), view, "vision")
    job = manifest["metadata"]["name"]
    plans = {}
    for task in manifest["spec"]["tasks"]:
        for index in range(task["replicas"]):
            pod = f"{job}-{task['name']}-{index}"
            environ = volcano_env(manifest, task, index)
            assert environ["WORLD_SIZE"] == "4"  # the plugin's, stale once the job resizes
            plans[pod] = restartable(node_plan(environ, gpus=_gpus(task), hostname=pod), 13)
    assert len(plans) == 4
    assert {p.num_nodes for p in plans.values()} == {(2, 4)}
    assert {p.rdzv_backend for p in plans.values()} == {"c10d"}
    assert {p.node_rank for p in plans.values()} == {None}  # ranks come from the rendezvous
    (host,) = (pod for pod, p in plans.items() if p.store_host)
    assert host == f"{job}-master-0"
    endpoint = next(iter(plans.values())).rdzv_endpoint
    assert endpoint == f"{host}.{job}:23456"


def test_a_lost_worker_restarts_its_pod_and_a_fatal_code_still_ends_the_job(
    view: PlatformView,
) -> None:
    """Volcano acts on the first matching policy, the task's before the job's: the worker
    task's list must keep the job's order, fatal codes first (a `PodFailed` catch-all above
    them would turn a user error into endless pod restarts)."""
    manifest = render(load_job(ELASTIC), view, "vision")
    master, worker = manifest["spec"]["tasks"]
    assert "policies" not in master  # the rendezvous host: the job's policies restart all
    job_policies = manifest["spec"]["policies"]
    assert len(worker["policies"]) == len(job_policies)
    for mine, jobs in zip(worker["policies"], job_policies, strict=True):
        assert {k: v for k, v in mine.items() if k != "action"} == {
            k: v for k, v in jobs.items() if k != "action"
        }
        expected = "RestartPod" if jobs["action"] == "RestartJob" else jobs["action"]
        assert mine["action"] == expected
    actions = {p.get("event", p.get("exitCode")): p["action"] for p in worker["policies"]}
    assert actions["PodEvicted"] == actions["PodFailed"] == "RestartPod"
    assert actions[int(ExitCode.USER_ERROR)] == "AbortJob"
    assert actions[int(ExitCode.DEADLINE_EXCEEDED)] == "TerminateJob"
    last_code = max(i for i, p in enumerate(worker["policies"]) if "exitCode" in p)
    first_event = min(i for i, p in enumerate(worker["policies"]) if "event" in p)
    assert last_code < first_event
