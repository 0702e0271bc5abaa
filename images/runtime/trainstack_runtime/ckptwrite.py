"""How DCP's checkpoint files are written: with O_DIRECT through an aligned buffer, checksummed
as the bytes are written, and without torch.save's per-record CRC-32.

Apart from ckptfiles.py (the directory's layout, checksums and verification) because this is
the storage layer under torch.distributed.checkpoint's FileSystemWriter: its FileSystem, the
file object it writes through and the switch into torch.serialization.
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .ckptfiles import CHECKSUM, _new_hash

# Checkpoint files are written with O_DIRECT where the file system takes it (ext4/xfs on the
# node's disk, Lustre, NFS): through the page cache, the writer thread spent ~1.4 s of kernel
# time per GB copying into it, allocating and reclaiming pages and writing them back, all taken
# from the training processes on a busy node (measured per thread, docs/runtime.md, Benchmark),
# and every checkpoint pushed the node's cached dataset out of memory. open(2): O_DIRECT needs
# buffers, lengths and offsets aligned to the block size, so writes go through one page-aligned
# buffer; the tail that is not a whole block is written after O_DIRECT is switched off
# (fcntl F_SETFL). A file system that refuses it (EINVAL: tmpfs, some FUSE) is written as usual.
_DIRECT_ALIGN = 4096
_DIRECT_BUFFER = 8 << 20


class DirectFile(io.RawIOBase):
    """A new file written with O_DIRECT through an aligned buffer (see above), checksummed on
    the way (``hash``; DCP writes through ``write``, asks ``tell`` for offsets and ``fileno``
    for fsync: filesystem.py, ``_write_files_from_queue``). ``flush`` keeps the buffer
    (O_DIRECT cannot write a partial block); ``fileno()`` -- which DCP asks for only to
    fsync -- and ``close()`` write everything first."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.hash = _new_hash()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        direct = getattr(os, "O_DIRECT", 0)
        try:
            self._fd = os.open(path, flags | direct, 0o666)
            self.direct = bool(direct)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            self._fd = os.open(path, flags, 0o666)
            self.direct = False
        self._buf = mmap.mmap(-1, _DIRECT_BUFFER)  # anonymous mappings are page-aligned
        self._view = memoryview(self._buf)
        self._fill = 0
        self._pos = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        self.hash.update(data)
        n, off = data.nbytes, 0
        while off < n:
            take = min(n - off, _DIRECT_BUFFER - self._fill)
            self._view[self._fill : self._fill + take] = data[off : off + take]
            self._fill += take
            off += take
            if self._fill == _DIRECT_BUFFER:
                self._drain(_DIRECT_BUFFER)
        self._pos += n
        return n

    def _drain(self, length: int) -> None:
        """Write the buffer's first ``length`` bytes, keep the rest at its start."""
        done = 0
        while done < length:
            try:
                done += os.write(self._fd, self._view[done:length])
            except OSError as err:
                if err.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered()  # mounted where O_DIRECT opens but does not write
        rest = self._fill - length
        if rest:
            self._view[:rest] = self._view[length : self._fill]
        self._fill = rest

    def _buffered(self) -> None:
        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~getattr(os, "O_DIRECT", 0))
        self.direct = False

    def _finish(self) -> None:
        if self._fill == 0:
            return
        whole = self._fill - self._fill % _DIRECT_ALIGN if self.direct else self._fill
        if whole:
            self._drain(whole)
        if self._fill:
            self._buffered()
            self._drain(self._fill)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass  # see the class doc

    def fileno(self) -> int:
        self._finish()
        return self._fd

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self._finish()
        finally:
            os.close(self._fd)
            self._fd = -1
            self._view.release()
            self._buf.close()
            super().close()


class ChecksumFileSystem(FileSystem):
    """DCP's local file system with the checksum of every file it writes, by file name
    (renames carry it: the index is written as ``.metadata.tmp`` and renamed)."""

    def __init__(self) -> None:
        super().__init__()
        # One writing thread (ChecksumWriter: thread_count=1, which the per-thread CRC switch
        # below needs too), so no lock.
        self.written: dict[str, dict[str, Any]] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = DirectFile(path)
        try:
            yield stream
        finally:
            stream.close()
        self.written[Path(path).name] = {"size": stream.tell(), CHECKSUM: stream.hash.hexdigest()}

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        entry = self.written.pop(Path(path).name, None)
        if entry is not None:
            self.written[Path(new_path).name] = entry


# torch.save computes a CRC-32 of every zip record it writes (torch.serialization
# ``get_crc32_options``, default on; software CRC, ~1 s of CPU per GB here), and DCP's writer
# serialises each tensor with torch.save (filesystem.py, ``_write_item``) without a way to turn
# it off. The file checksum above already covers every byte, so the writer thread skips it;
# the switch is per thread, so torch.save anywhere else in the process keeps its CRCs. Records
# without one load normally (``set_crc32_options`` docs: "torch.load will be able to load the
# file"); tests/runtime/test_checkpoint.py checks both, and that torch still reads the option.
_no_record_crc = threading.local()
_torch_crc32_option = torch.serialization.get_crc32_options


def _crc32_option() -> bool:
    return False if getattr(_no_record_crc, "on", False) else _torch_crc32_option()


@contextmanager
def without_record_crc32() -> Iterator[None]:
    """torch.save in this thread writes no per-record CRC-32 while the block runs."""
    torch.serialization.get_crc32_options = _crc32_option  # delegates outside such blocks
    _no_record_crc.on = True
    try:
        yield
    finally:
        _no_record_crc.on = False


class ChecksumWriter(FileSystemWriter):
    """FileSystemWriter whose files come with their checksums (``self.fs.written``), written
    in the calling thread (``thread_count=1``) without torch.save's per-record CRC-32."""

    fs: ChecksumFileSystem

    def __init__(self, path: Path) -> None:
        super().__init__(path, sync_files=True, thread_count=1)
        self.fs = ChecksumFileSystem()
        self.path = self.fs.init_path(path)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        with without_record_crc32():
            return super().write_data(plan, planner)
