"""Per-source request controls: concurrency, an adaptive request rate and a retry budget.

Concurrency alone does not bound the load a fleet puts on a bucket: 400 requests in flight at
~25 ms each is ~16,000 requests/s. So every request to a source also takes a token from that
source's :class:`AdaptiveRateLimiter` (a ceiling in requests/s that no window exceeds, the
node's share of a fleet budget, and below it a rate that halves on throttling and grows back
slowly, AIMD), and every retry spends from its :class:`RetryBudget` (shared by all
workers, refilled by successes), so a throttled node backs off instead of multiplying its
requests. Sources that share a backend share a key, so two fetches in one process from the same
bucket, or from the same Lustre filesystem, share one limit, one rate and one budget.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from trainstack_prewarm.errors import UsageError

# requests/s per node and source when no fleet budget says otherwise; the platform passes
# its fleet budget / the nodes that can run the agent (trainstack/builders/cache.py).
DEFAULT_MAX_RATE = 50.0
DEFAULT_MIN_RATE = 0.5
DEFAULT_RATE_INCREASE = 1.0  # requests/s gained per second without throttling
DEFAULT_RETRY_BUDGET = 100.0
# The window the ceiling is counted over: one second plus 0.1 s for the variation of a
# request's delay between this limiter and storage (see AdaptiveRateLimiter).
DEFAULT_RATE_WINDOW_S = 1.1


class AdaptiveRateLimiter:
    """A request-rate ceiling that holds in every window, with AIMD below it.

    Two rules decide when a request may start (both on this limiter's clock, at the moment the
    request is let go, so a thread that oversleeps cannot bunch its request up with the next):

    * the ceiling, ``max_rate``: at most ``window_quota`` = ``max(1, floor(max_rate))`` starts
      in any window of ``window_s`` seconds (default 1.1). A fleet of ``n`` nodes whose
      ceilings add up to a budget ``B`` (``n * max_rate <= B``) therefore sends at most ``B``
      requests in any one-second window, by construction and without coordination, provided a
      request's delay from this limiter to storage varies by less than ``window_s - 1``
      (the 0.1 s slack). Counts are whole requests, so a node's ceiling is rounded down to a
      whole number per window (1.56/s sends 1 per 1.1 s); the ceiling is never exceeded.
    * the adaptive rate, ``rate <= max_rate``: starts are spaced at least ``1 / rate``
      seconds apart (a token bucket of depth one: no burst after idling). ``throttled()``
      halves it (down to ``min_rate``), at most once per ``1 / rate`` seconds so a burst of
      throttled responses to requests already in flight counts as one signal; ``succeeded()``
      adds ``increase / rate`` so it grows by about ``increase`` requests/s per second, never
      above ``max_rate``. This is for storage that throttles below the budget.
    """

    def __init__(
        self,
        max_rate: float,
        *,
        min_rate: float = DEFAULT_MIN_RATE,
        initial_rate: float | None = None,
        increase: float = DEFAULT_RATE_INCREASE,
        window_s: float = DEFAULT_RATE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if max_rate <= 0 or min_rate <= 0 or increase < 0:
            raise UsageError("request rates must be > 0")
        if window_s < 1.0:
            raise UsageError("the rate window must be >= 1 s")
        self.max_rate = max_rate
        self.min_rate = min(min_rate, max_rate)
        self._rate = min(max_rate, initial_rate if initial_rate is not None else max_rate)
        self._increase = increase
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self.window_s = window_s
        self.window_quota = max(1, math.floor(max_rate))
        # Start times of the last window_quota requests, oldest first.
        self._starts: collections.deque[float] = collections.deque(maxlen=self.window_quota)
        self._next = clock()
        self._last_cut = float("-inf")
        self.throttle_events = 0
        self.cuts = 0
        self.lowest_rate = self._rate

    @property
    def rate(self) -> float:
        with self._lock:
            return self._rate

    def acquire(self) -> None:
        """Block until this request may start: its start time is taken when it is let go."""
        while True:
            with self._lock:
                now = self._clock()
                start = max(now, self._next)
                if len(self._starts) == self.window_quota:
                    start = max(start, self._starts[0] + self.window_s)
                if start <= now:
                    self._starts.append(now)
                    self._next = now + 1.0 / self._rate
                    return
            self._sleep(start - now)

    def throttled(self) -> None:
        with self._lock:
            self.throttle_events += 1
            now = self._clock()
            if now - self._last_cut < 1.0 / self._rate:
                return
            self._last_cut = now
            self._rate = max(self.min_rate, self._rate / 2.0)
            self.cuts += 1
            self.lowest_rate = min(self.lowest_rate, self._rate)
            # Requests already scheduled at the old spacing are pushed back to the new one.
            self._next = max(self._next, now + 1.0 / self._rate)

    def succeeded(self) -> None:
        with self._lock:
            self._rate = min(self.max_rate, self._rate + self._increase / self._rate)


class RetryBudget:
    """Retries allowed across all workers: each costs one token, each success refunds a bit.

    Like botocore's retry quota (``botocore/retries/quota.py``, 500 units, 5 per throttled
    retry), but shared by every worker and request of a source rather than per client. When
    the budget is empty a failed request is not retried at once: its file is deferred to a
    later round (see ``fetch``), so first attempts always proceed and retries cannot multiply.
    """

    def __init__(self, capacity: float = DEFAULT_RETRY_BUDGET, refill: float = 0.1) -> None:
        if capacity < 0 or refill < 0:
            raise UsageError("the retry budget must be >= 0")
        self.capacity = capacity
        self._tokens = capacity
        self._refill = refill
        self._lock = threading.Lock()
        self.denied = 0

    @property
    def tokens(self) -> float:
        with self._lock:
            return self._tokens

    def try_spend(self) -> bool:
        with self._lock:
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            self.denied += 1
            return False

    def refund(self) -> None:
        with self._lock:
            self._tokens = min(self.capacity, self._tokens + self._refill)


@dataclass(frozen=True)
class RateOptions:
    """Per-source rate settings; ``max_rate=None`` turns rate limiting off."""

    max_rate: float | None = None
    min_rate: float = DEFAULT_MIN_RATE
    initial_rate: float | None = None
    increase: float = DEFAULT_RATE_INCREASE
    retry_budget: float = DEFAULT_RETRY_BUDGET
    window_s: float = DEFAULT_RATE_WINDOW_S


class SourceLimiter:
    def __init__(
        self,
        default_limit: int,
        overrides: Mapping[str, int] | None = None,
        *,
        rate: RateOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        limits = dict(overrides or {})
        if default_limit < 1 or any(v < 1 for v in limits.values()):
            raise UsageError("concurrency limits must be >= 1")
        self._default = default_limit
        self._overrides = limits
        self._rate_opts = rate or RateOptions()
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._sems: dict[str, threading.BoundedSemaphore] = {}
        self._rates: dict[str, AdaptiveRateLimiter] = {}
        self._budgets: dict[str, RetryBudget] = {}
        self._in_flight: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        self.requests: dict[str, int] = {}

    def limit(self, key: str) -> int:
        return self._overrides.get(key, self._default)

    def _semaphore(self, key: str) -> threading.BoundedSemaphore:
        with self._lock:
            sem = self._sems.get(key)
            if sem is None:
                sem = threading.BoundedSemaphore(self.limit(key))
                self._sems[key] = sem
            return sem

    def rate(self, key: str) -> AdaptiveRateLimiter | None:
        opts = self._rate_opts
        if opts.max_rate is None:
            return None
        with self._lock:
            limiter = self._rates.get(key)
            if limiter is None:
                limiter = AdaptiveRateLimiter(
                    opts.max_rate,
                    min_rate=opts.min_rate,
                    initial_rate=opts.initial_rate,
                    increase=opts.increase,
                    window_s=opts.window_s,
                    clock=self._clock,
                    sleep=self._sleep,
                )
                self._rates[key] = limiter
            return limiter

    def budget(self, key: str) -> RetryBudget:
        with self._lock:
            budget = self._budgets.get(key)
            if budget is None:
                budget = RetryBudget(self._rate_opts.retry_budget)
                self._budgets[key] = budget
            return budget

    @contextmanager
    def slot(self, key: str) -> Iterator[None]:
        """One request: a concurrency slot, then a rate token (one per request started)."""
        sem = self._semaphore(key)
        rate = self.rate(key)
        with sem:
            if rate is not None:
                rate.acquire()
            with self._lock:
                now = self._in_flight.get(key, 0) + 1
                self._in_flight[key] = now
                self._peak[key] = max(self._peak.get(key, 0), now)
                self.requests[key] = self.requests.get(key, 0) + 1
            try:
                yield
            finally:
                with self._lock:
                    self._in_flight[key] -= 1

    def throttled(self, key: str) -> None:
        rate = self.rate(key)
        if rate is not None:
            rate.throttled()

    def succeeded(self, key: str) -> None:
        rate = self.rate(key)
        if rate is not None:
            rate.succeeded()
        self.budget(key).refund()

    def peak(self, key: str) -> int:
        """Most requests ever in flight at once for ``key`` (reported in the final log line)."""
        with self._lock:
            return self._peak.get(key, 0)
