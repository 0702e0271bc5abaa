"""Fractional GPUs (issue 47) on the real control plane: MIG slices scheduled and capped by
Volcano. (The shared-gpus rule's rows run on the real API server in test_admission.py.)

The platform is prod's h100-slices pool (p5.4xlarge, one H100 cut into seven 1g.10gb MIG
instances; the simulated nodes advertise nvidia.com/mig-1g.10gb as the device plugin's
`mixed` strategy does, sandbox/nodes.py) with one team, `tiny`, whose share is 1 GPU: its
queue's capability is 7 nvidia.com/mig-1g.10gb (builders/scheduling.pools_shape), with 28
on the pool's 4 nodes. Volcano caps every resource the capability names (v1.15.1
plugins/capacity/capacity.go and proportion.go: realCapability, allocate's
LessEqualWithDimension): a job that would take the queue past 7 waits with slices free.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e import jobs
from tests.e2e.conftest import Deployed, deploy_stack
from trainstack.config import ConfigError
from trainstack.config.project import Project
from trainstack.explain import Diagnosis, Reason, diagnose
from trainstack.explain.read import Reader, platform_facts, read_live
from trainstack.kube import ApiError, wait_for
from trainstack.preview.engine import Previewer
from trainstack.sandbox.cluster import ControlPlane

POOL = "h100-slices"
SHARED_POOL = "a10g-shared"
SHARED = "nvidia.com/gpu.shared"
MIG = "nvidia.com/mig-1g.10gb"
SEED = ROOT / "job_specs" / "vision" / "demo-train.yaml"


def slices_values(prod: dict[str, Any]) -> dict[str, Any]:
    """prod with team `tiny` alone, 1 GPU of quota, on the MIG pool only."""
    values = copy.deepcopy(prod)
    platform = values["config"]["trainstack:platform"]
    # And a pool of time-shared A10Gs, solo's alone (the loader refuses one two teams reach).
    platform["gpuPools"].append(
        {
            "name": SHARED_POOL,
            "instanceType": "g5.2xlarge",
            "fabric": "tcp",
            "size": {"min": 0, "max": 2},
            "gpuSharing": {"timeSlicing": {"replicas": 4}},
        }
    )
    platform["monitoring"]["prices"].append(
        {"instanceType": "g5.2xlarge", "capacity": "onDemand", "usdPerInstanceHour": 1.212}
    )
    owners = ["platform@example.com"]
    platform["registry"] = {
        "groups": [],
        "teams": [
            # No guarantee: a sliced pool has no whole GPUs to back one (config/capacity.py);
            # a fair share of 1 GPU is 7 slices here.
            {
                "name": "tiny",
                "owners": owners,
                "quota": {"gpus": 0, "deserved": 1},
                "pools": [POOL],
            },
            {
                "name": "solo",
                "owners": owners,
                "quota": {"gpus": 0, "deserved": 2},
                "pools": [SHARED_POOL],
            },
        ],
    }
    alerting = platform["monitoring"]["alertmanager"]
    alerting["receivers"] = [r for r in alerting["receivers"] if "teams" not in r]
    return values


@pytest.fixture(scope="module")
def sliced(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    folder = tmp_path_factory.mktemp("stacks")
    prod = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text(encoding="utf-8"))
    (folder / "Pulumi.slices.yaml").write_text(yaml.safe_dump(slices_values(prod)))
    deployed = deploy_stack(control_plane, Previewer(Project(ROOT, Path(folder))), "slices")
    yield deployed
    for job in deployed.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(deployed, job)


def seed_on_slices(
    replicas: int, name: str, team: str = "tiny", pool: str = POOL
) -> dict[str, Any]:
    """The seed example (8Gi of GPU memory per replica) as `team`'s, on `pool`."""
    doc = yaml.safe_load(SEED.read_text(encoding="utf-8"))
    doc["metadata"] = {"name": name, "team": team}
    doc["spec"]["pool"] = pool
    doc["spec"]["workers"]["replicas"] = replicas
    # A GPU of quota brings a GPU's share of the node's CPUs, 16 on p5.4xlarge, for its 7
    # slices: 2 CPUs a replica keeps the slices, not the CPUs, what binds at 8 replicas.
    doc["spec"]["workers"]["cpu"] = "2"
    doc["spec"].pop("data")  # tiny has no datasets claim here; the slice is what is tested
    doc["spec"]["image"] = f"registry.example.com/{team}/e2e:1.0@sha256:{'e' * 64}"
    return doc


def slices_held(platform: Deployed) -> int:
    total = 0
    for pod in platform.kube.list("v1", "Pod", "tiny"):
        if pod.get("status", {}).get("phase") == "Running":
            for c in pod["spec"]["containers"]:
                total += int(c["resources"].get("requests", {}).get(MIG, 0))
    return total


