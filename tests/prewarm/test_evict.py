"""Issue 24 #6: readers hold a version; eviction removes only unheld versions, LRU first,
down to a high-water mark; a repair waits for the readers of the version it would change."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from trainstack_prewarm import cache
from trainstack_prewarm.cli import main
from trainstack_prewarm.errors import LockTimeoutError

from tests.prewarm.conftest import FakeTime, LogCapture, make_files, read_tree, write_tree


def _version(root: Path, dataset: str, version: str, used_at: int) -> tuple[Path, dict[str, bytes]]:
    """A complete version as fetch leaves it, last used at ``used_at`` (epoch seconds)."""
    vdir = root / dataset / version
    files = make_files(4, size=4096, salt=version)
    write_tree(vdir, files)
    (vdir / cache.STATE_DIR).mkdir()
    records = tuple(
        cache.FileRecord(k, len(v), cache.hash_file(vdir / k)[1], "etag:x", "etag-md5")
        for k, v in sorted(files.items())
    )
    cache.write_marker(vdir, cache.Marker(dataset, version, "s3://b/p/", records))
    hold = vdir / cache.STATE_DIR / cache.HOLD
    hold.touch()
    os.utime(hold, (used_at, used_at))
    return vdir, files


def test_two_readers_keep_their_versions_while_an_evictor_removes_the_rest_lru_first(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cache"
    a, files_a = _version(root, "imagenet", "v1", used_at=1_000)  # oldest, but held
    b, files_b = _version(root, "imagenet", "v2", used_at=2_000)  # held
    c, _ = _version(root, "coco", "v1", used_at=3_000)  # unheld, least recently used
    d, _ = _version(root, "coco", "v2", used_at=4_000)  # unheld, used most recently
    size = cache.disk_bytes(a)

    held = threading.Barrier(3)
    stop = threading.Event()
    seen: dict[Path, list[bool]] = {a: [], b: []}

    def reader(vdir: Path, files: dict[str, bytes]) -> None:
        with cache.hold(vdir):  # what `verify --hold -- CMD` takes before CMD runs
            cache.verify(vdir, deep=False)
            held.wait()
            while not stop.is_set():  # the training job reads its version all along
                seen[vdir].append(read_tree(vdir) == files)

    readers = [
        threading.Thread(target=reader, args=(a, files_a)),
        threading.Thread(target=reader, args=(b, files_b)),
    ]
    for t in readers:
        t.start()
    held.wait()
    try:
        # High-water mark: room for three versions. One must go: the least recently used one
        # that nobody holds (coco/v1), not imagenet/v1, older but held.
        removed = cache.evict(root, high_water=3 * size)
        assert removed == [c]
        # Down to one version's worth: every unheld version goes, the held ones stay.
        removed = cache.evict(root, high_water=size)
        assert removed == [d]
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=30)
    assert not c.exists()
    assert not d.exists()
    assert seen[a]
    assert all(seen[a])
    assert seen[b]
    assert all(seen[b])
    cache.verify(a)
    cache.verify(b)
    # The readers are gone: now the least recently used of them is next.
    assert cache.evict(root, high_water=size) == [a]


def test_a_version_being_filled_is_not_evicted(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    vdir, _ = _version(root, "ds", "v1", used_at=1_000)
    with cache.version_lock(
        vdir / cache.STATE_DIR / cache.LOCK,
        timeout_s=0,
        sleep=lambda _s: None,
        clock=lambda: 0.0,
        on_wait=lambda: None,
    ):
        assert cache.evict(root, high_water=0) == []
    assert cache.evict(root, high_water=0) == [vdir]


def test_a_repair_waits_for_the_readers_of_the_version(tmp_path: Path, fake_time: FakeTime) -> None:
    root = tmp_path / "cache"
    vdir, _ = _version(root, "ds", "v1", used_at=1_000)
    with (
        cache.hold(vdir),
        pytest.raises(LockTimeoutError, match="a reader"),
        cache.hold(vdir, shared=False, timeout_s=5, sleep=fake_time.sleep, clock=fake_time.clock),
    ):
        pass
    assert sum(fake_time.sleeps) == pytest.approx(5.0)


def test_verify_hold_execs_the_command_holding_the_version(
    tmp_path: Path, logs: LogCapture
) -> None:
    root = tmp_path / "cache"
    vdir, _ = _version(root, "ds", "v1", used_at=1_000)
    before = cache.last_used(vdir)
    ran: list[list[str]] = []

    def execvp(_file: str, argv: list[str]) -> None:
        # In the real exec the fd is inherited and the hold lasts as long as CMD.
        assert cache.evict(root, high_water=0) == []
        ran.append(argv)

    target = ["--cache", str(root), "--dataset", "ds", "--version", "v1"]
    assert main(["verify", *target, "--", "python", "train.py"], log=logs, execvp=execvp) == 0
    assert ran == [["python", "train.py"]]
    assert cache.last_used(vdir) > before
    assert logs.events("holding")[0]["command"] == "python"


def test_evict_cli_to_a_high_water_mark(tmp_path: Path, logs: LogCapture) -> None:
    root = tmp_path / "cache"
    old, _ = _version(root, "ds", "v1", used_at=1_000)
    new, _ = _version(root, "ds", "v2", used_at=2_000)
    size = cache.disk_bytes(old)
    assert main(["evict", "--cache", str(root), "--high-water", str(size)], log=logs) == 0
    assert [e["cache"] for e in logs.events("evicted")] == [str(old)]
    assert new.exists()
