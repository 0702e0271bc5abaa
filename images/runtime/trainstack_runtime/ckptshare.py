"""The ranks' shares of replicated state in a save: which rank writes each plain (non-DTensor)
tensor, the part of the state each rank stages and hands DCP (and its size), and the digest
that checks, on the first save, that the ranks' copies are the same (taken from the live
tensors, a chunk at a time, so no rank ever holds a host copy of all of it).

Apart from checkpoint.py (the manager and its commit protocol), which only calls these: functions
of a state dict and the world size, the same on every rank, and the DCP save planner that leaves
module buffers to rank 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import xxhash
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.tensor import DTensor


class _SavePlanner(DefaultSavePlanner):
    """DCP's planner, except that module buffers are written by rank 0 only. DCP writes each
    replicated item once, from whichever rank balances the load (default_planner.py,
    ``dedup_save_plans``); DDP's buffers (BatchNorm statistics) legitimately differ between
    ranks after a forward and DDP takes rank 0's at the next one (``broadcast_buffers``), so
    rank 0's are the ones a bit-exact resume needs."""

    def __init__(self, rank: int, rank0_only: frozenset[str]) -> None:
        super().__init__()
        self._rank, self._rank0_only = rank, rank0_only

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        if self._rank != 0 and self._rank0_only:
            items = [i for i in plan.items if i.index.fqn not in self._rank0_only]
            plan = dataclasses.replace(plan, items=items)
            self.plan = plan
        return plan


def _flat_keys(tree: Any, prefix: str = "") -> dict[str, Any]:
    """DCP's flattened names (``flatten_state_dict``: nested keys joined with dots)."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flat_keys(v, f"{prefix}{k}."))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out.update(_flat_keys(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = tree
    return out


# Bytes of one tensor copied to host at a time for the digest: the first save's extra host
# memory per rank, instead of a full copy of the replicated state (issue 40 #6).
DIGEST_CHUNK = 64 << 20


def _digest(tree: dict[str, Any], skip: frozenset[str], chunk: int = DIGEST_CHUNK) -> int:
    """Of the plain tensors in a tree (not DTensor shards, not ``skip``): 63 bits.

    Reads live tensors a chunk at a time (a device tensor's chunk is copied to host on the
    current stream, so after the work that produced it), so hashing the whole replicated
    state holds one chunk, not a copy of it. xxh3's streaming digest does not depend on how
    the bytes are chunked, so every rank gets the same value for the same contents."""
    h = xxhash.xxh3_64()
    for key, value in sorted(_flat_keys(tree).items()):
        if key in skip or not _plain(value):
            continue
        h.update(key.encode())
        flat = value.detach().reshape(-1)  # a view, or one tensor's copy if not contiguous
        if not flat.numel():
            continue
        raw = flat.view(torch.uint8)
        for start in range(0, raw.numel(), chunk):
            h.update(raw[start : start + chunk].cpu().numpy().data)
    return int.from_bytes(h.digest(), "big") >> 1


def _plain(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, DTensor)


def writers(tree: dict[str, Any], world_size: int, rank0: frozenset[str]) -> dict[str, int]:
    """The rank that writes each plain (replicated) tensor: ``rank0`` ones (module buffers, see
    ``_SavePlanner``) on rank 0, the rest largest first onto the rank with the fewest bytes so
    far. The same on every rank: names and sizes of replicated tensors are the same everywhere
    (the first save checks their contents, names included)."""
    sizes = {
        key: value.numel() * value.element_size()
        for key, value in _flat_keys(tree).items()
        if _plain(value)
    }
    load = [0] * world_size
    owner: dict[str, int] = {}
    for key in sorted(sizes, key=lambda k: (k not in rank0, -sizes[k], k)):
        rank = 0 if key in rank0 else min(range(world_size), key=lambda r: (load[r], r))
        owner[key] = rank
        load[rank] += sizes[key]
    return owner


def own_share(tree: Any, keep: Callable[[str], bool], prefix: str = "") -> Any:
    """``tree`` without the plain tensors ``keep`` rejects (by DCP's flattened name); dicts are
    copied, tensors and everything else are the same objects. Only dict entries are dropped:
    dropping a list element would renumber the names after it."""
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            name = f"{prefix}{key}"
            if _plain(value) and not keep(name):
                continue
            out[key] = own_share(value, keep, name + ".")
        return out
    if isinstance(tree, list):
        return [own_share(v, keep, f"{prefix}{i}.") for i, v in enumerate(tree)]
    return tree


def _nbytes(tree: Any) -> int:
    total = 0
    for value in _flat_keys(tree).values():
        local = value.to_local() if isinstance(value, DTensor) else value
        if isinstance(local, torch.Tensor):
            total += local.numel() * local.element_size()
    return total
