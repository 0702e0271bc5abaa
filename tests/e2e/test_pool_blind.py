"""Pool-blind queues (issue 46 #5), on Volcano's real scheduler, in both queue modes.

Volcano's queues do not know pools. Reclaim takes a pod from another team's queue only while
that queue is above its fair share (v1.15.1 capacity.go reclaimableFn, checkDeservedExceedance;
proportion.go reclaimableFn), whatever node the pod sits on; a reclaimer looks for victims
only on the nodes it fits (actions/reclaim/reclaim.go reclaimForTask), so a team confined to
one pool waits while a team within its share holds that pool, even with GPUs free elsewhere.

The platform here is prod with two pools of 2 nodes x 8 GPUs, both firm: pool-a and pool-b.
`wide` may use both, `narrow` pool-a alone; each is guaranteed 8. In the `pool-blind`
arrangement `wide` deserves 16 (hierarchical) or its share follows its demand (flat): it can
hold all of pool-a within its share. In the `borrowing` arrangement `wide` deserves 8 (its
guarantee) and borrows up to 24: what it holds on pool-a above 8 is borrowed, and reclaim
returns it. The capacity checker warns about the first (trainstack/config/capacity.py,
`pool_blind`) and not the second; docs/scheduling.md, "What a guarantee does not cover".
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e import jobs
from tests.e2e.conftest import Deployed, deploy_stack
from trainstack.builders.fabric import GPU_RESOURCE
from trainstack.config import capacity
from trainstack.config.project import Project
from trainstack.kube import wait_for
from trainstack.preview.engine import Previewer
from trainstack.sandbox.cluster import ControlPlane

POOLS = ("pool-a", "pool-b")
WAIT = 20  # seconds the confined team's job is watched: twenty scheduling periods (1 s)


def _pool(name: str, reservation: str) -> dict[str, Any]:
    return {
        "name": name,
        "instanceType": "p5.48xlarge",
        "fabric": "efa",
        "availabilityZone": "us-east-1a",
        "capacity": {"type": "reservation", "reservationId": reservation, "instanceCount": 2},
        "size": {"min": 2, "desired": 2, "max": 2},
    }


def pool_blind_values(prod: dict[str, Any], mode: str, arrangement: str) -> dict[str, Any]:
    """prod with pools pool-a and pool-b (16 firm GPUs each) and teams wide and narrow."""
    values = copy.deepcopy(prod)
    platform = values["config"]["trainstack:platform"]
    platform["scheduling"] = {**platform.get("scheduling", {}), "queueMode": mode}
    platform["gpuPools"] = [
        _pool("pool-a", "cr-0a0a0a0a0a0a0a0a0"),
        _pool("pool-b", "cr-0b0b0b0b0b0b0b0b0"),
    ]
    if mode == "flat":
        wide = {"gpus": 8, "borrowLimit": 16}  # a share that follows demand, up to 24
    elif arrangement == "pool-blind":
        wide = {"gpus": 8, "deserved": 16, "borrowLimit": 8}
    else:
        wide = {"gpus": 8, "deserved": 8, "borrowLimit": 16}
    owners = ["platform@example.com"]
    platform["registry"] = {
        "groups": [],
        "teams": [
            {"name": "wide", "owners": owners, "quota": wide},
            {"name": "narrow", "owners": owners, "quota": {"gpus": 8}, "pools": ["pool-a"]},
        ],
    }
    alerting = platform["monitoring"]["alertmanager"]
    alerting["receivers"] = [r for r in alerting["receivers"] if "teams" not in r]
    return values


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Previewer:
    folder = tmp_path_factory.mktemp("stacks")
    prod = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text(encoding="utf-8"))
    for mode, arrangement in [
        ("hierarchical", "pool-blind"),
        ("flat", "pool-blind"),
        ("hierarchical", "borrowing"),
    ]:
        values = pool_blind_values(prod, mode, arrangement)
        (folder / f"Pulumi.{arrangement}-{mode}.yaml").write_text(yaml.safe_dump(values))
    return Previewer(Project(ROOT, Path(folder)))


@pytest.fixture(scope="module", params=["hierarchical", "flat"])
def blind(
    request: pytest.FixtureRequest, control_plane: ControlPlane, stacks: Previewer
) -> Iterator[Deployed]:
    deployed = deploy_stack(control_plane, stacks, f"pool-blind-{request.param}")
    assert deployed.cfg.scheduling.queue_mode == request.param
    yield deployed
    _clear(deployed)


@pytest.fixture(scope="module")
def borrowing(control_plane: ControlPlane, stacks: Previewer) -> Iterator[Deployed]:
    deployed = deploy_stack(control_plane, stacks, "borrowing-hierarchical")
    yield deployed
    _clear(deployed)


def _clear(platform: Deployed) -> None:
    for job in platform.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(platform, job)


def _free(platform: Deployed, pool: str) -> int:
    """GPUs of the pool's nodes that no running pod of any team holds."""
    held = 0
    for pod in platform.kube.list("v1", "Pod"):
        node = pod["spec"].get("nodeName") or ""
        if node.startswith(f"{pool}-") and pod.get("status", {}).get("phase") == "Running":
            for container in pod["spec"]["containers"]:
                held += int(container["resources"].get("requests", {}).get(GPU_RESOURCE, 0))
    return jobs.pool_gpus(platform, pool) - held


