"""Committed checkpoints tiered to object storage (S3 or S3-compatible), and resume from there.

The shared file system is the checkpoints' first tier: ranks write there and rank 0 commits
with a directory rename (checkpoint.py). An object store has no rename, so a copy there gets
its own commit rule: **manifest.json is uploaded last**. The uploader (rank 0, a thread of its
own, so training and the next checkpoint never wait for it) sends every file the committed
manifest lists, hashing each as it streams it and comparing with the manifest's checksum (the
file system's bytes, not whatever the disk returns now, reach the store), and only then the
manifest. S3 is strongly read-after-write consistent for PUTs and LISTs (Amazon S3 User Guide,
"Amazon S3 data consistency model"), so a reader that sees the manifest sees every file
uploaded before it. The reader checks that anyway: a copy is *complete* only when its
manifest is there and every file it lists is there with the listed size
(:func:`complete_copy`); resume verifies every checksum on top. A copy abandoned half-way
(the pod died, retention deleted the directory under the uploader) has no manifest and is
never complete; :mod:`.s3copies` tags it superseded once a newer copy is complete, and the
bucket's lifecycle rule expires it after the team's retention.

Why not FSx for Lustre's own export (a data repository association with AutoExport): it
exports each file as it changes, in no order the job controls, so a reader could see a
manifest before the data, and the step directory appears first under its ``.tmp`` name; its
DELETED events would also propagate the file system's retention (and any accident on it) to
the copies that are meant to outlive the file system (FSx for Lustre User Guide, "Automatically
export updates to your S3 bucket"). The uploader costs the job's network and one core's
hashing while training runs; it works the same on an existing cluster against any
S3-compatible store. Only the newest committed step waits for upload: when commits come
faster than uploads, older pending ones are skipped ("latest wins").

Resume: before choosing a checkpoint, rank 0 compares the file system's newest committed
step with the store's newest complete copy; if the store's is newer (the file system was
lost or replaced), it downloads that copy into ``step-N.tmp``, verifies every file against
the manifest and renames it into place, and the normal verified restore follows. After a
resume, a committed step the store lacks (a preempted run ended before its upload) is
uploaded first.

Configuration: ``TRAINSTACK_CHECKPOINT_S3_URI`` (the job's prefix, ``s3://BUCKET/teams/TEAM/
JOB/``; the platform renders it), ``TRAINSTACK_CHECKPOINT_S3_KEEP`` (complete copies kept
untagged, default 2). The client is boto3's default (region, credentials, and
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for an S3-compatible endpoint: boto3's
"Service-specific endpoints" configuration); boto3 is imported only when the URI is set.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .ckptfiles import (
    CHECKSUM,
    FORMAT,
    MANIFEST,
    _allowed_name,
    _new_hash,
    committed_steps,
    fsync_dir,
    read_manifest,
    step_dir_name,
    verify,
)
from .contract import ENV_CHECKPOINT_S3_KEEP as ENV_S3_KEEP
from .contract import ENV_CHECKPOINT_S3_URI as ENV_S3_URI
from .exitcodes import ConfigError, StorageError
from .s3copies import mark_superseded, parse_uri, step_prefixes

log = logging.getLogger("trainstack.tiering")

S3_KEEP_DEFAULT = 2
_CHUNK = 8 << 20


def make_client() -> Any:
    """boto3's default S3 client; ConfigError if the image has no boto3."""
    try:
        import boto3  # noqa: PLC0415 - only jobs that tier checkpoints need the AWS SDK
    except ImportError:
        raise ConfigError(
            f"{ENV_S3_URI} is set but boto3 is not installed in the image: "
            "pip install boto3 (or unset the variable)"
        ) from None
    return boto3.client("s3")


