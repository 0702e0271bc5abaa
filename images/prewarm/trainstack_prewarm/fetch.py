"""Fill ``<cache>/<dataset>/<version>`` from a source: bounded, retried, resumable, verified."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
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
    IntegrityError,
    LocalCacheError,
    SourceError,
    ThrottledError,
    TransientError,
)
from trainstack_prewarm.limits import SourceLimiter
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import RetryPolicy, call_with_retry
from trainstack_prewarm.sources import (
    SOURCE_INDEX,
    SOURCE_MANIFEST,
    RemoteFile,
    Source,
    parse_manifest,
)

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


@dataclass(frozen=True)
class FetchResult:
    vdir: Path
    files: int
    fetched: int
    skipped: int
    bytes_fetched: int
    retries: int
    already_complete: bool


class _Cancelled(Exception):
    """Another file failed for good; abandon this one quietly."""


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


def _tmp_name(path: str) -> str:
    # One stable temp name per file: a rerun truncates the previous attempt's partial file.
    return hashlib.sha256(path.encode()).hexdigest()[:32] + ".part"


class Fetcher:
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

    def _with_retry(
        self,
        attempt: Callable[[int], T],
        what: str,
        progress: _Progress | None,
        sleep: Callable[[float], object],
    ) -> T:
        """``attempt`` under the retry policy, spending the source's shared retry budget."""
        return call_with_retry(
            attempt,
            self.opts.retry,
            sleep=sleep,
            rng=self.rng,
            on_retry=self._on_retry(what, progress),
            budget=self.limiter.budget(self._key).try_spend,
        )

    def _request(self, fn: Callable[[], T]) -> T:
        """One request: a slot and a rate token; its outcome adapts the node's rate."""
        with self.limiter.slot(self._key):
            try:
                result = fn()
            except ThrottledError:
                self.limiter.throttled(self._key)
                raise
        self.limiter.succeeded(self._key)
        return result

    def _on_retry(
        self, what: str, progress: _Progress | None
    ) -> Callable[[int, float, TransientError], None]:
        def report(attempt: int, delay: float, exc: TransientError) -> None:
            if progress is not None:
                progress.retried()
            self.log(
                "retry",
                what=what,
                attempt=attempt,
                delay_s=round(delay, 4),
                error=exc.message,
                kind=type(exc).__name__,
            )

        return report

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
        free = shutil.disk_usage(self.vdir).free
        if needed > free and self.opts.evict:
            # A full disk is not permanent: versions no pod holds make room, LRU first.
            evicted = cache.evict(self.cache_root, free_at_least=needed, keep={self.vdir})
            for gone in evicted:
                self.log("evicted", cache=str(gone), reason="space")
            free = shutil.disk_usage(self.vdir).free
        if needed > free:
            raise LocalCacheError(
                f"{self.vdir}: needs {needed} bytes, the cache volume has {free} free "
                "(after evicting every version no pod holds)"
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

    def _sleep_unless_cancelled(self, seconds: float) -> None:
        if self._cancel.is_set():
            raise _Cancelled
        self.sleep(seconds)
        if self._cancel.is_set():
            raise _Cancelled

    def _still_valid(self, f: RemoteFile, rec: cache.FileRecord, sha256: str | None) -> bool:
        """Re-hash a file a previous run copied; local NVMe reads beat refetching from S3."""
        try:
            size, digest = cache.hash_file(self.vdir / f.path)
        except OSError:
            return False
        return size == f.size and digest == rec.sha256 and sha256 in (None, digest)

    def _transfer_once(self, f: RemoteFile, expected_sha256: str | None) -> cache.FileRecord:
        tmp = self._tmp / _tmp_name(f.path)
        hasher = hashlib.sha256()
        written = 0
        try:
            out = open(tmp, "wb")  # noqa: SIM115 - closed in finally, after fsync
        except OSError as exc:
            raise cache.local_error(exc, f"create {tmp}") from exc
        try:

            def sink(chunk: bytes) -> None:
                nonlocal written
                if self._cancel.is_set():
                    raise _Cancelled
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise cache.local_error(exc, f"write {tmp}") from exc
                hasher.update(chunk)
                written += len(chunk)

            check = self._request(lambda: self.source.transfer(f, sink))
            if written != f.size:
                raise IntegrityError(f"{f.path}: got {written} bytes, expected {f.size}")
            digest = hasher.hexdigest()
            check = self._check_sha256(f, digest, expected_sha256, check)
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as exc:
                raise cache.local_error(exc, f"fsync {tmp}") from exc
        except BaseException:
            out.close()
            tmp.unlink(missing_ok=True)
            raise
        out.close()
        return self._install(f, tmp, digest, check)

    @staticmethod
    def _check_sha256(f: RemoteFile, digest: str, expected: str | None, check: str) -> str:
        if expected is None:
            return check
        if digest != expected:
            raise IntegrityError(
                f"{f.path}: sha256 {digest} != the producer's {expected} "
                f"({SOURCE_MANIFEST} or {SOURCE_INDEX})"
            )
        return f"{check}+manifest-sha256"

    def _install(self, f: RemoteFile, tmp: Path, digest: str, check: str) -> cache.FileRecord:
        final = self.vdir / f.path
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
            cache.fsync_dir(final.parent)
        except OSError as exc:
            raise cache.local_error(exc, f"rename {tmp} -> {final}") from exc
        record = cache.FileRecord(f.path, f.size, digest, f.identity, check)
        self._journal.append(record)
        return record

    # ---- large objects: ranged, parallel, resumable parts (issue 24 #8) -------------------

    def _transfer_ranged(
        self, f: RemoteFile, expected_sha256: str | None, progress: _Progress
    ) -> cache.FileRecord:
        """Fetch ``f`` as ``part_size`` ranges in parallel into one preallocated temp file.

        Each part is retried on its own and resumes from the last byte it wrote, so a dropped
        connection costs the rest of one part, not the object. Finished parts are journaled
        in ``<hash>.parts``, so a restarted pod fetches only the parts still missing. Once
        assembled, the file is read once locally for its sha256 and the source's ETag check.
        """
        tmp = self._tmp / _tmp_name(f.path)
        state = tmp.with_suffix(".parts")
        count = -(-f.size // self.opts.part_size)
        header = {"identity": f.identity, "size": f.size, "part_size": self.opts.part_size}
        done = _load_parts(state, header)
        try:
            if done is None:
                with open(tmp, "wb") as out:
                    out.truncate(f.size)
                _write_parts_header(state, header)
                done = set()
            fd = os.open(tmp, os.O_WRONLY)
        except OSError as exc:
            raise cache.local_error(exc, f"create {tmp}") from exc
        try:
            todo = [n for n in range(count) if n not in done]
            if done:
                self.log("resume_parts", path=f.path, parts_done=len(done), parts=count)
            journal = _PartsJournal(state)
            workers = max(1, min(len(todo), self.limiter.limit(self._key)))
            with ThreadPoolExecutor(workers, thread_name_prefix="prewarm-part") as parts:
                futures = [parts.submit(self._one_part, f, n, fd, journal, progress) for n in todo]
                errors = [e for e in (fut.exception() for fut in futures) if e is not None]
            if errors:
                raise errors[0]
        finally:
            os.close(fd)
        try:
            digest, check = self._assembled(f, tmp, expected_sha256)
        except IntegrityError:
            # The parts do not add up to the object: start it again from zero next time.
            tmp.unlink(missing_ok=True)
            state.unlink(missing_ok=True)
            raise
        record = self._install(f, tmp, digest, check)
        state.unlink(missing_ok=True)
        return record

    def _one_part(
        self, f: RemoteFile, n: int, fd: int, journal: _PartsJournal, progress: _Progress
    ) -> None:
        start = n * self.opts.part_size
        end = min(f.size, start + self.opts.part_size) - 1
        pos = start

        def sink(chunk: bytes) -> None:
            nonlocal pos
            if self._cancel.is_set():
                raise _Cancelled
            if pos + len(chunk) > end + 1:
                raise IntegrityError(f"{f.path}: part {n} longer than requested")
            try:
                os.pwrite(fd, chunk, pos)
            except OSError as exc:
                raise cache.local_error(exc, f"write part {n} of {f.path}") from exc
            pos += len(chunk)

        def attempt(_attempt: int) -> None:
            # Resume where the last attempt stopped: only the missing bytes again.
            self._request(lambda: self.source.transfer_range(f, pos, end, sink))
            if pos != end + 1:
                raise TransientError(f"{f.path}: part {n} ended at {pos}, not {end + 1}")

        self._with_retry(attempt, f"{f.path} part {n}", progress, self._sleep_unless_cancelled)
        try:
            os.fsync(fd)
        except OSError as exc:
            raise cache.local_error(exc, f"fsync {f.path}") from exc
        journal.done(n)

    def _assembled(self, f: RemoteFile, tmp: Path, expected_sha256: str | None) -> tuple[str, str]:
        """sha256 and the source's check of an assembled file, from one local read."""
        check = self._request(lambda: self.source.local_check(f))
        hasher = hashlib.sha256()
        size = 0
        try:
            with open(tmp, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    hasher.update(chunk)
                    check.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise cache.local_error(exc, f"read {tmp}") from exc
        if size != f.size:
            raise IntegrityError(f"{f.path}: assembled {size} bytes, expected {f.size}")
        digest = hasher.hexdigest()
        return digest, self._check_sha256(f, digest, expected_sha256, check.result())

    def _cleanup_state(self) -> None:
        # The marker now carries every record; the journal and temp dir are no longer needed.
        # The lock and hold files stay: deleting one while another process waits on it would
        # break the lock.
        try:
            (self._state / cache.JOURNAL).unlink(missing_ok=True)
            shutil.rmtree(self._tmp, ignore_errors=True)
        except OSError as exc:
            raise cache.local_error(exc, f"clean {self._state}") from exc


def _load_parts(state: Path, header: dict[str, object]) -> set[int] | None:
    """The parts a previous run finished, or None when there is no usable parts journal."""
    try:
        lines = state.read_text(encoding="utf-8").splitlines()
        tmp_ok = state.with_suffix(".part").stat().st_size == header["size"]
    except (OSError, ValueError):
        return None
    if not lines or not tmp_ok:
        return None
    try:
        if json.loads(lines[0]) != header:
            return None  # another object (or part size) than the one listed now
    except ValueError:
        return None
    done: set[int] = set()
    for line in lines[1:]:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            done.add(int(json.loads(line)["part"]))  # a torn last line: that part again
    return done


def _write_parts_header(state: Path, header: dict[str, object]) -> None:
    with open(state, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class _PartsJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def done(self, n: int) -> None:
        try:
            with self._lock, open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"part": n}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise cache.local_error(exc, f"record part {n} in {self.path}") from exc
