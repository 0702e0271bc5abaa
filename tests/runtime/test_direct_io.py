"""Checkpoint files written with O_DIRECT through an aligned buffer (ckptwrite.DirectFile).

Through the page cache the writer thread spent ~1.4 s of kernel time per GB of checkpoint on a
busy node (per-thread accounting, docs/runtime.md, Benchmark). O_DIRECT needs block-aligned
buffers, lengths and offsets (open(2), "O_DIRECT"), which DCP's writes are not: what must hold
is that the bytes on disk are exactly the bytes written, whatever the write sizes, and that a
file system refusing O_DIRECT is written as usual.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.harness import HAVE_TORCH

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    from trainstack_runtime import ckptwrite
    from trainstack_runtime.ckptwrite import DirectFile


def _direct_supported(directory: Path) -> bool:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    buf = mmap.mmap(-1, 4096)
    try:
        fd = os.open(directory / "probe", os.O_WRONLY | os.O_CREAT | flag, 0o644)
        try:
            os.write(fd, buf)
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        buf.close()
        (directory / "probe").unlink(missing_ok=True)
    return True


def _chunks(total: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, left = [], total
    while left:
        n = min(left, rng.choice([1, 7, 4095, 4096, 4097, 65_536, 3 << 20, 9 << 20]))
        out.append(rng.randbytes(n))
        left -= n
    return out


@pytest.mark.parametrize("total", [0, 1, 4096, 8 << 20, (8 << 20) + 1, 21_000_017])
def test_bytes_on_disk_are_the_bytes_written(tmp_path: Path, total: int) -> None:
    chunks = _chunks(total, seed=total)
    path = tmp_path / "f.distcp"
    out = DirectFile(path)
    for i, chunk in enumerate(chunks):
        assert out.write(memoryview(chunk)) == len(chunk)
        if i % 3 == 0:
            out.flush()  # DCP flushes after every item: must not write a partial block
    assert out.tell() == total
    os.fsync(out.fileno())  # as DCP does: everything is written before the fsync
    out.close()
    out.close()
    assert path.read_bytes() == b"".join(chunks)


def test_o_direct_is_used_where_the_file_system_takes_it(tmp_path: Path) -> None:
    if not _direct_supported(tmp_path):
        pytest.skip(f"{tmp_path} does not take O_DIRECT")
    out = DirectFile(tmp_path / "f")
    out.write(b"x" * (9 << 20))
    assert out.direct  # whole blocks went direct; only the tail goes through the page cache
    out.close()


def test_a_file_system_refusing_o_direct_is_written_as_usual(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open, real_write = os.open, os.write
    direct = getattr(os, "O_DIRECT", 0)

    def open_refusing(path: Any, flags: int, mode: int = 0o777) -> int:
        if direct and flags & direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(ckptwrite.os, "open", open_refusing)
    out = DirectFile(tmp_path / "a")
    assert not out.direct
    out.write(b"a" * 10_000)
    out.close()
    assert (tmp_path / "a").read_bytes() == b"a" * 10_000
    monkeypatch.undo()

    refused: list[int] = []

    def write_refusing(fd: int, data: Any) -> int:  # opens, then refuses the first write
        if not refused:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(ckptwrite.os, "write", write_refusing)
    chunks = _chunks(20_000_000, seed=3)
    out = DirectFile(tmp_path / "b")
    for chunk in chunks:
        out.write(chunk)
    out.close()
    assert refused
    assert not out.direct
    assert (tmp_path / "b").read_bytes() == b"".join(chunks)
