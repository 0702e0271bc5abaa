"""Checkpoint copies in S3: tag the ones a newer copy superseded, so that they expire.

The platform's checkpoint bucket keeps each team's copies under ``teams/<team>/``; its
lifecycle rule expires a copy ``retentionDays`` after it was written only if it carries the tag
``trainstack.io/superseded=true`` (trainstack/builders/storage.py, checkpoint_lifecycle_rules).
S3 lifecycle rules cannot say "keep the newest object under each prefix", and an age rule
alone would delete the only checkpoint of a job paused for longer than the retention; so the
writer of the copies says which ones are superseded, here, after each copy it completes.

A job's copies lie under one prefix in the runtime's own layout (ckptfiles.py): one
``step-NNNNNNNNN/`` per checkpoint, committed once its ``manifest.json`` is there. Every copy
older than the newest ``keep`` committed ones is superseded, committed or not (a copy
abandoned half-way is as dead as a complete old one); nothing at or above the oldest kept
copy is ever tagged, so a job with no committed copy loses nothing. Tags already on an object
are kept: S3's PutObjectTagging replaces the whole set, so each object's set is read first.

The client is any boto3 S3 client (``boto3.client("s3")``): this module imports no AWS SDK,
so the runtime image needs none unless a job copies to S3. The team's role may list, read,
write and tag only under its own prefix (builders/storage.py, team_s3_policy).

    python -m trainstack_runtime.s3copies s3://BUCKET/teams/TEAM/JOB/ [--keep N]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from .ckptfiles import MANIFEST
from .contract import SUPERSEDED_TAG

_STEP = re.compile(r"^step-(\d{9})/$")


def parse_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix ending in '/') of ``s3://bucket/prefix/``; ValueError otherwise."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r}: not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket or not prefix.strip("/"):
        raise ValueError(f"{uri!r}: name a job's prefix, s3://BUCKET/teams/TEAM/JOB/")
    return bucket, prefix.rstrip("/") + "/"


def _pages(client: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    yield from client.get_paginator("list_objects_v2").paginate(**kwargs)


def step_prefixes(client: Any, bucket: str, prefix: str) -> dict[int, str]:
    """Every ``step-N/`` directly under ``prefix``, by step."""
    steps: dict[int, str] = {}
    for page in _pages(client, Bucket=bucket, Prefix=prefix, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            match = _STEP.match(common["Prefix"][len(prefix) :])
            if match:
                steps[int(match.group(1))] = common["Prefix"]
    return steps


def _committed(client: Any, bucket: str, step_prefix: str) -> bool:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=step_prefix + MANIFEST, MaxKeys=1)
    return any(o["Key"] == step_prefix + MANIFEST for o in listed.get("Contents", []))


def superseded(client: Any, bucket: str, prefix: str, keep: int = 1) -> list[str]:
    """The step prefixes older than the newest ``keep`` committed copies, oldest first."""
    if keep < 1:
        raise ValueError(f"keep={keep}: keep at least the newest copy")
    steps = step_prefixes(client, bucket, prefix)
    found = 0
    for step in sorted(steps, reverse=True):  # newest first: one listing per copy kept
        if _committed(client, bucket, steps[step]):
            found += 1
            if found == keep:
                return [steps[s] for s in sorted(steps) if s < step]
    return []


def _tag(client: Any, bucket: str, key: str) -> bool:
    """Tag one object superseded, keeping its other tags; False if it already was."""
    tags = client.get_object_tagging(Bucket=bucket, Key=key).get("TagSet", [])
    if any(t["Key"] == SUPERSEDED_TAG and t["Value"] == "true" for t in tags):
        return False
    kept = [t for t in tags if t["Key"] != SUPERSEDED_TAG]
    client.put_object_tagging(
        Bucket=bucket,
        Key=key,
        Tagging={"TagSet": [*kept, {"Key": SUPERSEDED_TAG, "Value": "true"}]},
    )
    return True


def mark_superseded(client: Any, uri: str, keep: int = 1) -> list[str]:
    """Tag every object of every superseded copy under the job's ``uri``; the keys newly
    tagged. Idempotent: run it after each copy, or again after a failure."""
    bucket, prefix = parse_uri(uri)
    tagged: list[str] = []
    for step_prefix in superseded(client, bucket, prefix, keep):
        for page in _pages(client, Bucket=bucket, Prefix=step_prefix):
            for obj in page.get("Contents", []):
                if _tag(client, bucket, obj["Key"]):
                    tagged.append(obj["Key"])
    return tagged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainstack_runtime.s3copies",
        description="Tag a job's checkpoint copies in S3 that a newer copy superseded, so the "
        "checkpoint bucket's lifecycle rule expires them.",
    )
    parser.add_argument("uri", help="the job's copies: s3://BUCKET/teams/TEAM/JOB/")
    parser.add_argument(
        "--keep", type=int, default=1, help="newest committed copies to keep untagged"
    )
    args = parser.parse_args(argv)
    try:
        import boto3  # noqa: PLC0415 - only this command needs the AWS SDK
    except ImportError:
        print("s3copies: needs boto3 (pip install boto3)", file=sys.stderr)
        return 2
    try:
        tagged = mark_superseded(boto3.client("s3"), args.uri, args.keep)
    except ValueError as exc:
        print(f"s3copies: {exc}", file=sys.stderr)
        return 2
    print(f"tagged {len(tagged)} object(s) {SUPERSEDED_TAG}=true under {args.uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
