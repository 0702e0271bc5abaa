"""The on-node cache layout, its completion manifest, the resume journal and the verify gate.

Layout of one dataset version (``<cache>/<dataset>/<version>/``)::

    <files of the dataset, at their relative paths>
    .complete            completion manifest: JSON, written last and atomically
    .prewarm/lock        flock: one fetcher per dataset version per node
    .prewarm/hold        flock: shared by every reader of the version, exclusive for a repair
                         or an eviction; its mtime is the version's last use (LRU)
    .prewarm/journal     JSON lines: files already copied and verified (for resumption)
    .prewarm/tmp/*.part  files being written; renamed into place only once verified
    .prewarm/tmp/*.parts JSON lines: the finished ranges of a large object's .part (resumption)

A node-level cache holds many versions side by side (``<cache>/<dataset>/<version>/``); every
pod that reads one holds it, and eviction removes only versions nobody holds.

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
import shutil
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
HOLD = "hold"
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


@dataclass(frozen=True, slots=True)
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
    head = {
        "format": MARKER_FORMAT,
        "dataset": marker.dataset,
        "version": marker.version,
        "source": marker.source,
        "file_count": len(marker.files),
        "total_bytes": marker.total_bytes,
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = vdir / STATE_DIR / (MARKER + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            # One record at a time: a million files never become a million dicts at once.
            fh.write(json.dumps(head, indent=1)[:-2] + ',\n "files": [')
            for n, rec in enumerate(marker.files):
                fh.write(("\n  " if n == 0 else ",\n  ") + json.dumps(asdict(rec)))
            fh.write("\n ]\n}\n")
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


def _open_lock_file(path: Path, *, read_only_ok: bool = False) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if read_only_ok and exc.errno in {errno.EROFS, errno.EACCES, errno.EPERM}:
            # A reader's read-only mount: flock works on a read-only descriptor too.
            with contextlib.suppress(OSError):
                return os.open(path, os.O_RDONLY)
        raise local_error(exc, f"open lock {path}") from exc


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (an evictor may have deleted it meanwhile)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


@contextlib.contextmanager
def _flock(
    path: Path,
    *,
    exclusive: bool,
    timeout_s: float,
    sleep: Callable[[float], object],
    clock: Callable[[], float],
    on_wait: Callable[[], None],
    poll_s: float = 1.0,
    what: str = "another fetcher",
) -> Iterator[int]:
    deadline = clock() + timeout_s
    waited = False
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    while True:
        if exclusive:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise local_error(exc, f"create {path.parent}") from exc
        elif not path.parent.is_dir():
            raise IncompleteCacheError(f"{path.parent.parent}: no such cached version")
        fd = _open_lock_file(path, read_only_ok=not exclusive)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if not waited:
                on_wait()
                waited = True
            remaining = deadline - clock()
            if remaining <= 0:
                raise LockTimeoutError(
                    f"{path}: {what} held the lock for over {timeout_s:g}s"
                ) from None
            sleep(min(poll_s, remaining))
            continue
        if _same_file(fd, path):
            break
        os.close(fd)  # locked a file an evictor unlinked: lock the new one instead
    try:
        yield fd
    finally:
        os.close(fd)  # closing drops the flock


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
    with _flock(
        path,
        exclusive=True,
        timeout_s=timeout_s,
        sleep=sleep,
        clock=clock,
        on_wait=on_wait,
        poll_s=poll_s,
    ):
        yield


@contextlib.contextmanager
def hold(
    vdir: Path,
    *,
    shared: bool = True,
    timeout_s: float = 0.0,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_wait: Callable[[], None] = lambda: None,
) -> Iterator[int]:
    """Hold a version: shared by readers, exclusive to change or evict it. Yields the fd.

    A reader's hold marks the version used now (the hold file's mtime orders eviction). The
    flock belongs to the open file, so a process that ``exec``s with the fd inheritable keeps
    holding the version until it exits (``verify --hold -- CMD``).
    """
    path = vdir / STATE_DIR / HOLD
    with _flock(
        path,
        exclusive=not shared,
        timeout_s=timeout_s,
        sleep=sleep,
        clock=clock,
        on_wait=on_wait,
        what="a reader" if not shared else "a repair or eviction",
    ) as fd:
        if shared:
            touch_last_used(vdir)
        yield fd


def _try_flock(path: Path) -> int | None:
    """An exclusive flock on ``path`` without waiting, or None when someone has it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if not _same_file(fd, path):
        os.close(fd)
        return None
    return fd


def touch_last_used(vdir: Path) -> None:
    """Record a use of the version (the hold file's mtime) where the mount is writable."""
    path = vdir / STATE_DIR / HOLD
    with contextlib.suppress(OSError):
        path.touch()


