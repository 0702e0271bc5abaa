"""Map failures to the exit-code contract in :mod:`trainstack_runtime.contract`.

Used in two places: the worker maps the exception that ended it, and the supervisor maps each
worker's exit status (and the message the worker left) to one verdict for the container.
No torch import: exceptions are matched by class name along the MRO.
"""

from __future__ import annotations

import errno
import json
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import EXIT_CLASS, FATAL, RETRYABLE, ExitCode


class ConfigError(Exception):
    """Bad arguments, environment or checkpoint/world mismatch: retrying will not help."""


class StorageError(OSError):
    """Checkpoint storage failed in a way that may succeed on retry."""


class Preempted(Exception):
    """Raised in the worker after the emergency checkpoint committed."""

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted at step {step}; emergency checkpoint committed")
        self.step = step


_STORAGE_ERRNOS = frozenset({errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.ENOSPC, errno.EROFS})
# A missing file or a refused permission on a job's volumes is usually the mount (not ready on
# a new node, a stale client, a uid that does not own a Lustre sub-path), which a new pod may
# not share; a real typo fails again and spends the job's maxRetry. Issue 22 #6: these were
# user errors (AbortJob).
_MOUNT_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTCONN})

# Order matters: the first matching class wins. Hardware is what the CUDA runtime says of its
# own device (cudaErrorECCUncorrectable, a GPU lost or off the bus); what only suggests it
# (illegal memory access, launch failure: most often a kernel bug) is a crash, and the node's
# DCGM evidence (evidence.py) decides hardware in the supervisor.
_TEXT_RULES: tuple[tuple[ExitCode, re.Pattern[str]], ...] = (
    (
        ExitCode.DEVICE_OOM,
        re.compile(r"CUDA out of memory|OutOfMemoryError|HIP out of memory", re.I),
    ),
    (
        ExitCode.HARDWARE,
        re.compile(
            r"uncorrectable ECC|ECC error|GPU is lost|fallen off the bus|NVLink error", re.I
        ),
    ),
    (
        ExitCode.CRASH,
        re.compile(
            r"illegal memory access|unspecified launch failure|misaligned address|"
            r"illegal instruction|Segmentation fault|Bus error",
            re.I,
        ),
    ),
    (
        ExitCode.PEER_LOST,
        re.compile(
            r"Connection closed by peer|Connection reset by peer|Broken pipe|"
            r"Connection refused|DistStoreError|RendezvousClosedError|"
            r"RendezvousConnectionError|peer .*(died|closed|lost)|socket closed",
            re.I,
        ),
    ),
    (
        ExitCode.COMM_ERROR,
        re.compile(
            r"DistBackendError|DistNetworkError|NCCL|Watchdog caught collective|"
            r"\bgloo\b.*Timed out|Timed out waiting|collective operation timeout|"
            r"Application timeout caused pair closure|operation timed out|"
            r"Timed out initializing process group|store_based_barrier|Socket Timeout|"
            r"wait timeout|RendezvousTimeoutError|RendezvousError|TimeoutError|"
            r"ProcessGroup.*(timeout|error)",
            re.I,
        ),
    ),
    (
        ExitCode.STORAGE,
        re.compile(
            r"Input/output error|Stale file handle|No space left on device|"
            r"Read-only file system|SlowDown|ServiceUnavailable",
            re.I,
        ),
    ),
)

# SIGSEGV and SIGBUS are mostly software (a native extension, a kernel bug) or a full
# /dev/shm (SIGBUS on a shared-memory page), not the node: a retry-limited crash. SIGABRT is
# the NCCL watchdog's teardown; an ECC error behind it shows in the node's evidence.
_SIGNAL_CODES: dict[int, ExitCode] = {
    signal.SIGKILL: ExitCode.KILLED,
    signal.SIGABRT: ExitCode.COMM_ERROR,  # NCCL watchdog teardown
    signal.SIGBUS: ExitCode.CRASH,
    signal.SIGSEGV: ExitCode.CRASH,
    signal.SIGILL: ExitCode.CRASH,
    signal.SIGFPE: ExitCode.CRASH,
    signal.SIGTERM: ExitCode.PREEMPTED,
}


