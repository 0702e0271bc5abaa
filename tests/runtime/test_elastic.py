"""Elastic jobs (issue 43): the rendered contract, the batch arithmetic, and real resizes.

An elastic job's worker pods get ``PET_NNODES=MIN:MAX``, ``PET_RDZV_BACKEND=c10d``,
``PET_RDZV_ENDPOINT=<job>-rendezvous-0.<job>:23456`` and ``TRAINSTACK_RDZV_STORE_HOST=0``:
the store is hosted by the job's rendezvous pod (trainstack_runtime.rendezvous), which Volcano
never preempts, not by a worker. The real runs below start that store and one supervisor per
"pod" on localhost with that environment (gloo, one worker each) and run
tests/runtime/elastic_train.py, which logs the dataset indices every rank reads and dumps the
model and optimizer state it restored (docs/runtime.md, "Elastic jobs").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from trainstack_runtime.contract import ExitCode
from trainstack_runtime.elastic import BatchPlan, batch_plan, check_world_sizes
from trainstack_runtime.exitcodes import ConfigError
from trainstack_runtime.topology import NodePlan, TopologyError, node_plan, restartable

from tests.runtime.harness import (
    HAVE_TORCH,
    TRAIN_SCRIPT,
    free_port,
    job_env,
    kill_all,
    supervisor_cmd,
    wait_for,
)

SCRIPT = Path(__file__).with_name("elastic_train.py")
ENDPOINT = "job-rendezvous-0.job:23456"
# What the rendered Volcano Job gives a worker pod of an elastic job of 1 to 3 nodes.
RENDERED = {
    "PET_NNODES": "1:3",
    "PET_RDZV_BACKEND": "c10d",
    "PET_RDZV_ENDPOINT": ENDPOINT,
    "TRAINSTACK_RDZV_STORE_HOST": "0",
}
# What Volcano's pytorch plugin gives pod 1 of a job of two pods (a fixed gang's contract).
POD_VARS = {"MASTER_ADDR": "job-master-0.job", "MASTER_PORT": "23456", "WORLD_SIZE": "2",
            "RANK": "1"}  # fmt: skip
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


# ---- the plan ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            RENDERED,
            NodePlan((1, 3), None, 2, "c10d", ENDPOINT, "trainstack", "pet", store_host=False),
            id="worker",
        ),
        pytest.param(
            {**RENDERED, "TRAINSTACK_RDZV_STORE_HOST": "1"},
            NodePlan((1, 3), None, 2, "c10d", ENDPOINT, "trainstack", "pet", store_host=True),
            id="hosting-pod",
        ),
        pytest.param(
            {k: v for k, v in RENDERED.items() if k != "TRAINSTACK_RDZV_STORE_HOST"},
            NodePlan((1, 3), None, 2, "c10d", ENDPOINT, "trainstack", "pet"),
            id="unset-torch-guesses",
        ),
        pytest.param(
            {
                **RENDERED,
                "TRAINSTACK_RDZV_JOIN_TIMEOUT_S": "1800",
                "TRAINSTACK_RDZV_LAST_CALL_TIMEOUT_S": "10",
            },
            NodePlan((1, 3), None, 2, "c10d", ENDPOINT, "trainstack", "pet", False, 1800, 10),
            id="timeouts",
        ),
        pytest.param(
            {"TRAINSTACK_RDZV_STORE_HOST": "1", "TRAINSTACK_RDZV_LAST_CALL_TIMEOUT_S": "5"},
            NodePlan(1, 0, 2, "c10d", "localhost:0", "trainstack", "single"),
            id="single-node-ignores-them",
        ),
    ],
)
def test_the_rendered_contract_plans_an_elastic_c10d_launch(
    env: dict[str, str], expected: NodePlan
) -> None:
    """PET_* win over the pod counts Volcano's pytorch plugin set (WORLD_SIZE, RANK), the
    store host is the platform's word, and the plan is already restartable as it is."""
    plan = node_plan({**env, "TRAINSTACK_NPROC_PER_NODE": "2"})
    assert plan == expected
    assert restartable(plan, 3, env) == plan
    if plan.source == "pet":
        assert plan.elastic
        assert plan.world_sizes() == [2, 4, 6]


