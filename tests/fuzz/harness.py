"""Running `trainstack` on mutants: the CLI under a time and memory limit, a scratch project.

Everything a command does goes through typer's CliRunner in this process, as a user's
`trainstack ...` would (same code path, no subprocess start-up per mutant).
"""

from __future__ import annotations

import itertools
import os
import resource
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from unittest import mock

import typer.main
import typer.testing
from typer.testing import CliRunner

from tests.fuzz.mutate import Mutant
from tests.fuzz.oracles import Outcome
from trainstack.cli import app

ROOT = Path(__file__).resolve().parents[2]
# What `trainstack preview` needs of a project (tests/conftest.py's ROOT is this repository).
PROJECT_PARTS = ("Pulumi.yaml", "__main__.py", "stacks", "job_specs", "policies")
# Wide enough that rich never wraps a line of ours (an `ok` line with a long temp path).
CLI_ENV = {"COLUMNS": "1000", "NO_COLOR": "1"}
MEMORY_HEADROOM = 4 << 30  # bytes of address space a command may add before MemoryError


class TimeLimit(BaseException):
    """Raised in the command when it runs too long; not an Exception, so nothing catches it."""


@contextmanager
def _limits(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds`, and an address-space cap (a size-driven allocation fails fast).

    Both are process-wide and restored on exit; SIGALRM needs the main thread (pytest's).
    """

    def expire(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise TimeLimit

    previous = signal.signal(signal.SIGALRM, expire)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm", encoding="ascii") as statm:
        in_use = int(statm.read().split()[0]) * resource.getpagesize()
    cap = in_use + MEMORY_HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# typer rebuilds the click command tree from the functions' signatures on every
# CliRunner.invoke (~9 ms, as much as a whole `validate`); `trainstack` builds it once per
# process, and so does this harness.
_COMMAND = typer.main.get_command(app)


@dataclass
class Cli:
    """`trainstack` in-process, one Outcome per invocation."""

    runner: CliRunner = field(default_factory=CliRunner)
    calls: int = 0
    seconds: float = 0.0

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        del cycle
        printer.text(f"Cli(calls={self.calls}, seconds={self.seconds:.1f})")

    def run(self, args: Sequence[str], time_limit: float) -> Outcome:
        started = time.perf_counter()
        self.calls += 1
        try:
            with (
                _limits(time_limit),
                mock.patch.object(typer.testing, "_get_command", return_value=_COMMAND),
            ):
                result = self.runner.invoke(app, list(args), env=CLI_ENV)
        except TimeLimit:
            elapsed = time.perf_counter() - started
            self.seconds += elapsed
            return Outcome(tuple(args), -1, "", None, elapsed, timed_out=True)
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        return Outcome(tuple(args), result.exit_code, result.output, result.exception, elapsed)


# Every write gets its own modification time: trainstack caches job specs by (path, mtime,
# size), and two mutants of one size written within the file system's clock tick would
# otherwise share a cache entry, so the second would never be evaluated.
_MTIMES = itertools.count(time.time_ns() - 10**15, 1_000_000)


def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    stamp = next(_MTIMES)
    os.utime(path, ns=(stamp, stamp))
    return path


@dataclass
class Scratch:
    """A folder for mutants checked alone: every mutant gets a path of its own."""

    root: Path
    count: int = 0

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        del cycle
        printer.text(f"Scratch({self.root})")

    def place(self, mutant: Mutant) -> Path:
        """Stack files keep their name (it names the stack) in a folder of their own."""
        self.count += 1
        if mutant.source.kind == "stack":
            return write(self.root / f"m{self.count:06d}" / mutant.source.name, mutant.content)
        return write(self.root / f"m{self.count:06d}-{mutant.source.name}", mutant.content)


@dataclass
class Project:
    """A copy of the project whose example files are swapped for mutants one at a time."""

    root: Path
    originals: dict[str, bytes] = field(default_factory=dict)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        del cycle
        printer.text(f"Project({self.root})")

    @classmethod
    def copy(cls, destination: Path) -> Project:
        for part in PROJECT_PARTS:
            source = ROOT / part
            if source.is_dir():
                shutil.copytree(
                    source, destination / part, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy2(source, destination / part)
        return cls(destination)

    @contextmanager
    def swapped(self, rel: str, content: bytes) -> Iterator[Path]:
        """The project with `rel` holding `content`; the original is back afterwards."""
        path = self.root / rel
        original = self.originals.setdefault(rel, path.read_bytes())
        write(path, content)
        try:
            yield path
        finally:
            write(path, original)
