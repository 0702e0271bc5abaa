"""Scheduling with the platform's generated Volcano configuration, on prod's simulated nodes.

prod: pools h100-block (8 nodes), h100-reserved (4) and h200-burst (4), 8 GPUs each;
queues trainstack → group-research → {vision, nlp}, group-product → recsys (see the queue
manifests in build/prod). Numbers below come from the stack, not from this file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import jobs
from tests.e2e.conftest import Deployed, job_manifest
from trainstack.builders import labels
from trainstack.builders.fabric import GPU_RESOURCE
from trainstack.kube import becomes, wait_for
from trainstack.preview.engine import Previewer


@pytest.fixture
def clean(prod: Deployed) -> Iterator[Deployed]:
    yield prod
    for job in prod.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(prod, job)


def _capability(platform: Deployed, team: str) -> int:
    queue = platform.kube.get("scheduling.volcano.sh/v1beta1", "Queue", team)
    return int(queue["spec"]["capability"][GPU_RESOURCE])


def _gpus_running(platform: Deployed, team: str) -> int:
    total = 0
    for pod in platform.kube.list("v1", "Pod", team):
        if pod.get("status", {}).get("phase") == "Running" and pod["spec"].get("nodeName"):
            for container in pod["spec"]["containers"]:
                total += int(container["resources"].get("requests", {}).get(GPU_RESOURCE, 0))
    return total


def _podgroup_phase(platform: Deployed, job: dict[str, Any]) -> str:
    """The phase of the PodGroup Volcano made for `job` (named after the job and its UID)."""
    uid = jobs.live(platform, job)["metadata"]["uid"]
    for group in platform.kube.list("scheduling.volcano.sh/v1beta1", "PodGroup", "vision"):
        if any(ref.get("uid") == uid for ref in group["metadata"].get("ownerReferences", [])):
            return str(group.get("status", {}).get("phase", ""))
    return ""


def _quota_refused_pods(platform: Deployed, job: dict[str, Any]) -> bool:
    """Volcano's controller tried to create the job's pods and the ResourceQuota refused."""
    meta = job["metadata"]
    return any(
        event["reason"] == "FailedCreate" and "exceeded quota" in event["message"]
        for event in platform.kube.list(
            "v1", "Event", meta["namespace"], fields=f"involvedObject.name={meta['name']}"
        )
    )


def _node_pool(platform: Deployed, node: str) -> str:
    live = platform.kube.get("v1", "Node", node)
    return str(live["metadata"]["labels"][labels.POOL])


def test_example_jobs_gang_schedule_onto_their_pools(clean: Deployed, previewer: Previewer) -> None:
    plan = previewer.preview("vision")
    for name in ("demo-train", "embeddings-ps"):
        job = job_manifest(plan, name)
        jobs.submit(clean, job)
        pods = jobs.wait_running(clean, job, timeout=90)
        wanted = {"demo-train": "h100-reserved", "embeddings-ps": "h200-burst"}[name]
        misplaced = {
            p["metadata"]["name"]: _node_pool(clean, p["spec"]["nodeName"])
            for p in pods
            if _node_pool(clean, p["spec"]["nodeName"]) != wanted
        }
        assert not misplaced, f"{name}: pods outside {wanted}: {misplaced}"
        wait_for(f"{name}'s PodGroup Running", lambda j=job: _podgroup_phase(clean, j) == "Running")


def test_a_gang_is_never_partially_placed(clean: Deployed) -> None:
    """More replicas than the pool has nodes for: no pod gets a node, rather than some."""
    # vision's capability (64) would allow it; the pool's 4 nodes cannot hold 5 full replicas.
    job = jobs.rendered(
        clean, jobs.spec("vision", "too-wide", pool="h200-burst", replicas=4, gpus=8)
    )
    job["spec"]["tasks"][-1]["replicas"] += 1
    job["spec"]["tasks"][-1]["minAvailable"] += 1
    job["spec"]["minAvailable"] += 1
    jobs.submit(clean, job)
    assert jobs.stays_unscheduled(clean, job) == []


def test_job_above_capability_stays_pending_while_a_fitting_one_runs(clean: Deployed) -> None:
    capability = _capability(clean, "vision")
    fitting = jobs.rendered(clean, jobs.spec("vision", "fits", pool="h100-block", gpus=8))
    jobs.submit(clean, fitting)
    jobs.wait_running(clean, fitting)
    # Above the team's capability: the renderer refuses it at preview, so submit it the way a
    # kubectl user would, with the replica count raised on the rendered manifest.
    big = jobs.rendered(clean, jobs.spec("vision", "too-big", pool="h100-block", gpus=8))
    big["spec"]["tasks"][0]["replicas"] = capability // 8 + 1
    big["spec"]["tasks"][0]["minAvailable"] = capability // 8 + 1
    big["spec"]["minAvailable"] = capability // 8 + 1
    jobs.submit(clean, big)
    assert jobs.stays_unscheduled(clean, big) == []
    assert len(jobs.running_pods(clean, fitting)) == 1


def _fill(platform: Deployed, team: str, gpus: int, pool: str, prefix: str) -> list[Any]:
    """Jobs of one 8-GPU replica each, `gpus` GPUs in all, submitted at once."""
    made = []
    for index in range(gpus // 8):
        job = jobs.rendered(platform, jobs.spec(team, f"{prefix}-{index}", pool=pool, gpus=8))
        jobs.submit(platform, job)
        made.append(job)
    return made


def test_a_team_borrows_idle_gpus_up_to_its_borrow_limit(clean: Deployed) -> None:
    capability = _capability(clean, "vision")  # deserved + borrowLimit
    # Two 8-GPU jobs more than the limit allows, over both H100 pools (96 GPUs): the nodes
    # could hold them all, so only the limit can keep two waiting.
    extra = _fill(clean, "vision", 32, "h100-reserved", "borrow-reserved")
    extra += _fill(clean, "vision", capability + 16 - 32, "h100-block", "borrow")
    wait_for(
        f"vision running {capability} GPUs",
        lambda: _gpus_running(clean, "vision") == capability,
        timeout=90,
    )
    time.sleep(5)  # several more scheduling cycles: never beyond the limit
    assert _gpus_running(clean, "vision") == capability
    assert sum(1 for job in extra if not jobs.bound_pods(clean, job)) == 2


def test_higher_priority_preempts_lower_inside_a_queue(clean: Deployed) -> None:
    """Issue 15 #6: with a namespace ResourceQuota at the queue's capability the API refused
    the urgent job's pods, so Volcano never saw a preemptor."""
    capability = _capability(clean, "vision")
    low = _fill(clean, "vision", capability, "h100-block", "low")
    wait_for(
        "vision full with normal-priority work",
        lambda: _gpus_running(clean, "vision") == capability,
        timeout=90,
    )
    urgent = jobs.rendered(
        clean, jobs.spec("vision", "urgent", pool="h100-block", gpus=8, priority="high")
    )
    jobs.submit(clean, urgent)
    if not becomes(lambda: len(jobs.running_pods(clean, urgent)) == 1, 60):
        assert not _quota_refused_pods(clean, urgent), "the ResourceQuota refused urgent's pods"
        jobs.wait_running(clean, urgent, timeout=1)
    running_low = sum(1 for job in low if jobs.running_pods(clean, job))
    assert running_low == len(low) - 1, "exactly one normal job should have made room"


