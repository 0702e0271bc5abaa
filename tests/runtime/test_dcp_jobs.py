"""Checkpoints of sharded and per-rank state on real runs (2 workers, gloo, the supervisor).

The runtime's first format compared tensor shapes only, so per-rank state with equal shapes
(FSDP1 optimizer shards, per-rank models) was restored from other ranks with valid checksums,
and FSDP2's DTensors failed at the first save. On torch.distributed.checkpoint, DTensor shards
are saved per shard (``get_state_dict``, torch/distributed/checkpoint/state_dict.py), plain
tensors declared replicated are compared across ranks on the first save, and per-rank state is
saved under each rank's own keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from trainstack_runtime.contract import ExitCode

from tests.runtime.harness import (
    HAVE_TORCH,
    Baseline,
    RunJob,
    assert_matches_baseline,
)

if HAVE_TORCH:
    from trainstack_runtime.checkpoint import committed_steps, step_dir_name, verify

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed"),
]


@pytest.mark.parametrize("parallel", ["fsdp2", "per-rank"])
def test_sharded_and_per_rank_state_resume_bit_exact(
    tmp_path: Path, run_job: RunJob, baselines: Callable[..., Baseline], parallel: str
) -> None:
    args = ("--parallel", parallel)
    reference = baselines(args)
    if parallel == "per-rank":  # the two ranks really hold different models
        assert reference[0][1] != reference[1][1]
    first = run_job(tmp_path, fault="sigkill@13,rank=1", args=args)
    assert first.code == ExitCode.KILLED, first.output[-3000:]
    last = committed_steps(first.checkpoints)[-1]
    assert last in (5, 10)  # step 10 commits asynchronously: the kill may come first
    assert verify(first.checkpoints / step_dir_name(last)).ok

    second = run_job(tmp_path, args=args)
    assert second.code == ExitCode.OK, second.output[-3000:]
    assert_matches_baseline(second, reference, replayed_from=last)


def test_per_rank_state_declared_replicated_is_refused(tmp_path: Path, run_job: RunJob) -> None:
    result = run_job(tmp_path, args=("--parallel", "per-rank", "--declare-replicated"))
    assert result.code == ExitCode.CONFIG_ERROR, result.output[-3000:]
    assert "tensors differ between ranks" in result.output
    assert committed_steps(result.checkpoints) == []


def test_fsdp2_checkpoint_resumes_on_fewer_ranks(tmp_path: Path, run_job: RunJob) -> None:
    """Resharding on load: a checkpoint of 2 FSDP2 ranks resumed by 1 process."""
    first = run_job(tmp_path, args=("--parallel", "fsdp2", "--steps", "10"))
    assert first.code == ExitCode.OK, first.output[-3000:]
    manifest = json.loads((first.checkpoints / step_dir_name(10) / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert len(list((first.checkpoints / step_dir_name(10)).glob("__*_*.distcp"))) == 2

    second = run_job(tmp_path, args=("--parallel", "fsdp2"), nproc=1)
    assert second.code == ExitCode.OK, second.output[-3000:]
    assert "resumed on 1 ranks from a checkpoint of 2" in second.output
    steps = [int(line.split()[0]) for line in (tmp_path / "loss" / "rank-0.txt").open()]
    assert steps == list(range(1, 21))  # 1-10 on two ranks, then 11-20 on one: no replay


def test_several_ranks_per_node_with_local_tier(
    tmp_path: Path, run_job: RunJob, baseline: Baseline
) -> None:
    """Both ranks of the pod stage in one local directory: each must use its own."""
    local = tmp_path / "nvme"
    first = run_job(tmp_path, fault="sigkill@13,rank=1", TRAINSTACK_CHECKPOINT_LOCAL_DIR=str(local))
    assert first.code == ExitCode.KILLED, first.output[-3000:]
    assert "No such file" not in first.output
    last = committed_steps(first.checkpoints)[-1]
    assert last in (5, 10)
    second = run_job(tmp_path, TRAINSTACK_CHECKPOINT_LOCAL_DIR=str(local))
    assert second.code == ExitCode.OK, second.output[-3000:]
    assert_matches_baseline(second, baseline, replayed_from=last)
    assert list(local.iterdir()) == []  # uploaded and cleaned, rank by rank


@pytest.mark.parametrize("parallel", ["fsdp2", "ddp"])
def test_four_ranks_resume(
    tmp_path: Path, run_job: RunJob, baselines: Callable[..., Baseline], parallel: str
) -> None:
    """Beyond two ranks the order of an all-reduce's sum matters (with two, a + b == b + a).
    FSDP2 resumes bit-exact on four ranks. DDP does not, in the last bits: it buckets
    gradients in reversed parameter order at start and rebuilds its buckets in the order
    gradients became ready during the first iteration (torch/nn/parallel/distributed.py,
    ``_compute_bucket_assignment_by_size`` ... "reverse list of buckets" and
    ``reducer._rebuild_buckets()`` in forward), so the first step after any start reduces
    over another layout than the uninterrupted run's step at that point. Everything before
    that step is bit-exact; afterwards the losses agree to float32 rounding."""
    args = ("--parallel", parallel)
    reference = baselines(args, nproc=4)
    first = run_job(tmp_path, fault="sigkill@13,rank=2", nproc=4, args=args)
    assert first.code == ExitCode.KILLED, first.output[-3000:]
    last = committed_steps(first.checkpoints)[-1]
    assert last in (5, 10)
    second = run_job(tmp_path, nproc=4, args=args)
    assert second.code == ExitCode.OK, second.output[-3000:]
    if parallel == "fsdp2":
        assert_matches_baseline(second, reference, replayed_from=last)
        return
    for rank, per_step in second.losses().items():
        assert sorted(per_step) == sorted(reference[rank]), rank
        for step, values in per_step.items():
            expected = float.fromhex(reference[rank][step][0])
            for value in values:
                if step <= last + 1:  # up to the first resumed step's loss: same bits
                    assert value == reference[rank][step][0], (rank, step)
                else:
                    assert float.fromhex(value) == pytest.approx(expected, rel=1e-5), (rank, step)
