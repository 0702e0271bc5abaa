"""Exit codes and the exceptions that map onto them."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes of ``trainstack-prewarm`` (documented in docs/prewarm.md)."""

    OK = 0
    INTERNAL = 1  # a bug: an unexpected exception
    USAGE = 2  # bad arguments (argparse uses 2 as well)
    INCOMPLETE = 3  # verify/wait: the cache is not complete, or does not match its manifest
    SOURCE = 4  # non-retryable source error: access denied, no such key/bucket/path
    RETRIES_EXHAUSTED = 5  # throttling or transient errors outlasted --max-attempts
    INTEGRITY = 6  # size/checksum mismatch that persisted through every attempt
    LOCAL = 7  # the local cache cannot be written: no space, permissions, bad layout
    LOCK_TIMEOUT = 8  # another fetcher held this dataset version longer than --lock-timeout
    UNHEALTHY = 9  # probe: the agent's CSI Identity.Probe failed, timed out or said not ready


class PrewarmError(Exception):
    """An error with a clear message and the exit code it maps to."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(PrewarmError):
    exit_code = ExitCode.USAGE


class IncompleteCacheError(PrewarmError):
    exit_code = ExitCode.INCOMPLETE


class SourceError(PrewarmError):
    """Not worth retrying: the request will fail the same way every time."""

    exit_code = ExitCode.SOURCE


class TransientError(PrewarmError):
    """Worth retrying: throttling, a 5xx, a dropped connection, a torn read."""

    exit_code = ExitCode.RETRIES_EXHAUSTED


class ThrottledError(TransientError):
    """The source asked us to slow down (SlowDown, 503, 429): the node's request rate halves."""


class IntegrityError(TransientError):
    """Copied bytes do not match the source's size or checksum.

    Retryable, because a torn read or a corrupted response is usually not repeated; when every
    attempt disagrees the source itself is inconsistent and the exit code says so.
    """

    exit_code = ExitCode.INTEGRITY


class LocalCacheError(PrewarmError):
    exit_code = ExitCode.LOCAL


class LockTimeoutError(PrewarmError):
    exit_code = ExitCode.LOCK_TIMEOUT


class AgentUnhealthyError(PrewarmError):
    """The node agent did not answer the CSI Identity.Probe ready: its liveness check fails."""

    exit_code = ExitCode.UNHEALTHY
