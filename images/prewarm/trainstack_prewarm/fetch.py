"""Fill ``<cache>/<dataset>/<version>`` from a source: bounded, retried, resumable, verified.

This module is the fill of one version: its lock and marker, the listing and the producer's
manifest, room on the cache volume, which files an earlier run already left in place, and the
rounds that fetch the rest. Copying one file into place (in one stream, or a large object in
ranged parts) and the requests under the node's limits are
:class:`~trainstack_prewarm.transfer.FileTransfer` (``transfer.py``), which :class:`Fetcher`
extends.
"""

from __future__ import annotations

import functools
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from trainstack_prewarm import cache
from trainstack_prewarm.errors import (
    IncompleteCacheError,
    LocalCacheError,
    SourceError,
    TransientError,
)
from trainstack_prewarm.limits import SourceLimiter
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.sources import (
    SOURCE_INDEX,
    SOURCE_MANIFEST,
    RemoteFile,
    Source,
    parse_manifest,
)
from trainstack_prewarm.transfer import FileTransfer, _Cancelled

_MAX_MANIFEST_BYTES = 64 << 20
T = TypeVar("T")
# Spread the first requests of a fleet's pods that start in the same second (the job layer
# renders `fetch` without --start-jitter, so this default is what runs).
DEFAULT_START_JITTER_S = 10.0
DEFAULT_PART_SIZE = 64 << 20
DEFAULT_RANGED_THRESHOLD = 128 << 20
DEFAULT_FILE_ROUNDS = 3


@dataclass(frozen=True)
class FetchOptions:
    concurrency: int = 8
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lock_timeout_s: float = 3600.0
    # Spread the first requests of many jobs that start at the same second.
    start_jitter_s: float = DEFAULT_START_JITTER_S
    progress_interval_s: float = 10.0
    # Hash every file of an existing, marked cache before trusting it. Off by default: the
    # marker is written only after every byte was hashed on the way in (issue 24 #7).
    deep_check: bool = False
    # Files that failed transiently are retried in up to this many later rounds (issue 24 #3).
    file_rounds: int = DEFAULT_FILE_ROUNDS
    # Files submitted ahead of the workers; None: 4 per worker (issue 24 #5).
    window: int | None = None
    # Objects of at least ranged_threshold bytes are fetched as ranged parts (issue 24 #8).
    part_size: int = DEFAULT_PART_SIZE
    ranged_threshold: int = DEFAULT_RANGED_THRESHOLD
    # Make room for this version by evicting unheld versions, least recently used first.
    evict: bool = True
    # Percentage of the cache's volume a fill leaves free (issue 39 #1). The library reserves
    # nothing unless told; the CLI's --reserve (fetch and the node agent) defaults to
    # cache.DEFAULT_RESERVE_PERCENT, above the kubelet's eviction and image GC thresholds.
    reserve_percent: float = 0.0


@dataclass(frozen=True)
class FetchResult:
    vdir: Path
    files: int
    fetched: int
    skipped: int
    bytes_fetched: int
    retries: int
    already_complete: bool


class _Progress:
    def __init__(
        self,
        total_files: int,
        total_bytes: int,
        log: JsonLog,
        clock: Callable[[], float],
        interval_s: float,
    ) -> None:
        self._lock = threading.Lock()
        self.total_files, self.total_bytes = total_files, total_bytes
        self.done_files = self.done_bytes = self.fetched = self.skipped = 0
        self.bytes_fetched = self.retries = 0
        self._log, self._clock, self._interval = log, clock, interval_s
        self._last = clock()

    def file_done(self, size: int, *, fetched: bool) -> None:
        with self._lock:
            self.done_files += 1
            self.done_bytes += size
            if fetched:
                self.fetched += 1
                self.bytes_fetched += size
            else:
                self.skipped += 1
            now = self._clock()
            if now - self._last < self._interval:
                return
            self._last = now
            self._log(
                "progress",
                files_done=self.done_files,
                files_total=self.total_files,
                bytes_done=self.done_bytes,
                bytes_total=self.total_bytes,
            )

    def retried(self) -> None:
        with self._lock:
            self.retries += 1


