"""The checkpoint directory on disk: names, manifest, verification, quarantine, retention, and
the restricted readers. No training state and no collectives here (those are checkpoint.py).

Layout under the durable root (``TRAINSTACK_CHECKPOINT_DIR``, default ``/checkpoints``)::

    step-000000120/            committed: renamed from .tmp only after manifest.json exists
      manifest.json            written last by rank 0: format, step, world size, size and
                               checksum (xxh3_128) of every file below
      .metadata                torch.distributed.checkpoint's index (written by its coordinator)
      __0_0.distcp             DCP data: the model/optimizer tensors rank 0 wrote
      __1_0.distcp             ... rank 1's share (replicated tensors are written once)
      rank-00000.pkl           rank 0's private state (step, RNG, loader, scheduler, extras)
      rank-00000.done.json     rank 0's commit vote (its files and checksums)
    step-000000130.tmp/        in flight (or left by a crash: deleted on the next start)
    step-000000110.corrupt/    failed verification: kept for inspection until it is older than
                               every kept checkpoint, then deleted with them
    LATEST                     hint only; the highest valid step-* directory is authoritative
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import logging
import mmap
import os
import pickle
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .exitcodes import ConfigError, StorageError

log = logging.getLogger("trainstack.checkpoint")

FORMAT = "trainstack-checkpoint/2"
# Written by the runtime before it moved onto torch.distributed.checkpoint; refused on load.
LEGACY_FORMATS = frozenset({"trainstack-checkpoint/1"})
MANIFEST = "manifest.json"
LATEST = "LATEST"
DCP_METADATA = ".metadata"  # FileSystemWriter's index name (filesystem.py, _metadata_fn)
_STEP_DIR = re.compile(r"^step-(\d{9})$")
_CORRUPT_DIR = re.compile(r"^step-(\d{9})\.corrupt\d*$")
_CHUNK = 16 << 20


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def rank_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def data_files(directory: Path, rank: int) -> list[Path]:
    """The DCP data files ``rank`` wrote: FileSystemWriter prefixes them ``__<rank>_``
    (torch/distributed/checkpoint/filesystem.py, ``prepare_global_plan``)."""
    return sorted(directory.glob(f"__{rank}_*.distcp"))


# --- file helpers ---------------------------------------------------------------------------
def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


# File checksums. The manifest's checksums catch storage faults: torn or truncated writes, bit
# rot, a copy that went wrong. They are not a signature (whoever can rewrite a file can rewrite
# the manifest), so a fast non-cryptographic hash with 128 bits is the right tool: xxh3_128
# (xxHash, BSD-2) runs at several GB/s per core where sha256 ran at ~1 GB/s on the same machine
# (docs/runtime.md, Benchmark), and the checksum is computed on the bytes as they are written
# (ChecksumFileSystem) instead of by reading each file back after fsync -- a read-back right
# after writing comes from the page cache, so it proved nothing the write-side checksum does not.
# Checkpoints of this format written before the switch carry "sha256"; verify() checks either.
CHECKSUM = "xxh3_128"


def _new_hash() -> xxhash.xxh3_128:
    return xxhash.xxh3_128()


def write_bytes(path: Path, data: bytes) -> dict[str, Any]:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return {"size": len(data), CHECKSUM: xxhash.xxh3_128_hexdigest(data)}


def file_checksum(path: Path, algorithm: str = CHECKSUM) -> str:
    h: Any = _new_hash() if algorithm == CHECKSUM else hashlib.new(algorithm)
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return str(h.hexdigest())


def describe(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, CHECKSUM: file_checksum(path)}


def copy_verified(src: Path, dst: Path, expected: dict[str, Any] | None = None) -> dict[str, Any]:
    """Copy from the local tier to the durable one (fsync). The checksum is of the bytes read
    back from the local disk and, given ``expected`` (what the writer checksummed as it wrote),
    must match it: a bad local copy fails the commit rather than the resume."""
    h = _new_hash()
    size = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            fout.write(chunk)
            h.update(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    got = {"size": size, CHECKSUM: h.hexdigest()}
    if expected is not None and expected != got:
        raise StorageError(
            f"{src}: read back from the local checkpoint tier as {got}, written as {expected}: "
            "the node's disk returned different bytes"
        )
    return got


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


# --- verification ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    manifest: dict[str, Any] | None = None


def _allowed_name(name: str) -> bool:
    return "/" not in name and (name == DCP_METADATA or not name.startswith("."))


def read_manifest(directory: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return None, "no manifest.json (incomplete write)"
    except (OSError, ValueError) as err:
        return None, f"unreadable manifest: {err}"
    if not isinstance(manifest, dict):
        return None, f"not a {FORMAT} manifest"
    return manifest, ""


def legacy_error(directory: Path, fmt: object) -> ConfigError:
    return ConfigError(
        f"checkpoint {directory} is in the format {fmt!r} of an earlier trainstack runtime; "
        f"this runtime reads {FORMAT} (torch.distributed.checkpoint). Finish the run with the "
        "earlier runtime image, or point TRAINSTACK_CHECKPOINT_DIR at an empty path to start "
        "fresh (the old directory is left as it is)"
    )


def verify(  # noqa: PLR0911 - one exit per defect
    directory: Path, *, share: tuple[int, int] = (0, 1)
) -> Verdict:
    """Check a committed checkpoint: manifest readable, every file present with its size, and
    the checksum of the files in this caller's ``share`` = (index, count): file ``i`` (sorted
    by name) is hashed by the caller with ``i % count == index``, so ranks verify in parallel."""
    manifest, reason = read_manifest(directory)
    if manifest is None:
        return Verdict(False, reason)
    if manifest.get("format") != FORMAT:
        return Verdict(False, f"not a {FORMAT} manifest", manifest)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return Verdict(False, "manifest lists no files")
    index, count = share
    for i, (name, meta) in enumerate(sorted(files.items())):
        if not _allowed_name(name):
            return Verdict(False, f"manifest names a path outside the checkpoint: {name}")
        path = directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return Verdict(False, f"missing file {name}")
        if size != meta.get("size"):
            return Verdict(False, f"{name}: size {size} != manifest {meta.get('size')}")
        if i % count == index:
            algorithm = next((a for a in (CHECKSUM, "sha256") if a in meta), None)
            if algorithm is None:
                return Verdict(False, f"{name}: no checksum in the manifest")
            if file_checksum(path, algorithm) != meta[algorithm]:
                return Verdict(False, f"{name}: {algorithm} mismatch")
    return Verdict(True, manifest=manifest)


def committed_steps(root: Path) -> list[int]:
    """Steps whose directory was renamed into place (not yet verified), ascending."""
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            steps.append(int(match.group(1)))
    return sorted(steps)


def check_candidate(directory: Path, share: tuple[int, int] = (0, 1)) -> Verdict:
    """One step of the newest-first walk over committed checkpoints: ``verify`` this caller's
    share; a checkpoint of an earlier format stops the walk (``legacy_error``: refused, not
    quarantined), damage is logged and left to the caller to quarantine."""
    result = verify(directory, share=share)
    fmt = (result.manifest or {}).get("format")
    if fmt in LEGACY_FORMATS:
        raise legacy_error(directory, fmt)
    if not result.ok:
        log.error("checkpoint %s is invalid (%s)", directory, result.reason)
    return result


def select_checkpoint(root: Path, *, quarantine: bool = True) -> int | None:
    """Newest verified step under ``root`` for a single process; corrupt ones are moved aside.
    None: start fresh. (Jobs verify in parallel across ranks: CheckpointManager.restore.)"""
    for step in reversed(committed_steps(root)):
        directory = root / step_dir_name(step)
        if check_candidate(directory).ok:
            return step
        if quarantine:
            quarantine_dir(directory)
    return None


def quarantine_dir(directory: Path) -> None:
    target = directory.with_name(directory.name + ".corrupt")
    n = 1
    while target.exists():
        target = directory.with_name(f"{directory.name}.corrupt{n}")
        n += 1
    os.replace(directory, target)


def retain(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints, and quarantined ones older than the
    oldest kept (kept that long for inspection). A failed delete costs space, not correctness."""
    steps = committed_steps(root)
    doomed = [root / step_dir_name(s) for s in steps[: max(0, len(steps) - keep)]]
    kept = steps[max(0, len(steps) - keep) :]
    if kept:
        doomed += [
            entry
            for entry in root.iterdir()
            if (m := _CORRUPT_DIR.match(entry.name)) and int(m.group(1)) < kept[0]
        ]
    for path in doomed:
        try:
            shutil.rmtree(path)
        except OSError as err:
            log.warning("could not delete old checkpoint %s: %s", path, err)


