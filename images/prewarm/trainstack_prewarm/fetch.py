"""Fill ``<cache>/<dataset>/<version>`` from a source: bounded, retried, resumable, verified."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from trainstack_prewarm import cache
from trainstack_prewarm.errors import (
    IncompleteCacheError,
    IntegrityError,
    LocalCacheError,
    SourceError,
    TransientError,
)
from trainstack_prewarm.limits import SourceLimiter
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import RetryPolicy, call_with_retry
from trainstack_prewarm.sources import SOURCE_MANIFEST, RemoteFile, Source, parse_manifest

_MAX_MANIFEST_BYTES = 64 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class FetchOptions:
    concurrency: int = 8
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lock_timeout_s: float = 3600.0
    # Spread the first requests of many jobs that start at the same second.
    start_jitter_s: float = 0.0
    progress_interval_s: float = 10.0
    # Hash every file of an existing cache before trusting it (same depth as `verify`).
    deep_check: bool = True


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
        self.vdir = cache.version_dir(cache_root, dataset, version)
        self.opts = options or FetchOptions()
        self.limiter = limiter or SourceLimiter(self.opts.concurrency)
        self.log = log or JsonLog()
        self._cancel = threading.Event()
        # By default backoff sleeps wake up early when another file has failed for good.
        self.sleep: Callable[[float], object] = sleep or self._cancel.wait
        self.clock = clock
        self.rng = rng or random.Random()
        self._state = self.vdir / cache.STATE_DIR
        self._tmp = self._state / cache.TMP_DIR
        self._journal = cache.Journal(self._state / cache.JOURNAL)

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
        known = self._existing_marker_records()
        if known is None:  # the marker is there and the files match it
            marker = cache.read_marker(self.vdir)
            self.log(
                "already_complete",
                cache=str(self.vdir),
                files=len(marker.files),
                source=marker.source,
            )
            return FetchResult(self.vdir, len(marker.files), 0, len(marker.files), 0, 0, True)
        known.update(self._journal.load())

        if self.opts.start_jitter_s > 0:
            self.sleep(self.rng.uniform(0.0, self.opts.start_jitter_s))
        self.log(
            "start",
            source=self.source.uri,
            cache=str(self.vdir),
            dataset=self.dataset,
            version=self.version,
            concurrency=self.limiter.limit(self.source.limit_key),
        )

        files = self._retrying("list " + self.source.uri, self.source.list_files)
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
        )

        records = self._fetch_all(files, known, expected, progress)
        marker = cache.Marker(
            self.dataset,
            self.version,
            self.source.uri,
            tuple(sorted(records, key=lambda r: r.path)),
        )
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
            peak_in_flight=self.limiter.peak(self.source.limit_key),
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

    def _existing_marker_records(self) -> dict[str, cache.FileRecord] | None:
        """None if a valid marker exists; else the records a stale marker still vouches for."""
        if not (self.vdir / cache.MARKER).exists():
            return {}
        try:
            cache.verify(
                self.vdir,
                deep=self.opts.deep_check,
                workers=self.opts.concurrency,
                dataset=self.dataset,
                version=self.version,
            )
            return None
        except IncompleteCacheError as exc:
            self.log("marker_invalid", cache=str(self.vdir), reason=exc.message)
        try:
            records = {r.path: r for r in cache.read_marker(self.vdir).files}
        except IncompleteCacheError:
            records = {}
        cache.remove_marker(self.vdir)  # close the gate before repairing
        return records

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        """One small source request (list, manifest) under the source's limit, retried."""

        def attempt(_n: int) -> T:
            with self.limiter.slot(self.source.limit_key):
                return fn()

        return call_with_retry(
            attempt,
            self.opts.retry,
            sleep=self.sleep,
            rng=self.rng,
            on_retry=self._on_retry(what, None),
        )

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
        wanted = {f.path: f for f in files}
        try:
            self._tmp.mkdir(exist_ok=True)
            # Partial files of an interrupted run are redone from scratch, never appended to.
            for part in self._tmp.iterdir():
                part.unlink()
            # Files of an older listing must not be read by training as part of this version.
            for rel in sorted(cache.dataset_files(self.vdir) - set(wanted)):
                (self.vdir / rel).unlink()
                self.log("removed_stale", path=rel)
        except OSError as exc:
            raise cache.local_error(exc, f"clean {self.vdir}") from exc
        needed = sum(f.size for f in files if not self._maybe_present(f, known.get(f.path)))
        free = shutil.disk_usage(self.vdir).free
        if needed > free:
            raise LocalCacheError(
                f"{self.vdir}: needs {needed} bytes, the cache volume has {free} free"
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
        # Workers only block on the source's slots; more workers than slots would just idle.
        workers = max(1, self.limiter.limit(self.source.limit_key))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prewarm") as pool:
            futures: list[Future[cache.FileRecord | None]] = [
                pool.submit(self._one, f, known.get(f.path), expected.get(f.path), progress)
                for f in files
            ]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                self._cancel.set()
                for fut in futures:
                    fut.cancel()
                wait(futures)
                errors = [f.exception() for f in futures if f.done() and not f.cancelled()]
                real = [e for e in errors if e is not None and not isinstance(e, _Cancelled)]
                raise real[0]
        records = [fut.result() for fut in futures]
        return [r for r in records if r is not None]

    def _one(
        self,
        f: RemoteFile,
        rec: cache.FileRecord | None,
        sha256: str | None,
        progress: _Progress,
    ) -> cache.FileRecord | None:
        if self._cancel.is_set():
            raise _Cancelled
        if rec is not None and self._maybe_present(f, rec) and self._still_valid(f, rec, sha256):
            progress.file_done(f.size, fetched=False)
            return rec
        try:
            result = call_with_retry(
                lambda _n: self._transfer_once(f, sha256),
                self.opts.retry,
                sleep=self._sleep_unless_cancelled,
                rng=self.rng,
                on_retry=self._on_retry(f.path, progress),
            )
        except BaseException:
            # Stop the other workers before this one picks up its next file.
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
        final = self.vdir / f.path
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

            with self.limiter.slot(self.source.limit_key):
                check = self.source.transfer(f, sink)
            if written != f.size:
                raise IntegrityError(f"{f.path}: got {written} bytes, expected {f.size}")
            digest = hasher.hexdigest()
            if expected_sha256 is not None and digest != expected_sha256:
                raise IntegrityError(
                    f"{f.path}: sha256 {digest} != {SOURCE_MANIFEST} entry {expected_sha256}"
                )
            if expected_sha256 is not None:
                check = f"{check}+manifest-sha256"
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
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
            cache.fsync_dir(final.parent)
        except OSError as exc:
            raise cache.local_error(exc, f"rename {tmp} -> {final}") from exc
        record = cache.FileRecord(f.path, f.size, digest, f.identity, check)
        self._journal.append(record)
        return record

    def _cleanup_state(self) -> None:
        # The marker now carries every record; the journal and temp dir are no longer needed.
        # The lock file stays: deleting it while another job waits on it would break the lock.
        try:
            (self._state / cache.JOURNAL).unlink(missing_ok=True)
            shutil.rmtree(self._tmp, ignore_errors=True)
        except OSError as exc:
            raise cache.local_error(exc, f"clean {self._state}") from exc