def last_used(vdir: Path) -> float:
    """When the version was last held by a reader (else written): the LRU order."""
    for path in (vdir / STATE_DIR / HOLD, vdir / MARKER, vdir):
        with contextlib.suppress(OSError):
            return path.stat().st_mtime
    return 0.0


def version_dirs(cache_root: Path) -> list[Path]:
    """Every ``<dataset>/<version>`` directory under a cache root.

    Only valid names: the node agent keeps its own state in ``<cache>/.agent`` (never a
    dataset name), which eviction must not take for a version.
    """
    out: list[Path] = []
    try:
        datasets = sorted(p for p in cache_root.iterdir() if p.is_dir() and _NAME.match(p.name))
    except OSError:
        return out
    for ds in datasets:
        with contextlib.suppress(OSError):
            out.extend(sorted(p for p in ds.iterdir() if p.is_dir() and _NAME.match(p.name)))
    return out


def disk_bytes(vdir: Path) -> int:
    """Bytes the version occupies (allocated blocks, temp files included)."""
    total = 0
    for dirpath, _dirs, names in os.walk(vdir):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


# Free space the cache leaves on its volume, as a percentage of the volume's size. The cache
# shares the instance-store array with the kubelet's and containerd's state and pod logs, so it
# must stay clear of the kubelet's defaults (k8s.io/kubernetes v1.37.2,
# pkg/kubelet/eviction/defaults_linux.go DefaultEvictionHard: nodefs.available 10 %,
# imagefs.available 15 %; pkg/kubelet/apis/config/v1beta1/defaults.go: image garbage
# collection from 85 % used down to 80 %). Below 10 or 15 % free the node goes into
# DiskPressure and evicts training pods (which frees nothing the cache holds); below 20 % it
# deletes images the next job pulls again. 20 % keeps the cache out of all three (issue 39 #1).
DEFAULT_RESERVE_PERCENT = 20.0


def free_and_reserve(path: Path, percent: float) -> tuple[int, int]:
    """The free bytes of the volume holding ``path``, and the bytes ``percent`` of it is (what
    the cache keeps free), from one look at the volume."""
    try:
        usage = shutil.disk_usage(path)
    except OSError as exc:
        raise local_error(exc, f"stat {path}") from exc
    return usage.free, -(-int(usage.total * percent) // 100)  # rounded up: never below


def keep_reserve(
    cache_root: Path,
    percent: float,
    *,
    on_evict: Callable[[Path, int], None] = lambda _p, _b: None,
) -> list[Path]:
    """Evict versions nobody holds, LRU first, until ``percent`` of the volume is free again:
    other tenants of the volume (images, logs, emptyDirs) grow after a fill was admitted."""
    free, reserve = free_and_reserve(cache_root, percent)
    if free >= reserve:
        return []
    return evict(cache_root, free_at_least=reserve, on_evict=on_evict)


def evict(
    cache_root: Path,
    *,
    high_water: int | None = None,
    free_at_least: int | None = None,
    keep: set[Path] | frozenset[Path] = frozenset(),
    usage: Callable[[Path], int] = disk_bytes,
    free: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free,
    on_evict: Callable[[Path, int], None] = lambda _p, _b: None,
) -> list[Path]:
    """Remove versions nobody holds, least recently used first, until the cache is back under
    ``high_water`` bytes (and/or the volume has ``free_at_least`` bytes free).

    A version is skipped while a reader holds it (shared ``hold``) or a fetcher fills it
    (``lock``); while it is removed the evictor holds both exclusively, and the marker goes
    first so a gate never passes on a half-removed version. Returns the removed directories.
    """
    sizes = {v: usage(v) for v in version_dirs(cache_root)}

    def satisfied() -> bool:
        ok = True
        if high_water is not None:
            ok = ok and sum(sizes.values()) <= high_water
        if free_at_least is not None:
            ok = ok and free(cache_root) >= free_at_least
        return ok

    removed: list[Path] = []
    for vdir in sorted(sizes, key=last_used):
        if satisfied():
            break
        if vdir in keep:
            continue
        lock_fd = _try_flock(vdir / STATE_DIR / LOCK) if (vdir / STATE_DIR).is_dir() else None
        if lock_fd is None and (vdir / STATE_DIR).is_dir():
            continue  # a fetcher is filling it
        try:
            hold_fd = _try_flock(vdir / STATE_DIR / HOLD) if lock_fd is not None else None
            if lock_fd is not None and hold_fd is None:
                continue  # a reader holds it
            try:
                with contextlib.suppress(OSError, LocalCacheError):
                    remove_marker(vdir)
                shutil.rmtree(vdir, ignore_errors=True)
            finally:
                if hold_fd is not None:
                    os.close(hold_fd)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        on_evict(vdir, sizes.pop(vdir))
        removed.append(vdir)
    return removed
