"""Issue 24 #2 to #8: request rate, failed files, paged listing, bounded memory, large objects,
trusting a marked version. Against moto on loopback with a real boto3 client."""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, IncompleteReadError
from botocore.response import StreamingBody
from hypothesis import given, settings
from hypothesis import strategies as st
from trainstack_prewarm import cache
from trainstack_prewarm.cli import build_parser, main
from trainstack_prewarm.errors import ThrottledError, TransientError
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.limits import AdaptiveRateLimiter, RateOptions, SourceLimiter
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.s3 import (
    S3Source,
    classify_s3_error,
    make_s3_client,
)

from tests.prewarm.conftest import (
    FakeTime,
    LogCapture,
    S3Server,
    make_fetcher,
    make_files,
    read_tree,
    s3_source,
    seeded_source,
    upload,
)
from tests.prewarm.loadtest import GeneratedSource

PREFIX = "datasets/scale/v1"


def _fetcher(
    source: Any, tmp_path: Path, fake_time: FakeTime, logs: LogCapture, **kw: Any
) -> Fetcher:
    options = {"concurrency": 1, "retry": RetryPolicy(2, 0.5, 4.0), "seed": 3} | kw
    return make_fetcher(source, tmp_path, fake_time, logs, dataset="scale", version="v1", **options)


# ---- #2: request rate, not concurrency -----------------------------------------------------


def test_rate_limiter_spaces_requests_halves_on_throttling_and_grows_back_slowly() -> None:
    t = FakeTime()
    rate = AdaptiveRateLimiter(10.0, clock=t.clock, sleep=t.sleep, increase=1.0)
    start = t.now
    for _ in range(21):
        rate.acquire()
    # 10/s: spaced 0.1 s, and at most 10 in any 1.1 s window (the ceiling's window), so the
    # 11th waits for 1.1 s after the 1st and the 21st for 1.1 s after the 11th: never a burst.
    assert t.now - start == pytest.approx(2.2)
    rate.throttled()
    rate.throttled()  # the same burst of throttled replies: one halving, not two
    assert rate.rate == pytest.approx(5.0)
    assert rate.cuts == 1
    t.sleep(1.0)
    rate.throttled()
    assert rate.rate == pytest.approx(2.5)
    for _ in range(5):  # ~2 s of successes at 2.5/s: about +1 req/s per second
        rate.succeeded()
    assert 4.0 < rate.rate < 5.0
    for _ in range(10_000):
        rate.succeeded()
    assert rate.rate == 10.0  # never above the ceiling
    for _ in range(20):
        t.sleep(1.0)
        rate.throttled()
    assert rate.rate == rate.min_rate


@settings(max_examples=200, deadline=None)
@given(
    max_rate=st.floats(0.1, 60.0),
    gaps=st.lists(st.sampled_from([0.0, 0.001, 0.05, 0.3, 0.9, 1.5]), min_size=1, max_size=120),
    cuts=st.sets(st.integers(0, 119)),
)
def test_no_window_ever_holds_more_starts_than_the_ceiling(
    max_rate: float, gaps: list[float], cuts: set[int]
) -> None:
    """Whatever the callers do (idle, bursts, throttled replies, fast growth back), no window
    shorter than window_s holds more than the ceiling's whole requests, and AIMD never grows
    the rate above the ceiling."""
    t = FakeTime()
    rate = AdaptiveRateLimiter(max_rate, clock=t.clock, sleep=t.sleep, increase=50.0)
    starts: list[float] = []
    for i, gap in enumerate(gaps):
        t.sleep(gap)
        rate.acquire()
        starts.append(t.now)
        if i in cuts:
            rate.throttled()
        else:
            rate.succeeded()
        assert rate.rate <= max_rate
    quota = rate.window_quota
    assert quota == max(1, math.floor(max_rate))
    for i in range(len(starts) - quota):
        assert starts[i + quota] - starts[i] >= rate.window_s - 1e-9


