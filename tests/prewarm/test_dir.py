"""Fetch from a Lustre-like mounted directory."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

import pytest
from trainstack_prewarm import cache
from trainstack_prewarm.dirsource import DirSource
from trainstack_prewarm.errors import (
    ExitCode,
    IntegrityError,
    LocalCacheError,
    SourceError,
    TransientError,
)
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.retry import RetryPolicy

from tests.prewarm.conftest import (
    FakeTime,
    InstrumentedSource,
    LogCapture,
    make_files,
    read_tree,
    unshare_works,
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


# ---- beneath an allowed root: the node agent's reads ----------------------------------------


def test_beneath_its_root_a_directory_source_copies_the_same_tree(
    lustre: tuple[Path, dict[str, bytes]], tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    root, files = lustre
    source = DirSource(root, beneath=tmp_path / "fsx" / "datasets")
    assert source.limit_key == DirSource(root).limit_key
    result = _run(source, tmp_path, fake_time, logs).run()
    assert read_tree(result.vdir) == files
    assert {r.check for r in cache.read_marker(result.vdir).files} == {"stat"}


def test_the_one_shot_fetch_still_follows_links_to_files(
    tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    """`trainstack-prewarm fetch --source DIR` reads with its caller's own rights: a link is
    no way to read what the caller could not, so links to files are still followed there."""
    root = tmp_path / "src"
    write_tree(root, {"a.bin": b"a"})
    write_tree(tmp_path / "elsewhere", {"b.bin": b"b"})
    (root / "b.bin").symlink_to(tmp_path / "elsewhere" / "b.bin")
    result = _run(DirSource(root), tmp_path, fake_time, logs).run()
    assert read_tree(result.vdir) == {"a.bin": b"a", "b.bin": b"b"}
    with pytest.raises(SourceError, match="symbolic link"):
        DirSource(root, beneath=tmp_path).list_page(None)


def test_a_fifo_swapped_in_after_the_listing_is_refused_without_blocking(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes; the agent's open does not
    (O_NONBLOCK) and refuses what is not a regular file."""
    root = tmp_path / "sets" / "v1"
    write_tree(root, {"a.bin": b"a"})
    source = DirSource(root, beneath=tmp_path / "sets")
    (listed,) = source.list_page(None).files
    (root / "a.bin").unlink()
    os.mkfifo(root / "a.bin")
    got: list[bytes] = []
    with pytest.raises(SourceError, match="not a regular file"):
        source.transfer(listed, got.append)
    assert got == []


def test_an_opener_cannot_bypass_the_walk_beneath_the_root(tmp_path: Path) -> None:
    write_tree(tmp_path / "v1", {"a.bin": b"a"})
    with pytest.raises(ValueError, match="bypass"):
        DirSource(tmp_path / "v1", beneath=tmp_path, opener=lambda p: p.open("rb"))
    with pytest.raises(SourceError, match="not under"):
        DirSource(tmp_path / "v1", beneath=tmp_path / "elsewhere")


OTHER_FS = """
import subprocess, sys
from pathlib import Path
from trainstack_prewarm.errors import SourceError
from trainstack_prewarm.dirsource import DirSource
sets = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(sets / "v1" / "mnt")], check=True)
(sets / "v1" / "mnt" / "x.bin").write_bytes(b"x")
try:
    DirSource(sets / "v1", beneath=sets).list_page(None)
except SourceError as exc:
    assert "on another file system" in exc.message, exc.message
else:
    raise AssertionError("a mount inside the source was walked into")
print("ok")
"""


@pytest.mark.skipif(not unshare_works(), reason="no user+mount namespace here (unshare -rm)")
def test_a_file_system_mounted_inside_a_source_is_refused(tmp_path: Path) -> None:
    """st_dev differs across a mount point: the agent stays on the source root's device."""
    write_tree(tmp_path / "sets" / "v1", {"a.bin": b"a", "mnt/.keep": b""})
    run = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", OTHER_FS, str(tmp_path / "sets")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
