"""Where datasets come from: an S3 prefix or a mounted (Lustre-like) directory.

Each source lists the files of one dataset version and streams one file into a sink, checking
what it can on its side (S3: the ETag; a directory: that the file did not change while it was
read). The fetcher checks the byte count and the optional ``MANIFEST.sha256`` for every source.

This module holds what every source shares: the :class:`Source` protocol and the types it
speaks, the producer's index and manifest parsers, and the path checks (a file name inside a
version, a source under an allowed prefix). Each source is a module of its own, with what only
it needs: ``s3.py`` (:class:`~trainstack_prewarm.s3.S3Source`, its client and error
classification) and ``dirsource.py`` (:class:`~trainstack_prewarm.dirsource.DirSource` and
its no-follow opening); ``location.py`` opens the one a ``--source`` names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from trainstack_prewarm.errors import SourceError

CHUNK = 1 << 20
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