class Fetcher(FileTransfer):
    def __init__(
        self,
        source: Source,
        cache_root: Path,
        dataset: str,
        version: str,
        *,
        options: FetchOptions | None = None,
        limiter: SourceLimiter | None = None,
        log: JsonLog | None = None,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.source = source
        self.dataset = dataset
        self.version = version
        self.cache_root = cache_root
        self.vdir = cache.version_dir(cache_root, dataset, version)
        self.opts = options or FetchOptions()
        self.limiter = limiter or SourceLimiter(self.opts.concurrency)
        self.log = log or JsonLog()
        self._cancel = threading.Event()
        # By default backoff sleeps wake up early when another file has failed for good.
        self.sleep: Callable[[float], object] = sleep or self._cancel.wait
        self.clock = clock
        self.rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        self._state = self.vdir / cache.STATE_DIR
        self._tmp = self._state / cache.TMP_DIR
        self._journal = cache.Journal(self._state / cache.JOURNAL)
        self._key = self.source.limit_key
        self._fatal: BaseException | None = None
        self.peak_pending = 0  # most files submitted and not yet settled (bounded by the window)

    # ---- entry point ---------------------------------------------------------------------

    def run(self) -> FetchResult:
        try:
            self._state.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cache.local_error(exc, f"create {self._state}") from exc
        with cache.version_lock(
            self._state / cache.LOCK,
            timeout_s=self.opts.lock_timeout_s,
            sleep=self.sleep,
            clock=self.clock,
            on_wait=lambda: self.log("lock_wait", cache=str(self.vdir)),
        ):
            return self._run_locked()

    def _run_locked(self) -> FetchResult:
        if self._trusted_marker():
            marker = cache.read_marker(self.vdir)
            cache.touch_last_used(self.vdir)  # every pod's init container: a use (LRU)
            self.log(
                "already_complete",
                cache=str(self.vdir),
                files=len(marker.files),
                source=marker.source,
            )
            return FetchResult(self.vdir, len(marker.files), 0, len(marker.files), 0, 0, True)
        # Readers hold a complete version (`verify --hold`); it is changed only once none does.
        with cache.hold(
            self.vdir,
            shared=False,
            timeout_s=self.opts.lock_timeout_s,
            sleep=self.sleep,
            clock=self.clock,
            on_wait=lambda: self.log("hold_wait", cache=str(self.vdir)),
        ):
            return self._fill()

    def _fill(self) -> FetchResult:
        known = self._existing_marker_records()
        known.update(self._journal.load())

        if self.opts.start_jitter_s > 0:
            self.sleep(self._uniform(0.0, self.opts.start_jitter_s))
        self.log(
            "start",
            source=self.source.uri,
            cache=str(self.vdir),
            dataset=self.dataset,
            version=self.version,
            concurrency=self.limiter.limit(self._key),
        )

        files, from_index = self._list()
        expected = self._expected_sha256(files)
        self._check_listing(files)
        self._prepare_dir(files, known)
        progress = _Progress(
            len(files),
            sum(f.size for f in files),
            self.log,
            self.clock,
            self.opts.progress_interval_s,
        )
        self.log(
            "listed",
            files=len(files),
            bytes=progress.total_bytes,
            resumable=sum(1 for f in files if f.path in known),
            from_index=from_index,
        )

        records = self._fetch_all(files, known, expected, progress)
        del known, expected
        records.sort(key=lambda r: r.path)
        marker = cache.Marker(self.dataset, self.version, self.source.uri, tuple(records))
        cache.write_marker(self.vdir, marker)  # last: only now may training start
        self._cleanup_state()
        self.log(
            "complete",
            cache=str(self.vdir),
            files=len(files),
            fetched=progress.fetched,
            skipped=progress.skipped,
            bytes_fetched=progress.bytes_fetched,
            retries=progress.retries,
            peak_in_flight=self.limiter.peak(self._key),
        )
        return FetchResult(
            self.vdir,
            len(files),
            progress.fetched,
            progress.skipped,
            progress.bytes_fetched,
            progress.retries,
            False,
        )

    # ---- steps -----------------------------------------------------------------------------

    def _uniform(self, lo: float, hi: float) -> float:
        with self._rng_lock:
            return self.rng.uniform(lo, hi)

    def _trusted_marker(self) -> bool:
        """A marked version is trusted on its marker and file sizes (sha256 with deep_check).

        The marker is written only after every file was hashed while it was downloaded, so
        re-hashing terabytes at every pod start buys nothing but minutes (issue 24 #7).
        """
        if not (self.vdir / cache.MARKER).exists():
            return False
        try:
            cache.verify(
                self.vdir,
                deep=self.opts.deep_check,
                workers=self.opts.concurrency,
                dataset=self.dataset,
                version=self.version,
            )
            return True
        except IncompleteCacheError as exc:
            self.log("marker_invalid", cache=str(self.vdir), reason=exc.message)
            return False

    def _existing_marker_records(self) -> dict[str, cache.FileRecord]:
        """The records a stale marker still vouches for; the marker is removed (gate closed)."""
        if not (self.vdir / cache.MARKER).exists():
            return {}
        try:
            records = {r.path: r for r in cache.read_marker(self.vdir).files}
        except IncompleteCacheError:
            records = {}
        cache.remove_marker(self.vdir)  # close the gate before repairing
        return records

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        """One small source request (a list page, a manifest) under the source's limits."""
        return self._with_retry(lambda _n: self._request(fn), what, None, self.sleep)

    def _list(self) -> tuple[list[RemoteFile], bool]:
        """The producer's index where there is one, else the listing, retried page by page."""
        index = self._retrying(SOURCE_INDEX, self.source.read_index)
        if index is not None:
            return index, True
        files: list[RemoteFile] = []
        token: str | None = None
        page_no = 1
        while True:
            # Each page is retried on its own from its continuation token: a throttled page
            # 900 does not restart the listing from page 1 (issue 24 #4).
            page = self._retrying(
                f"list {self.source.uri} page {page_no}",
                functools.partial(self.source.list_page, token),
            )
            files.extend(page.files)
            if page.next_token is None:
                return files, False
            token = page.next_token
            page_no += 1

    def _expected_sha256(self, files: list[RemoteFile]) -> dict[str, str]:
        if not any(f.path == SOURCE_MANIFEST for f in files):
            return {}
        data = self._retrying(
            SOURCE_MANIFEST,
            lambda: self.source.read_small(SOURCE_MANIFEST, _MAX_MANIFEST_BYTES),
        )
        if data is None:
            raise SourceError(f"{self.source.uri}: {SOURCE_MANIFEST} vanished after listing")
        expected = parse_manifest(data, f"{self.source.uri}{SOURCE_MANIFEST}")
        present = {f.path for f in files} - {SOURCE_MANIFEST}
        missing = sorted(set(expected) - present)
        unlisted = sorted(present - set(expected))
        if missing or unlisted:
            raise SourceError(
                f"{self.source.uri}: {SOURCE_MANIFEST} disagrees with the listing: "
                f"missing at source {missing[:5]}, not in manifest {unlisted[:5]}"
            )
        return expected

    def _check_listing(self, files: list[RemoteFile]) -> None:
        if not files:
            raise SourceError(f"{self.source.uri}: no files (wrong prefix or path?)")
        seen: set[str] = set()
        for f in files:
            top = f.path.split("/", 1)[0]
            if top in cache.RESERVED_TOP_LEVEL:
                raise SourceError(
                    f"{self.source.uri}: {f.path!r} collides with the cache's "
                    f"bookkeeping ({', '.join(sorted(cache.RESERVED_TOP_LEVEL))})"
                )
            if f.path in seen:
                raise SourceError(f"{self.source.uri}: duplicate file {f.path!r}")
            seen.add(f.path)

    def _prepare_dir(self, files: list[RemoteFile], known: dict[str, cache.FileRecord]) -> None:
        wanted = {f.path for f in files}
        try:
            self._tmp.mkdir(exist_ok=True)
            # Partial files of an interrupted run are redone from scratch, never appended to,
            # except the ranged parts a .parts journal vouches for (issue 24 #8).
            parts = {p.name for p in self._tmp.iterdir()}
            for name in parts:
                stem = name.removesuffix(".part").removesuffix(".parts")
                if not (f"{stem}.part" in parts and f"{stem}.parts" in parts):
                    (self._tmp / name).unlink()
            # Files of an older listing must not be read by training as part of this version.
            for rel in sorted(cache.dataset_files(self.vdir) - wanted):
                (self.vdir / rel).unlink()
                self.log("removed_stale", path=rel)
        except OSError as exc:
            raise cache.local_error(exc, f"clean {self.vdir}") from exc
        needed = sum(f.size for f in files if not self._maybe_present(f, known.get(f.path)))
        # The fill is admitted only if the volume keeps its reserve afterwards: the cache
        # shares it with the kubelet, containerd and pod logs (issue 39 #1).
        free, reserve = cache.free_and_reserve(self.vdir, self.opts.reserve_percent)
        if needed + reserve > free and self.opts.evict:
            # A full disk is not permanent: versions no pod holds make room, LRU first.
            evicted = cache.evict(self.cache_root, free_at_least=needed + reserve, keep={self.vdir})
            for gone in evicted:
                self.log("evicted", cache=str(gone), reason="space")
            free = shutil.disk_usage(self.vdir).free
        if needed + reserve > free:
            raise LocalCacheError(
                f"{self.vdir}: needs {needed} bytes and keeps {reserve} free "
                f"({self.opts.reserve_percent:g}% of the volume, for the kubelet and "
                f"containerd); the cache volume has {free} free (after evicting every "
                "version no pod holds)"
            )

    def _maybe_present(self, f: RemoteFile, rec: cache.FileRecord | None) -> bool:
        if rec is None or rec.identity != f.identity or rec.size != f.size:
            return False
        try:
            return (self.vdir / f.path).stat().st_size == f.size
        except OSError:
            return False

    def _fetch_all(
        self,
        files: list[RemoteFile],
        known: dict[str, cache.FileRecord],
        expected: dict[str, str],
        progress: _Progress,
    ) -> list[cache.FileRecord]:
        """Every file once; files that failed transiently get up to ``file_rounds`` more tries.

        One failed file does not abort the others (issue 24 #3): it is deferred, retried in a
        later round after a backoff, and only if it still fails does the fetch exit, leaving the
        journal with everything done so the next run resumes from there.
        """
        records: list[cache.FileRecord] = []
        todo: list[RemoteFile] | None = None
        last: TransientError | None = None
        for round_no in range(self.opts.file_rounds + 1):
            if round_no:
                assert todo is not None
                if not todo:
                    break
                delay = self.opts.retry.backoff(round_no + 1, self.rng)
                self.log("retry_round", round=round_no, files=len(todo), delay_s=round(delay, 4))
                self.sleep(delay)
            batch: Iterable[RemoteFile] = files if todo is None else todo
            failed: list[RemoteFile] = []
            last = (
                self._fetch_round(
                    batch,
                    known=known,
                    expected=expected,
                    progress=progress,
                    records=records,
                    failed=failed,
                )
                or last
            )
            todo = failed
        if todo:
            assert last is not None
            last.message = (
                f"{last.message}; {len(todo)} file(s) still failing after "
                f"{self.opts.file_rounds} more round(s), {len(records)} done are kept for the "
                "next run"
            )
            last.args = (last.message,)
            raise last
        return records

    def _fetch_round(
        self,
        files: Iterable[RemoteFile],
        *,
        known: dict[str, cache.FileRecord],
        expected: dict[str, str],
        progress: _Progress,
        records: list[cache.FileRecord],
        failed: list[RemoteFile],
    ) -> TransientError | None:
        """One pass over ``files``, at most ``window`` submitted ahead (issue 24 #5)."""
        # Workers only block on the source's slots; more workers than slots would just idle.
        workers = max(1, self.limiter.limit(self._key))
        window = self.opts.window or 4 * workers
        last: TransientError | None = None
        pending: dict[Future[cache.FileRecord], RemoteFile] = {}

        def settle(done: set[Future[cache.FileRecord]]) -> None:
            nonlocal last
            for fut in done:
                f = pending.pop(fut)
                exc = fut.exception()
                if exc is None:
                    records.append(fut.result())
                elif isinstance(exc, _Cancelled):
                    pass  # the error that cancelled it is in self._fatal
                elif isinstance(exc, TransientError) and not self._cancel.is_set():
                    failed.append(f)
                    last = exc
                    self.log("deferred", path=f.path, error=exc.message, kind=type(exc).__name__)
                else:
                    raise self._fatal or exc
            if self._fatal is not None:
                raise self._fatal

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prewarm") as pool:
            try:
                for f in files:
                    while len(pending) >= window:
                        done, _ = wait(pending, return_when=FIRST_COMPLETED)
                        settle(done)
                    fut = pool.submit(
                        self._one,
                        f,
                        known.get(f.path),
                        expected.get(f.path) or f.sha256,
                        progress,
                    )
                    pending[fut] = f
                    self.peak_pending = max(self.peak_pending, len(pending))
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    settle(done)
            except BaseException as exc:
                self._cancel.set()
                for fut in pending:
                    fut.cancel()
                wait(pending)
                if isinstance(exc, _Cancelled) and self._fatal is not None:
                    raise self._fatal from None
                raise
        return last

    def _one(
        self,
        f: RemoteFile,
        rec: cache.FileRecord | None,
        sha256: str | None,
        progress: _Progress,
    ) -> cache.FileRecord:
        if self._cancel.is_set():
            raise _Cancelled
        if rec is not None and self._maybe_present(f, rec) and self._still_valid(f, rec, sha256):
            progress.file_done(f.size, fetched=False)
            return rec
        try:
            if f.size >= self.opts.ranged_threshold and f.size > self.opts.part_size:
                result = self._transfer_ranged(f, sha256, progress)
            else:
                result = self._with_retry(
                    lambda _n: self._transfer_once(f, sha256),
                    f.path,
                    progress,
                    self._sleep_unless_cancelled,
                )
        except (TransientError, _Cancelled):
            raise  # a transient failure is deferred to a later round by _fetch_round
        except BaseException as exc:
            # Stop the other workers before this one picks up its next file.
            with self._rng_lock:
                self._fatal = self._fatal or exc
            self._cancel.set()
            raise
        progress.file_done(f.size, fetched=True)
        return result

    def _still_valid(self, f: RemoteFile, rec: cache.FileRecord, sha256: str | None) -> bool:
        """Re-hash a file a previous run copied; local NVMe reads beat refetching from S3."""
        try:
            size, digest = cache.hash_file(self.vdir / f.path)
        except OSError:
            return False
        return size == f.size and digest == rec.sha256 and sha256 in (None, digest)

    def _cleanup_state(self) -> None:
        # The marker now carries every record; the journal and temp dir are no longer needed.
        # The lock and hold files stay: deleting one while another process waits on it would
        # break the lock.
        try:
            (self._state / cache.JOURNAL).unlink(missing_ok=True)
            shutil.rmtree(self._tmp, ignore_errors=True)
        except OSError as exc:
            raise cache.local_error(exc, f"clean {self._state}") from exc
