"""Each reason `explain` gives, from fixture objects: one row per live state, its message.

The same reasons on the real control plane: tests/e2e/test_explain.py.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from tests.explain import objects as o
from trainstack.explain import Diagnosis, Live, Reason, diagnose

H100 = tuple(o.node(f"h100-{i}") for i in range(8))
H200 = tuple(o.node(f"h200-{i}", "h200-burst") for i in range(4))
NODES = H100 + H200
# Every h100-block node holds one 8-GPU pod of someone's.
FULL = tuple(o.pod(f"other-{i}", f"h100-{i}") for i in range(8))


def _live(**kw: Any) -> Live:
    base: dict[str, Any] = {"job": o.job(), "podgroup": o.podgroup(o.GANG_NO_ORIGIN)}
    return Live(**{**base, **kw})


ROWS: list[tuple[str, Live, Reason, str]] = [
    (
        "running",
        _live(
            job=o.job(phase="Running"),
            pods=(o.pod("train-worker-0", "h100-0"), o.pod("train-worker-1", "h100-1")),
        ),
        Reason.RUNNING,
        "vision/train is running (2 of 2 pods running, attempt 1)",
    ),
    (
        "queue at capability",
        _live(queues=o.queues(vision=56), nodes=NODES, node_pods=()),
        Reason.QUEUE_AT_CAPABILITY,
        "vision/train waits: queue vision is at its capability (56 of 64 GPUs in use, the gang "
        "needs 16 more)",
    ),
    (
        "group at capability",
        _live(
            queues=tuple(
                o.queue("group-research", capability=64, allocated=56, deserved=64, parent="x")
                if q["metadata"]["name"] == "group-research"
                else q
                for q in o.queues(vision=8, nlp=48)
            ),
            nodes=NODES,
            node_pods=(),
        ),
        Reason.PARENT_AT_CAPABILITY,
        "vision/train waits: queue group-research, above the team's queue vision, is at its "
        "capability (56 of 64 GPUs in use, the gang needs 16 more)",
    ),
    (
        "guarantee lent to a non-reclaimable queue",
        _live(
            podgroup=o.podgroup(o.GANG_INSUFFICIENT),
            queues=tuple(
                o.queue(
                    "nlp",
                    capability=72,
                    allocated=64,
                    deserved=56,
                    reclaimable=False,
                    parent="group-research",
                )
                if q["metadata"]["name"] == "nlp"
                else q
                for q in o.queues(nlp=64)
            ),
            nodes=NODES,
            node_pods=FULL,
        ),
        Reason.GUARANTEE_NOT_RECLAIMABLE,
        "vision/train waits for GPUs that team vision's share entitles it to (0 + 16 of a "
        "deserved 40), lent to other teams and not yet reclaimable: queue nlp is not "
        "reclaimable (reclaimable: false in its quota)",
    ),
    (
        "health gate, nodes readable",
        _live(
            podgroup=o.podgroup(o.GANG_TAINT),
            queues=o.queues(),
            nodes=tuple(o.node(f"h100-{i}", health="pending") for i in range(8)) + H200,
            node_pods=(),
        ),
        Reason.HEALTH_GATE,
        "vision/train waits on the health gate: 8 of 8 nodes of pool h100-block are not yet "
        "cleared (trainstack.io/health: 8 pending)",
    ),
    (
        "health gate, as a team member",
        _live(podgroup=o.podgroup(o.GANG_TAINT)),
        Reason.HEALTH_GATE,
        "vision/train waits on the health gate: 8 nodes carry a taint the job does not "
        "tolerate, on this platform the health gate's (trainstack.io/health)",
    ),
    (
        "pool at maximum",
        _live(
            podgroup=o.podgroup(o.GANG_INSUFFICIENT), queues=o.queues(), nodes=NODES, node_pods=FULL
        ),
        Reason.POOL_AT_MAXIMUM,
        "vision/train waits: pool h100-block is at its maximum size (8 of 8 nodes) and 8 of "
        "them cannot take a gang member (short: nvidia.com/gpu on 8 nodes)",
    ),
    (
        "pool scaling",
        _live(
            podgroup=o.podgroup(o.GANG_INSUFFICIENT),
            queues=o.queues(),
            nodes=(*H100[:6], o.node("h100-new", ready=False), *H200),
            node_pods=FULL[:6],
        ),
        Reason.POOL_SCALING,
        "vision/train waits for pool h100-block to grow: 7 of at most 8 nodes, 1 starting",
    ),
    (
        "no node fits, even empty",
        _live(job=o.job(gpus=16), queues=o.queues(), nodes=NODES, node_pods=()),
        Reason.NO_NODE_FITS,
        "vision/train can never run on pool h100-block: no node of it can take a gang member "
        "even empty (short: nvidia.com/gpu)",
    ),
    (
        "no node fits, as a team member",
        _live(podgroup=o.podgroup(o.GANG_INSUFFICIENT)),
        Reason.NO_NODE_FITS,
        "vision/train waits: no node can take a gang member (short: nvidia.com/gpu on 8 nodes)",
    ),
    (
        "pods refused at admission",
        _live(events=(o.event("FailedCreate", o.DENIED_POD),)),
        Reason.ADMISSION_REFUSED,
        "the pods of vision/train were refused at admission by rule pod-example: pods may not "
        "do that",
    ),
    (
        "stopped by the enforcer past its maximum duration",
        _live(
            job=o.job(
                phase="Terminated",
                conditions=[
                    {"status": "Pending", "lastTransitionTime": "2026-12-05T00:00:00Z"},
                    {"status": "Running", "lastTransitionTime": "2026-12-05T00:10:00Z"},
                ],
                state_time="2026-12-06T00:20:00Z",
            ),
            events=(
                o.event(
                    "CommandIssued",
                    "Start to execute command TerminateJob, and clean it up to make sure "
                    "executed not more than once.",
                ),
            ),
        ),
        Reason.MAX_DURATION,
        "vision/train was stopped by the platform: it ran 24.2h, past its maximum duration of 24h",
    ),
    (
        "completed",
        _live(job=o.job(phase="Completed")),
        Reason.FINISHED,
        "vision/train is not running: it is Completed",
    ),
    (
        "nothing known",
        _live(),
        Reason.WAITING,
        "vision/train is Pending: waiting for the scheduler",
    ),
]


@pytest.mark.parametrize(
    ("live", "reason", "summary"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_each_state_gives_its_reason_and_message(live: Live, reason: Reason, summary: str) -> None:
    found = diagnose(live, o.PLATFORM)
    assert (found.reason, found.summary) == (reason, summary), found


def test_every_reason_has_a_row_or_is_named_here() -> None:
    """A new reason needs a row (and an e2e scenario: tests/e2e/test_explain.py)."""
    tabled = {r[2] for r in ROWS}
    assert set(Reason) - tabled <= {Reason.STARTING}


def test_a_team_member_is_told_what_could_not_be_read() -> None:
    live = _live(unreadable=("queues (forbidden)", "nodes (forbidden)"))
    assert diagnose(live, o.PLATFORM).limits == ("queues (forbidden)", "nodes (forbidden)")


def test_a_fix_comes_with_every_reason_but_running() -> None:
    for _, live, reason, _ in ROWS:
        found: Diagnosis = diagnose(live, o.PLATFORM)
        assert bool(found.fix) is (reason is not Reason.RUNNING), found


def test_the_max_duration_falls_back_to_the_team_maximum() -> None:
    job = o.job(
        phase="Terminated",
        annotations={},
        conditions=[{"status": "Running", "lastTransitionTime": "2026-12-03T00:00:00Z"}],
        state_time="2026-12-06T00:10:00Z",
    )
    issued = o.event("CommandIssued", "Start to execute command TerminateJob, and …")
    found = diagnose(Live(job=job, events=(issued,)), o.PLATFORM)
    assert found.reason is Reason.MAX_DURATION
    assert "maximum duration of 72h" in found.summary


def test_a_terminated_job_within_its_duration_is_just_finished() -> None:
    job = o.job(
        phase="Terminated",
        conditions=[{"status": "Running", "lastTransitionTime": "2026-12-06T00:00:00Z"}],
        state_time="2026-12-06T01:00:00Z",
    )
    assert diagnose(Live(job=job), o.PLATFORM).reason is Reason.FINISHED


def test_the_runtimes_deadline_exit_is_the_max_duration() -> None:
    pod = o.pod("train-worker-0", "h100-0", phase="Failed")
    pod["status"]["containerStatuses"] = [{"state": {"terminated": {"exitCode": 4}}}]
    found = diagnose(Live(job=o.job(phase="Terminated"), pods=(pod,)), o.PLATFORM)
    assert found.reason is Reason.MAX_DURATION
    assert "DEADLINE_EXCEEDED" in found.summary


def test_a_job_whose_pods_all_have_nodes_is_starting() -> None:
    pods = (o.pod("train-worker-0", "h100-0", phase="Pending"),
            o.pod("train-worker-1", "h100-1", phase="Pending"))  # fmt: skip
    assert diagnose(_live(pods=pods), o.PLATFORM).reason is Reason.STARTING


def test_without_platform_outputs_the_pool_label_still_finds_the_nodes() -> None:
    live = _live(podgroup=o.podgroup(o.GANG_INSUFFICIENT), queues=o.queues(), nodes=NODES,
                 node_pods=FULL)  # fmt: skip
    found = diagnose(live, replace(o.PLATFORM, pools=()))
    assert found.reason is Reason.NO_NODE_FITS
    assert "8 of 8 nodes of pool h100-block cannot take a gang member" in found.summary


def test_one_node_is_one_node() -> None:
    message = o.GANG_INSUFFICIENT.replace("8 Insufficient", "1 Insufficient")
    found = diagnose(_live(podgroup=o.podgroup(message)), o.PLATFORM)
    assert found.summary.endswith("(short: nvidia.com/gpu on 1 node)")


MIG = "nvidia.com/mig-1g.10gb"


def on_slices(obj: dict[str, Any], count: int) -> dict[str, Any]:
    """A job, PodGroup or queue whose GPUs are `count` MIG instances instead (issue 47)."""
    sliced = copy.deepcopy(obj)
    for task in sliced.get("spec", {}).get("tasks") or []:
        resources = task["template"]["spec"]["containers"][0]["resources"]
        for side in ("requests", "limits"):
            resources[side].pop(o.GPU, None)
            resources[side][MIG] = "1"
    if "minResources" in sliced.get("spec", {}):
        sliced["spec"]["minResources"] = {MIG: str(count)}
    return sliced


def test_a_slice_job_at_its_queues_slice_capability() -> None:
    """The queue holds 5 of its 7 slices and the gang needs 3: the answer counts slices, not
    the whole GPUs the queue has room for."""
    vision = copy.deepcopy(next(q for q in o.queues() if q["metadata"]["name"] == "vision"))
    vision["spec"]["capability"][MIG] = "7"
    vision["status"]["allocated"] = {MIG: "5"}
    queues = tuple(vision if q["metadata"]["name"] == "vision" else q for q in o.queues())
    live = _live(
        job=on_slices(o.job(replicas=3), 3),
        podgroup=on_slices(o.podgroup(o.GANG_NO_ORIGIN), 3),
        queues=queues,
        nodes=NODES,
        node_pods=(),
    )
    found = diagnose(live)
    assert found.reason == Reason.QUEUE_AT_CAPABILITY
    assert found.summary == (
        "vision/train waits: queue vision is at its capability (5 of 7 nvidia.com/mig-1g.10gb "
        "in use, the gang needs 3 more)"
    )
