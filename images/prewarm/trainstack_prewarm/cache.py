"""The on-node cache layout, its completion manifest, the resume journal and the verify gate.

Layout of one dataset version (``<cache>/<dataset>/<version>/``)::

    <files of the dataset, at their relative paths>
    .complete            completion manifest: JSON, written last and atomically
    .prewarm/lock        flock: one fetcher per dataset version per node
    .prewarm/journal     JSON lines: files already copied and verified (for resumption)
    .prewarm/tmp/*.part  files being written; renamed into place only once verified

A file reaches its final name only by an atomic rename after its bytes were fsynced and
checked, so a final name never holds a torn copy; ``.complete`` exists only when every file
does, so "marker present and matching" is the one condition training may start on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from trainstack_prewarm.errors import (
    IncompleteCacheError,
    LocalCacheError,
    LockTimeoutError,
    UsageError,
)

MARKER = ".complete"
STATE_DIR = ".prewarm"
JOURNAL = "journal"
LOCK = "lock"
TMP_DIR = "tmp"
MARKER_FORMAT = 1
RESERVED_TOP_LEVEL = frozenset({MARKER, STATE_DIR})
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HASH_CHUNK = 1 << 20


def check_name(kind: str, value: str) -> str:
    # Names become path components: no separators, no "..", nothing hidden.
    if not _NAME.match(value):
        raise UsageError(f"--{kind} {value!r}: use letters, digits, '.', '_' or '-' (max 128)")
    return value


def version_dir(cache_root: Path, dataset: str, version: str) -> Path:
    return cache_root / check_name("dataset", dataset) / check_name("version", version)


@dataclass(frozen=True)
class FileRecord:
    path: str
    size: int
    sha256: str
    identity: str  # the source identity the copy was made from (see sources.RemoteFile)
    check: str  # the source-side check that passed: etag-md5, etag-multipart, stat, size


@dataclass(frozen=True)
class Marker:
    dataset: str
    version: str
    source: str
    files: tuple[FileRecord, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def local_error(exc: OSError, what: str) -> LocalCacheError:
    if exc.errno == errno.ENOSPC:
        return LocalCacheError(f"{what}: no space left on the cache volume")
    return LocalCacheError(f"{what}: {exc.strerror or exc}")


def hash_file(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def write_marker(vdir: Path, marker: Marker) -> None:
    """Write ``.complete`` atomically: temp file, fsync, rename, fsync the directory."""
    body = {
        "format": MARKER_FORMAT,
        "dataset": marker.dataset,
        "version": marker.version,
        "source": marker.source,
        "file_count": len(marker.files),
        "total_bytes": marker.total_bytes,
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": [asdict(f) for f in marker.files],
    }
    tmp = vdir / STATE_DIR / (MARKER + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(body, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, vdir / MARKER)
        fsync_dir(vdir)
    except OSError as exc:
        raise local_error(exc, f"write {vdir / MARKER}") from exc


def remove_marker(vdir: Path) -> None:
    """Close the gate before touching files a marker vouches for."""
    try:
        (vdir / MARKER).unlink(missing_ok=True)
        fsync_dir(vdir)
    except OSError as exc:
        raise local_error(exc, f"remove {vdir / MARKER}") from exc


def _record(raw: object) -> FileRecord:
    if not isinstance(raw, dict):
        raise ValueError("file entry is not an object")
    rec = FileRecord(
        path=str(raw["path"]),
        size=int(raw["size"]),
        sha256=str(raw["sha256"]),
        identity=str(raw.get("identity", "")),
        check=str(raw.get("check", "")),
    )
    if rec.size < 0 or not re.fullmatch(r"[0-9a-f]{64}", rec.sha256):
        raise ValueError(f"bad size or sha256 for {rec.path!r}")
    return rec


def read_marker(vdir: Path) -> Marker:
    path = vdir / MARKER
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise IncompleteCacheError(
            f"{vdir}: no {MARKER} marker: the cache is not complete"
        ) from exc
    except (OSError, ValueError) as exc:
        raise IncompleteCacheError(f"{path}: unreadable marker: {exc}") from exc
    try:
        if body["format"] != MARKER_FORMAT:
            raise ValueError(f"unknown format {body['format']!r}")
        files = tuple(_record(f) for f in body["files"])
        if int(body["file_count"]) != len(files):
            raise ValueError("file_count does not match the file list")
        return Marker(str(body["dataset"]), str(body["version"]), str(body["source"]), files)
    except (KeyError, TypeError, ValueError) as exc:
        raise IncompleteCacheError(f"{path}: malformed marker: {exc}") from exc


def dataset_files(vdir: Path) -> set[str]:
    """Relative paths of the data files present (bookkeeping excluded)."""
    found: set[str] = set()
    for dirpath, dirs, names in os.walk(vdir):
        here = Path(dirpath)
        top = here == vdir
        if top:
            dirs[:] = [d for d in dirs if d != STATE_DIR]
        found.update(
            (here / n).relative_to(vdir).as_posix()
            for n in names
            if not (top and n in RESERVED_TOP_LEVEL)
        )
    return found


def verify(
    vdir: Path,
    *,
    deep: bool = True,
    workers: int = 8,
    dataset: str | None = None,
    version: str | None = None,
) -> Marker:
    """Raise :class:`IncompleteCacheError` unless ``vdir`` is complete and matches its marker.

    Checked: the marker parses (and names ``dataset``/``version`` when given); every listed
    file exists with its size; no unlisted file is present; with ``deep`` also every sha256.
    """
    marker = read_marker(vdir)
    if dataset is not None and marker.dataset != dataset:
        raise IncompleteCacheError(f"{vdir}: marker is for dataset {marker.dataset!r}")
    if version is not None and marker.version != version:
        raise IncompleteCacheError(f"{vdir}: marker is for version {marker.version!r}")
    problems: list[str] = []
    listed = {f.path for f in marker.files}
    problems.extend(f"unexpected file {p}" for p in sorted(dataset_files(vdir) - listed))

    def check(rec: FileRecord) -> str | None:
        path = vdir / rec.path
        try:
            if not deep:
                size = path.stat().st_size
                return None if size == rec.size else f"{rec.path}: size {size} != {rec.size}"
            size, digest = hash_file(path)
        except FileNotFoundError:
            return f"{rec.path}: missing"
        except OSError as exc:
            return f"{rec.path}: {exc.strerror or exc}"
        if size != rec.size:
            return f"{rec.path}: size {size} != {rec.size}"
        if digest != rec.sha256:
            return f"{rec.path}: sha256 mismatch"
        return None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        problems.extend(p for p in pool.map(check, marker.files) if p)
    if problems:
        shown = "; ".join(problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise IncompleteCacheError(f"{vdir}: cache does not match {MARKER}: {shown}{more}")
    return marker


class Journal:
    """Append-only JSON lines of files already copied, so a restarted fetch can skip them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def load(self) -> dict[str, FileRecord]:
        records: dict[str, FileRecord] = {}
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return records
        except OSError as exc:
            raise local_error(exc, f"read {self.path}") from exc
        for line in lines:
            # A crash mid-append leaves a torn last line; that file is simply fetched again.
            with contextlib.suppress(ValueError, KeyError, TypeError):
                rec = _record(json.loads(line))
                records[rec.path] = rec
        return records

    def append(self, rec: FileRecord) -> None:
        line = json.dumps(asdict(rec)) + "\n"
        with self._lock:
            try:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(line)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:
                raise local_error(exc, f"append {self.path}") from exc


@contextlib.contextmanager
def version_lock(
    path: Path,
    *,
    timeout_s: float,
    sleep: Callable[[float], object],
    clock: Callable[[], float],
    on_wait: Callable[[], None],
    poll_s: float = 1.0,
) -> Iterator[None]:
    """Exclusive flock on ``path``: two jobs on one node never fill one version at once.

    The second one waits, then usually finds the marker written and returns at once.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise local_error(exc, f"open lock {path}") from exc
    try:
        deadline = clock() + timeout_s
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    on_wait()
                    waited = True
                remaining = deadline - clock()
                if remaining <= 0:
                    raise LockTimeoutError(
                        f"{path}: another fetcher held the lock for over {timeout_s:g}s"
                    ) from None
                sleep(min(poll_s, remaining))
        yield
    finally:
        os.close(fd)  # closing drops the flock
