"""SIGTERM handling in workers: note the request, agree across ranks, stop at the same step.

The handler only sets a flag (no I/O in signal context). Ranks may see the signal at different
steps (kubelet signals each pod separately), so at every step end the flags are all-reduced
with MAX. The all-reduce is started at step N and read at step N+1, so its latency hides
behind a step; all ranks read the same reduced value at the same step, so they stop together.
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist


class PreemptionWatcher:
    def __init__(self, distributed: bool, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self.distributed = distributed
        self.requested_at: float | None = None
        self._work: Any = None
        self._flag = torch.zeros(1, dtype=torch.int32)
        for sig in signals:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        if self.requested_at is None:
            self.requested_at = time.time()

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def agreed(self) -> bool:
        """Call once per step on every rank; True when any rank asked to stop."""
        if not self.distributed:
            return self.requested
        stop = False
        if self._work is not None:
            self._work.wait()
            stop = int(self._flag.item()) > 0
        if stop:
            self._work = None
            return True
        self._flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, async_op=True)
        return False

    def until_signalled(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Wait up to ``timeout_s`` for this process's own signal; True once it came."""
        deadline = time.monotonic() + timeout_s
        while not self.requested and time.monotonic() < deadline:
            time.sleep(poll_s)
        return self.requested

    def drain(self) -> None:
        """Complete the outstanding all-reduce so the process group can shut down cleanly."""
        if self._work is not None:
            self._work.wait()
            self._work = None
