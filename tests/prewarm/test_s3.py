"""Fetch from a real S3-compatible server (moto, loopback) with a real boto3 client."""

from __future__ import annotations

import hashlib
import json
import random
import threading
from pathlib import Path

import pytest
from trainstack_prewarm import cache
from trainstack_prewarm.errors import (
    ExitCode,
    IntegrityError,
    SourceError,
    TransientError,
)
from trainstack_prewarm.fetch import Fetcher
from trainstack_prewarm.limits import SourceLimiter
from trainstack_prewarm.retry import RetryPolicy

from tests.prewarm.conftest import (
    FakeTime,
    InFlight,
    InstrumentedSource,
    LogCapture,
    S3Server,
    make_fetcher,
    make_files,
    read_tree,
    s3_source,
    seeded_source,
    upload,
)

PREFIX = "datasets/imagenet/v3"


def _fetcher(
    source: object,
    tmp_path: Path,
    fake_time: FakeTime,
    logs: LogCapture,
    *,
    concurrency: int = 4,
    attempts: int = 5,
    base: float = 1.0,
    cap: float = 8.0,
    seed: int = 7,
    limiter: SourceLimiter | None = None,
    dataset: str = "imagenet",
    version: str = "v3",
) -> Fetcher:
    return make_fetcher(
        source,  # type: ignore[arg-type]
        tmp_path, fake_time, logs, dataset=dataset, version=version,
        concurrency=concurrency, retry=RetryPolicy(attempts, base, cap), seed=seed,
        limiter=limiter,
    )  # fmt: skip


def test_fetch_copies_every_object_and_writes_marker_last(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(9)
    files["nested/deeper/empty.txt"] = b""
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)

    result = _fetcher(source, tmp_path, fake_time, logs).run()

    vdir = tmp_path / "cache" / "imagenet" / "v3"
    assert result.vdir == vdir
    assert (result.fetched, result.skipped, result.retries) == (10, 0, 0)
    assert read_tree(vdir) == files
    assert sorted(faults.gets()) == sorted(f"{PREFIX}/{k}" for k in files)
    marker = json.loads((vdir / ".complete").read_text())
    assert marker["dataset"] == "imagenet"
    assert marker["version"] == "v3"
    assert marker["source"] == f"s3://{bucket}/{PREFIX}/"
    assert marker["file_count"] == 10
    assert marker["total_bytes"] == sum(len(v) for v in files.values())
    assert {f["path"]: (f["size"], f["sha256"]) for f in marker["files"]} == {
        k: (len(v), hashlib.sha256(v).hexdigest()) for k, v in files.items()
    }
    # Single-part uploads: the ETag is an MD5 and was checked.
    assert {f["check"] for f in marker["files"]} == {"etag-md5"}
    # The marker is the last thing written: its "complete" log line follows every file.
    assert [r["event"] for r in logs.records()][-1] == "complete"
    assert not (vdir / ".prewarm" / "journal").exists()
    assert not (vdir / ".prewarm" / "tmp").exists()
    cache.verify(vdir)


