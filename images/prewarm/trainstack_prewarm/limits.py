"""Bounded concurrency per source.

A fetch holds one slot of its source's semaphore for each request in flight (never while it
sleeps in backoff). Sources that share a backend share a key, so two fetches in one process
from the same bucket, or from the same Lustre filesystem, share one limit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from trainstack_prewarm.errors import UsageError


class SourceLimiter:
    def __init__(self, default_limit: int, overrides: Mapping[str, int] | None = None) -> None:
        limits = dict(overrides or {})
        if default_limit < 1 or any(v < 1 for v in limits.values()):
            raise UsageError("concurrency limits must be >= 1")
        self._default = default_limit
        self._overrides = limits
        self._lock = threading.Lock()
        self._sems: dict[str, threading.BoundedSemaphore] = {}
        self._in_flight: dict[str, int] = {}
        self._peak: dict[str, int] = {}

    def limit(self, key: str) -> int:
        return self._overrides.get(key, self._default)

    def _semaphore(self, key: str) -> threading.BoundedSemaphore:
        with self._lock:
            sem = self._sems.get(key)
            if sem is None:
                sem = threading.BoundedSemaphore(self.limit(key))
                self._sems[key] = sem
            return sem

    @contextmanager
    def slot(self, key: str) -> Iterator[None]:
        sem = self._semaphore(key)
        with sem:
            with self._lock:
                now = self._in_flight.get(key, 0) + 1
                self._in_flight[key] = now
                self._peak[key] = max(self._peak.get(key, 0), now)
            try:
                yield
            finally:
                with self._lock:
                    self._in_flight[key] -= 1

    def peak(self, key: str) -> int:
        """Most requests ever in flight at once for ``key`` (reported in the final log line)."""
        with self._lock:
            return self._peak.get(key, 0)