class _HashingReader:
    """A read-only stream over a file that hashes what it hands out. No seek/tell: boto3's
    managed transfer then reads it once, in order (s3transfer's non-seekable upload path), so
    the hash covers exactly the bytes sent."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self.hash = _new_hash()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._fh.read(n)
        self.hash.update(data)
        self.size += len(data)
        return data


class ObjectTier:
    """One job's copies under ``s3://bucket/prefix/``, in the file system's layout."""

    def __init__(self, uri: str, client: Any, keep: int = S3_KEEP_DEFAULT) -> None:
        try:
            self.bucket, self.prefix = parse_uri(uri)
        except ValueError as err:
            raise ConfigError(f"{ENV_S3_URI}: {err}") from None
        if keep < 1:
            raise ConfigError(f"{ENV_S3_KEEP}={keep}: keep at least the newest copy")
        self.uri, self.client, self.keep = uri, client, keep

    def _key(self, step: int, name: str) -> str:
        return f"{self.prefix}{step_dir_name(step)}/{name}"

    # ---- reading ----
    def complete_copy(self, step: int) -> dict[str, Any] | None:
        """The manifest of step's copy if it is complete, else None."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(step, MANIFEST))
        except self.client.exceptions.NoSuchKey:
            return None
        manifest = json.loads(body["Body"].read())
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return None
        files = manifest.get("files")
        if not isinstance(files, dict):
            return None
        listed: dict[str, int] = {}
        step_prefix = self._key(step, "")
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=step_prefix):
            for obj in page.get("Contents", []):
                listed[obj["Key"][len(step_prefix) :]] = int(obj["Size"])
        for name, meta in files.items():
            if listed.get(name) != int(meta.get("size", -1)):
                return None
        return manifest

    def newest_complete(self) -> tuple[int, dict[str, Any]] | None:
        for step in sorted(step_prefixes(self.client, self.bucket, self.prefix), reverse=True):
            manifest = self.complete_copy(step)
            if manifest is not None:
                return step, manifest
        return None

    def download(self, step: int, manifest: dict[str, Any], root: Path) -> Path:
        """Copy step's complete copy to ``root/step-N`` (through ``step-N.tmp``), verified."""
        final = root / step_dir_name(step)
        tmp = root / (step_dir_name(step) + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        bad = [name for name in manifest["files"] if not _allowed_name(name)]
        if bad:  # before writing anything: a manifest in the store is input, not trusted
            raise StorageError(
                f"{self.uri}{step_dir_name(step)}/{MANIFEST} names paths outside the "
                f"checkpoint: {sorted(bad)}"
            )
        tmp.mkdir(parents=True)
        for name in sorted(manifest["files"]):
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(step, name))
            with open(tmp / name, "wb") as out:
                for chunk in obj["Body"].iter_chunks(_CHUNK):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        raw = self.client.get_object(Bucket=self.bucket, Key=self._key(step, MANIFEST))
        (tmp / MANIFEST).write_bytes(raw["Body"].read())
        verdict = verify(tmp)
        if verdict.ok and verdict.manifest != manifest:  # replaced since it was judged complete
            verdict = type(verdict)(False, "manifest changed while downloading")
        if not verdict.ok:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StorageError(f"{self.uri}{step_dir_name(step)}/: {verdict.reason}")
        fsync_dir(tmp)
        os.replace(tmp, final)
        fsync_dir(root)
        return final

    def fetch_if_newer(self, root: Path) -> int | None:
        """Download the store's newest complete copy when the file system has nothing as
        new; the step fetched, or None."""
        local = committed_steps(root)
        newest = self.newest_complete()
        if newest is None or (local and local[-1] >= newest[0]):
            return None
        step, manifest = newest
        log.warning(
            "the file system's newest checkpoint is %s; fetching step %d from %s",
            local[-1] if local else "none",
            step,
            self.uri,
        )
        t0 = time.perf_counter()
        self.download(step, manifest, root)
        log.info("fetched step %d in %.1f s", step, time.perf_counter() - t0)
        return step

    # ---- writing ----
    def upload(self, step: int, directory: Path) -> bool:
        """Copy one committed directory, manifest last; False if the copy was complete
        already. Raises StorageError if a file's bytes differ from its manifest entry."""
        if self.complete_copy(step) is not None:
            return False
        manifest, reason = read_manifest(directory)
        if manifest is None:
            raise StorageError(f"{directory}: {reason}")
        for name, meta in sorted(manifest["files"].items()):
            with open(directory / name, "rb") as fh:
                reader = _HashingReader(fh)
                self.client.upload_fileobj(reader, self.bucket, self._key(step, name))
            got = {"size": reader.size, CHECKSUM: reader.hash.hexdigest()}
            want = {"size": meta.get("size"), CHECKSUM: meta.get(CHECKSUM)}
            if got != want:
                raise StorageError(
                    f"{directory / name}: read for upload as {got}, committed as {want}: the "
                    "copy is left incomplete"
                )
        self.client.put_object(
            Bucket=self.bucket,
            Key=self._key(step, MANIFEST),
            Body=(directory / MANIFEST).read_bytes(),
            ContentType="application/json",
        )
        mark_superseded(self.client, self.uri, self.keep)
        return True


class Uploader:
    """Rank 0's background uploads: one at a time, the newest pending step only."""

    def __init__(
        self, tier: ObjectTier, on_uploaded: Callable[[int, float], None] | None = None
    ) -> None:
        self.tier = tier
        self._on_uploaded = on_uploaded
        self._cond = threading.Condition()
        self._pending: tuple[int, Path] | None = None
        self._busy = False
        self._closed = False
        self.last_uploaded_step = -1
        self.last_error: tuple[int, BaseException] | None = None
        self._thread = threading.Thread(target=self._run, name="ckpt-upload", daemon=True)
        self._thread.start()

    def submit(self, step: int, directory: Path) -> None:
        with self._cond:
            if self._pending is not None:
                log.info("upload of step %d skipped: step %d is newer", self._pending[0], step)
            self._pending = (step, directory)
            self._cond.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or in flight; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                assert self._pending is not None
                step, directory = self._pending
                self._pending, self._busy = None, True
            t0 = time.perf_counter()
            try:
                self.tier.upload(step, directory)
            except Exception as err:  # the next commit tries again
                log.warning("checkpoint %d not copied to %s: %s", step, self.tier.uri, err)
                with self._cond:
                    self.last_error = (step, err)
            else:
                seconds = time.perf_counter() - t0
                log.info("checkpoint %d copied to %s in %.1f s", step, self.tier.uri, seconds)
                with self._cond:
                    self.last_uploaded_step = max(self.last_uploaded_step, step)
                    if self.last_error is not None and self.last_error[0] <= step:
                        self.last_error = None
                if self._on_uploaded is not None:
                    self._on_uploaded(step, seconds)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