# --- private state: nested plain data with tensors as raw bytes ------------------------------
@dataclass(frozen=True)
class TensorRef:
    index: int


def _encode(obj: Any, out: list[tuple[str, list[int], bytes]]) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse or obj.is_quantized or obj.is_nested:
            raise ConfigError("sparse, quantized and nested tensors are not supported")
        host = obj.detach().to("cpu").contiguous()
        raw = host.reshape(-1).view(torch.uint8).numpy().tobytes() if host.numel() else b""
        out.append((str(host.dtype), list(host.shape), raw))
        return TensorRef(len(out) - 1)
    if isinstance(obj, dict):
        encoded = {k: _encode(v, out) for k, v in obj.items()}
        return type(obj)(encoded) if type(obj) is not dict else encoded
    if isinstance(obj, list):
        return [_encode(v, out) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_encode(v, out) for v in obj)
    return obj


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise pickle.UnpicklingError(f"unknown dtype {name}")
    return value


def _decode(obj: Any, tensors: list[tuple[str, list[int], bytes]]) -> Any:
    if isinstance(obj, TensorRef):
        dtype_name, shape, data = tensors[obj.index]
        dtype = _dtype(dtype_name)
        if not data:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    if isinstance(obj, dict):
        decoded = {k: _decode(v, tensors) for k, v in obj.items()}
        return type(obj)(decoded) if type(obj) is not dict else decoded
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_decode(v, tensors) for v in obj)
    return obj


