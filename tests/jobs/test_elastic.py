"""Elastic jobs (issue 43): the spec's range, the Volcano Job it renders, what updates in place
and what the diff shows. Volcano's behaviour behind each rendered field is cited in
trainstack/jobs/elastic.py and proved on the real scheduler by tests/e2e/test_guarantees.py."""

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
    # Volcano starts the job once minAvailable pods fit: the rendezvous pod and `min` workers,
    # each task's own minimum keeping its part of the gang.
    assert manifest["spec"]["minAvailable"] == 3
    assert tasks(manifest) == {"rendezvous": (1, 1), "worker": (4, 2)}
    smaller = render(resized(spec, 2, 4, size=3), view, "vision")
    assert tasks(smaller) == {"rendezvous": (1, 1), "worker": (3, 2)}
    assert smaller["spec"]["minAvailable"] == 3
    # Done once the minimum's workers are, whatever waits above it.
    assert manifest["spec"]["minSuccess"] == 2
    assert "minSuccess" not in render(load_job(DEMO), view, "vision")["spec"]


def test_a_size_of_one_is_one_worker_beside_the_store(view: PlatformView) -> None:
    spec = resized(load_job(ELASTIC), 1, 4, size=1)
    manifest = render(spec, view, "vision")
    assert tasks(manifest) == {"rendezvous": (1, 1), "worker": (1, 1)}
    assert manifest["spec"]["minAvailable"] == 2


def test_the_workers_rendezvous_on_the_store_of_a_pod_of_its_own(view: PlatformView) -> None:
    spec = load_job(ELASTIC)
    manifest = render(spec, view, "vision")
    worker = env(manifest, "worker")
    assert worker["PET_NNODES"] == "2:4"
    assert worker["PET_RDZV_BACKEND"] == "c10d"
    assert worker["PET_RDZV_ENDPOINT"] == "elastic-pretrain-rendezvous-0.elastic-pretrain:23456"
    assert worker["TRAINSTACK_RDZV_STORE_HOST"] == "0"  # no worker hosts it, rank 0 included
    # A lost worker restarts the others in their pods: the spec's failures and preemptions
    # are the budget.
    assert worker["TRAINSTACK_MAX_RESTARTS"] == str(spec.max_retries + spec.max_preemptions)
    # No pytorch plugin: its MASTER_ADDR/WORLD_SIZE/RANK would count pods, stale on a resize.
    assert set(manifest["spec"]["plugins"]) == {"svc", "env"}


def test_the_store_is_a_small_cpu_pod_that_volcano_never_preempts(view: PlatformView) -> None:
    """Volcano v1.15.1 leaves a pod annotated `volcano.sh/preemptable: "false"` off every
    preempt and reclaim victim list (api/pod_info.go GetPodPreemptable; reclaim.go,
    preempt.go); the policy allows that only on a one-replica CPU pod within its bounds."""
    spec = load_job(ELASTIC)
    manifest = render(spec, view, "vision")
    store = next(t for t in manifest["spec"]["tasks"] if t["name"] == "rendezvous")
    pod = store["template"]
    assert pod["metadata"]["annotations"]["volcano.sh/preemptable"] == "false"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == [
        "python", "-m", "trainstack_runtime.rendezvous", "--port", "23456",
    ]  # fmt: skip
    assert container["image"] == spec.image  # the runtime ships in the job's image
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    assert container["livenessProbe"]["tcpSocket"] == {"port": 23456}
    assert not any(m["name"] in ("data", "dataset") for m in container["volumeMounts"])
    # The workers are not exempt: reclaim takes them back.
    worker = next(t for t in manifest["spec"]["tasks"] if t["name"] == "worker")
    assert "volcano.sh/preemptable" not in worker["template"]["metadata"]["annotations"]


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
    assert "pytorch" in manifest["spec"]["plugins"]


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


def test_every_worker_plans_the_same_elastic_world_on_the_store(view: PlatformView) -> None:
    """The runtime's own planning (trainstack_runtime topology.node_plan), run on each worker
    pod's environment as Volcano's plugins complete it."""
    manifest = render(load_job(ELASTIC), view, "vision")
    job = manifest["metadata"]["name"]
    plans = {}
    (worker,) = (t for t in manifest["spec"]["tasks"] if t["name"] == "worker")
    for index in range(worker["replicas"]):
        pod = f"{job}-worker-{index}"
        environ = volcano_env(manifest, worker, index)
        assert "WORLD_SIZE" not in environ
        plans[pod] = restartable(node_plan(environ, gpus=_gpus(worker), hostname=pod), 13)
    assert len(plans) == 4
    assert {p.num_nodes for p in plans.values()} == {(2, 4)}
    assert {p.rdzv_backend for p in plans.values()} == {"c10d"}
    assert {p.node_rank for p in plans.values()} == {None}  # ranks come from the rendezvous
    assert {p.store_host for p in plans.values()} == {False}
    # The store's pod, by the name Volcano's svc plugin gives it in the job's Service.
    assert {p.rdzv_endpoint for p in plans.values()} == {f"{job}-rendezvous-0.{job}:23456"}


def test_a_lost_worker_restarts_its_pod_and_a_fatal_code_still_ends_the_job(
    view: PlatformView,
) -> None:
    """Volcano acts on the first matching policy, the task's before the job's: the worker
    task's list must keep the job's order, fatal codes first (a `PodFailed` catch-all above
    them would turn a user error into endless pod restarts)."""
    manifest = render(load_job(ELASTIC), view, "vision")
    store, worker = manifest["spec"]["tasks"]
    assert "policies" not in store  # the store: the job's policies restart all
    job_policies = manifest["spec"]["policies"]
    assert len(worker["policies"]) == len(job_policies)
    for mine, jobs in zip(worker["policies"], job_policies, strict=True):
        assert {k: v for k, v in mine.items() if k != "action"} == {
            k: v for k, v in jobs.items() if k != "action"
        }
        whole = jobs.get("exitCode") == ExitCode.BELOW_MINIMUM
        expected = "RestartPod" if jobs["action"] == "RestartJob" and not whole else jobs["action"]
        assert mine["action"] == expected
    actions = {p.get("event", p.get("exitCode")): p["action"] for p in worker["policies"]}
    assert actions["PodEvicted"] == actions["PodFailed"] == "RestartPod"
    assert actions[int(ExitCode.USER_ERROR)] == "AbortJob"
    assert actions[int(ExitCode.DEADLINE_EXCEEDED)] == "TerminateJob"
    # Below the minimum the workers left restart with the whole job, as a gang.
    assert actions[int(ExitCode.BELOW_MINIMUM)] == "RestartJob"
    last_code = max(i for i, p in enumerate(worker["policies"]) if "exitCode" in p)
    first_event = min(i for i, p in enumerate(worker["policies"]) if "event" in p)
    assert last_code < first_event