@needs_torch
def test_launch_config_hands_torch_the_store_host_and_the_timeouts() -> None:
    from trainstack_runtime.supervisor import launch_config  # noqa: PLC0415

    env = {**RENDERED, "TRAINSTACK_RDZV_STORE_HOST": "1", "TRAINSTACK_RDZV_JOIN_TIMEOUT_S": "900"}
    config = launch_config(node_plan(env), max_restarts=3, shutdown_timeout=30)
    assert (config.min_nodes, config.max_nodes, config.rdzv_backend) == (1, 3, "c10d")
    assert config.rdzv_endpoint == ENDPOINT
    assert config.rdzv_configs["is_host"] is True
    assert "read_timeout" not in config.rdzv_configs  # the host does not connect
    client = launch_config(node_plan(RENDERED), max_restarts=3, shutdown_timeout=30)
    # A worker waits for the rendezvous pod as long as for its peers: torch's join timeout.
    assert (client.rdzv_configs["is_host"], client.rdzv_configs["read_timeout"]) == (False, 600)
    assert config.rdzv_configs["join_timeout"] == 900
    assert "last_call_timeout" not in config.rdzv_configs  # torch's 30 s


def test_the_store_host_of_an_implied_static_plan() -> None:
    """With restarts, a plan from pod-level variables is hosted by node rank 0, unless the
    platform says which pod hosts the store."""
    pod = dict(POD_VARS)
    assert restartable(node_plan(pod), 1, pod).store_host is False
    told = {**pod, "TRAINSTACK_RDZV_STORE_HOST": "1"}
    assert restartable(node_plan(told), 1, told).store_host is True


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"TRAINSTACK_RDZV_STORE_HOST": "yes"},
            "TRAINSTACK_RDZV_STORE_HOST='yes' must be 1 (this pod) or 0",
            id="store-host",
        ),
        pytest.param(
            {"TRAINSTACK_RDZV_LAST_CALL_TIMEOUT_S": "0"},
            "TRAINSTACK_RDZV_LAST_CALL_TIMEOUT_S=0 must be >= 1",
            id="last-call-zero",
        ),
        pytest.param(
            {"TRAINSTACK_RDZV_JOIN_TIMEOUT_S": "1.5"},
            "TRAINSTACK_RDZV_JOIN_TIMEOUT_S='1.5' is not an integer",
            id="join-fraction",
        ),
    ],
)
def test_bad_rendezvous_settings(env: dict[str, str], message: str) -> None:
    with pytest.raises(TopologyError) as info:
        node_plan({**RENDERED, **env})
    assert message in str(info.value)


# ---- the batch -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("micro", "world", "env", "expected"),
    [
        pytest.param(4, 2, {}, BatchPlan(4, 2, 1, keep_global=False), id="per-worker"),
        pytest.param(4, 3, {}, BatchPlan(4, 3, 1, keep_global=False), id="per-worker-3"),
        pytest.param(4, 2, {"TRAINSTACK_GLOBAL_BATCH": "24"}, BatchPlan(4, 2, 3, True), id="g2"),
        pytest.param(4, 3, {"TRAINSTACK_GLOBAL_BATCH": "24"}, BatchPlan(4, 3, 2, True), id="g3"),
        pytest.param(4, 1, {"TRAINSTACK_GLOBAL_BATCH": "24"}, BatchPlan(4, 1, 6, True), id="g1"),
    ],
)
def test_batch_plan(micro: int, world: int, env: dict[str, str], expected: BatchPlan) -> None:
    plan = batch_plan(micro, world, env)
    assert plan == expected
    if plan.keep_global:
        assert plan.global_batch == int(env["TRAINSTACK_GLOBAL_BATCH"])
    else:
        assert plan.global_batch == micro * world


