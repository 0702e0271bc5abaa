"""A job on a sliced pool (issue 47): the seed example on prod's MIG pool, and the rules that
keep slices to the jobs they suit, as a table of specs and their messages."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from tests.conftest import ROOT
from trainstack.config import ConfigError
from trainstack.jobs.elastic import WorkerRange
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import JobSpec, load_job
from trainstack.policy.isolation import shared_gpus
from trainstack.policy.objects import Config
from trainstack.preview.plan import Plan
from trainstack.slices import time_slices

SEED = ROOT / "job_specs" / "vision" / "demo-train.yaml"
MIG = "nvidia.com/mig-1g.10gb"


@pytest.fixture
def view(example_plans: dict[str, Plan]) -> PlatformView:
    return PlatformView(example_plans["prod"].outputs)


def time_shared(view: PlatformView) -> PlatformView:
    """prod, with h100-slices time-shared 4 ways instead of cut by MIG."""
    outputs = copy.deepcopy(dict(view.outputs))
    for pool in outputs["gpuPools"]:
        if pool["name"] == "h100-slices":
            pool["slices"] = [s.to_json() for s in time_slices(4, 85.9)]
    return PlatformView(outputs)


def seed(**workers: Any) -> JobSpec:
    spec = dataclasses.replace(load_job(SEED), pool="h100-slices")
    return dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, **workers))


def limits(job: dict[str, Any]) -> list[dict[str, str]]:
    return [
        t["template"]["spec"]["containers"][0]["resources"]["limits"] for t in job["spec"]["tasks"]
    ]


def test_the_seed_example_on_the_mig_pool_asks_for_a_1g_slice(view: PlatformView) -> None:
    """8Gi of GPU memory on an all-1g.10gb H100 pool: one nvidia.com/mig-1g.10gb per replica,
    no whole GPU, no EFA, one process per replica."""
    job = render(seed(), view, "vision")
    assert limits(job) == [{"cpu": "4", "memory": "16Gi", MIG: "1"}] * 2
    for task in job["spec"]["tasks"]:
        container = task["template"]["spec"]["containers"][0]
        assert container["resources"]["requests"] == container["resources"]["limits"]
        assert "--nproc-per-node" in container["command"]
        assert container["command"][container["command"].index("--nproc-per-node") + 1] == "1"
    assert "trainstack.io/shared-gpus" not in job["metadata"]["annotations"]


SHARED = "time-shared"
REFUSED = [
    (
        "memory no slice holds",
        "mig",
        {"gpu_memory": "40Gi"},
        "job.spec.workers.gpuMemory: 40Gi fits no slice of pool h100-slices (1g.10gb (10 GB)); "
        "pools that hold it: h100-block (whole GPUs), h100-reserved (whole GPUs), h200-burst "
        "(whole GPUs)",
    ),
    (
        "no gpuMemory on a sliced pool",
        "mig",
        {"gpu_memory": None},
        "job.spec.workers.gpuMemory: required on pool h100-slices, whose GPUs are cut into slices",
    ),
    (
        "two GPUs per replica",
        "mig",
        {"gpus": 2},
        "job.spec.workers.gpus: 2 GPUs per replica, but pool h100-slices has no whole GPUs",
    ),
    (
        "more slices than the pool holds",
        "mig",
        {"replicas": 40, "scale": WorkerRange(40, 40, 40)},
        "job.spec.workers: 40 1g.10gb slices need 6 nodes but pool h100-slices has at most 4",
    ),
    (
        "a distributed job on time-shared GPUs",
        SHARED,
        {},
        "job.spec.workers.replicas: 2 replicas on pool h100-slices's time-shared GPUs",
    ),
]


@pytest.mark.parametrize(
    ("case", "kind", "workers", "message"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_what_a_sliced_pool_refuses(
    case: str, kind: str, workers: dict[str, Any], message: str, view: PlatformView
) -> None:
    del case
    target = time_shared(view) if kind == SHARED else view
    with pytest.raises(ConfigError) as error:
        render(seed(**workers), target, "vision")
    assert message in str(error.value)


def test_a_spec_may_allow_a_distributed_job_on_time_shared_gpus(view: PlatformView) -> None:
    """workers.sharedGpus: the job renders, with the annotation the shared-gpus rule reads,
    and the rule passes it (and refuses it without)."""
    job = render(seed(shared_gpus=True), time_shared(view), "vision")
    assert limits(job)[0]["nvidia.com/gpu.shared"] == "1"
    assert job["metadata"]["annotations"]["trainstack.io/shared-gpus"] == "allow"
    assert shared_gpus(job, Config()) == []
    del job["metadata"]["annotations"]["trainstack.io/shared-gpus"]
    assert shared_gpus(job, Config()) == [
        "2 containers ask for time-shared GPUs (nvidia.com/gpu.shared) without "
        "trainstack.io/shared-gpus: allow on the Job: NCCL across processes that take turns on "
        "a GPU fails or crawls"
    ]


def test_one_replica_on_a_time_shared_gpu_needs_nothing_more(view: PlatformView) -> None:
    spec = seed(replicas=1, scale=WorkerRange(1, 1, 1))
    job = render(spec, time_shared(view), "vision")
    assert shared_gpus(job, Config()) == []


def test_a_team_holds_a_gpus_worth_of_slices_per_gpu_of_capability(view: PlatformView) -> None:
    """Capability 1 GPU: 7 1g.10gb slices, as the queue's capability names them
    (builders/scheduling.pools_shape); an 8-replica gang could never start."""
    outputs = dict(view.outputs)
    team = json.loads(outputs["team/vision"])  # a team's slice travels as JSON text
    team["scheduling"]["gpus"]["capability"] = 1
    capped = PlatformView({**outputs, "team/vision": json.dumps(team)})
    render(seed(replicas=7, scale=WorkerRange(7, 7, 7)), capped, "vision")
    with pytest.raises(ConfigError) as error:
        render(seed(replicas=8, scale=WorkerRange(8, 8, 8)), capped, "vision")
    assert (
        "job.spec.workers: 8 x 1 = 8 1g.10gb slices exceeds team vision's capability of 7 "
        "1g.10gb slices (1 GPUs x 7 per GPU)"
    ) in str(error.value)
