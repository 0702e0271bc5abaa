"""`trainstack explain` on the real control plane (issue 45): every reason it gives, produced by
the state that causes it, with the prod stack's queues, pools and policies, and its message
asserted. The diagnosis reads the live objects as a team member (impersonated: Jobs,
PodGroups, pods, events of the team's namespace, nothing cluster-scoped) and as an admin (also
queues, nodes and every bound pod), through `trainstack.explain.read`, and the platform's
outputs from the plan (what `--stack` computes offline).

prod (numbers from the stack, read back here where a message names them): pools h100-block 8
nodes, h100-reserved 4 and h200-burst 4, 8 GPUs each; queues trainstack → group-research →
{vision, nlp}, group-product → recsys; vision may use every pool, nlp the H100 pools, recsys
h200-burst. Real capabilities (Volcano's, plugins/capacity/capacity.go checkHierarchicalQueue):
vision 64, group-research 120 (128 less group-product's guarantee).

Also a finished job, and a starting one (every pod bound, none running: its node is one no
kubelet serves). What cannot run here, and what stands in for it (said again in each scenario):
no cluster autoscaler: a pool that is growing is a pool with a node registered and not yet
Ready (what the API server shows while a new instance joins); no runtime in the pods (kwok):
the job that passes its maximum duration is stopped by the platform's enforcer, one pass of its
own loop in process (as tests/e2e/test_deadlines.py runs it), at real time.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from trainstack_deadlines import contract as deadlines_contract
from trainstack_deadlines.controller import StateStore, read_registry, run_once
from trainstack_deadlines.decide import Settings
from trainstack_deadlines.kube import Access
from trainstack_deadlines.kube import Kube as EnforcerKube
from trainstack_deadlines.metrics import Metrics
from typer.testing import CliRunner

from tests.e2e import jobs
from trainstack.builders.teams import team_group
from trainstack.contracts import health as health_contract
from trainstack.contracts.deadlines import MAX_DURATION_ANNOTATION
from trainstack.explain import Diagnosis, Reason, diagnose
from trainstack.explain import cli as explain_cli
from trainstack.explain.read import Reader, platform_facts, read_live
from trainstack.kube import ApiError, wait_for
from trainstack.policy.rules import K8S_RULES
from trainstack.sandbox import deploy, nodes
from trainstack.sandbox.cluster import KWOK_ANNOTATION
from trainstack.sandbox.stacks import Deployed

QUEUE = ("scheduling.volcano.sh/v1beta1", "Queue")
# Keeps a pool's other nodes out of reach (as tests/e2e/test_health.py does).
FULL = {"key": "e2e.trainstack.io/full", "value": "true", "effect": "NoSchedule"}
TEAM = "vision"


@pytest.fixture
def clean(prod: Deployed) -> Iterator[Deployed]:
    yield prod
    for pod in prod.kube.list("v1", "Pod"):  # pods a test left Terminating, as a kubelet would
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            prod.kube.delete("v1", "Pod", meta["name"], meta["namespace"], grace=0)
    for job in prod.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(prod, job)


def _explain(platform: Deployed, job: dict[str, Any], *, member: bool) -> Diagnosis:
    meta = job["metadata"]
    team = meta["namespace"]
    reader = Reader(platform.kube, platform.member(team) if member else None)
    live = read_live(reader, meta["namespace"], meta["name"])
    return diagnose(live, platform_facts(platform.plan.outputs, team))


def _says(
    platform: Deployed, job: dict[str, Any], reason: Reason, *, member: bool = False
) -> Diagnosis:
    """The diagnosis once it gives `reason` (the scheduler writes conditions and queue status
    at the end of its cycles, so the first reads may come before them)."""
    found: list[Diagnosis] = []

    def answer() -> Diagnosis | None:
        found.append(_explain(platform, job, member=member))
        return found[-1] if found[-1].reason is reason else None

    try:
        return wait_for(f"explain to say {reason}", answer, timeout=60)
    except TimeoutError:
        pytest.fail(f"explain never said {reason}; last: {found[-1] if found else None}")


def _job(
    platform: Deployed,
    name: str,
    *,
    pool: str,
    replicas: int = 1,
    gpus: int = 8,
    team: str = TEAM,
) -> dict[str, Any]:
    return jobs.rendered(
        platform, jobs.spec(team, name, pool=pool, replicas=replicas, gpus=gpus, cpu="4")
    )


def _run(platform: Deployed, *made: dict[str, Any]) -> None:
    for job in made:
        jobs.submit(platform, job)
    for job in made:
        jobs.wait_running(platform, job, timeout=90)


def _pool_nodes(platform: Deployed, pool: str) -> list[dict[str, Any]]:
    return platform.kube.list("v1", "Node", labels=f"trainstack.io/pool={pool}")


def _set_taints(platform: Deployed, name: str, taints: list[dict[str, Any]]) -> None:
    platform.kube.patch({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
                        {"spec": {"taints": taints}})  # fmt: skip


def _queue_gpus(platform: Deployed, name: str, field: str) -> int:
    queue = platform.kube.get(*QUEUE, name)
    section = queue["spec"]["capability"] if field == "capability" else queue["status"]["allocated"]
    return int(section.get("nvidia.com/gpu", 0))


# -- running ------------------------------------------------------------------------------


def test_a_running_job_says_it_is_running(clean: Deployed) -> None:
    job = _job(clean, "explain-running", pool="h100-reserved", gpus=1)
    _run(clean, job)
    for member in (True, False):
        found = _says(clean, job, Reason.RUNNING, member=member)
        assert found.summary == "vision/explain-running is running (1 of 1 pods running, attempt 1)"


def test_a_finished_job_says_so(clean: Deployed) -> None:
    job = _job(clean, "explain-done", pool="h100-reserved", gpus=1)
    jobs.exiting(job, 0)
    jobs.submit(clean, job)
    wait_for("the job Completed", lambda: jobs.phase(clean, job) == "Completed", timeout=90)
    found = _says(clean, job, Reason.FINISHED, member=True)
    assert found.summary == "vision/explain-done is not running: it is Completed"


def test_a_job_whose_pods_have_nodes_is_starting(clean: Deployed) -> None:
    """Every pod bound, none Running yet: what a job looks like while its images pull. Here the
    node is one no kubelet serves (kwok manages only nodes with its annotation): Ready when
    registered, so Volcano binds the pod there, and nothing ever starts it. The pool's other
    nodes are kept out of reach with a taint."""
    pool = "h100-reserved"
    cfg_pool = clean.cfg.pool(pool)
    assert cfg_pool is not None
    node = copy.deepcopy(nodes.pool_nodes(clean.cfg, cfg_pool, 1)[0])
    name = f"{pool}-slow"
    node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    node["metadata"]["annotations"].pop(KWOK_ANNOTATION)
    node["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}
    ]
    others = {n["metadata"]["name"]: n["spec"].get("taints", []) for n in _pool_nodes(clean, pool)}
    for other, taints in others.items():
        _set_taints(clean, other, [*taints, FULL])
    clean.kube.create(node)
    drivers = nodes.csi_drivers([obj for _, obj in clean.plan.kubernetes_objects()])
    for csi in nodes.csi_nodes([node], drivers):
        clean.kube.apply(csi)
    job = _job(clean, "explain-starting", pool=pool, gpus=1)
    try:
        jobs.submit(clean, job)
        found = _says(clean, job, Reason.STARTING, member=True)
        assert found.summary == (
            "vision/explain-starting has a node for every pod; its containers are starting"
        )
    finally:
        # No kubelet finishes these pods' deletion: remove them as one would, by force.
        clean.kube.delete(*jobs.VOLCANO_JOB, "explain-starting", TEAM)
        for pod in jobs.pods(clean, job):
            clean.kube.delete("v1", "Pod", pod["metadata"]["name"], TEAM, grace=0)
        clean.kube.delete("v1", "Node", name)
        for other, taints in others.items():
            _set_taints(clean, other, taints)


# -- queues -------------------------------------------------------------------------------


def test_queue_at_its_capability(clean: Deployed) -> None:
    """vision's own jobs hold its whole capability; one more job waits for them."""
    capability = _queue_gpus(clean, "vision", "capability")
    assert capability == 64, "the scenario fills h100-block (64 GPUs) with vision's capability"
    _run(clean, _job(clean, "explain-fill", pool="h100-block", replicas=8))
    job = _job(clean, "explain-over-capability", pool="h200-burst")
    jobs.submit(clean, job)
    found = _says(clean, job, Reason.QUEUE_AT_CAPABILITY)
    assert found.summary == (
        "vision/explain-over-capability waits: queue vision is at its capability (64 of 64 GPUs "
        "in use, the gang needs 8 more)"
    )
    assert "in use by the team's own jobs: 64 GPUs" in found.details
    assert jobs.stays_unscheduled(clean, job, seconds=3) == []


