"""Backoff, the retry loop, ETag arithmetic, path safety and the manifest parser."""

from __future__ import annotations

import hashlib
import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from trainstack_prewarm.errors import (
    ExitCode,
    IntegrityError,
    SourceError,
    TransientError,
    UsageError,
)
from trainstack_prewarm.limits import SourceLimiter
from trainstack_prewarm.retry import RetryPolicy, call_with_retry
from trainstack_prewarm.s3 import _EtagHasher
from trainstack_prewarm.sources import check_relpath, parse_manifest


@given(
    attempt=st.integers(min_value=1, max_value=5000),
    base=st.floats(min_value=0.0, max_value=10.0),
    cap=st.floats(min_value=0.0, max_value=600.0),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_is_full_jitter_under_a_capped_exponential(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    policy = RetryPolicy(3, base, cap)
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 62))
    assert policy.ceiling(attempt) == ceiling
    assert 0.0 <= policy.backoff(attempt, random.Random(seed)) <= ceiling


def test_backoff_spreads_over_the_whole_window() -> None:
    # Full jitter, not equal jitter: draws land in the lower half as often as the upper half.
    policy = RetryPolicy(8, 1.0, 100.0)
    rng = random.Random(0)
    draws = [policy.backoff(4, rng) for _ in range(2000)]
    assert min(draws) < 0.5
    assert max(draws) > 7.5
    assert 0.4 < sum(d < 4 for d in draws) / len(draws) < 0.6


def test_retry_loop_retries_only_transient_errors() -> None:
    sleeps: list[float] = []
    calls: list[int] = []
    seen: list[tuple[int, str]] = []

    def flaky(attempt: int) -> str:
        calls.append(attempt)
        if attempt < 3:
            raise TransientError(f"slow down #{attempt}")
        return "ok"

    policy = RetryPolicy(5, 1.0, 10.0)
    result = call_with_retry(
        flaky,
        policy,
        sleep=sleeps.append,
        rng=random.Random(2),
        on_retry=lambda a, _d, e: seen.append((a, e.message)),
    )
    assert result == "ok"
    assert calls == [1, 2, 3]
    assert seen == [(1, "slow down #1"), (2, "slow down #2")]
    rng = random.Random(2)
    assert sleeps == [rng.uniform(0, 1.0), rng.uniform(0, 2.0)]

    def denied(_attempt: int) -> str:
        calls.append(-1)
        raise SourceError("AccessDenied")

    calls.clear()
    with pytest.raises(SourceError):
        call_with_retry(
            denied, policy, sleep=sleeps.append, rng=random.Random(2), on_retry=lambda *_: None
        )
    assert calls == [-1]


def test_exhausted_integrity_errors_keep_their_exit_code() -> None:
    def corrupt(_attempt: int) -> None:
        raise IntegrityError("sha256 mismatch")

    with pytest.raises(IntegrityError) as info:
        call_with_retry(
            corrupt,
            RetryPolicy(4, 0, 0),
            sleep=lambda _s: None,
            rng=random.Random(),
            on_retry=lambda *_: None,
        )
    assert info.value.exit_code == ExitCode.INTEGRITY
    assert str(info.value) == "sha256 mismatch (gave up after 4 attempts)"


def test_invalid_limits_are_usage_errors() -> None:
    with pytest.raises(UsageError):
        RetryPolicy(0)
    with pytest.raises(UsageError):
        RetryPolicy(3, -1.0)
    with pytest.raises(UsageError):
        SourceLimiter(0)
    with pytest.raises(UsageError):
        SourceLimiter(4, {"s3://b": 0})
    assert SourceLimiter(4, {"s3://b": 2}).limit("s3://b") == 2


@given(
    data=st.binary(min_size=1, max_size=5000),
    part=st.integers(min_value=1, max_value=1500),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6),
)
def test_multipart_etag_matches_s3_definition_for_any_chunking(
    data: bytes, part: int, cuts: list[int]
) -> None:
    parts = [data[i : i + part] for i in range(0, len(data), part)]
    md5s = b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts)
    expected = f"{hashlib.md5(md5s, usedforsecurity=False).hexdigest()}-{len(parts)}"
    hasher = _EtagHasher(part)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    for lo, hi in itertools.pairwise(bounds):
        hasher.update(data[lo:hi])
    assert hasher.hexdigest() == expected
    single = _EtagHasher(None)
    single.update(data)
    assert single.hexdigest() == hashlib.md5(data, usedforsecurity=False).hexdigest()


@pytest.mark.parametrize(
    "bad", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", "nul\x00byte"]
)
def test_unsafe_paths_are_rejected(bad: str) -> None:
    with pytest.raises(SourceError, match="unsafe file name"):
        check_relpath(bad, "s3://b/p/")


def test_safe_paths_pass() -> None:
    assert check_relpath("train/shard-00001.tar", "x") == "train/shard-00001.tar"
    assert check_relpath("..hidden-ok", "x") == "..hidden-ok"


def test_manifest_parser_accepts_sha256sum_output_and_rejects_garbage() -> None:
    h = "ab" * 32
    assert parse_manifest(f"# comment\n{h}  a.bin\n{h.upper()} *./dir/b.bin\n\n".encode(), "m") == {
        "a.bin": h,
        "dir/b.bin": h,
    }
    with pytest.raises(SourceError, match="m:1: not a sha256sum line"):
        parse_manifest(b"deadbeef  a.bin\n", "m")
    with pytest.raises(SourceError, match="unsafe"):
        parse_manifest(f"{h}  ../../etc/shadow\n".encode(), "m")
