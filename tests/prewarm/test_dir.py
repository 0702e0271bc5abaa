"""Fetch from a Lustre-like mounted directory."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
from pathlib import Path
from typing import BinaryIO

import pytest
from trainstack_prewarm import cache
from trainstack_prewarm.errors import (
    ExitCode,
    IntegrityError,
    LocalCacheError,
    SourceError,
    TransientError,
)
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.sources import DirSource

from tests.prewarm.conftest import (
    FakeTime,
    InstrumentedSource,
    LogCapture,
    make_files,
    read_tree,
    write_tree,
)


def _run(
    source: DirSource | InstrumentedSource,
    tmp_path: Path,
    fake_time: FakeTime,
    logs: LogCapture,
    *,
    concurrency: int = 4,
    attempts: int = 4,
) -> Fetcher:
    return Fetcher(
        source,
        tmp_path / "cache",
        "laion",
        "2026-11-01",
        options=FetchOptions(
            concurrency=concurrency,
            retry=RetryPolicy(attempts, 0.5, 5.0),
            start_jitter_s=0.0,
            file_rounds=0,
        ),
        log=logs,
        sleep=fake_time.sleep,
        clock=fake_time.clock,
        rng=random.Random(1),
    )


class FlakyOpener:
    """Fails ``open`` of chosen files the way a Lustre client does during an OST failover."""

    def __init__(self, failures: dict[str, list[int]]) -> None:
        self.failures = failures  # file name -> errnos to raise, in order
        self.opens: list[str] = []

    def __call__(self, path: Path) -> BinaryIO:
        self.opens.append(path.name)
        pending = self.failures.get(path.name)
        if pending:
            code = pending.pop(0)
            raise OSError(code, os.strerror(code), str(path))
        return open(path, "rb")


@pytest.fixture
def lustre(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "fsx" / "datasets" / "laion" / "2026-11-01"
    files = make_files(12, size=70_000)  # several 1 MiB chunks would be slow; 70 KB suffices
    files["deep/a/b/c.txt"] = b"hello"
    files["empty"] = b""
    write_tree(root, files)
    return root, files


def test_directory_source_copies_tree_with_sha256(
    lustre: tuple[Path, dict[str, bytes]], tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    root, files = lustre
    result = _run(DirSource(root), tmp_path, fake_time, logs).run()

    assert read_tree(result.vdir) == files
    marker = cache.read_marker(result.vdir)
    assert marker.source == str(root)
    assert {r.path: r.sha256 for r in marker.files} == {
        k: hashlib.sha256(v).hexdigest() for k, v in files.items()
    }
    assert {r.check for r in marker.files} == {"stat"}
    cache.verify(result.vdir)


def test_transient_eio_is_retried_and_eacces_fails_fast(
    lustre: tuple[Path, dict[str, bytes]], tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    root, files = lustre
    opener = FlakyOpener({"c.txt": [errno.EIO, errno.ESTALE]})
    result = _run(DirSource(root, opener=opener), tmp_path / "ok", fake_time, logs).run()
    assert opener.opens.count("c.txt") == 3
    assert result.retries == 2
    assert len(fake_time.sleeps) == 2
    assert read_tree(result.vdir) == files

    denied = FlakyOpener({"c.txt": [errno.EACCES]})
    with pytest.raises(SourceError, match="Permission denied") as info:
        _run(DirSource(root, opener=denied), tmp_path / "denied", fake_time, logs).run()
    assert info.value.exit_code == ExitCode.SOURCE
    assert denied.opens.count("c.txt") == 1


def test_eio_beyond_max_attempts_exhausts(
    lustre: tuple[Path, dict[str, bytes]], tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    root, _ = lustre
    opener = FlakyOpener({"empty": [errno.EIO] * 10})
    with pytest.raises(TransientError) as info:
        _run(DirSource(root, opener=opener), tmp_path, fake_time, logs, attempts=3).run()
    assert info.value.exit_code == ExitCode.RETRIES_EXHAUSTED
    assert opener.opens.count("empty") == 3


def test_file_rewritten_during_copy_is_an_integrity_failure(
    lustre: tuple[Path, dict[str, bytes]], tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    root, _ = lustre
    target = root / "file-000.bin"

    def mutating_open(path: Path) -> BinaryIO:
        if path == target:
            # Someone rewrites the "immutable" version in place while we read it.
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        return path.open("rb")

    with pytest.raises(IntegrityError, match="changed while it was copied") as info:
        _run(DirSource(root, opener=mutating_open), tmp_path, fake_time, logs).run()
    assert info.value.exit_code == ExitCode.INTEGRITY
    assert not (tmp_path / "cache/laion/2026-11-01/.complete").exists()


def test_directory_concurrency_bound_is_per_filesystem(
    lustre: tuple[Path, dict[str, bytes]], tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    root, files = lustre
    src = InstrumentedSource(DirSource(root), gate_at=3)
    assert src.limit_key == f"dev:{os.stat(root).st_dev}"
    _run(src, tmp_path, fake_time, logs, concurrency=3).run()
    assert src.state.peak == 3
    assert src.state.total == len(files)
    assert not src.state.gate_timed_out


@pytest.mark.parametrize("name", [".complete", ".prewarm/x"])
def test_source_names_that_collide_with_bookkeeping_are_rejected(
    tmp_path: Path, fake_time: FakeTime, logs: LogCapture, name: str
) -> None:
    root = tmp_path / "src"
    write_tree(root, {"ok.bin": b"1", name: b"2"})
    with pytest.raises(SourceError, match="collides"):
        _run(DirSource(root), tmp_path, fake_time, logs).run()


def test_missing_source_directory_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="No such file"):
        DirSource(tmp_path / "nope")


def test_no_space_is_a_local_error(
    lustre: tuple[Path, dict[str, bytes]],
    tmp_path: Path,
    fake_time: FakeTime,
    logs: LogCapture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, files = lustre
    real = shutil.disk_usage

    def tiny(path: str | os.PathLike[str]) -> object:
        usage = real(path)
        return type(usage)(usage.total, usage.used, sum(len(v) for v in files.values()) - 1)

    monkeypatch.setattr("trainstack_prewarm.fetch.shutil.disk_usage", tiny)
    with pytest.raises(LocalCacheError, match=r"needs \d+ bytes") as info:
        _run(DirSource(root), tmp_path, fake_time, logs).run()
    assert info.value.exit_code == ExitCode.LOCAL
