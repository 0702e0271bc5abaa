"""Where datasets come from: an S3 prefix or a mounted (Lustre-like) directory.

Each source lists the files of one dataset version and streams one file into a sink, checking
what it can on its side (S3: the ETag; a directory: that the file did not change while it was
read). The fetcher checks the byte count and the optional ``MANIFEST.sha256`` for every source.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ChecksumError,
    ClientError,
    ConnectionError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)

from trainstack_prewarm.errors import (
    IntegrityError,
    PrewarmError,
    SourceError,
    ThrottledError,
    TransientError,
    UsageError,
)

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import ListObjectsV2RequestTypeDef

CHUNK = 1 << 20
T = TypeVar("T")
# sha256sum-format file list published by the dataset's producer; when present it is the
# authority for the checksum of every file (it works for multipart and KMS objects alike).
SOURCE_MANIFEST = "MANIFEST.sha256"
# JSON lines published by the producer: one {"path", "size", "etag", "sha256"} per file. Where
# it exists it replaces the listing (one GET instead of one LIST per 1,000 objects per node).
SOURCE_INDEX = "MANIFEST.jsonl"

Sink = Callable[[bytes], None]


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str  # relative POSIX path inside the dataset version
    size: int
    # Changes whenever the source object changes (S3 ETag; size+mtime for a directory), so a
    # cached copy made from an older object is fetched again.
    identity: str
    etag: str | None = None
    sha256: str | None = None  # the producer's checksum, from MANIFEST.jsonl


@dataclass(frozen=True, slots=True)
class ListPage:
    files: list[RemoteFile]
    next_token: str | None  # None: this was the last page


class LocalCheck(Protocol):
    """Checks the assembled bytes of one file against the source's identity (ETag)."""

    def update(self, data: bytes) -> None: ...

    def result(self) -> str:
        """The check that passed (``etag-md5``, ``size``, ...); IntegrityError on a mismatch."""
        ...


class Source(Protocol):
    uri: str
    # Requests to sources with the same key share one concurrency limit.
    limit_key: str

    def list_page(self, token: str | None) -> ListPage:
        """One page of the listing; ``token`` is the previous page's ``next_token``."""
        ...

    def read_index(self) -> list[RemoteFile] | None:
        """The producer's ``MANIFEST.jsonl`` in place of a listing, or None where there is none."""
        ...

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        """Contents of ``path`` (for the manifest), or None when the source has no such file."""
        ...

    def transfer(self, f: RemoteFile, sink: Sink) -> str:
        """Stream ``f`` into ``sink``; return the source-side check that was applied."""
        ...

    def transfer_range(self, f: RemoteFile, start: int, end: int, sink: Sink) -> None:
        """Stream bytes ``start..end`` (inclusive) of ``f`` into ``sink``."""
        ...

    def local_check(self, f: RemoteFile) -> LocalCheck:
        """A check of ``f``'s bytes once assembled from ranges (one local read, no GET)."""
        ...


def list_all(source: Source) -> list[RemoteFile]:
    """Every page of the listing, without retries (tests and small tools)."""
    files: list[RemoteFile] = []
    token: str | None = None
    while True:
        page = source.list_page(token)
        files.extend(page.files)
        if page.next_token is None:
            return files
        token = page.next_token


def parse_index(lines: Iterator[bytes], where: str, *, dir_source: bool) -> list[RemoteFile]:
    """Parse ``MANIFEST.jsonl``: one ``{"path", "size", "etag"?, "sha256"}`` object per line."""
    files: list[RemoteFile] = []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
            path = check_relpath(str(entry["path"]), where)
            size = int(entry["size"])
            sha = str(entry["sha256"]).lower()
            etag = None if dir_source else str(entry["etag"]).strip('"')
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"{where}:{n}: bad {SOURCE_INDEX} line: {exc}") from exc
        if size < 0 or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise SourceError(f"{where}:{n}: bad size or sha256 for {path!r}")
        identity = f"sha256:{sha}" if etag is None else f"etag:{etag}"
        files.append(RemoteFile(path, size, identity, etag, sha))
    return files


_SAFE_COMPONENT = re.compile(r"^[^\x00/]+$")