def test_throttling_slows_the_node_and_retries_come_from_one_shared_budget(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(6)
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)
    names = sorted(files)
    faults.throttle(3, key=f"{PREFIX}/{names[0]}")
    faults.throttle(3, key=f"{PREFIX}/{names[1]}")
    limiter = SourceLimiter(
        2,
        rate=RateOptions(max_rate=20.0, retry_budget=2),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
    )

    result = _fetcher(
        source, tmp_path, fake_time, logs, concurrency=2, limiter=limiter,
        retry=RetryPolicy(8, 0.5, 4.0), file_rounds=3,
    ).run()  # fmt: skip

    assert read_tree(result.vdir) == files
    rate = limiter.rate(source.limit_key)
    assert rate is not None
    assert rate.cuts >= 1  # SlowDown halved the node's rate
    assert rate.lowest_rate <= 10.0
    # Eight attempts each would have been allowed per file; the shared budget of two retries
    # stopped them, and the files were retried in later rounds instead.
    deferred = logs.events("deferred")
    assert deferred
    assert any("retry budget exhausted" in d["error"] for d in deferred)
    assert logs.events("retry_round")


def test_cli_defaults_jitter_starts_and_limit_the_rate() -> None:
    args = build_parser().parse_args(
        ["fetch", "--source", "s3://b/p", "--dataset", "d", "--version", "v"]
    )
    assert args.start_jitter > 0  # the job layer renders no --start-jitter: this applies
    assert args.max_request_rate > 0
    assert args.retry_budget > 0
    assert FetchOptions().start_jitter_s == args.start_jitter
    # Where our limiter is off, botocore's adaptive mode paces the client (one attempt still).
    client = make_s3_client(endpoint_url="http://127.0.0.1:9", region="us-east-1", adaptive=True)
    assert client.meta.config.retries == {"total_max_attempts": 1, "mode": "adaptive"}