def test_group_queue_at_its_capability(clean: Deployed) -> None:
    """nlp borrows up to its capability (72) and vision holds 48: group-research holds 120 of
    the 124 GPUs Volcano lets it use (its capability, 132 with prod's h100-slices, less
    group-product's guarantee of 8), too few for an 8-GPU gang, though vision itself is below
    its own (64) and h200-burst has a free node."""
    _run(
        clean,
        _job(clean, "explain-nlp-block", pool="h100-block", replicas=8, team="nlp"),
        _job(clean, "explain-nlp-reserved", pool="h100-reserved", team="nlp"),
        _job(clean, "explain-vision-reserved", pool="h100-reserved", replicas=3),
        _job(clean, "explain-vision-burst", pool="h200-burst", replicas=3),
    )
    job = _job(clean, "explain-over-group", pool="h200-burst")
    jobs.submit(clean, job)
    found = _says(clean, job, Reason.PARENT_AT_CAPABILITY)
    assert found.summary == (
        "vision/explain-over-group waits: queue group-research, above the team's queue vision, "
        "is at its capability (120 of 124 GPUs in use, the gang needs 8 more)"
    )
    assert "queue nlp: 72 GPUs, 16 above its deserved 56" in found.details
    assert "queue vision: 48 GPUs, 8 above its deserved 40" in found.details


