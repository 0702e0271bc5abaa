"""A resumable, deterministic data pipeline: its position is part of the checkpoint.

Shuffling uses a private ``torch.Generator`` seeded from (seed, epoch), never the global RNG,
so creating or resuming an iterator does not perturb model randomness (dropout etc.).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .exitcodes import ConfigError


class SyntheticRegression(Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """Sample ``i`` is a pure function of (seed, i): same bytes on every run and rank."""

    def __init__(self, size: int, dim: int, seed: int = 0) -> None:
        if size < 1 or dim < 1:
            raise ConfigError("dataset size and dim must be >= 1")
        self.size, self.dim, self.seed = size, dim, seed
        g = torch.Generator().manual_seed(seed)
        self._w = torch.randn(dim, 1, generator=g)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, int) or not 0 <= index < self.size:
            raise IndexError(index)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 1)
        x = torch.randn(self.dim, generator=g)
        y = x @ self._w + 0.01 * torch.randn(1, generator=g)
        return x, y


class ResumableLoader:
    """Batches from this rank's shard of a shuffled dataset; ``state_dict`` is its position."""

    def __init__(
        self,
        dataset: Sequence[tuple[torch.Tensor, ...]],
        batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        per_rank = len(dataset) // world_size
        if batch_size < 1 or per_rank < batch_size:
            raise ConfigError(
                f"batch_size={batch_size} must be >= 1 and <= samples per rank ({per_rank})"
            )
        self.dataset, self.batch_size = dataset, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch, self.position = 0, 0
        self._order: list[int] | None = None

    def _shard(self) -> list[int]:
        if self._order is None:
            g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
            perm = torch.randperm(len(self.dataset), generator=g).tolist()
            per_rank = len(perm) // self.world_size
            self._order = perm[self.rank :: self.world_size][:per_rank]
        return self._order

    def __iter__(self) -> ResumableLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, ...]:
        order = self._shard()
        if self.position + self.batch_size > len(order):  # drop the ragged tail
            self.epoch, self.position, self._order = self.epoch + 1, 0, None
            order = self._shard()
        idx = order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        samples = [self.dataset[i] for i in idx]
        return tuple(torch.stack(parts) for parts in zip(*samples, strict=True))

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume; also on another number of ranks (a resharded checkpoint). Ranks read
        ``perm[rank::world]`` in lockstep, so ``position`` on W ranks means the first
        ``position * W`` samples of the epoch's permutation were consumed; on W' ranks that
        is position ``position * W // W'``, rounded down to whole batches so that the epoch's
        tail is cut where a run on W' ranks cuts it: nothing skipped, fewer than
        ``batch_size * W'`` samples read twice."""
        if state["seed"] != self.seed:
            raise ConfigError(
                f"data-loader state was saved with seed {state['seed']}, this loader has "
                f"{self.seed}"
            )
        position = int(state["position"]) * int(state["world_size"]) // self.world_size
        position -= position % self.batch_size
        self.epoch, self.position, self._order = int(state["epoch"]), position, None