def test_throttling_is_retried_with_full_jitter_backoff(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    upload(s3_server.client(), bucket, PREFIX, {"only.bin": b"x" * 5000})
    source, faults = s3_source(s3_server, bucket, PREFIX)
    faults.throttle(2, op="ListObjectsV2")
    faults.throttle(4, key=f"{PREFIX}/only.bin")

    result = _fetcher(source, tmp_path, fake_time, logs, base=1.0, cap=4.0, seed=11).run()

    assert result.fetched == 1
    assert len(faults.gets()) == 5  # four SlowDowns, then the real GET
    # Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))], drawn from the seeded rng
    # in order: two list retries, then four GET retries.
    ceilings = [1.0, 2.0, 1.0, 2.0, 4.0, 4.0]
    rng = random.Random(11)
    expected = [rng.uniform(0.0, c) for c in ceilings]
    assert fake_time.sleeps == pytest.approx(expected)
    assert all(0 <= s <= c for s, c in zip(fake_time.sleeps, ceilings, strict=True))
    retries = logs.events("retry")
    assert [r["attempt"] for r in retries] == [1, 2, 1, 2, 3, 4]
    assert all("SlowDown (HTTP 503)" in r["error"] for r in retries)
    assert [r["delay_s"] for r in retries] == pytest.approx(expected, abs=1e-4)
    assert result.retries == 4  # per-file retries; list retries are logged, not counted
    assert (tmp_path / "cache/imagenet/v3/only.bin").read_bytes() == b"x" * 5000


def test_throttling_beyond_max_attempts_fails_without_marker(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    upload(s3_server.client(), bucket, PREFIX, {"a.bin": b"a" * 100, "b.bin": b"b" * 100})
    source, faults = s3_source(s3_server, bucket, PREFIX)
    faults.throttle(1_000, key=f"{PREFIX}/b.bin")

    with pytest.raises(TransientError) as info:
        _fetcher(source, tmp_path, fake_time, logs, concurrency=1, attempts=3).run()

    assert info.value.exit_code == ExitCode.RETRIES_EXHAUSTED
    assert "gave up after 3 attempts" in info.value.message
    assert len(faults.gets(f"{PREFIX}/b.bin")) == 3
    assert len(fake_time.sleeps) == 2  # no sleep after the last attempt
    assert not (tmp_path / "cache/imagenet/v3/.complete").exists()


def test_connection_errors_and_5xx_are_retried(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(3)
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)
    first = f"{PREFIX}/{sorted(files)[0]}"
    faults.drop_connection(2, key=first)
    faults.error("InternalError", 500, key=first, times=1)
    faults.error("RequestTimeout", 400, key=first, times=1)

    result = _fetcher(source, tmp_path, fake_time, logs, attempts=5).run()

    assert result.retries == 4
    assert len(faults.gets(first)) == 5
    kinds = [r["error"] for r in logs.events("retry")]
    assert sum("connection error" in k for k in kinds) == 2
    assert any("InternalError (HTTP 500)" in k for k in kinds)
    assert any("RequestTimeout (HTTP 400)" in k for k in kinds)
    assert read_tree(result.vdir) == files


@pytest.mark.parametrize(
    "case", [("AccessDenied", 403, "IRSA"), ("NoSuchKey", 404, "must not change")]
)
def test_non_retryable_errors_fail_fast_with_a_clear_message(
    *,
    s3_server: S3Server,
    bucket: str,
    tmp_path: Path,
    fake_time: FakeTime,
    logs: LogCapture,
    case: tuple[str, int, str],
) -> None:
    code, status, hint = case
    files = make_files(6)
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)
    bad = f"{PREFIX}/{sorted(files)[2]}"
    faults.error(code, status, key=bad)

    with pytest.raises(SourceError) as info:
        _fetcher(source, tmp_path, fake_time, logs, concurrency=1).run()

    assert info.value.exit_code == ExitCode.SOURCE
    assert f"{code} (HTTP {status})" in info.value.message
    assert bad in info.value.message
    assert hint in info.value.message
    assert len(faults.gets(bad)) == 1  # no retry
    assert fake_time.sleeps == []
    # Concurrency 1 runs files in listing order: nothing after the failure was fetched.
    assert set(faults.gets()) == {f"{PREFIX}/{k}" for k in sorted(files)[:3]}
    assert not (tmp_path / "cache/imagenet/v3/.complete").exists()


def test_missing_bucket_and_empty_prefix_are_source_errors(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    source, _ = s3_source(s3_server, bucket + "-nope", PREFIX)
    with pytest.raises(SourceError, match="NoSuchBucket"):
        _fetcher(source, tmp_path, fake_time, logs).run()
    source, _ = s3_source(s3_server, bucket, "no/such/prefix")
    with pytest.raises(SourceError, match="no files"):
        _fetcher(source, tmp_path, fake_time, logs).run()


def test_corrupted_transfer_is_detected_by_etag_and_retried(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(4)
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)
    victim = sorted(files)[1]
    faults.corrupt(f"{PREFIX}/{victim}", times=2)

    result = _fetcher(source, tmp_path, fake_time, logs).run()

    assert len(faults.gets(f"{PREFIX}/{victim}")) == 3
    retries = logs.events("retry")
    assert [r["kind"] for r in retries] == ["IntegrityError", "IntegrityError"]
    assert all("ETag mismatch" in r["error"] for r in retries)
    assert read_tree(result.vdir) == files


def test_persistent_checksum_mismatch_fails_with_integrity_exit(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(3)
    lines = [f"{hashlib.sha256(v).hexdigest()}  {k}" for k, v in sorted(files.items())]
    victim = sorted(files)[0]
    lines[0] = f"{'0' * 64}  {victim}"  # the producer's manifest disagrees with the object
    files["MANIFEST.sha256"] = ("\n".join(lines) + "\n").encode()
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)

    with pytest.raises(IntegrityError) as info:
        _fetcher(source, tmp_path, fake_time, logs, concurrency=1, attempts=3).run()

    assert info.value.exit_code == ExitCode.INTEGRITY
    assert "MANIFEST.sha256" in info.value.message
    assert len(faults.gets(f"{PREFIX}/{victim}")) == 3
    vdir = tmp_path / "cache/imagenet/v3"
    assert not (vdir / ".complete").exists()
    assert not (vdir / victim).exists()  # never renamed into place
    assert list((vdir / ".prewarm/tmp").iterdir()) == []


def test_source_manifest_is_checked_for_every_file(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(4)
    manifest = "".join(f"{hashlib.sha256(v).hexdigest()} *./{k}\n" for k, v in files.items())
    files["MANIFEST.sha256"] = manifest.encode()
    source, _ = seeded_source(s3_server, bucket, PREFIX, files)

    result = _fetcher(source, tmp_path, fake_time, logs).run()

    checks = {r.path: r.check for r in cache.read_marker(result.vdir).files}
    assert checks.pop("MANIFEST.sha256") == "etag-md5"
    assert set(checks.values()) == {"etag-md5+manifest-sha256"}


def test_manifest_that_disagrees_with_the_listing_is_rejected(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(3)
    manifest = "".join(f"{hashlib.sha256(v).hexdigest()}  {k}\n" for k, v in files.items())
    files["MANIFEST.sha256"] = (manifest + f"{'1' * 64}  lost.bin\n").encode()
    source, faults = seeded_source(s3_server, bucket, PREFIX, files)

    with pytest.raises(SourceError, match=r"missing at source \['lost.bin'\]"):
        _fetcher(source, tmp_path, fake_time, logs).run()
    assert faults.gets() == [f"{PREFIX}/MANIFEST.sha256"]


def test_multipart_object_is_verified_by_its_composite_etag(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    client = s3_server.client()
    part = 5 * 1024 * 1024  # S3's minimum part size
    rnd = random.Random(3)
    parts = [rnd.randbytes(part), rnd.randbytes(part), rnd.randbytes(1234)]
    key = f"{PREFIX}/big.bin"
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    done = []
    for n, body in enumerate(parts, start=1):
        etag = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=body
        )["ETag"]
        done.append({"PartNumber": n, "ETag": etag})
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
    )
    md5s = b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts)
    assert client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"') == (
        hashlib.md5(md5s, usedforsecurity=False).hexdigest() + "-3"
    )
    source, faults = s3_source(s3_server, bucket, PREFIX)
    faults.corrupt(key, times=1)

    result = _fetcher(source, tmp_path, fake_time, logs).run()

    assert [r["kind"] for r in logs.events("retry")] == ["IntegrityError"]
    (record,) = cache.read_marker(result.vdir).files
    assert record.check == "etag-multipart"
    assert (result.vdir / "big.bin").read_bytes() == b"".join(parts)


def test_concurrency_is_bounded_per_source(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(24, size=500)
    upload(s3_server.client(), bucket, PREFIX, files)
    upload(s3_server.client(), bucket, "datasets/coco/v1", make_files(24, size=400, salt="c"))
    limit = 3
    # Two fetches from one bucket share a limiter: six workers, three slots.
    limiter = SourceLimiter(limit)
    inner_a, _ = s3_source(s3_server, bucket, PREFIX)
    inner_b, _ = s3_source(s3_server, bucket, "datasets/coco/v1")
    a = InstrumentedSource(inner_a, gate_at=limit)
    b = InstrumentedSource(inner_b, gate_at=limit, state=a.state)
    fa = _fetcher(a, tmp_path, fake_time, logs, limiter=limiter, concurrency=limit)
    fb = _fetcher(
        b,
        tmp_path,
        fake_time,
        logs,
        limiter=limiter,
        concurrency=limit,
        dataset="coco",
        version="v1",
    )

    errors: list[BaseException] = []

    def run(f: Fetcher) -> None:
        try:
            f.run()
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f,)) for f in (fa, fb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert a.state.total == 48
    assert a.state.peak == limit  # reached the limit, never exceeded it
    assert not a.state.gate_timed_out
    assert limiter.peak(inner_a.limit_key) == limit
    assert read_tree(tmp_path / "cache/imagenet/v3") == files


def test_single_fetch_concurrency_flag_bounds_in_flight(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    upload(s3_server.client(), bucket, PREFIX, make_files(20, size=300))
    inner, _ = s3_source(s3_server, bucket, PREFIX)
    for limit in (1, 5):
        src = InstrumentedSource(inner, gate_at=limit, state=InFlight(limit))
        _fetcher(src, tmp_path / str(limit), fake_time, logs, concurrency=limit).run()
        assert src.state.peak == limit
        assert src.state.total == 20
        assert logs.events("complete")[-1]["peak_in_flight"] == limit