def test_guarantee_lent_to_a_team_that_is_not_reclaimable(clean: Deployed) -> None:
    """recsys borrows h200-burst beyond its deserved share; its quota says `reclaimable:
    false` (a registry setting, builders/scheduling.queues), set here on its live queue. vision,
    far below its own share, waits and is told why reclaim does not take the GPUs back."""
    _run(clean, _job(clean, "explain-borrow", pool="h200-burst", replicas=4, team="recsys"))
    wait_for("recsys's allocation", lambda: _queue_gpus(clean, "recsys", "allocated") == 32)
    patch = {"apiVersion": QUEUE[0], "kind": QUEUE[1], "metadata": {"name": "recsys"}}
    clean.kube.patch(patch, {"spec": {"reclaimable": False}})
    try:
        job = _job(clean, "explain-lent", pool="h200-burst")
        jobs.submit(clean, job)
        found = _says(clean, job, Reason.GUARANTEE_NOT_RECLAIMABLE)
        assert found.summary == (
            "vision/explain-lent waits for GPUs that team vision's share entitles it to (0 + 8 "
            "of a deserved 40), lent to other teams and not yet reclaimable: queue recsys is not "
            "reclaimable (reclaimable: false in its quota)"
        )
        assert "queue recsys: 32 GPUs, 8 above its deserved 24" in found.details
    finally:
        clean.kube.patch(patch, {"spec": {"reclaimable": True}})


# -- nodes --------------------------------------------------------------------------------


def _fill_burst(platform: Deployed) -> dict[str, Any]:
    """h200-burst (4 nodes, its maximum) full with vision's own job; one more job of 8 GPUs."""
    _run(platform, _job(platform, "explain-burst", pool="h200-burst", replicas=4))
    job = _job(platform, "explain-no-room", pool="h200-burst")
    jobs.submit(platform, job)
    return job


def test_pool_at_its_maximum_size(clean: Deployed) -> None:
    job = _fill_burst(clean)
    found = _says(clean, job, Reason.POOL_AT_MAXIMUM)
    # Every resource the member asks for that a full node lacks: the GPUs, and with them the
    # EFA devices and hugepages each GPU's share of the node comes with.
    assert found.summary.startswith(
        "vision/explain-no-room waits: pool h200-burst is at its maximum size (4 of 4 nodes) "
        "and 4 of them cannot take a gang member (short: "
    ), found.summary
    assert "nvidia.com/gpu on 4 nodes" in found.summary


def test_no_node_can_take_a_gang_member_as_a_team_member_sees_it(clean: Deployed) -> None:
    """Without nodes to read, the scheduler's own histogram on the PodGroup: which resource is
    short on how many nodes (the pool's four, and any node with no GPU at all)."""
    job = _fill_burst(clean)
    found = _says(clean, job, Reason.NO_NODE_FITS, member=True)
    # Volcano names the first short resource of each node (allocate.go predicate,
    # WrapInsufficientResourceReason), whichever of the GPUs, EFA devices or hugepages it is.
    counts = re.fullmatch(
        r"vision/explain-no-room waits: no node can take a gang member \(short: "
        r"((?:\S+ on \d+ nodes?(?:, )?)+)\)",
        found.summary,
    )
    assert counts, found.summary
    assert sum(int(n) for n in re.findall(r" on (\d+) node", counts[1])) >= 4
    assert found.limits == ("queues (forbidden)", "nodes (forbidden)")