@pytest.mark.parametrize(
    ("micro", "world", "raw", "message"),
    [
        pytest.param(
            4,
            3,
            "20",
            "TRAINSTACK_GLOBAL_BATCH=20 cannot be kept on 3 workers with a micro-batch of 4: "
            "it is not a multiple of 4 x 3 = 12",
            id="not-divisible",
        ),
        pytest.param(4, 2, "lots", "TRAINSTACK_GLOBAL_BATCH='lots' is not an integer", id="nan"),
        pytest.param(4, 2, "0", "TRAINSTACK_GLOBAL_BATCH=0 must be >= 1", id="zero"),
    ],
)
def test_batch_plan_errors(micro: int, world: int, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        batch_plan(micro, world, {"TRAINSTACK_GLOBAL_BATCH": raw})
    assert message in str(info.value)


def test_a_global_batch_every_world_size_must_split() -> None:
    check_world_sizes([2, 4, 6], {"TRAINSTACK_GLOBAL_BATCH": "24"})
    check_world_sizes([2, 4, 6], {})
    with pytest.raises(ConfigError) as info:
        check_world_sizes([2, 4, 6], {"TRAINSTACK_GLOBAL_BATCH": "16"})
    assert "cannot be split evenly over 6 workers" in str(info.value)
    assert "use a multiple of 12 x the micro-batch" in str(info.value)


@needs_torch
def test_the_supervisor_refuses_such_a_global_batch_before_launching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Growing to 3 nodes would stop the job with a config error mid-run: it stops now."""
    from trainstack_runtime import supervisor  # noqa: PLC0415

    for name, value in {
        **job_env(tmp_path),
        **RENDERED,
        "TRAINSTACK_GLOBAL_BATCH": "16",
    }.items():
        monkeypatch.setenv(name, value)
    code = supervisor.main(["--nproc-per-node", "2", str(TRAIN_SCRIPT)])
    assert code == ExitCode.CONFIG_ERROR
    verdict = json.loads((tmp_path / "termination-log").read_text())
    assert "cannot be split evenly over 6 workers" in verdict["cause"]


@needs_torch
def test_elastic_workers_never_share_the_agents_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Membership changes restart the workers without spending the restart budget
    (torch/distributed/elastic/agent/server/api.py ``_invoke_run``), so an elastic job needs
    a store per round even with ``TRAINSTACK_MAX_RESTARTS=0``."""
    from trainstack_runtime.supervisor import worker_environment  # noqa: PLC0415

    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, "1")  # set, so worker_environment leaves them
    monkeypatch.setenv("TRAINSTACK_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    worker_environment(node_plan({**RENDERED, "PET_NNODES": "2"}), 0)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ
    worker_environment(node_plan(RENDERED), 0)
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


# ---- real resizes --------------------------------------------------------------------------
MICRO, DATASET = 4, 96  # 96 splits into whole micro-batches on 1, 2 and 3 workers


def start_store(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The job's rendezvous pod: trainstack_runtime.rendezvous on a free port (output in
    ``tmp_path/rendezvous.out``), once it listens."""
    out_path = tmp_path / "rendezvous.out"
    port = free_port()
    cmd = [sys.executable, "-m", "trainstack_runtime.rendezvous", "--port", str(port)]
    with open(out_path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out)
    try:
        wait_for(
            lambda: (
                f"listening on port {port}" in out_path.read_text(errors="replace")
                or proc.poll() is not None
            ),
            60,
            "the rendezvous store",
        )
        assert proc.poll() is None, out_path.read_text(errors="replace")
    except BaseException:
        kill_all([proc])
        raise
    return proc, port


def stop_store(store: subprocess.Popen[bytes]) -> None:
    """Volcano's SIGTERM when the job ends: the store exits 0."""
    store.send_signal(signal.SIGTERM)
    assert store.wait(timeout=30) == 0


def start_pods(
    tmp_path: Path,
    pods: range,
    port: int,
    args: list[str],
    *,
    max_restarts: int,
    nnodes: str = "1:3",
    **env: str,
) -> dict[int, subprocess.Popen[bytes]]:
    """Supervisors of one worker each with an elastic job's environment, on one checkpoint
    volume, all clients of the rendezvous store on ``port`` (start_store), as the rendered
    job's workers are. Output in ``tmp_path/pod<N>.out``."""
    procs = {}
    for pod in pods:
        workdir = tmp_path / f"pod{pod}"
        pod_env = job_env(
            workdir,
            **{
                "PET_NNODES": nnodes,
                "PET_RDZV_BACKEND": "c10d",
                "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
                "TRAINSTACK_RDZV_STORE_HOST": "0",
                "TRAINSTACK_RDZV_LAST_CALL_TIMEOUT_S": "3",
                "TRAINSTACK_RDZV_JOIN_TIMEOUT_S": "120",
                "TRAINSTACK_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
                **env,
            },
        )
        cmd = supervisor_cmd(workdir, nproc=1, max_restarts=max_restarts)
        cmd = [*cmd[: cmd.index(str(TRAIN_SCRIPT))], str(SCRIPT), "--", *args]
        cmd += ["--log", str(tmp_path / "log"), "--dump", str(tmp_path / "dump")]
        workdir.mkdir(parents=True, exist_ok=True)
        with open(tmp_path / f"pod{pod}.out", "ab") as out:
            procs[pod] = subprocess.Popen(cmd, env=pod_env, stdout=out, stderr=out)
    return procs


def finish(
    tmp_path: Path, procs: dict[int, subprocess.Popen[bytes]], store: subprocess.Popen[bytes]
) -> None:
    try:
        for p in procs.values():
            p.wait(timeout=300)
        stop_store(store)
    finally:
        kill_all([*procs.values(), store])
    for pod, p in procs.items():
        out = (tmp_path / f"pod{pod}.out").read_text(errors="replace")
        assert p.returncode == ExitCode.OK, out[-3000:]


def snapshot(tmp_path: Path, step: int) -> dict[str, Any]:
    """The checkpoint of ``step`` as DCP itself reads it (format_utils, not the runtime)."""
    import torch  # noqa: PLC0415
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: PLC0415

    out = tmp_path / f"checkpoint-{step}.pt"
    dcp_to_torch_save(tmp_path / "ckpt" / f"step-{step:09d}", out)
    loaded: dict[str, Any] = torch.load(out, weights_only=False)
    return loaded


def assert_same(a: Any, b: Any, where: str = "") -> None:
    import torch  # noqa: PLC0415

    if isinstance(a, dict):
        assert isinstance(b, dict), where
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def assert_restored(tmp_path: Path, step: int, world: int, ckpt: Any) -> None:
    """Every rank of the run at ``world`` workers restored the checkpoint's model and
    optimizer state, to the bit, and its step."""
    import torch  # noqa: PLC0415

    for rank in range(world):
        restored = torch.load(tmp_path / "dump" / f"restored-{step}-w{world}-r{rank}.pt")
        assert restored["step"] == step
        assert_same({"model": restored["model"], "optim": restored["optim"]}, ckpt, f"r{rank}")


def wait_for_checkpoint(
    tmp_path: Path, step: int, procs: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    """The manifest of the checkpoint of ``step`` once it is committed."""
    manifest = tmp_path / "ckpt" / f"step-{step:09d}" / "manifest.json"
    wait_for(
        lambda: manifest.exists() or any(p.poll() is not None for p in procs),
        300,
        f"the checkpoint of step {step}",
    )
    loaded: dict[str, Any] = json.loads(manifest.read_text())
    return loaded


def read_log(tmp_path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((tmp_path / "log").glob("rank-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def assert_steps(records: list[dict[str, Any]], phases: list[tuple[int, range]]) -> None:
    """Each step ran once, by every rank of the world size its phase had: the step counter
    continues across resizes, and the learning rate is the schedule's at that step."""
    from tests.runtime.elastic_train import LR, LR_EVERY, LR_GAMMA  # noqa: PLC0415

    seen = Counter((r["step"], r["world"], r["rank"]) for r in records)
    expected = Counter((s, w, rank) for w, steps in phases for s in steps for rank in range(w))
    assert seen == expected
    for r in records:
        assert r["lr"] == pytest.approx(LR * LR_GAMMA ** ((r["step"] - 1) // LR_EVERY))


def reads_per_epoch(records: list[dict[str, Any]]) -> dict[int, Counter[int]]:
    """Epoch -> how many times each dataset index was read in it, all ranks and runs."""
    out: dict[int, Counter[int]] = {}
    for r in records:
        for epoch, indices in r["batches"]:
            out.setdefault(epoch, Counter()).update(indices)
    return out


def expected_rereads(samples: int, old: int, new: int) -> int:
    """docs/runtime.md, "Elastic jobs": ``samples`` of the epoch read on ``old`` workers;
    the new position is ``samples / new`` rounded down to whole micro-batches."""
    position = samples // new
    position -= position % MICRO
    return samples - position * new


@needs_torch
@pytest.mark.faults
@pytest.mark.parametrize("keep", ["global-batch", "per-worker-batch"])
def test_a_job_resized_from_2_to_3_to_1_workers_across_restarts(tmp_path: Path, keep: str) -> None:
    """Three runs of one job on one checkpoint volume, on 2, 3 and 1 "pods" of the same
    elastic environment (PET_NNODES=1:3); each resumes from the previous run's last
    checkpoint, resharded by DCP.

    Keeping the global batch (24: 3, 2 and 6 micro-batches of 4 accumulated per worker), every
    optimizer step reads exactly the samples one worker reading batches of 24 reads: nothing
    skipped, nothing read twice. Keeping the per-worker batch (4), every sample of an epoch is
    read, and the samples read twice are exactly what the docs' formula says, fewer than
    micro-batch x new world size."""
    global_batch = keep == "global-batch"
    env = {"TRAINSTACK_GLOBAL_BATCH": "24"} if global_batch else {}
    # Global batch 24: 4 steps an epoch; per-worker batch 4: 12, 8 and 24 steps an epoch.
    phases = (
        [(2, range(1, 4)), (3, range(4, 8)), (1, range(8, 13))]
        if global_batch
        else [(2, range(1, 6)), (3, range(6, 13)), (1, range(13, 31))]
    )
    checkpoints = {}
    for world, steps in phases:
        args = ["--steps", str(steps[-1]), "--worlds", str(world)]
        store, port = start_store(tmp_path)  # each run of the job has a rendezvous pod
        try:
            pods = start_pods(tmp_path, range(world), port, args, max_restarts=3, **env)
        except BaseException:
            kill_all([store])
            raise
        finish(tmp_path, pods, store)
        checkpoints[steps[-1]] = snapshot(tmp_path, steps[-1])
    import torch  # noqa: PLC0415

    for (_, done), (world, _) in pairwise(phases):
        # What the previous run held at its end is the checkpoint, and so is what every rank
        # of the next run restored.
        final = torch.load(tmp_path / "dump" / f"final-{done[-1]}.pt")
        assert_same({"model": final["model"], "optim": final["optim"]}, checkpoints[done[-1]])
        assert_restored(tmp_path, done[-1], world, checkpoints[done[-1]])
    out = (tmp_path / "pod0.out").read_text()
    assert "resumed on 3 ranks from a checkpoint of 2" in out
    assert "resumed on 1 ranks from a checkpoint of 3" in out

    records = read_log(tmp_path)
    assert_steps(records, phases)
    epochs = reads_per_epoch(records)
    assert sorted(epochs) == ([0, 1, 2] if global_batch else [0, 1])
    for epoch, reads in epochs.items():
        assert set(reads) == set(range(DATASET)), f"epoch {epoch}: skipped samples"
    if global_batch:
        from trainstack_runtime.data import ResumableLoader  # noqa: PLC0415

        # One worker reading whole global batches: the order every world size shares.
        oracle = ResumableLoader([(torch.tensor(i),) for i in range(DATASET)], 24, seed=7)
        for step in range(1, 13):
            (batch,) = next(oracle)
            read = [i for r in records if r["step"] == step for _, idx in r["batches"] for i in idx]
            assert sorted(read) == sorted(batch.tolist()), f"step {step}"
        for r in records:
            assert r["accumulation"] == 24 // (MICRO * r["world"])
        assert all(n == 1 for reads in epochs.values() for n in reads.values())
        return
    # Per-worker batch: epoch 0 read 40 samples on 2 workers, the rest on 3; epoch 1 read 24
    # on 3 workers, the rest on 1.
    twice = {e: sum(n - 1 for n in reads.values()) for e, reads in epochs.items()}
    assert twice == {0: expected_rereads(40, 2, 3), 1: expected_rereads(24, 3, 1)}
    assert twice[0] == 4 < MICRO * 3
    assert twice[1] == 0 < MICRO * 1


def resize_after_step_5(
    tmp_path: Path, old: int, new: int, *, max_restarts: int
) -> tuple[dict[int, subprocess.Popen[bytes]], subprocess.Popen[bytes], Any]:
    """Pods of a job of PET_NNODES=2:3 meant to run steps 1-5 on ``old`` workers and 6-12
    on ``new``: ``old`` pods start; once they committed the checkpoint of step 5, pods join
    up to ``new``, or the first ones to start get the kubelet's SIGTERM and exit 203
    (preempted). The pods left running, the rendezvous store, and that checkpoint as DCP
    reads it."""
    store, port = start_store(tmp_path)
    args = ["--steps", "12", "--worlds", f"{old},{new}", "--switch-at", "5"]
    procs = start_pods(tmp_path, range(old), port, args, max_restarts=max_restarts, nnodes="2:3")
    try:
        assert wait_for_checkpoint(tmp_path, 5, list(procs.values()))["world_size"] == old
        ckpt = snapshot(tmp_path, 5)
        more = range(old, new)
        procs |= start_pods(tmp_path, more, port, args, max_restarts=max_restarts, nnodes="2:3")
        for pod in range(old - new):
            lost = procs.pop(pod)
            lost.send_signal(signal.SIGTERM)
            lost.wait(timeout=120)
            out = (tmp_path / f"pod{pod}.out").read_text()
            assert lost.returncode == ExitCode.PREEMPTED, out[-3000:]
    except BaseException:
        kill_all([*procs.values(), store])
        raise
    return procs, store, ckpt


def assert_resized_after_step_5(
    tmp_path: Path, ckpt: Any, old: int, new: int, survivors: list[int]
) -> list[dict[str, Any]]:
    """Steps 1-5 ran on ``old`` workers, 6-12 on ``new``, which restored the checkpoint of
    step 5 (``ckpt``) on every rank; of epoch 0, read on both, nothing was skipped and 4
    samples were read twice (the docs' count: 5 x 4 x ``old`` samples read before), of
    epoch 1 none. The log's records."""
    for pod in survivors:  # the pods that ran on
        out = (tmp_path / f"pod{pod}.out").read_text()
        assert f"resumed on {new} ranks from a checkpoint of {old}" in out, out[-3000:]
    assert_restored(tmp_path, 5, new, ckpt)
    records = read_log(tmp_path)
    assert_steps(records, [(old, range(1, 6)), (new, range(6, 13))])
    epochs = reads_per_epoch(records)
    assert set(epochs[0]) == set(range(DATASET))
    assert sum(n - 1 for n in epochs[0].values()) == expected_rereads(20 * old, old, new) == 4
    assert all(n == 1 for n in epochs[1].values())
    return records


@needs_torch
@pytest.mark.faults
def test_a_third_node_joins_a_running_job(tmp_path: Path) -> None:
    """Two pods train at world size 2 (PET_NNODES=2:3, no restart budget); once their
    checkpoint of step 5 is committed they hold, and a third pod starts. Its agent waits for
    the next round, the two running agents see it (``num_nodes_waiting``), stop their workers
    and start them again at world size 3, which resume from that checkpoint: the same two
    supervisors, without spending a restart, then all three train to the end."""
    procs, store, ckpt = resize_after_step_5(tmp_path, 2, 3, max_restarts=0)
    finish(tmp_path, procs, store)
    records = assert_resized_after_step_5(tmp_path, ckpt, 2, 3, survivors=[0, 1])
    assert {r["restarts"] for r in records} == {0}  # TORCHELASTIC_RESTART_COUNT


@needs_torch
@pytest.mark.faults
def test_a_job_keeps_training_after_losing_a_node(tmp_path: Path) -> None:
    """Three pods train at world size 3 (PET_NNODES=2:3, a restart budget of 1); after the
    checkpoint of step 5 the kubelet's SIGTERM reaches pod 0, the first to join (an eviction:
    a lender's reclaim, a spot node going away). All ranks stop at the same step and exit
    203; pod 0's supervisor exits 203 (preempted) and leaves the rendezvous open
    (torch/distributed/launcher/api.py launch_agent: no shutdown of it on a signal); the other
    two agents count a failed worker group, restart it in a round of the two nodes left,
    spending their one restart, and training resumes from that checkpoint at world size 2.
    Which pod goes does not matter: the store is the rendezvous pod's (a store hosted by pod 0
    went with it, and the others could not re-form)."""
    procs, store, ckpt = resize_after_step_5(tmp_path, 3, 2, max_restarts=1)
    finish(tmp_path, procs, store)
    records = assert_resized_after_step_5(tmp_path, ckpt, 3, 2, survivors=[1, 2])
    assert {r["restarts"] for r in records if r["world"] == 3} == {0}
    assert {r["restarts"] for r in records if r["world"] == 2} == {1}


@needs_torch
@pytest.mark.faults
def test_a_node_left_below_the_minimum_exits_below_minimum(tmp_path: Path) -> None:
    """One pod of a job of PET_NNODES=2:3 waits for a second that never comes (reclaim took
    the rest of the job below its minimum): after the join timeout its supervisor exits 206
    (`below_minimum`), which restarts the whole job as a gang, even from the worker task
    (jobs/lifecycle.py WHOLE_JOB_EXITS), and is not counted against maxRetries."""
    store, port = start_store(tmp_path)
    env = {"TRAINSTACK_RDZV_JOIN_TIMEOUT_S": "3", "TRAINSTACK_MAX_FAILURES": "0",
           "TRAINSTACK_JOB_RETRY": "0", "TRAINSTACK_JOB_INSTANCE": "job-1"}  # fmt: skip
    args = ["--steps", "2", "--worlds", "2"]
    pods = start_pods(tmp_path, range(1), port, args, max_restarts=1, nnodes="2:3", **env)
    try:
        assert pods[0].wait(timeout=120) == ExitCode.BELOW_MINIMUM, (
            tmp_path / "pod0.out"
        ).read_text()[-3000:]
        stop_store(store)
    finally:
        kill_all([*pods.values(), store])
    verdict = json.loads((tmp_path / "pod0" / "termination-log").read_text())
    assert verdict["class"] == "below_minimum"
    assert "minimum of 2 nodes" in verdict["cause"]
    assert not list((tmp_path / "ckpt").glob(".trainstack-failures*/*"))  # not a failure
