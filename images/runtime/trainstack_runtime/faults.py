"""Fault injection for chaos tests (``TRAINSTACK_FAULT``); inert when the variable is unset.

Spec: ``KIND@STEP[,rank=R][,attempt=A]``, several joined by ``;``. ``attempt`` (default 0)
matches ``TORCHELASTIC_RESTART_COUNT`` so an in-pod restart does not re-inject the fault.

Kinds fired at the end of step STEP: ``raise`` (ValueError), ``oom`` (torch.OutOfMemoryError),
``sigkill``, ``hang``, ``eio`` (OSError EIO), ``ecc`` (an uncorrectable-ECC CUDA error),
``kill-node`` (SIGKILL the launcher, then this process: a node vanishing), ``wedge`` (stuck
like ``hang`` but keeping the runtime's SIGTERM handler, so only SIGKILL ends it: a rank
wedged in native code never runs the Python handler's graceful stop), ``segv`` (SIGSEGV:
a native crash), ``abort`` (SIGABRT, as the NCCL watchdog tears a process down).
Fired inside the checkpoint writer of step STEP: ``kill-in-ckpt`` (SIGKILL halfway through
writing this rank's data file).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass

import torch

from .contract import ENV_FAULT
from .exitcodes import ConfigError

STEP_KINDS = frozenset(
    {"raise", "oom", "sigkill", "hang", "eio", "ecc", "kill-node", "wedge", "segv", "abort"}
)
CKPT_KINDS = frozenset({"kill-in-ckpt"})


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None
    attempt: int = 0


def parse(spec: str) -> list[Fault]:
    faults = []
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        head, *opts = item.split(",")
        kind, sep, step = head.partition("@")
        if not sep or kind not in STEP_KINDS | CKPT_KINDS or not step.isdigit():
            raise ConfigError(f"{ENV_FAULT}: bad fault {item!r} (want KIND@STEP[,rank=R])")
        fields: dict[str, int] = {}
        for opt in opts:
            key, _, value = opt.partition("=")
            if key not in ("rank", "attempt") or not value.isdigit():
                raise ConfigError(f"{ENV_FAULT}: bad option {opt!r} in {item!r}")
            fields[key] = int(value)
        faults.append(Fault(kind, int(step), fields.get("rank"), fields.get("attempt", 0)))
    return faults


class Injector:
    def __init__(self, rank: int, attempt: int, spec: str | None = None) -> None:
        spec = os.environ.get(ENV_FAULT, "") if spec is None else spec
        self._faults = [
            f for f in parse(spec) if (f.rank is None or f.rank == rank) and f.attempt == attempt
        ]

    def _match(self, kinds: frozenset[str], step: int) -> str | None:
        for fault in self._faults:
            if fault.kind in kinds and fault.step == step:
                return fault.kind
        return None

    def at_step_end(self, step: int) -> None:
        kind = self._match(STEP_KINDS, step)
        if kind is None:
            return
        if kind == "raise":
            raise ValueError(f"injected user error at step {step}")
        if kind == "oom":
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected at step {step})")
        if kind == "eio":
            raise OSError(errno.EIO, f"Input/output error (injected at step {step})")
        if kind == "ecc":
            raise RuntimeError("CUDA error: uncorrectable ECC error encountered (injected)")
        if kind == "kill-node":
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "wedge":
            self.wedge()
        if kind in ("segv", "abort"):
            self.crash(signal.SIGSEGV if kind == "segv" else signal.SIGABRT)
        if kind == "hang":
            # Stuck outside any collective, so peers hit the comm timeout. Like a process
            # wedged in native code it ignores the graceful path: SIGTERM kills it outright.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            while True:
                time.sleep(1.0)

    def in_checkpoint_write(self, step: int) -> bool:
        return self._match(CKPT_KINDS, step) is not None

    @staticmethod
    def wedge() -> None:
        """Never return, and leave SIGTERM to whatever handler is installed (the preemption
        watcher's only sets a flag), as a rank stuck in a kernel or a collective does."""
        while True:
            time.sleep(1.0)

    @staticmethod
    def crash(sig: int) -> None:
        """Die of ``sig`` with its default action, as a native crash or abort does."""
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(10.0)  # the signal is delivered at once; never reached
