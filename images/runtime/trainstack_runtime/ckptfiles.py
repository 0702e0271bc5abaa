"""The checkpoint directory on disk: names, checksums, manifest, verification, quarantine and
retention. No training state and no collectives here (those are checkpoint.py), nor how DCP's
files are written (ckptwrite.py) or what reads the pickles in the directory (ckptpickle.py).

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

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

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
# (ckptwrite.ChecksumFileSystem) instead of by reading each file back after fsync -- a read-back
# right after writing comes from the page cache, so it proved nothing the write-side checksum
# does not.
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


# --- the private state's tensor reference ----------------------------------------------------
# Here, not in ckptpickle.py with the rest of the private state's format: its qualified name,
# trainstack_runtime.ckptfiles.TensorRef, is in every rank-NNNNN.pkl ever written, and the
# unpickler there allows exactly that name, so moving it would make those checkpoints unreadable.
@dataclass(frozen=True)
class TensorRef:
    index: int
