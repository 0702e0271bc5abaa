"""The S3 source: a dataset version under an S3 prefix.

Apart from the other sources because all of it is S3's: the client (its own retries off, so
the pre-warm policy alone decides), the classification of botocore's errors into retryable and
fail-fast ones, ``If-Match`` GETs pinned to the listed ETag, and the recomputation of that
ETag (MD5, or for multipart uploads MD5 of the part MD5s) as the bytes arrive. What every
source shares is in ``sources.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

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
)
from trainstack_prewarm.sources import (
    CHUNK,
    SOURCE_INDEX,
    ListPage,
    LocalCheck,
    RemoteFile,
    Sink,
    check_relpath,
    parse_index,
)

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import ListObjectsV2RequestTypeDef

T = TypeVar("T")

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
