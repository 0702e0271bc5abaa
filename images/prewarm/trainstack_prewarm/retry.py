"""Retry with capped exponential backoff and full jitter.

Full jitter (sleep uniformly in ``[0, min(cap, base * 2**(attempt-1))]``) matters when fifty jobs
are throttled by the same bucket at the same moment: equal-jitter or plain exponential backoff
would bring them back in synchronised waves, full jitter spreads them over the whole window.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from trainstack_prewarm.errors import TransientError, UsageError

T = TypeVar("T")

# 2**62 * any sane base is far beyond any cap; larger exponents would overflow a float.
_MAX_EXPONENT = 62


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 8
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UsageError(f"max attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise UsageError("backoff delays must be >= 0")

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the sleep after failed attempt number ``attempt`` (1-based)."""
        exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
        return min(self.max_delay_s, self.base_delay_s * 2.0**exponent)

    def backoff(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, self.ceiling(attempt))


def call_with_retry(
    fn: Callable[[int], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], object],
    rng: random.Random,
    on_retry: Callable[[int, float, TransientError], None],
    budget: Callable[[], bool] | None = None,
) -> T:
    """Call ``fn(attempt)`` until it returns, retrying only :class:`TransientError`.

    Any other exception (a non-retryable source error, a local disk error, a bug) propagates at
    once. When the attempts run out the last transient error is re-raised, its message naming
    the attempt count; its class keeps its exit code (integrity vs. retries exhausted).
    ``budget`` is asked before every retry (the source's shared :class:`RetryBudget`); when it
    says no, the error is re-raised at once so the caller can defer the work.
    """
    attempt = 1
    while True:
        try:
            return fn(attempt)
        except TransientError as exc:
            if attempt >= policy.max_attempts:
                exc.message = f"{exc.message} (gave up after {attempt} attempts)"
                exc.args = (exc.message,)
                raise
            if budget is not None and not budget():
                exc.message = f"{exc.message} (retry budget exhausted after {attempt} attempts)"
                exc.args = (exc.message,)
                raise
            delay = policy.backoff(attempt, rng)
            on_retry(attempt, delay, exc)
            sleep(delay)
            attempt += 1