def check_relpath(path: str, where: str) -> str:
    """Reject paths that could escape the cache directory or collide with its bookkeeping."""
    parts = PurePosixPath(path).parts
    if (
        not path
        or path.startswith("/")
        or any(p in {".", ".."} or not _SAFE_COMPONENT.match(p) for p in parts)
        or "/".join(parts) != path
    ):
        raise SourceError(f"{where}: unsafe file name {path!r} in the dataset")
    return path


def dir_parts(path: str) -> tuple[str, ...] | None:
    """The components of an absolute, normalised directory path (``/fsx/datasets/`` is
    ``("fsx", "datasets")``; one trailing ``/`` is allowed), or None: a relative path, ``/``
    itself, or one with a ``.``, ``..`` or empty segment, which the agent takes from no one
    (a ``..`` resolves outside the prefix that the same text starts with)."""
    if not path.startswith("/"):
        return None
    parts = tuple(path[1:].removesuffix("/").split("/"))
    if any(p in {"", ".", ".."} or "\x00" in p for p in parts):
        return None
    return parts


def source_under(source: str, prefix: str) -> bool:
    """Is ``source`` inside the allowed ``prefix``? An S3 prefix as S3 and the agent's IAM
    policy read it (the key's text starts with it: ``s3:prefix`` ``prefix*``); a directory
    component by component, both normalised (``/data/sets/../x/`` and ``/data/setsX/`` are
    not under ``/data/sets``)."""
    if prefix.startswith("s3://"):
        return source.startswith(prefix)
    src, root = dir_parts(source), dir_parts(prefix)
    return src is not None and root is not None and src[: len(root)] == root


# --------------------------------------------------------------------------------------------
# S3


