"""Resumption of a partial cache, repair of a corrupted one, and one fetcher per version."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from trainstack_prewarm import cache
from trainstack_prewarm.errors import (
    ExitCode,
    IncompleteCacheError,
    LockTimeoutError,
    SourceError,
)
from trainstack_prewarm.fetch import Fetcher
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.s3 import S3Source
from trainstack_prewarm.transfer import _tmp_name

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

PREFIX = "datasets/wiki/v7"


def _fetcher(
    source: S3Source,
    tmp_path: Path,
    fake_time: FakeTime,
    logs: LogCapture,
    *,
    concurrency: int = 1,
    lock_timeout: float = 60.0,
    deep_check: bool = False,
) -> Fetcher:
    return make_fetcher(
        source, tmp_path, fake_time, logs, dataset="wiki", version="v7",
        concurrency=concurrency, retry=RetryPolicy(3, 0.1, 1.0), seed=5,
        lock_timeout=lock_timeout, deep_check=deep_check,
    )  # fmt: skip


def test_interrupted_fetch_resumes_only_missing_partial_and_changed_files(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(8)
    names = sorted(files)
    client = s3_server.client()
    upload(client, bucket, PREFIX, files)
    vdir = tmp_path / "cache/wiki/v7"

    # Run 1 dies on the fourth file (in listing order, one worker): three files are done.
    source, faults = s3_source(s3_server, bucket, PREFIX)
    faults.error("AccessDenied", 403, key=f"{PREFIX}/{names[3]}")
    with pytest.raises(SourceError):
        _fetcher(source, tmp_path, fake_time, logs).run()
    assert set(read_tree(vdir)) == set(names[:3])
    assert not (vdir / ".complete").exists()

    # What a crash leaves behind, and what changed since:
    tmp = vdir / ".prewarm/tmp"
    (tmp / _tmp_name(names[5])).write_bytes(files[names[5]][:100])  # a torn temp file
    (tmp / "deadbeef.part").write_bytes(b"from a run with another listing")
    (vdir / names[6]).parent.mkdir(parents=True, exist_ok=True)
    (vdir / names[6]).write_bytes(files[names[6]][:-10])  # a truncated file at its final name
    (vdir / "stale-from-old-listing.bin").write_bytes(b"old")  # not part of this version
    flipped = bytearray((vdir / names[1]).read_bytes())  # bit rot after it was copied
    flipped[0] ^= 1
    (vdir / names[1]).write_bytes(bytes(flipped))
    files[names[0]] = b"republished object, new ETag"  # the source object was replaced
    upload(client, bucket, PREFIX, {names[0]: files[names[0]]})

    source, faults = s3_source(s3_server, bucket, PREFIX)
    result = _fetcher(source, tmp_path, fake_time, logs, concurrency=3).run()

    fetched = {k.removeprefix(f"{PREFIX}/") for k in faults.gets()}
    assert fetched == {names[0], names[1], *names[3:]}
    assert len(faults.gets()) == len(fetched)  # each once
    assert names[2] not in fetched  # complete, verified, skipped
    assert (result.skipped, result.fetched) == (1, 7)
    assert read_tree(vdir) == files
    assert not (vdir / ".prewarm/tmp").exists()
    assert [r["path"] for r in logs.events("removed_stale")] == ["stale-from-old-listing.bin"]
    cache.verify(vdir)


def test_complete_cache_is_reused_without_contacting_the_source(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    upload(s3_server.client(), bucket, PREFIX, make_files(5))
    source, _ = s3_source(s3_server, bucket, PREFIX)
    _fetcher(source, tmp_path, fake_time, logs).run()

    source, faults = s3_source(s3_server, bucket, PREFIX)
    result = _fetcher(source, tmp_path, fake_time, logs).run()

    assert result.already_complete
    assert faults.requests == []
    assert logs.events("already_complete")[0]["files"] == 5


def test_corrupted_complete_cache_closes_the_gate_and_is_repaired(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    files = make_files(6)
    source, _ = seeded_source(s3_server, bucket, PREFIX, files)
    vdir = _fetcher(source, tmp_path, fake_time, logs).run().vdir
    victim = sorted(files)[4]
    data = bytearray((vdir / victim).read_bytes())
    data[-1] ^= 0x55  # same size, different bytes
    (vdir / victim).write_bytes(bytes(data))

    with pytest.raises(IncompleteCacheError, match=f"{victim}: sha256 mismatch"):
        cache.verify(vdir)
    cache.verify(vdir, deep=False)  # sizes alone cannot see it: why deep is the default

    source, faults = s3_source(s3_server, bucket, PREFIX)
    assert _fetcher(source, tmp_path, fake_time, logs).run().already_complete  # sizes match
    result = _fetcher(source, tmp_path, fake_time, logs, deep_check=True).run()

    assert "sha256 mismatch" in logs.events("marker_invalid")[0]["reason"]
    assert faults.gets() == [f"{PREFIX}/{victim}"]
    assert (result.fetched, result.skipped) == (1, 5)
    assert read_tree(vdir) == files
    cache.verify(vdir)


def test_a_second_fetcher_waits_for_the_version_lock(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    upload(s3_server.client(), bucket, PREFIX, make_files(2))
    lock_path = tmp_path / "cache/wiki/v7/.prewarm/lock"
    lock_path.parent.mkdir(parents=True)
    holder = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another job on this node is filling the version
    try:
        source, faults = s3_source(s3_server, bucket, PREFIX)
        with pytest.raises(LockTimeoutError) as info:
            _fetcher(source, tmp_path, fake_time, logs, lock_timeout=5.0).run()
        assert info.value.exit_code == ExitCode.LOCK_TIMEOUT
        assert sum(fake_time.sleeps) == pytest.approx(5.0)
        assert faults.requests == []
        assert len(logs.events("lock_wait")) == 1

        # The holder finishes while we wait: we then proceed.
        def release_then_sleep(seconds: float) -> None:
            fcntl.flock(holder, fcntl.LOCK_UN)
            fake_time.sleep(seconds)

        fetcher = _fetcher(source, tmp_path, fake_time, logs, lock_timeout=5.0)
        fetcher.sleep = release_then_sleep
        assert fetcher.run().fetched == 2
    finally:
        os.close(holder)


def test_torn_journal_line_is_ignored(tmp_path: Path) -> None:
    journal = cache.Journal(tmp_path / "journal")
    rec = cache.FileRecord("a.bin", 3, "a" * 64, "etag:x", "etag-md5")
    journal.append(rec)
    with open(tmp_path / "journal", "a") as fh:
        fh.write(json.dumps({"path": "b.bin", "size": 1})[:20])  # crash mid-append
    assert journal.load() == {"a.bin": rec}
