"""Batch arithmetic for elastic jobs: what a change of world size does to the batch.

An elastic job (``PET_NNODES=MIN:MAX``) may resume on another number of workers. The user
chooses what stays fixed (docs/runtime.md, "Elastic jobs"):

* **the global batch** (``TRAINSTACK_GLOBAL_BATCH`` set): samples per optimizer step over all
  workers. Each worker accumulates gradients over ``global / (micro_batch x world)``
  micro-batches, so an optimizer step sees the same number of samples, and with
  ``ResumableLoader`` the very same samples, at every world size; a learning-rate schedule
  that is a function of the step stays right.
* **the per-worker batch** (unset): one micro-batch per worker and step, no accumulation; the
  global batch is ``micro_batch x world`` and changes with the world size.

No torch import: the supervisor checks the variable before it launches any worker.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .contract import ENV_GLOBAL_BATCH
from .exitcodes import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """One optimizer step at this world size."""

    micro_batch: int  # samples per worker per forward/backward
    world_size: int
    accumulation: int  # micro-batches each worker accumulates before optimizer.step()
    keep_global: bool  # True: TRAINSTACK_GLOBAL_BATCH is kept; False: the per-worker batch

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, all workers together."""
        return self.micro_batch * self.accumulation * self.world_size


def global_batch(env: Mapping[str, str] | None = None) -> int | None:
    """``TRAINSTACK_GLOBAL_BATCH`` as a positive integer, or None when it is unset."""
    env = os.environ if env is None else env
    raw = env.get(ENV_GLOBAL_BATCH)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV_GLOBAL_BATCH}={raw!r} is not an integer") from None
    if value < 1:
        raise ConfigError(f"{ENV_GLOBAL_BATCH}={value} must be >= 1")
    return value


def batch_plan(
    micro_batch: int, world_size: int, env: Mapping[str, str] | None = None
) -> BatchPlan:
    """The accumulation that keeps ``TRAINSTACK_GLOBAL_BATCH`` at ``world_size`` workers of
    ``micro_batch`` samples each, or no accumulation when the variable is unset."""
    if micro_batch < 1 or world_size < 1:
        raise ConfigError(f"micro-batch ({micro_batch}) and world size ({world_size}) must be >= 1")
    target = global_batch(env)
    if target is None:
        return BatchPlan(micro_batch, world_size, 1, keep_global=False)
    per_step = micro_batch * world_size
    if target % per_step:
        raise ConfigError(
            f"{ENV_GLOBAL_BATCH}={target} cannot be kept on {world_size} workers with a "
            f"micro-batch of {micro_batch}: it is not a multiple of {micro_batch} x "
            f"{world_size} = {per_step}. Use a global batch that micro-batch x every world "
            f"size of the job divides, another micro-batch, or unset {ENV_GLOBAL_BATCH} to "
            "keep the per-worker batch instead"
        )
    return BatchPlan(micro_batch, world_size, target // per_step, keep_global=True)


def check_world_sizes(world_sizes: Iterable[int], env: Mapping[str, str] | None = None) -> None:
    """Refuse, before any worker starts, a global batch some reachable world size cannot
    split: the job would otherwise stop with a config error when it grows or shrinks to it.
    (The micro-batch is the script's; this checks what holds for any micro-batch.)"""
    target = global_batch(env)
    sizes = sorted(set(world_sizes))
    if target is None or not sizes:
        return
    bad = [w for w in sizes if target % w]
    if bad:
        lcm = math.lcm(*sizes)
        raise ConfigError(
            f"{ENV_GLOBAL_BATCH}={target} cannot be split evenly over "
            f"{', '.join(map(str, bad))} workers, and this job may run on "
            f"{', '.join(map(str, sizes))}: use a multiple of {lcm} x the micro-batch, or "
            f"unset {ENV_GLOBAL_BATCH} to keep the per-worker batch"
        )