class _SafeUnpickler(pickle.Unpickler):
    """Private state holds plain data: refuse every global except these few."""

    _ALLOWED = frozenset(
        {
            (__name__, "TensorRef"),
            ("collections", "OrderedDict"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "complex"),
            ("builtins", "slice"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"checkpoint refers to disallowed global {module}.{name}")


def safe_loads(data: bytes) -> Any:
    return _SafeUnpickler(io.BytesIO(data)).load()


def dumps_private(obj: Any) -> bytes:
    """Pickle private state with its tensors as bytes, refusing what ``loads_private`` would."""
    tensors: list[tuple[str, list[int], bytes]] = []
    data = pickle.dumps((_encode(obj, tensors), tensors), protocol=5)
    try:
        safe_loads(data)
    except pickle.UnpicklingError as err:
        raise ConfigError(
            f"training state holds an object checkpoints cannot restore: {err}"
        ) from err
    return data


def loads_private(data: bytes) -> Any:
    skeleton, tensors = safe_loads(data)
    return _decode(skeleton, tensors)


# --- DCP readers that unpickle only data -----------------------------------------------------
class _MetadataUnpickler(pickle.Unpickler):
    """DCP's FileSystemReader.read_metadata is a plain ``pickle.load`` (any global, so any
    code); its index holds only DCP's metadata dataclasses, sizes, dtypes and paths."""

    _MODULES = frozenset({"torch.distributed.checkpoint.metadata"})
    _ALLOWED = frozenset(
        {
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("pathlib", "PosixPath"),
            ("collections", "OrderedDict"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if module in self._MODULES or (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"checkpoint index refers to disallowed global {module}.{name}"
        )


class SafeReader(FileSystemReader):
    def read_metadata(self, *_: Any, **__: Any) -> Metadata:
        path = Path(self.path) / DCP_METADATA
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} is not a checkpoint index")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (learning rates, betas...) are ``torch.save`` blobs that
    DefaultLoadPlanner.load_bytes reads with ``torch.load(weights_only=False)``
    (default_planner.py, torch 2.13.0): check them with the weights-only unpickler first."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        torch.load(value, weights_only=True)  # raises on anything but plain data
        value.seek(0)
        super().load_bytes(read_item, value)