def _fill(platform: Deployed, team: str, pool: str, gpus: int) -> list[dict[str, Any]]:
    """The team runs `gpus` GPUs on the pool in 8-GPU jobs, and asks for nothing more."""
    made = []
    for index in range(gpus // 8):
        spec = jobs.spec(team, f"{team}-{pool}-{index}", pool=pool, gpus=8)
        made.append(jobs.rendered(platform, spec))
        jobs.submit(platform, made[-1])
    for job in made:
        jobs.wait_running(platform, job, timeout=60)
    return made


def _unschedulable(group: dict[str, Any] | None) -> str | None:
    """The scheduler's reason a PodGroup waits, once it has recorded one."""
    for condition in (group or {}).get("status", {}).get("conditions", []):
        if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
            return str(condition.get("message", ""))
    return None


def test_a_team_within_its_share_keeps_the_confined_teams_pool(blind: Deployed) -> None:
    """wide runs 16 GPUs on pool-a, within its fair share; narrow asks for 8 of its
    guarantee on pool-a, its only pool. It waits, with pool-b's 16 GPUs free, until one of
    wide's jobs ends; nothing reclaims or moves wide's pods. The checker's worst case is the
    one measured: wide may hold all 16 of pool-a, narrow is left 0 of its 8."""
    guarantee = jobs.queue_gpus(blind, "narrow", "guarantee")
    pool_a = jobs.pool_gpus(blind, "pool-a")
    held = _fill(blind, "wide", "pool-a", pool_a)
    if blind.cfg.scheduling.queue_mode == "hierarchical":
        assert pool_a <= jobs.queue_gpus(blind, "wide", "deserved"), "wide within its share"
    else:  # the proportion plugin's share follows demand while the cluster has room
        assert pool_a + guarantee <= sum(jobs.pool_gpus(blind, p) for p in POOLS)

    waiting = jobs.rendered(blind, jobs.spec("narrow", "confined", pool="pool-a", gpus=8))
    jobs.submit(blind, waiting)
    since = time.monotonic()
    assert jobs.stays_unscheduled(blind, waiting, seconds=WAIT) == []
    group = jobs.podgroup(blind, waiting)
    assert group is not None
    assert group.get("status", {}).get("phase") in ("Pending", "Inqueue"), group.get("status")
    reason = _unschedulable(group)
    assert reason is not None, group.get("status")
    assert jobs.running_gpus(blind, "narrow") == 0
    assert jobs.running_gpus(blind, "wide", "pool-a-") == pool_a, "nothing was reclaimed"
    assert _free(blind, "pool-b") == jobs.pool_gpus(blind, "pool-b")
    # The checker's worst case (trainstack/config/capacity.py, pool_blind) is what happened.
    [exposure] = capacity.pool_blind(blind.cfg)
    assert (exposure.team, [k.team for k in exposure.keepers]) == ("narrow", ["wide"])
    assert exposure.kept == jobs.running_gpus(blind, "wide", "pool-a-") == pool_a
    assert exposure.left == _free(blind, "pool-a") == 0

    # The wait ends when one of wide's jobs on pool-a does (at most its maxDurationHours).
    jobs.delete(blind, held[0])
    jobs.wait_running(blind, waiting, timeout=60)
    print(
        f"{blind.cfg.scheduling.queue_mode}: narrow waited {time.monotonic() - since:.0f} s "
        f"with {jobs.pool_gpus(blind, 'pool-b')} GPUs free on pool-b ({reason!r})"
    )


def test_a_borrowing_team_is_reclaimed_on_the_confined_pool(borrowing: Deployed) -> None:
    """wide deserves 8 (its guarantee) and borrows the rest: holding all of pool-a it is
    above its share, so reclaim takes one of its jobs there for narrow's guarantee, and wide
    keeps its share. The checker has nothing to warn about."""
    assert capacity.pool_blind(borrowing.cfg) == []
    guarantee = jobs.queue_gpus(borrowing, "narrow", "guarantee")
    deserved = jobs.queue_gpus(borrowing, "wide", "deserved")
    pool_a = jobs.pool_gpus(borrowing, "pool-a")
    _fill(borrowing, "wide", "pool-a", pool_a)
    assert jobs.running_gpus(borrowing, "wide") > deserved, "wide should be borrowing"

    confined = jobs.rendered(borrowing, jobs.spec("narrow", "confined", pool="pool-a", gpus=8))
    since = time.monotonic()
    jobs.submit(borrowing, confined)
    wait_for(
        f"narrow running its {guarantee} guaranteed GPUs on pool-a",
        lambda: jobs.running_gpus(borrowing, "narrow", "pool-a-") >= guarantee,
        timeout=90,
    )
    print(f"borrowing: reclaim gave narrow its guarantee in {time.monotonic() - since:.0f} s")
    assert jobs.running_gpus(borrowing, "wide") >= deserved