def test_slowdown_and_503_are_throttling() -> None:
    for code, status in [("SlowDown", 503), ("ServiceUnavailable", 503), ("X", 429)]:
        err = ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
        )
        assert isinstance(classify_s3_error(err, "get"), ThrottledError)
    err = ClientError(
        {"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 500}}, "Get"
    )
    classified = classify_s3_error(err, "get")
    assert isinstance(classified, TransientError)
    assert not isinstance(classified, ThrottledError)


# ---- #3: one failed file does not abort ------------------------------------------------------


def test_a_failing_file_is_retried_in_a_later_round_while_the_others_proceed(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(6)
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)
    victim = f"{PREFIX}/{sorted(files)[0]}"
    faults.throttle(5, key=victim)  # more than its 2 attempts in one go

    result = _fetcher(source, tmp_path, fake_time, logs, file_rounds=3).run()

    assert read_tree(result.vdir) == files
    assert len(faults.gets(victim)) == 6  # 2 + 2 + 2: three rounds
    others = [k for k in faults.gets() if k != victim]
    assert sorted(others) == sorted(f"{PREFIX}/{k}" for k in sorted(files)[1:])  # each once
    assert [r["round"] for r in logs.events("retry_round")] == [1, 2]


def test_a_file_that_keeps_failing_leaves_the_rest_for_the_next_run(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(6)
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)
    victim = sorted(files)[0]
    faults.throttle(1_000, key=f"{PREFIX}/{victim}")

    with pytest.raises(TransientError, match="1 file\\(s\\) still failing after 1 more round"):
        _fetcher(source, tmp_path, fake_time, logs, file_rounds=1).run()
    vdir = tmp_path / "cache/scale/v1"
    assert set(read_tree(vdir)) == set(files) - {victim}  # everything else is there
    assert not (vdir / ".complete").exists()

    source, faults = s3_source(s3_server, bucket, PREFIX)
    result = _fetcher(source, tmp_path, fake_time, logs).run()
    assert faults.gets() == [f"{PREFIX}/{victim}"]  # resumed: only the missing file
    assert (result.fetched, result.skipped) == (1, 5)
    assert read_tree(vdir) == files


# ---- #4: listing per page; the producer's index replaces it ---------------------------------


def test_a_throttled_list_page_is_retried_from_its_continuation_token(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(9)
    upload(s3_server.client(), bucket, PREFIX, files)
    client = s3_server.client()
    lists: list[str] = []

    def throttle_third_page(request: Any, **_kw: Any) -> AWSResponse | None:
        token = request.url.partition("continuation-token=")[2].partition("&")[0]
        lists.append(token)
        if len(lists) in {3, 4}:  # page 3, twice
            body = b"<Error><Code>SlowDown</Code><Message>slow</Message></Error>"
            return AWSResponse(request.url, 503, {}, _Raw(body))
        return None

    client.meta.events.register("before-send.s3.ListObjectsV2", throttle_third_page)
    source = S3Source(client, bucket, PREFIX, page_size=2)

    result = _fetcher(source, tmp_path, fake_time, logs, retry=RetryPolicy(4, 0.5, 4.0)).run()

    assert read_tree(result.vdir) == files
    assert len(lists) == 5 + 2  # five pages, page 3 asked three times; never page 1 again
    assert lists[0] == ""
    assert lists[2] == lists[3] == lists[4] != ""
    assert len(set(lists)) == 5
    assert [r["what"] for r in logs.events("retry")] == [f"list {source.uri} page 3"] * 2


def test_the_producers_index_replaces_the_listing(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(5)
    client = s3_server.client()
    upload(client, bucket, PREFIX, files)
    index = [
        {
            "path": k,
            "size": len(v),
            "etag": hashlib.md5(v, usedforsecurity=False).hexdigest(),
            "sha256": hashlib.sha256(v).hexdigest(),
        }
        for k, v in sorted(files.items())
    ]
    body = "".join(json.dumps(e) + "\n" for e in index).encode()
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/MANIFEST.jsonl", Body=body)
    source, faults = s3_source(s3_server, bucket, PREFIX)

    result = _fetcher(source, tmp_path, fake_time, logs).run()

    assert [op for op, _ in faults.requests if op == "ListObjectsV2"] == []
    assert read_tree(result.vdir) == files
    assert logs.events("listed")[0]["from_index"] is True
    assert {r.check for r in cache.read_marker(result.vdir).files} == {"etag-md5+manifest-sha256"}


# ---- #5: bounded memory -----------------------------------------------------------------------


def test_files_are_submitted_in_a_bounded_window(
    tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    fetcher = _fetcher(
        GeneratedSource(2_000, page=100, body=b"abc"), tmp_path, fake_time, logs, concurrency=3
    )
    result = fetcher.run()
    assert result.fetched == 2_000
    # 4 per worker are queued at most, never the whole listing (~2.6 GiB at 1.28M files).
    assert 3 <= fetcher.peak_pending <= 12


# ---- #7: a verified, marked version is trusted -----------------------------------------------


def test_gate_and_refetch_trust_a_marked_version_without_rehashing(
    s3_server: S3Server,
    bucket: str,
    tmp_path: Path,
    fake_time: FakeTime,
    logs: LogCapture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    files = make_files(5)
    source, _ = seeded_source(s3_server, bucket, PREFIX, files)
    vdir = _fetcher(source, tmp_path, fake_time, logs).run().vdir
    hashed: list[Path] = []
    real_hash = cache.hash_file

    def counting(path: Path) -> tuple[int, str]:
        hashed.append(path)
        return real_hash(path)

    monkeypatch.setattr(cache, "hash_file", counting)
    target = ["--cache", str(tmp_path / "cache"), "--dataset", "scale", "--version", "v1"]
    assert main(["verify", *target], log=logs) == 0  # the pod-start gate
    source, faults = s3_source(s3_server, bucket, PREFIX)
    assert _fetcher(source, tmp_path, fake_time, logs).run().already_complete  # init again
    assert hashed == []  # hashed once, on the way in; not again at every pod start
    assert faults.requests == []
    assert main(["verify", "--deep", *target], log=logs) == 0
    assert len(hashed) == 5
    assert vdir.is_dir()


# ---- #8: large objects: ranged, parallel, resumable -------------------------------------------


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_kwargs: Any) -> Any:
        yield self._body


class _DropsHalfway(io.RawIOBase):
    """A response body that delivers half its bytes, then the connection drops."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def read(self, amt: int | None = -1) -> bytes:  # type: ignore[override]
        half = len(self._data) // 2
        if self._pos >= half:
            raise IncompleteReadError(actual_bytes=half, expected_bytes=len(self._data))
        n = half - self._pos if amt is None or amt < 0 else min(amt, half - self._pos)
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out


def _record_ranges(client: Any) -> list[str]:
    seen: list[str] = []

    def record(request: Any, **_kw: Any) -> None:
        seen.append(request.headers.get("Range", b"").decode() if isinstance(
            request.headers.get("Range"), bytes) else request.headers.get("Range", ""))  # fmt: skip

    client.meta.events.register("before-send.s3.GetObject", record)
    return seen


MIB = 1 << 20


def _big(client: Any, bucket: str) -> bytes:
    data = random.Random(5).randbytes(5 * MIB + 12345)
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/big.bin", Body=data)
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/small.bin", Body=b"small")
    return data


def test_large_object_is_fetched_in_parallel_ranges_and_a_dropped_part_resumes(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    client = s3_server.client()
    data = _big(client, bucket)
    source = S3Source(client, bucket, PREFIX)
    ranges = _record_ranges(client)
    dropped: list[int] = []

    def drop_part_two(http_response: Any, parsed: dict[str, Any], **_kw: Any) -> None:
        if parsed.get("ContentRange", "").startswith(f"bytes {2 * MIB}-") and not dropped:
            body = parsed["Body"].read()
            dropped.append(len(body))
            parsed["Body"] = StreamingBody(_DropsHalfway(body), len(body))

    client.meta.events.register("after-call.s3.GetObject", drop_part_two)
    result = _fetcher(
        source, tmp_path, fake_time, logs, concurrency=3, retry=RetryPolicy(3, 0.1, 1.0),
        part_size=MIB, ranged_threshold=2 * MIB,
    ).run()  # fmt: skip

    assert (result.vdir / "big.bin").read_bytes() == data
    big = [r for r in ranges if r]
    assert len(big) == 6 + 1  # six 1 MiB parts, and the rest of the dropped one
    assert f"bytes={2 * MIB + MIB // 2}-{3 * MIB - 1}" in big  # resumed mid-part
    checks = {r.path: r.check for r in cache.read_marker(result.vdir).files}
    assert checks == {"big.bin": "etag-md5", "small.bin": "etag-md5"}


def test_a_restarted_fetch_asks_only_for_the_parts_it_is_missing(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    client = s3_server.client()
    data = _big(client, bucket)
    source, _ = s3_source(s3_server, bucket, PREFIX)

    def part_four_fails(request: Any, **_kw: Any) -> AWSResponse | None:
        rng = request.headers.get("Range")
        if rng and str(rng).find(f"bytes={4 * MIB}-") >= 0:
            body = b"<Error><Code>SlowDown</Code><Message>slow</Message></Error>"
            return AWSResponse(request.url, 503, {}, _Raw(body))
        return None

    source.client.meta.events.register("before-send.s3.GetObject", part_four_fails)
    opts: dict[str, Any] = {"part_size": MIB, "ranged_threshold": 2 * MIB, "concurrency": 2}
    with pytest.raises(ThrottledError):
        _fetcher(source, tmp_path, fake_time, logs, **opts).run()

    source, _ = s3_source(s3_server, bucket, PREFIX)
    ranges = _record_ranges(source.client)
    result = _fetcher(source, tmp_path, fake_time, logs, **opts).run()

    assert [r for r in ranges if r] == [f"bytes={4 * MIB}-{5 * MIB - 1}"]
    assert logs.events("resume_parts")[-1]["parts_done"] == 5
    assert (result.vdir / "big.bin").read_bytes() == data
