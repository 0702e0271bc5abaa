"""The source a ``--source`` names: an ``s3://`` URI or a directory path, and for the node
agent only under its allowed prefixes.

Apart from ``sources.py`` because it is the one place that knows every kind of source: it
imports ``s3.py`` and ``dirsource.py``, which themselves import ``sources.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainstack_prewarm.dirsource import DirSource
from trainstack_prewarm.errors import SourceError, UsageError
from trainstack_prewarm.s3 import S3Source
from trainstack_prewarm.sources import Source, dir_parts, source_under

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


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
