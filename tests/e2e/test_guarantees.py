"""Guarantees under contention (issue 16), on Volcano's real scheduler, in both queue modes.

hierarchical: the prod stack (capacity plugin; teams share by `deserved`). flat: the same
stack with `queueMode: flat` (proportion plugin; shares from `weight`, no group quotas and no
`deserved`, which the loader refuses there), written next to the test (`flat_values`).

prod's pools: h100-block 64 GPUs (elastic), h100-reserved 32 and h200-burst 32 (16 firm);
vision may use every pool, nlp the two H100 pools, recsys h200-burst alone. Every number a
test relies on is read from the queues the stack made, not written here.

What both plugins do (v1.15.1): a queue's real capability is its parent's (the cluster's, in
flat mode) minus its siblings' guarantees, so nobody can allocate another team's guarantee
while it is idle (capacity.go checkHierarchicalQueue; proportion.go OnSessionOpen); reclaim
takes running pods back from a queue above its deserved share, never below it
(capacity.go checkDeservedExceedance; proportion.go reclaimableFn). Neither knows pools: a
team at or below its deserved share keeps its pods even on the only pool a confined team can
use (docs/scheduling.md, "What a guarantee does not cover").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e import jobs
from tests.e2e.conftest import Deployed, deploy_stack
from trainstack.config.project import Project
from trainstack.kube import wait_for
from trainstack.preview.engine import Previewer
from trainstack.sandbox.cluster import ControlPlane


def flat_values(prod: dict[str, Any]) -> dict[str, Any]:
    """prod in flat mode: shares from weights, each team's capability kept at its prod value
    plus what the hierarchy's deserved share gave it room to borrow. Its real capability is
    the cluster minus every guarantee plus its own (104), whatever the borrow limit."""
    platform = prod["config"]["trainstack:platform"]
    platform["scheduling"] = {**platform.get("scheduling", {}), "queueMode": "flat"}
    for group in platform["registry"]["groups"]:
        group.pop("quota", None)
    for team in platform["registry"]["teams"]:
        quota = team["quota"]
        deserved = quota.pop("deserved", quota["gpus"])
        quota["borrowLimit"] = deserved - quota["gpus"] + quota.get("borrowLimit", 0)
    # vision may borrow up to everything the others' guarantees leave (128 - 16 - 8)
    vision = next(t for t in platform["registry"]["teams"] if t["name"] == "vision")
    vision["quota"]["borrowLimit"] = 128 - 16 - 8 - vision["quota"]["gpus"]
    return prod


@pytest.fixture(scope="module", params=["hierarchical", "flat"])
def platform(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    previewer: Previewer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Deployed:
    if request.param == "hierarchical":
        return deploy_stack(control_plane, previewer, "prod")
    stacks = tmp_path_factory.mktemp("stacks")
    prod = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text(encoding="utf-8"))
    (stacks / "Pulumi.prod-flat.yaml").write_text(yaml.safe_dump(flat_values(prod)))
    flat = Previewer(Project(ROOT, Path(stacks)))
    deployed = deploy_stack(control_plane, flat, "prod-flat")
    assert deployed.cfg.scheduling.queue_mode == "flat"
    return deployed


@pytest.fixture
def clean(platform: Deployed) -> Iterator[Deployed]:
    yield platform
    for job in platform.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(platform, job)


def _run_guarantee(platform: Deployed, team: str, pool: str, prefix: str, priority: str) -> None:
    """The team asks for its guarantee on `pool`, in 8-GPU jobs, and gets it within 90 s."""
    guarantee = jobs.queue_gpus(platform, team, "guarantee")
    for index in range(guarantee // 8):
        spec = jobs.spec(team, f"{prefix}-{index}", pool=pool, gpus=8, priority=priority)
        jobs.submit(platform, jobs.rendered(platform, spec))
    wait_for(
        f"{team} running its {guarantee} guaranteed GPUs",
        lambda: jobs.running_gpus(platform, team) >= guarantee,
        timeout=90,
    )


def _saturate(
    platform: Deployed,
    team: str,
    pools: list[str],
    prefix: str,
    priority: str = "normal",
    gpus: int | None = None,
) -> int:
    """The team asks for everything: 8-GPU jobs filling each pool in turn, up to its
    capability. Once its running GPUs stop growing, what still waits is withdrawn (a pending
    request changes the proportion plugin's shares), and what runs is returned."""
    capability = jobs.queue_gpus(platform, team, "capability")
    if gpus is not None:
        capability = min(capability, gpus)
    made, asked = [], 0
    for pool in pools:
        for index in range(min(jobs.pool_gpus(platform, pool), capability - asked) // 8):
            job = jobs.rendered(
                platform,
                jobs.spec(team, f"{prefix}-{pool}-{index}", pool=pool, gpus=8, priority=priority),
            )
            jobs.submit(platform, job)
            made.append(job)
            asked += 8
    last, since = -1, time.monotonic()
    while time.monotonic() - since < 6:  # unchanged for six scheduling periods
        now = jobs.running_gpus(platform, team)
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(1)
    for job in made:
        if not jobs.running_pods(platform, job):
            jobs.delete(platform, job)
    return jobs.running_gpus(platform, team)


def _fair_floor(platform: Deployed, team: str) -> int:
    """What reclaim never takes a team below: its deserved share (hierarchical) or its
    guarantee (flat, where the share moves with demand but never below the guarantee)."""
    if platform.cfg.scheduling.queue_mode == "hierarchical":
        return jobs.queue_gpus(platform, team, "deserved")
    return jobs.queue_gpus(platform, team, "guarantee")


def test_a_lender_reclaims_its_guarantee_from_a_borrower(clean: Deployed) -> None:
    """vision takes every GPU it may, h100-block first, and recsys the rest of h200-burst;
    nlp then asks for its guarantee on h100-block, with preemptible jobs: reclaim returns it
    (a class with PreemptionPolicy Never never reclaims, issue 15 #10), and vision keeps at
    least its floor.

    recsys saturates too because in flat mode a share follows demand: with recsys's GPUs idle
    the proportion plugin counts them as nlp's room, vision stays within its share, and nlp,
    which cannot use h200-burst, waits (the limit described in docs/scheduling.md)."""
    borrowed = _saturate(clean, "vision", ["h100-block", "h100-reserved", "h200-burst"], "b")
    _saturate(clean, "recsys", ["h200-burst"], "r")
    guarantee = jobs.queue_gpus(clean, "nlp", "guarantee")
    assert borrowed > _fair_floor(clean, "vision"), "vision should be borrowing"
    block = jobs.pool_gpus(clean, "h100-block")
    on_block = jobs.running_gpus(clean, "vision", "h100-block-")
    assert on_block + guarantee > block, "no room without reclaim"
    _run_guarantee(clean, "nlp", "h100-block", "lender", "preemptible")
    assert jobs.running_gpus(clean, "vision") >= _fair_floor(clean, "vision")


def test_a_confined_teams_guarantee_is_met_while_others_saturate(clean: Deployed) -> None:
    """recsys can use h200-burst alone. vision fills it first, then vision and nlp take every
    other GPU they may; recsys's guarantee still runs, on h200-burst, within a minute."""
    _saturate(clean, "vision", ["h200-burst", "h100-block", "h100-reserved"], "v")
    _saturate(clean, "nlp", ["h100-reserved", "h100-block"], "n")
    h200 = jobs.pool_gpus(clean, "h200-burst")
    on_h200 = jobs.running_gpus(clean, "vision", "h200-burst-")
    guarantee = jobs.queue_gpus(clean, "recsys", "guarantee")
    assert on_h200 + guarantee > h200, "vision should hold the GPUs recsys needs"
    _run_guarantee(clean, "recsys", "h200-burst", "confined", "normal")
    assert jobs.running_gpus(clean, "vision") >= _fair_floor(clean, "vision")


def _running_class(platform: Deployed, team: str, short: str) -> int:
    """GPUs of the team's running pods of one class; a pod being deleted (evicted, in its
    grace period) no longer counts."""
    return sum(
        8
        for pod in platform.kube.list("v1", "Pod", team)
        if pod["spec"].get("priorityClassName") == f"trainstack-{short}"
        and pod.get("status", {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    )


def test_priority_preempts_inside_a_queue(clean: Deployed) -> None:
    """docs/scheduling.md: at its limit, a team's higher-class job preempts one of its own
    lower-class jobs (Volcano's preempt action works inside a queue). vision runs normal and
    preemptible jobs side by side on h200-burst and normal ones on the H100s, up to its
    capability; its urgent job on h200-burst takes the node of a preemptible job, never of a
    normal one.

    The victim is pinned, not just counted: with Volcano's default minCandidateNodesPercentage
    (10 %) the preempt action's dry run looked at one of the four h200-burst nodes, from a
    random offset, and a normal job went about half the time (issue 39 #3; v1.15.1
    actions/preempt/preempt.go calculateNumCandidates). The platform sets it to 100."""
    capability = jobs.queue_gpus(clean, "vision", "capability")
    _saturate(clean, "vision", ["h200-burst"], "h200", gpus=16)
    _saturate(clean, "vision", ["h100-block", "h100-reserved"], "h100", gpus=capability - 32)
    _saturate(clean, "vision", ["h200-burst"], "spare", "preemptible", gpus=16)
    assert jobs.running_gpus(clean, "vision") == capability
    assert _running_class(clean, "vision", "preemptible") == 16
    normal = _running_class(clean, "vision", "normal")
    urgent = jobs.rendered(
        clean, jobs.spec("vision", "urgent", pool="h200-burst", gpus=8, priority="high")
    )
    jobs.submit(clean, urgent)

    def lower() -> int:
        return _running_class(clean, "vision", "preemptible") + _running_class(
            clean, "vision", "normal"
        )

    # One job leaves for urgent: wait until it has (evicted pods linger in their grace period).
    wait_for("one of vision's jobs evicted for urgent", lambda: lower() < 16 + normal, timeout=60)
    jobs.wait_running(clean, urgent, timeout=60)
    assert lower() == 16 + normal - 8, "exactly one of vision's own lower-class jobs made room"
    assert jobs.running_gpus(clean, "vision") == capability


def _state(platform: Deployed, job: dict[str, Any]) -> dict[str, Any]:
    """What a failed wait reports: the GPUs each team runs, the job's pods and status."""
    return {
        "running": {t: jobs.running_gpus(platform, t) for t in ("vision", "nlp", "recsys")},
        "pods": sorted(
            (p["metadata"]["name"], p.get("status", {}).get("phase"), p["spec"].get("nodeName"))
            for p in jobs.pods(platform, job)
        ),
        "status": jobs.live(platform, job).get("status"),
    }


def _companions(platform: Deployed, job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's headless Service (svc plugin) and PodGroup, once both exist."""
    meta = job["metadata"]
    service = platform.kube.get_or_none("v1", "Service", meta["name"], meta["namespace"])
    groups = [
        g["metadata"]["name"]
        for g in platform.kube.list("scheduling.volcano.sh/v1beta1", "PodGroup", meta["namespace"])
        if any(o.get("name") == meta["name"] for o in g["metadata"].get("ownerReferences", []))
    ]
    return {"service": service, "podgroups": groups} if service and groups else None


def _uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def _elastic(
    platform: Deployed, size: int | None = None, *, lo: int = 6, name: str = "elastic"
) -> dict[str, Any]:
    replicas = {"min": lo, "max": 8} | ({} if size is None else {"size": size})
    return jobs.rendered(
        platform, jobs.spec("vision", name, pool="h100-block", gpus=8, replicas=replicas)
    )


def _nlp_holds_16_of_the_block(platform: Deployed) -> list[dict[str, Any]]:
    """Two of nlp's 8-GPU jobs running on h100-block: what an elastic job cannot have."""
    hold = [
        jobs.rendered(platform, jobs.spec("nlp", f"hold-{i}", pool="h100-block", gpus=8))
        for i in range(2)
    ]
    for job in hold:
        jobs.submit(platform, job)
    wait_for(
        "nlp holding 16 of h100-block",
        lambda: jobs.running_gpus(platform, "nlp") == 16,
        timeout=60,
    )
    return hold


def _of_task(pods: list[dict[str, Any]], task: str) -> list[dict[str, Any]]:
    return [p for p in pods if p["metadata"]["labels"].get("volcano.sh/task-spec") == task]


def _workers(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _of_task(pods, "worker")


def _store(platform: Deployed, job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's rendezvous pod, while it runs."""
    return next(iter(_of_task(jobs.running_pods(platform, job), "rendezvous")), None)


def test_an_elastic_job_starts_small_grows_and_loses_a_worker_alone(clean: Deployed) -> None:
    """Issue 43 (docs/jobs.md, "Elastic jobs"): vision's elastic job of 6 to 8 workers of 8
    GPUs on h100-block (and its CPU rendezvous pod) starts with 6 while nlp holds the rest of
    the block and grows to 8 when nlp's jobs end, none of its first workers replaced. A
    worker deleted as the scheduler's reclaim or preempt deletes it comes back alone: no
    other pod of the job restarts (lifecycle.py elastic_worker_policies: RestartPod, one
    retry counted). A smaller size applied to the running Job (what a team stack's update
    does) removes the top worker in place."""
    hold = _nlp_holds_16_of_the_block(clean)

    elastic = _elastic(clean)
    assert elastic["spec"]["minAvailable"] == 7  # the rendezvous pod and 6 workers
    assert jobs.replicas(elastic) == 9
    jobs.submit(clean, elastic)
    started = wait_for(
        "the elastic job started with its minimum",
        lambda: found if len(found := jobs.running_pods(clean, elastic)) == 7 else None,
        timeout=60,
    )
    time.sleep(5)  # scheduling periods pass: the two above the minimum still wait
    assert len(jobs.running_pods(clean, elastic)) == 7, _state(clean, elastic)
    assert jobs.phase(clean, elastic) == "Running"
    assert _store(clean, elastic) is not None

    for job in hold:
        jobs.delete(clean, job)
    grown = jobs.wait_running(clean, elastic, timeout=60)
    assert _uids(started) <= _uids(grown), "growing replaced none of the first workers"

    lost = next(p for p in grown if p["metadata"]["name"] == "elastic-worker-3")
    clean.kube.delete("v1", "Pod", "elastic-worker-3", "vision")
    back = wait_for(
        "the lost worker back, alone",
        lambda: (
            found
            if len(found := jobs.running_pods(clean, elastic)) == 9
            and lost["metadata"]["uid"] not in _uids(found)
            else None
        ),
        timeout=60,
    )
    assert _uids(grown) - _uids(back) == {lost["metadata"]["uid"]}, _state(clean, elastic)
    # RestartPod also runs the job plugins' OnJobDelete, which deletes the svc plugin's
    # headless Service (the peers' DNS names), and deletes the PodGroup (v1.15.1
    # job_controller_actions.go killPods); the next sync makes both again.
    wait_for("the job's Service and PodGroup back", lambda: _companions(clean, elastic), timeout=30)
    wait_for("the job Running", lambda: jobs.phase(clean, elastic) == "Running", timeout=30)
    assert int(jobs.live(clean, elastic)["status"].get("retryCount", 0)) == 1

    smaller = _elastic(clean, size=7)
    clean.kube.apply(smaller, as_=clean.member("vision"))
    kept = wait_for(
        "the job down to 7 workers",
        lambda: found if len(found := jobs.pods(clean, elastic)) == 8 else None,
        timeout=60,
    )
    assert {p["metadata"]["name"] for p in kept} == {
        "elastic-rendezvous-0",
        *(f"elastic-worker-{i}" for i in range(7)),
    }
    assert _uids(kept) <= _uids(back), "shrinking restarted none of the workers it kept"
    wait_for("the job Running", lambda: jobs.phase(clean, elastic) == "Running", timeout=30)


def test_a_lender_reclaims_only_the_workers_above_an_elastic_jobs_minimum(
    clean: Deployed,
) -> None:
    """Issue 43: vision's elastic job of 4 to 8 workers holds all of h100-block; nlp asks for
    its guarantee there. Reclaim takes workers, never the rendezvous pod (annotated
    `volcano.sh/preemptable: "false"`, which v1.15.1 reclaim.go leaves off the victim list)
    and never below the minimum (gang.go reclaimableFn permits `ready - minAvailable`, the
    store counted in both); the job is not restarted: the store and every worker it kept are
    the same pods, and each lost worker is back Pending alone (RestartPod), waiting for
    capacity. The job never runs fewer than its minimum of workers meanwhile.

    Which pods reclaim picks is Volcano's: before the rendezvous pod existed, the master
    (rank 0 and the store's host) was as likely a victim as any worker (gang.go counts pods,
    not roles), and its loss restarted every worker (docs/jobs.md, "What Volcano does not
    protect")."""
    elastic = _elastic(clean, lo=4)
    jobs.submit(clean, elastic)
    before = jobs.wait_running(clean, elastic, timeout=60)
    store = _store(clean, elastic)
    assert store is not None
    guarantee = jobs.queue_gpus(clean, "nlp", "guarantee")
    assert jobs.running_gpus(clean, "vision", "h100-block-") == jobs.pool_gpus(clean, "h100-block")
    assert guarantee <= 8 * (8 - 4), "the workers above the minimum cover nlp's guarantee"

    fewest = [8]

    def watched() -> int:
        running = len(_workers(jobs.running_pods(clean, elastic)))
        fewest[0] = min(fewest[0], running)
        return running

    for index in range(guarantee // 8):
        spec = jobs.spec(
            "nlp", f"lender-{index}", pool="h100-block", gpus=8, priority="preemptible"
        )
        jobs.submit(clean, jobs.rendered(clean, spec))
    wait_for(
        "nlp running its guarantee",
        lambda: watched() >= 0 and jobs.running_gpus(clean, "nlp") >= guarantee,
        timeout=90,
    )
    lost = guarantee // 8
    after = wait_for(
        "the reclaimed workers back, Pending",
        lambda: (
            found
            if watched() == 8 - lost
            and len(found := jobs.pods(clean, elastic)) == 9
            and sum(p.get("status", {}).get("phase") == "Pending" for p in found) == lost
            else None
        ),
        timeout=60,
    )
    running = [p for p in after if p.get("status", {}).get("phase") == "Running"]
    assert store["metadata"]["uid"] in _uids(running), _state(clean, elastic)
    assert len(_uids(before) - _uids(running)) == lost, _state(clean, elastic)
    assert _uids(running) <= _uids(before), "no pod the job kept was restarted"
    assert fewest[0] >= 4, f"the job ran {fewest[0]} workers, below its minimum of 4"
    assert jobs.phase(clean, elastic) == "Running"
    # Each RestartPod counts one retry, but two evictions of one session may reach the
    # controller as one (a request older than the job's version is only a sync:
    # job_controller_util.go applyPolicies); never a RestartJob's worth of restarts.
    assert 1 <= int(jobs.live(clean, elastic)["status"].get("retryCount", 0)) <= lost
    time.sleep(5)  # scheduling periods pass: the lost workers wait, nlp keeps its GPUs
    assert jobs.running_gpus(clean, "nlp") >= guarantee
    assert len(_workers(jobs.running_pods(clean, elastic))) == 8 - lost


def test_an_elastic_job_completes_with_workers_still_waiting(clean: Deployed) -> None:
    """Issue 43: an elastic job of 2 to 8 workers runs 6 while nlp holds the rest of
    h100-block; its workers finish (exit 0). The job is Completed once two have, although
    two workers never started (`minSuccess` = min: v1.15.1 state/running.go), and Volcano
    deletes what was left, the rendezvous pod and the waiting workers (state/finished.go,
    KillJob): nothing holds the pool's CPU, nor would start training later."""
    _nlp_holds_16_of_the_block(clean)
    elastic = _elastic(clean, lo=2)
    jobs.exiting(elastic, 0, after="5s", task="worker")
    jobs.submit(clean, elastic)
    wait_for(
        "the job Completed",
        lambda: jobs.phase(clean, elastic) == "Completed",
        timeout=90,
    )

    def finished() -> list[dict[str, Any]] | None:
        found = jobs.pods(clean, elastic)
        phases = {p.get("status", {}).get("phase") for p in found}
        return found if phases == {"Succeeded"} else None

    left = wait_for("only finished pods left", finished, timeout=60)
    # At least the minimum finished; workers still finishing when the job completed were
    # deleted with the rest (KillJob keeps only finished pods). With torchrun that loses
    # nothing: an agent returns only after every node's workers have (its exit barrier,
    # torch/distributed/elastic/agent/server/api.py _exit_barrier).
    assert 2 <= len(left) <= 6, _state(clean, elastic)
    assert {p["metadata"]["labels"].get("volcano.sh/task-spec") for p in left} == {"worker"}