def test_pool_growing(clean: Deployed) -> None:
    """No autoscaler runs here: what the API server shows while the autoscaler adds a node is
    a node of the pool registered and not yet Ready. One node of h200-burst is replaced by one
    that never becomes Ready (kwok manages only nodes with its annotation), the other three are
    full."""
    pool = "h200-burst"
    original = sorted(_pool_nodes(clean, pool), key=lambda n: n["metadata"]["name"])[-1]
    name = original["metadata"]["name"]
    cfg_pool = next(p for p in clean.cfg.gpu_pools if p.name == pool)
    simulated = next(
        n for n in nodes.pool_nodes(clean.cfg, cfg_pool) if n["metadata"]["name"] == name
    )
    joining = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"{pool}-joining", "labels": dict(original["metadata"]["labels"])},
        "spec": {"taints": original["spec"].get("taints", [])},
    }
    clean.kube.delete("v1", "Node", name)
    clean.kube.create(joining)
    try:
        _run(clean, _job(clean, "explain-burst", pool=pool, replicas=3))
        job = _job(clean, "explain-waits-for-node", pool=pool)
        jobs.submit(clean, job)
        found = _says(clean, job, Reason.POOL_SCALING)
        assert found.summary == (
            "vision/explain-waits-for-node waits for pool h200-burst to grow: 4 of at most 4 "
            "nodes, 1 starting"
        )
    finally:
        clean.kube.delete("v1", "Node", f"{pool}-joining")
        deploy.create_nodes(clean.kube, [simulated])
        drivers = nodes.csi_drivers([obj for _, obj in clean.plan.kubernetes_objects()])
        for csi in nodes.csi_nodes([simulated], drivers):
            clean.kube.apply(csi)


def test_waiting_on_the_health_gate(clean: Deployed) -> None:
    """Every node of h100-reserved carries the gate's startup taint (as new nodes register,
    builders/pools.node_taints): nothing of the job's runs until the agent clears one."""
    pool = "h100-reserved"
    before = {n["metadata"]["name"]: n["spec"].get("taints", []) for n in _pool_nodes(clean, pool)}
    gate = {
        "key": health_contract.TAINT_KEY,
        "value": health_contract.TAINT_PENDING,
        "effect": health_contract.TAINT_EFFECT,
    }
    for name, taints in before.items():
        _set_taints(clean, name, [*taints, gate])
    try:
        job = _job(clean, "explain-gated", pool=pool)
        jobs.submit(clean, job)
        found = _says(clean, job, Reason.HEALTH_GATE)
        assert found.summary == (
            "vision/explain-gated waits on the health gate: 4 of 4 nodes of pool h100-reserved "
            "are not yet cleared (trainstack.io/health: 4 pending)"
        )
        seen = _says(clean, job, Reason.HEALTH_GATE, member=True)
        assert seen.summary == (
            "vision/explain-gated waits on the health gate: 4 nodes carry a taint the job does "
            "not tolerate, on this platform the health gate's (trainstack.io/health)"
        )
    finally:
        for name, taints in before.items():
            _set_taints(clean, name, taints)


# -- admission and the maximum duration ----------------------------------------------------


def _member_kubeconfig(platform: Deployed, team: str, folder: Path) -> Path:
    """A kubeconfig of a person of `team` (a client certificate with the team's group), as the
    cluster's identity provider would give one: what a team member runs `trainstack` with."""
    entry = next(t for t in platform.cfg.registry.teams if t.name == team)
    pair = platform.plane.ca.issue(
        f"{team}-member", f"{team}-member@example.com", orgs=(team_group(entry),), client=True
    )
    credentials = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    return platform.plane.write_kubeconfig(folder / "kubeconfig", "member", credentials)


def _cli() -> typer.Typer:
    app = typer.Typer()
    explain_cli.register(app)
    return app