# botocore's own list of throttling codes is ThrottledRetryableChecker._THROTTLED_ERROR_CODES
# (botocore/retries/standard.py); these are the ones S3 returns.
_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "BandwidthLimitExceeded",
    }
)
_RETRYABLE_CODES = frozenset(
    {
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
_HINTS = {
    "AccessDenied": "the pod's role (IRSA) needs s3:ListBucket and s3:GetObject on this prefix",
    "403": "the pod's role (IRSA) needs s3:ListBucket and s3:GetObject on this prefix",
    "NoSuchBucket": "check the bucket name in --source",
    "NoSuchKey": "the object was deleted after it was listed; dataset versions must not change",
    "404": "the object was deleted after it was listed; dataset versions must not change",
    "PreconditionFailed": "the object changed after it was listed; dataset versions must not "
    "change",
    "InvalidObjectState": "the object is archived (Glacier); restore it first",
}


def _classify_client_error(exc: ClientError, what: str) -> PrewarmError:
    err = exc.response.get("Error", {})
    code = str(err.get("Code", "Unknown"))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    msg = f"{what}: {code} (HTTP {status})"
    if err.get("Message"):
        msg = f"{msg}: {err['Message']}"
    if code in _THROTTLING_CODES or status in {429, 503}:
        return ThrottledError(msg)
    if code in _RETRYABLE_CODES or status in {500, 502, 504}:
        return TransientError(msg)
    hint = _HINTS.get(code)
    return SourceError(f"{msg}; {hint}" if hint else msg)


def classify_s3_error(exc: Exception, what: str) -> PrewarmError | None:
    """Translate a botocore exception into a retryable or a fail-fast error (None: unknown)."""
    result: PrewarmError | None = None
    if isinstance(exc, ClientError):
        result = _classify_client_error(exc, what)
    elif isinstance(exc, FlexibleChecksumError | ChecksumError):
        result = IntegrityError(f"{what}: response checksum mismatch: {exc}")
    elif isinstance(exc, HTTPClientError | ConnectionError | IncompleteReadError):
        result = TransientError(f"{what}: connection error: {exc}")
    elif isinstance(exc, NoCredentialsError | PartialCredentialsError):
        result = SourceError(f"{what}: no AWS credentials (IRSA not configured for this pod?)")
    elif isinstance(exc, BotoCoreError):
        result = SourceError(f"{what}: {exc}")
    return result


def make_s3_client(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    max_connections: int = 10,
    adaptive: bool = False,
    user_agent_extra: str | None = None,
) -> S3Client:
    """An S3 client whose own retries are off, so the pre-warm policy alone decides.

    botocore's standard mode would otherwise retry SlowDown up to 3 times with its own backoff,
    multiplying the attempts and hiding the throttling from the logs. ``adaptive`` selects
    botocore's adaptive mode, still with one attempt: its client-side rate limiter
    (``botocore/retries/adaptive.py``: a token bucket whose rate follows a CUBIC curve,
    enabled only after the first throttling response) then paces this client. The fetcher
    uses it only when its own node rate limiter is off (``--max-request-rate 0``): the two in
    series would compound, and botocore's is per client and unbounded until the first
    throttle, which is exactly the synchronised start it should prevent.
    """
    config = Config(
        retries={"total_max_attempts": 1, "mode": "adaptive" if adaptive else "standard"},
        user_agent_extra=user_agent_extra,
        max_pool_connections=max_connections,
        connect_timeout=10,
        read_timeout=60,
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, region_name=region, config=config
    )


class _EtagHasher:
    """Computes an S3 ETag: MD5 of the body, or for multipart uploads MD5 of the part MD5s."""

    def __init__(self, part_size: int | None) -> None:
        self._part_size = part_size
        self._whole = hashlib.md5(usedforsecurity=False)
        self._part = hashlib.md5(usedforsecurity=False)
        self._in_part = 0
        self._digests: list[bytes] = []

    def update(self, data: bytes) -> None:
        if self._part_size is None:
            self._whole.update(data)
            return
        view = memoryview(data)
        while view:
            take = min(len(view), self._part_size - self._in_part)
            self._part.update(view[:take])
            self._in_part += take
            view = view[take:]
            if self._in_part == self._part_size:
                self._close_part()

    def _close_part(self) -> None:
        self._digests.append(self._part.digest())
        self._part = hashlib.md5(usedforsecurity=False)
        self._in_part = 0

    def hexdigest(self) -> str:
        if self._part_size is None:
            return self._whole.hexdigest()
        if self._in_part:
            self._close_part()
        combined = hashlib.md5(b"".join(self._digests), usedforsecurity=False).hexdigest()
        return f"{combined}-{len(self._digests)}"


_SINGLE_ETAG = re.compile(r"^[0-9a-f]{32}$")
_MULTI_ETAG = re.compile(r"^[0-9a-f]{32}-(\d+)$")


class S3Source:
    def __init__(
        self, client: S3Client, bucket: str, prefix: str, *, page_size: int = 1000
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.uri = f"s3://{bucket}/{self.prefix}"
        # S3 throttles per prefix but a bucket is the unit teams share; limit per bucket.
        self.limit_key = f"s3://{bucket}"
        self.page_size = page_size

    def _key(self, path: str) -> str:
        return self.prefix + path

    def _fail(self, exc: Exception, what: str) -> PrewarmError:
        classified = classify_s3_error(exc, what)
        if classified is None:
            raise exc
        return classified

    def list_page(self, token: str | None) -> ListPage:
        files: list[RemoteFile] = []
        try:
            params: ListObjectsV2RequestTypeDef = {
                "Bucket": self.bucket,
                "Prefix": self.prefix,
                "MaxKeys": self.page_size,
            }
            if token:
                params["ContinuationToken"] = token
            page = self.client.list_objects_v2(**params)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(exc, f"list {self.uri}") from exc
        for obj in page.get("Contents", []):
            key = obj["Key"]
            rel = key[len(self.prefix) :]
            if rel.endswith("/") and obj["Size"] == 0:
                continue  # a "folder" placeholder created by consoles
            if obj.get("StorageClass") in {"GLACIER", "DEEP_ARCHIVE"}:
                raise SourceError(f"s3://{self.bucket}/{key}: {_HINTS['InvalidObjectState']}")
            etag = obj["ETag"].strip('"')
            files.append(
                RemoteFile(
                    path=check_relpath(rel, self.uri),
                    size=int(obj["Size"]),
                    identity=f"etag:{etag}",
                    etag=etag,
                )
            )
        if not page.get("IsTruncated"):
            return ListPage(files, None)
        return ListPage(files, page.get("NextContinuationToken") or None)

    def _get_small(self, path: str, read: Callable[[Any, str], T]) -> T | None:
        """GET one object under the prefix and ``read(body, what)`` it; None when there is
        no such object. Any other failure raises as the fetch's other requests do."""
        what = f"s3://{self.bucket}/{self._key(path)}"
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
            with contextlib.closing(resp["Body"]) as body:
                return read(body, what)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                return None
            raise self._fail(exc, f"get {what}") from exc
        except BotoCoreError as exc:
            raise self._fail(exc, f"get {what}") from exc

    def read_index(self) -> list[RemoteFile] | None:
        return self._get_small(
            SOURCE_INDEX, lambda body, what: parse_index(body.iter_lines(), what, dir_source=False)
        )

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        def read(body: Any, what: str) -> bytes:
            data: bytes = body.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise SourceError(f"{what}: larger than {max_bytes} bytes")
            return data

        return self._get_small(path, read)

    def _part_size(self, f: RemoteFile, parts: int) -> int | None:
        """Part size of a multipart object, from the size of its first part (one HEAD)."""
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(f.path), PartNumber=1)
        size = int(head["ContentLength"])
        # Uploaders (aws s3 cp, boto3, s5cmd) use one part size; if the count does not fit
        # that assumption the ETag cannot be recomputed and only the size is checked.
        if size <= 0 or -(-f.size // size) != parts:
            return None
        return size

    def _etag_check(self, f: RemoteFile, encrypted: bool) -> _S3Check:
        what = f"s3://{self.bucket}/{self._key(f.path)}"
        if not f.etag:
            raise SourceError(f"{what}: listed without an ETag")
        multi = _MULTI_ETAG.match(f.etag)
        part_size = self._part_size(f, int(multi.group(1))) if multi else None
        # SSE-KMS and SSE-C ETags are not an MD5 of the content.
        verifiable = not encrypted and (bool(_SINGLE_ETAG.match(f.etag)) or part_size is not None)
        return _S3Check(what, f.etag, _EtagHasher(part_size) if verifiable else None, part_size)

    def transfer(self, f: RemoteFile, sink: Sink) -> str:
        what = f"s3://{self.bucket}/{self._key(f.path)}"
        if not f.etag:
            raise SourceError(f"{what}: listed without an ETag")
        try:
            # If-Match: a GET of a different object than the one listed fails instead of
            # silently mixing two versions of the dataset.
            resp = self.client.get_object(
                Bucket=self.bucket, Key=self._key(f.path), IfMatch=f'"{f.etag}"'
            )
            encrypted = resp.get("ServerSideEncryption", "").startswith("aws:kms") or bool(
                resp.get("SSECustomerAlgorithm")
            )
            check = self._etag_check(f, encrypted)
            with contextlib.closing(resp["Body"]) as body:
                for chunk in body.iter_chunks(CHUNK):
                    check.update(chunk)
                    sink(chunk)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(exc, f"get {what}") from exc
        return check.result()

    def transfer_range(self, f: RemoteFile, start: int, end: int, sink: Sink) -> None:
        what = f"s3://{self.bucket}/{self._key(f.path)} bytes {start}-{end}"
        if not f.etag:
            raise SourceError(f"{what}: listed without an ETag")
        try:
            resp = self.client.get_object(
                Bucket=self.bucket,
                Key=self._key(f.path),
                IfMatch=f'"{f.etag}"',
                Range=f"bytes={start}-{end}",
            )
            with contextlib.closing(resp["Body"]) as body:
                for chunk in body.iter_chunks(CHUNK):
                    sink(chunk)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(exc, f"get {what}") from exc

    def local_check(self, f: RemoteFile) -> LocalCheck:
        what = f"s3://{self.bucket}/{self._key(f.path)}"
        try:
            head = self.client.head_object(
                Bucket=self.bucket, Key=self._key(f.path), IfMatch=f'"{f.etag}"'
            )
            encrypted = head.get("ServerSideEncryption", "").startswith("aws:kms") or bool(
                head.get("SSECustomerAlgorithm")
            )
            return self._etag_check(f, encrypted)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(exc, f"head {what}") from exc


class _S3Check:
    def __init__(
        self, what: str, etag: str, hasher: _EtagHasher | None, part_size: int | None
    ) -> None:
        self._what, self._etag, self._hasher, self._part_size = what, etag, hasher, part_size

    def update(self, data: bytes) -> None:
        if self._hasher is not None:
            self._hasher.update(data)

    def result(self) -> str:
        if self._hasher is None:
            return "size"
        got = self._hasher.hexdigest()
        if got != self._etag:
            raise IntegrityError(
                f"{self._what}: ETag mismatch: expected {self._etag}, computed {got}"
            )
        return "etag-multipart" if self._part_size is not None else "etag-md5"


# --------------------------------------------------------------------------------------------
# Directory (a Lustre or any POSIX mount)


# Errors a Lustre client returns while an OST fails over or the network blips.
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.EAGAIN,
        errno.ETIMEDOUT,
        errno.EINTR,
        errno.ESTALE,
        errno.ECONNRESET,
        errno.ENOTCONN,
        errno.EBUSY,
    }
)


def classify_os_error(exc: OSError, what: str) -> PrewarmError:
    msg = f"{what}: {exc.strerror or exc}"
    if exc.errno in _TRANSIENT_ERRNOS:
        return TransientError(msg)
    return SourceError(msg)


Opener = Callable[[Path], BinaryIO]


def _open_binary(path: Path) -> BinaryIO:
    return open(path, "rb")


# Walking a source beneath its allowed root: every component is opened relative to its parent
# directory's descriptor, and O_NOFOLLOW makes the open fail on a symbolic link instead of
# following it (open(2): "If the trailing component ... is a symbolic link, then the open
# fails"; ELOOP, or ENOTDIR together with O_DIRECTORY).
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the listing would block a plain open until a writer
# came; with it the open returns and the descriptor is refused as not a regular file. It
# changes nothing for reading regular files.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class DirSource:
    """A mounted directory (Lustre, NFS, any POSIX file system).

    By default (the one-shot ``trainstack-prewarm fetch``, which reads with its caller's own
    rights) paths are opened as given and symbolic links to files are followed. With
    ``beneath`` (the node agent, which reads as root from a file system other people may
    write, and whose copy every team can read) nothing is followed: the source must lie
    under ``beneath`` and every path is opened component by component from it without
    following a link; a link anywhere in the version, the version directory included, is
    refused, as is a file or directory on another file system than ``beneath`` or anything
    but a regular file where a file is read. A path swapped for a link between the listing
    and the read fails the same way.
    """

    def __init__(
        self, root: Path, *, opener: Opener | None = None, beneath: Path | None = None
    ) -> None:
        self.root = root.absolute()
        self.uri = str(self.root)
        self._beneath = beneath.absolute() if beneath is not None else None
        if self._beneath is None:
            # Injectable so tests can make the mount fail the way Lustre does (EIO, ESTALE).
            self._open: Opener = opener or _open_binary
            self._stat: Callable[[Path], os.stat_result] = os.stat
            try:
                st = os.stat(self.root)
            except OSError as exc:
                raise classify_os_error(exc, f"source {self.root}") from exc
            if not stat.S_ISDIR(st.st_mode):
                raise SourceError(f"source {self.root}: not a directory")
            dev = st.st_dev
        else:
            if opener is not None:
                raise ValueError("an opener would bypass the walk beneath the source's root")
            if not self.root.is_relative_to(self._beneath):
                raise SourceError(f"source {self.root}: not under {self._beneath}")
            self._open, self._stat = self._open_beneath, self._stat_beneath
            self._rel = self.root.relative_to(self._beneath).parts
            try:
                top = os.open(self._beneath, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                raise classify_os_error(exc, f"source root {self._beneath}") from exc
            try:
                self._dev = os.fstat(top).st_dev
            finally:
                os.close(top)
            try:
                os.close(self._walk(self._rel))  # the version directory: no link on the way
            except OSError as exc:
                raise classify_os_error(exc, f"source {self.root}") from exc
            dev = self._dev
        # Everything on one filesystem shares its servers: limit per device, not per path.
        self.limit_key = f"dev:{dev}"

    # ---- beneath a root: no link followed, no other file system ----------------------------

    def _where(self, parts: tuple[str, ...]) -> Path:
        assert self._beneath is not None
        return self._beneath.joinpath(*parts)

    def _refuse_link(self, parts: tuple[str, ...]) -> SourceError:
        return SourceError(
            f"{self._where(parts)}: a symbolic link in a directory source; the cache agent "
            f"follows none, so that no file outside {self._beneath} is ever read into the "
            "cache (replace the link with the file or directory it points to)"
        )

    def _open_at(self, dir_fd: int, parts: tuple[str, ...], flags: int) -> int:
        """Open ``parts[-1]`` in ``dir_fd``: never through a link, only on the root's file
        system, and (``_FILE_FLAGS``) only a regular file. OSError as the call raised it."""
        name = parts[-1]
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
                with contextlib.suppress(OSError):
                    if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                        raise self._refuse_link(parts) from exc
            raise
        try:
            st = os.fstat(fd)
            if st.st_dev != self._dev:
                raise SourceError(
                    f"{self._where(parts)}: on another file system than {self._beneath} "
                    "(a mount inside a directory source); list that mount as its own source"
                )
            if flags == _FILE_FLAGS and not stat.S_ISREG(st.st_mode):
                raise SourceError(f"{self._where(parts)}: not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _walk(self, parts: tuple[str, ...]) -> int:
        """A descriptor of the directory ``parts`` under the root, reached from the root one
        component at a time. The root's own path is the operator's, so links in it are his."""
        assert self._beneath is not None
        fd = os.open(self._beneath, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i in range(len(parts)):
                child = self._open_at(fd, parts[: i + 1], _DIR_FLAGS)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_beneath(self, full: Path) -> BinaryIO:
        assert self._beneath is not None
        parts = full.relative_to(self._beneath).parts
        parent = self._walk(parts[:-1])
        try:
            fd = self._open_at(parent, parts, _FILE_FLAGS)
        finally:
            os.close(parent)
        return os.fdopen(fd, "rb")

    def _stat_beneath(self, full: Path) -> os.stat_result:
        with self._open_beneath(full) as fh:
            return os.fstat(fh.fileno())

    def _list_beneath(self) -> list[RemoteFile]:
        files: list[RemoteFile] = []
        pending: list[tuple[str, ...]] = [()]
        while pending:
            rel = pending.pop()
            here = (*self._rel, *rel)
            try:
                fd = self._walk(here)  # again from the root: a directory swapped meanwhile fails
                try:
                    for name in sorted(os.listdir(fd)):
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if stat.S_ISLNK(st.st_mode):
                            raise self._refuse_link((*here, name))
                        if stat.S_ISDIR(st.st_mode):
                            pending.append((*rel, name))  # its device is checked as it opens
                        elif stat.S_ISREG(st.st_mode):
                            if st.st_dev != self._dev:
                                raise SourceError(
                                    f"{self._where((*here, name))}: on another file system "
                                    f"than {self._beneath}"
                                )
                            files.append(
                                RemoteFile(
                                    path=check_relpath("/".join((*rel, name)), self.uri),
                                    size=st.st_size,
                                    identity=f"stat:{st.st_size}:{st.st_mtime_ns}",
                                )
                            )
                finally:
                    os.close(fd)
            except OSError as exc:
                raise classify_os_error(exc, f"list {self._where(here)}") from exc
        return files

    # ---- the Source protocol ------------------------------------------------------------------

    def list_page(self, token: str | None) -> ListPage:
        """A directory is listed in one page (os.walk has no continuation)."""
        del token
        if self._beneath is not None:
            return ListPage(self._list_beneath(), None)
        files: list[RemoteFile] = []

        def onerror(exc: OSError) -> None:
            raise classify_os_error(exc, f"list {exc.filename}")

        for dirpath, _dirs, names in os.walk(self.root, onerror=onerror):
            for name in names:
                full = Path(dirpath, name)
                rel = full.relative_to(self.root).as_posix()
                try:
                    # Follows file symlinks: the one-shot fetch reads with its caller's rights.
                    st = os.stat(full)
                except OSError as exc:
                    raise classify_os_error(exc, f"stat {full}") from exc
                if not stat.S_ISREG(st.st_mode):
                    continue
                files.append(
                    RemoteFile(
                        path=check_relpath(rel, self.uri),
                        size=st.st_size,
                        identity=f"stat:{st.st_size}:{st.st_mtime_ns}",
                    )
                )
        return ListPage(files, None)

    def read_index(self) -> list[RemoteFile] | None:
        # A directory is listed by walking the mount, no request per page: no index needed.
        return None

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        full = self.root / path
        try:
            with self._open(full) as fh:
                data = fh.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise classify_os_error(exc, f"read {full}") from exc
        if len(data) > max_bytes:
            raise SourceError(f"{full}: larger than {max_bytes} bytes")
        return data

    def transfer(self, f: RemoteFile, sink: Sink) -> str:
        full = self.root / f.path
        try:
            fh = self._open(full)
        except OSError as exc:
            raise classify_os_error(exc, f"open {full}") from exc
        with fh:
            while True:
                try:
                    chunk = fh.read(CHUNK)
                except OSError as exc:
                    raise classify_os_error(exc, f"read {full}") from exc
                if not chunk:
                    break
                sink(chunk)  # local write errors are the sink's to report
            try:
                after = os.fstat(fh.fileno())
            except OSError as exc:
                raise classify_os_error(exc, f"stat {full}") from exc
        # The listing's identity pins what we meant to copy; a file rewritten in place while we
        # read it would give a torn copy that no later check could notice.
        if f"stat:{after.st_size}:{after.st_mtime_ns}" != f.identity:
            raise IntegrityError(f"{full}: changed while it was copied (size/mtime differ)")
        return "stat"

    def transfer_range(self, f: RemoteFile, start: int, end: int, sink: Sink) -> None:
        full = self.root / f.path
        try:
            fh = self._open(full)
        except OSError as exc:
            raise classify_os_error(exc, f"open {full}") from exc
        with fh:
            try:
                fh.seek(start)
                left = end - start + 1
                while left > 0:
                    chunk = fh.read(min(CHUNK, left))
                    if not chunk:
                        break
                    left -= len(chunk)
                    sink(chunk)
            except OSError as exc:
                raise classify_os_error(exc, f"read {full}") from exc

    def local_check(self, f: RemoteFile) -> LocalCheck:
        return _StatCheck(self.root / f.path, f.identity, self._stat)


class _StatCheck:
    """After ranged reads: the source file must still have the size and mtime it was listed with."""

    def __init__(
        self, full: Path, identity: str, stat_fn: Callable[[Path], os.stat_result]
    ) -> None:
        self._full, self._identity, self._stat = full, identity, stat_fn

    def update(self, data: bytes) -> None:
        pass

    def result(self) -> str:
        try:
            st = self._stat(self._full)
        except OSError as exc:
            raise classify_os_error(exc, f"stat {self._full}") from exc
        if f"stat:{st.st_size}:{st.st_mtime_ns}" != self._identity:
            raise IntegrityError(f"{self._full}: changed while it was copied (size/mtime differ)")
        return "stat"


# --------------------------------------------------------------------------------------------


def parse_manifest(data: bytes, where: str) -> dict[str, str]:
    """Parse ``sha256sum`` output: ``<64 hex>  <path>`` (``*`` binary marker allowed)."""
    out: dict[str, str] = {}
    for n, raw in enumerate(data.decode("utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([0-9a-fA-F]{64}) [ *](.+)$", line)
        if not m:
            raise SourceError(f"{where}:{n}: not a sha256sum line: {raw!r}")
        path = m.group(2).removeprefix("./")
        out[check_relpath(path, where)] = m.group(1).lower()
    return out


def open_source(
    uri: str,
    *,
    s3_client_factory: Callable[[], S3Client],
    within: Sequence[str] | None = None,
) -> Source:
    """The source at ``uri``. ``within``: the node agent's allowed prefixes; the source must
    be under one, and a directory source is then read beneath the longest such directory,
    following no link (:class:`DirSource`)."""
    if within is not None and not any(source_under(uri, p) for p in within):
        allowed = ", ".join(within) or "none configured"
        raise SourceError(f"source {uri!r} is not under an allowed prefix ({allowed})")
    if uri.startswith("s3://"):
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not bucket:
            raise UsageError(f"--source {uri}: no bucket")
        return S3Source(s3_client_factory(), bucket, prefix)
    if "://" in uri:
        raise UsageError(f"--source {uri}: only s3:// URIs and local paths are supported")
    if within is None:
        return DirSource(Path(uri))
    roots = [p for p in within if not p.startswith("s3://") and source_under(uri, p)]
    beneath = max(roots, key=lambda p: len(dir_parts(p) or ()))
    return DirSource(Path(uri), beneath=Path(beneath))