def explained(platform: Deployed, job: dict[str, Any]) -> Diagnosis:
    """`trainstack explain` as the platform team runs it (a member's Role reads no queues)."""
    meta = job["metadata"]
    reader = Reader(platform.kube, None)
    live = read_live(reader, meta["namespace"], meta["name"])
    return diagnose(live, platform_facts(platform.plan.outputs, meta["namespace"]))


def test_the_seed_job_binds_to_mig_slices(sliced: Deployed) -> None:
    """The seed example on the MIG pool asks for one 1g.10gb instance per replica and binds
    to nodes that advertise it; the queue's capability names the slice."""
    capability = sliced.kube.get("scheduling.volcano.sh/v1beta1", "Queue", "tiny")["spec"][
        "capability"
    ]
    assert capability[MIG] == "7"
    node = sliced.kube.get("v1", "Node", f"{POOL}-0")
    assert node["status"]["allocatable"][MIG] == "7"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    job = jobs.rendered(sliced, seed_on_slices(2, "seed"))
    for task in job["spec"]["tasks"]:
        limits = task["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits[MIG] == "1"
        assert "nvidia.com/gpu" not in limits
    jobs.submit(sliced, job)
    pods = jobs.wait_running(sliced, job, timeout=60)
    assert {p["spec"]["nodeName"].rsplit("-", 1)[0] for p in pods} == {POOL}
    jobs.delete(sliced, job)


def test_the_queue_caps_its_slices(sliced: Deployed) -> None:
    """tiny holds 5 slices; a second job of 3 would make 8, above its 7: it waits with 23
    slices free on the pool, and runs once the first ends."""
    first = jobs.rendered(sliced, seed_on_slices(5, "five"))
    jobs.submit(sliced, first)
    jobs.wait_running(sliced, first, timeout=60)
    second = jobs.rendered(sliced, seed_on_slices(3, "three"))
    jobs.submit(sliced, second)
    assert jobs.stays_unscheduled(sliced, second, seconds=15) == []
    assert slices_held(sliced) == 5
    # `trainstack explain`, as a member of tiny reads it, counts the job's own slice.
    why = wait_for(
        "explain names the slice quota",
        lambda: (
            d if (d := explained(sliced, second)).reason == Reason.QUEUE_AT_CAPABILITY else None
        ),
        timeout=30,
    )
    assert why.summary == (
        "tiny/three waits: queue tiny is at its capability (5 of 7 nvidia.com/mig-1g.10gb in "
        "use, the gang needs 3 more)"
    ), why
    free = 4 * 7 - 5
    assert free >= 3, "the pool has room: only the queue stops it"
    jobs.delete(sliced, first)
    jobs.wait_running(sliced, second, timeout=60)
    assert slices_held(sliced) == 3
    jobs.delete(sliced, second)


def test_time_shared_gpus_stay_with_their_team_and_off_distributed_jobs(sliced: Deployed) -> None:
    """The way a member of another team, or one who skips the spec, would try it, on the real
    API server: tiny's job pinned to solo's time-shared pool is refused (gpu-placement: not
    one of its team's pools), and solo's two replicas without the Job's annotation are refused
    (shared-gpus); with workers.sharedGpus the job renders with it and binds there."""
    theirs = jobs.rendered(sliced, seed_on_slices(1, "intruder"))
    for task in theirs["spec"]["tasks"]:
        task["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"] = [
            {
                "matchExpressions": [
                    {"key": "trainstack.io/pool", "operator": "In", "values": [SHARED_POOL]}
                ]
            }
        ]
        res = task["template"]["spec"]["containers"][0]["resources"]
        for side in ("requests", "limits"):
            res[side][SHARED] = res[side].pop(MIG)
    with pytest.raises(ApiError, match="trainstack-rule-gpu-placement"):
        jobs.submit(sliced, theirs)

    doc = seed_on_slices(2, "pair", team="solo", pool=SHARED_POOL)
    with pytest.raises(ConfigError, match="time-shared GPUs"):
        jobs.rendered(sliced, doc)  # the job layer refuses it first
    doc["spec"]["workers"]["sharedGpus"] = True
    allowed = jobs.rendered(sliced, doc)
    stripped = copy.deepcopy(allowed)
    del stripped["metadata"]["annotations"]["trainstack.io/shared-gpus"]
    with pytest.raises(ApiError, match="trainstack-rule-shared-gpus"):
        jobs.submit(sliced, stripped)
    jobs.submit(sliced, allowed)
    pods = jobs.wait_running(sliced, allowed, timeout=60)
    assert {p["spec"]["nodeName"].rsplit("-", 1)[0] for p in pods} == {SHARED_POOL}
    jobs.delete(sliced, allowed)