def classify_text(text: str, default: ExitCode = ExitCode.USER_ERROR) -> ExitCode:
    """Classify free text (an error message or traceback)."""
    for code, pattern in _TEXT_RULES:
        if pattern.search(text):
            return code
    return default


def _type_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def classify_exception(exc: BaseException) -> ExitCode:  # noqa: PLR0911 - a rule table
    """Exit code for the exception that ended a worker."""
    names = _type_names(exc)
    if isinstance(exc, Preempted):
        return ExitCode.PREEMPTED
    if isinstance(exc, ConfigError) or "TopologyError" in names:
        return ExitCode.CONFIG_ERROR
    if "OutOfMemoryError" in names:  # torch.OutOfMemoryError (device memory)
        return ExitCode.DEVICE_OOM
    if isinstance(exc, MemoryError):
        # Host allocation failed without the OOM-killer: usually transient pressure.
        return ExitCode.KILLED
    if isinstance(exc, StorageError) or (
        isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS | _MOUNT_ERRNOS
    ):
        return ExitCode.STORAGE
    if isinstance(exc, TimeoutError):  # a rendezvous or store that did not answer in time
        return ExitCode.COMM_ERROR
    text = f"{type(exc).__name__}: {exc}"
    if names & {"DistStoreError"}:
        return ExitCode.PEER_LOST
    if names & {"DistBackendError", "DistNetworkError", "DistError"}:
        # A distributed error carrying peer-loss text is a peer loss, else a comm error.
        by_text = classify_text(text, default=ExitCode.COMM_ERROR)
        if by_text in (ExitCode.PEER_LOST, ExitCode.HARDWARE, ExitCode.CRASH):
            return by_text
        return ExitCode.COMM_ERROR
    by_text = classify_text(text)
    if by_text is not ExitCode.USER_ERROR:
        return by_text
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        return classify_exception(cause)
    return ExitCode.USER_ERROR


def classify_exit(exitcode: int, message: str = "") -> ExitCode:
    """Classify one worker's exit status as seen by the launcher.

    ``exitcode`` follows ``subprocess`` semantics: negative means killed by that signal.
    Workers started through :func:`trainstack_runtime.session.run` already exit with a
    contract code; anything else (a bare script, an interpreter crash) is mapped here.
    """
    if exitcode < 0:
        return _SIGNAL_CODES.get(-exitcode, ExitCode.KILLED)
    try:
        code = ExitCode(exitcode)
    except ValueError:
        if exitcode > 128 and exitcode - 128 in _SIGNAL_CODES:  # a shell's 128+signal
            return _SIGNAL_CODES[exitcode - 128]
        return classify_text(message, default=ExitCode.USER_ERROR)
    if code is ExitCode.USER_ERROR and message:
        # A plain `exit 1` from an uncaught exception: the error file may say more.
        return classify_text(message, default=ExitCode.USER_ERROR)
    return code


# Among retryable classes the most specific root cause wins; PEER_LOST and PREEMPTED are
# usually side effects of another rank's failure, so they rank last.
_PRIORITY: tuple[ExitCode, ...] = (
    ExitCode.CONFIG_ERROR,
    ExitCode.DEVICE_OOM,
    ExitCode.CRASH_LOOP,
    ExitCode.RETRIES_EXHAUSTED,
    ExitCode.USER_ERROR,
    ExitCode.HARDWARE,
    ExitCode.CRASH,
    ExitCode.STORAGE,
    ExitCode.KILLED,
    ExitCode.COMM_ERROR,
    ExitCode.PEER_LOST,
    ExitCode.PREEMPTED,
)