def test_two_jobs_over_quota_never_both_hold_partial_gangs(clean: Deployed) -> None:
    """Submitted together, two jobs that each take three quarters of the team's quota: one
    runs whole, the other holds no node (its pods, if created, stay unbound), and a third job
    that fits what is left runs too.

    Issue 15 #6: with a namespace ResourceQuota at the queue's capability, the waiting job's
    pending pods held the quota, so a job that fit was refused (and when pod creations
    interleaved, both jobs held part of a gang for ever)."""
    capability = _capability(clean, "vision")
    replicas = capability // 8 * 3 // 4
    pair = [
        jobs.rendered(clean, jobs.spec("vision", n, pool="h100-block", replicas=replicas, gpus=8))
        for n in ("big-a", "big-b")
    ]
    for job in pair:
        jobs.submit(clean, job)
    whole = becomes(lambda: any(len(jobs.running_pods(clean, j)) == replicas for j in pair), 60)
    held = [len(jobs.bound_pods(clean, j)) for j in pair]
    assert whole, f"neither job runs whole; bound pods: {held}"
    waiting = next(j for j in pair if len(jobs.running_pods(clean, j)) < replicas)
    time.sleep(3)  # a few more cycles for anything to go wrong
    assert not jobs.bound_pods(clean, waiting), "the waiting job holds part of a gang"
    assert not any(_quota_refused_pods(clean, j) for j in pair)
    left = capability // 8 - replicas
    small = jobs.rendered(
        clean, jobs.spec("vision", "small", pool="h100-reserved", replicas=left, gpus=8)
    )
    jobs.submit(clean, small)
    jobs.wait_running(clean, small)