def test_refused_at_admission(clean: Deployed, tmp_path: Path) -> None:
    """A job whose maximum duration is above the team's: the platform's `max-duration` policy
    refuses it, so there is no live Job; `explain --file` asks admission with a dry run, as a
    member of the team, through the command line."""
    job = _job(clean, "explain-refused", pool="h100-reserved", gpus=1)
    job["metadata"]["annotations"][MAX_DURATION_ANNOTATION] = str(10**9)
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job), encoding="utf-8")
    rule = next(r for r in K8S_RULES if r.name == "max-duration")
    kubeconfig = _member_kubeconfig(clean, TEAM, tmp_path)
    args = ["explain", "explain-refused", "--team", TEAM, "--kubeconfig", str(kubeconfig)]

    missing = CliRunner().invoke(_cli(), args)
    assert missing.exit_code == 1
    assert missing.output.startswith("error: no Volcano Job explain-refused in namespace vision")

    result = CliRunner().invoke(_cli(), [*args, "--file", str(manifest)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        f"vision/explain-refused was refused at admission by rule max-duration: {rule.description}"
    )
    assert lines[-1].startswith("what to do: ")
    assert lines[-1] != "what to do: "
    with pytest.raises(ApiError):  # nothing was stored
        clean.kube.get(*jobs.VOLCANO_JOB, "explain-refused", TEAM)


def test_a_team_member_runs_the_commands(clean: Deployed, tmp_path: Path) -> None:
    """`trainstack status` and `trainstack explain` with a member's kubeconfig: the team's jobs,
    and an answer that says what the member's credentials could not read."""
    job = _job(clean, "explain-listed", pool="h100-reserved", gpus=2)
    _run(clean, job)
    kubeconfig = _member_kubeconfig(clean, TEAM, tmp_path)
    status = CliRunner().invoke(_cli(), ["status", "--team", TEAM, "--kubeconfig", str(kubeconfig)])
    assert status.exit_code == 0, status.output
    row = next(line for line in status.output.splitlines() if "explain-listed" in line)
    assert [c.strip() for c in row.split("│")[1:-1]][:2] == ["explain-listed", "Running"]
    assert [c.strip() for c in row.split("│")[1:-1]][3:] == ["2", "1"]
    answer = CliRunner().invoke(
        _cli(), ["explain", "explain-listed", "--team", TEAM, "--kubeconfig", str(kubeconfig)]
    )
    assert answer.exit_code == 0, answer.output
    assert answer.output.splitlines() == [
        "vision/explain-listed is running (1 of 1 pods running, attempt 1)",
        "not checked, not readable with these credentials: queues (forbidden), nodes (forbidden)",
    ]
    other = CliRunner().invoke(
        _cli(), ["explain", "explain-listed", "--team", "nlp", "--kubeconfig", str(kubeconfig)]
    )
    assert other.exit_code == 1
    assert other.output.startswith(
        "error: not allowed to read Volcano Jobs in namespace nlp (403 Forbidden)"
    ), other.output


def test_stopped_past_its_maximum_duration(clean: Deployed) -> None:
    """The platform's enforcer stops a job that runs past its maximum duration (docs/
    deadlines.md). Its maximum here is 2 s and its grace 1 s, so real time passes it; one pass
    of the enforcer's own loop (as tests/e2e/test_deadlines.py runs it, with its ServiceAccount's
    RBAC) issues the TerminateJob Command and Volcano's job controller stops the job."""
    contract = deadlines_contract
    job = _job(clean, "explain-overdue", pool="h100-reserved", gpus=1)
    job["metadata"]["annotations"][MAX_DURATION_ANNOTATION] = "2"
    for task in job["spec"]["tasks"]:
        task["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    _run(clean, job)
    wait_for("the job Running", lambda: jobs.phase(clean, job) == "Running")
    time.sleep(4)  # past first Running + 2 s + 1 s grace (margin 0 below)

    answer = clean.kube.request(
        "POST",
        f"/api/v1/namespaces/{contract.SYSTEM_NAMESPACE}/serviceaccounts/"
        f"{contract.SERVICE_ACCOUNT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 600}},
    )  # fmt: skip
    token = Path(clean.plane.workdir) / "explain-enforcer-token"
    token.write_text(answer["status"]["token"])
    enforcer = EnforcerKube(Access(clean.plane.server, Path(clean.plane.ca.cert), token))
    registry = clean.kube.get("v1", "ConfigMap", "trainstack-platform", contract.SYSTEM_NAMESPACE)
    registry_file = Path(clean.plane.workdir) / "explain-registry.json"
    registry_file.write_text(registry["data"]["registry.json"])
    result = run_once(
        enforcer,
        read_registry(registry_file),
        StateStore(enforcer, contract.SYSTEM_NAMESPACE, contract.STATE_CONFIGMAP),
        now=time.time(),
        settings=Settings(margin_s=0, reissue_after_s=600),
        metrics=Metrics(),
        log=lambda *_, **__: None,
    )
    assert result.created == ["vision/explain-overdue"], result
    found = _says(clean, job, Reason.MAX_DURATION, member=True)
    assert re.fullmatch(
        r"vision/explain-overdue was stopped by the platform: it ran \d+s, past its maximum "
        r"duration of 2s",
        found.summary,
    ), found.summary