def verdict(codes: Iterable[ExitCode]) -> ExitCode:
    """One code for the container: any fatal cause wins, else the most specific retryable."""
    present = {c for c in codes if c is not ExitCode.OK}
    if not present:
        return ExitCode.OK
    for code in _PRIORITY:
        if code in present:
            return code
    raise AssertionError(f"unranked exit codes {present}")  # pragma: no cover


def is_fatal(code: ExitCode) -> bool:
    return code in FATAL


@dataclass
class Outcome:
    code: ExitCode
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    cause: str = ""

    def termination_message(self) -> str:
        return json.dumps(
            {
                "code": int(self.code),
                "class": EXIT_CLASS[self.code],
                "retryable": self.code in RETRYABLE,
                "ranks": {str(k): v for k, v in sorted(self.ranks.items())},
                "cause": self.cause[:300],
            },
            separators=(",", ":"),
        )


def _read_exit_record(run_dir: Path, rank: int, pid: int) -> dict[str, Any] | None:
    path = run_dir / "exit" / f"rank-{rank:05d}.json"
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("pid") == pid else None  # stale: from an earlier attempt


# How long after the first failure an exit still counts as a cause. Once a worker fails the
# launcher SIGTERMs the rest and SIGKILLs those still alive 30 s later (torch 2.13
# torch/distributed/elastic/multiprocessing/api.py: SubprocessContext._poll calls close(),
# whose _close(death_sig, timeout=30) escalates to SIGKILL); ranks that fail together (a
# peer's connection reset, a shared timeout) exit within a poll or two of each other.
COLLATERAL_AFTER_S = 5.0


def classify_failures(failures: dict[int, Any], run_dir: Path) -> Outcome:
    """``failures``: rank -> torch ProcessFailure (``exitcode``, ``pid``, ``message``,
    ``timestamp``).

    Exits after the first failure are collateral, not causes: the launcher's SIGTERM, and its
    SIGKILL of a rank that kept the preemption handler and stayed blocked (a wedged peer, or
    one waiting on it in a collective). Counting that SIGKILL made a wedged rank's job
    ``killed`` (137) instead of the communication error that ended it (issue 22 #5).
    """
    ranks: dict[int, dict[str, Any]] = {}
    codes: dict[int, ExitCode] = {}
    messages: dict[int, str] = {}
    times: dict[int, float | None] = {}
    for rank, failure in failures.items():
        exitcode = int(failure.exitcode)
        record = _read_exit_record(run_dir, rank, int(failure.pid))
        message = (record or {}).get("message") or str(getattr(failure, "message", "") or "")
        code = classify_exit(exitcode, message)
        codes[rank], messages[rank] = code, message
        times[rank] = _exit_time(failure, record)
        entry: dict[str, Any] = {"exitcode": exitcode, "code": int(code)}
        if exitcode < 0:
            try:
                entry["signal"] = signal.Signals(-exitcode).name
            except ValueError:
                entry["signal"] = str(-exitcode)
        ranks[rank] = entry
    known = [t for t in times.values() if t is not None]
    late = min(known, default=0.0) + COLLATERAL_AFTER_S
    causes = {
        r: c
        for r, c in codes.items()
        if failures[r].exitcode != -signal.SIGTERM and (times[r] or 0.0) <= late
    } or codes
    for rank in set(codes) - set(causes):
        ranks[rank]["collateral"] = True
    code = verdict(causes.values())
    root = next((r for r in sorted(causes) if causes[r] is code), None)
    cause = messages.get(root, "") if root is not None else ""
    if root is not None and not cause:
        cause = f"rank {root} exited {ranks[root]['exitcode']}"
    return Outcome(code, ranks, cause)


def _exit_time(failure: Any, record: dict[str, Any] | None) -> float | None:
    """When a rank exited: its own record's time, else when the launcher saw it (torch's
    ProcessFailure.timestamp, whole seconds, errors/__init__.py); None when neither is known
    (such a rank counts as a cause)."""
    if record and isinstance(record.get("time"), int | float):
        return float(record["time"])
    stamp = getattr(failure, "timestamp", None)
    return float(stamp) if isinstance(stamp, int | float) else None
