"""Copy one file of a dataset version from its source into the version directory.

A file is streamed into a temp file under ``.prewarm/tmp``, or, from ``ranged_threshold``
bytes, fetched as ranges in parallel into one preallocated temp file whose finished parts are
journaled (``<hash>.parts``) so that a restarted pod fetches only the parts still missing.
Either way its bytes are counted and hashed, checked against the source's own check and the
producer's sha256, fsynced, renamed into place and journaled. Every request goes through the
node's limits and the retry policy, spending the source's shared retry budget.

Apart from ``fetch.py``, the fill of a whole version (lock, marker, listing, manifest, room,
rounds), which decides which files to copy: :class:`FileTransfer` holds the copying, and
:class:`~trainstack_prewarm.fetch.Fetcher`, its one subclass, sets the attributes it declares.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from trainstack_prewarm import cache
from trainstack_prewarm.errors import IntegrityError, ThrottledError, TransientError
from trainstack_prewarm.limits import SourceLimiter
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import call_with_retry
from trainstack_prewarm.sources import SOURCE_INDEX, SOURCE_MANIFEST, RemoteFile, Source

if TYPE_CHECKING:
    from trainstack_prewarm.fetch import FetchOptions, _Progress

T = TypeVar("T")


class _Cancelled(Exception):
    """Another file failed for good; abandon this one quietly."""


def _tmp_name(path: str) -> str:
    # One stable temp name per file: a rerun truncates the previous attempt's partial file.
    return hashlib.sha256(path.encode()).hexdigest()[:32] + ".part"


class FileTransfer:
    """Copying one file into place, and the requests it makes; the fill is its subclass
    :class:`~trainstack_prewarm.fetch.Fetcher`, whose constructor sets these attributes."""

    source: Source
    vdir: Path
    opts: FetchOptions
    limiter: SourceLimiter
    log: JsonLog
    sleep: Callable[[float], object]
    rng: random.Random
    _cancel: threading.Event
    _tmp: Path
    _journal: cache.Journal
    _key: str

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

    def _sleep_unless_cancelled(self, seconds: float) -> None:
        if self._cancel.is_set():
            raise _Cancelled
        self.sleep(seconds)
        if self._cancel.is_set():
            raise _Cancelled

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
