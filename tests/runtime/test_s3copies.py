"""Issue 39 #8: superseded checkpoint copies in S3 get the tag the bucket's lifecycle rule
expires, and a job's newest copy never does.

Against moto's S3 (object tagging, delimiter listing and pagination as S3 answers them).
Before the fix nothing set `trainstack.io/superseded` and the team role could not: every copy
stayed forever. The role's grant is asserted in tests/components/test_storage.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from trainstack_runtime import s3copies
from trainstack_runtime.ckptfiles import MANIFEST, step_dir_name
from trainstack_runtime.contract import SUPERSEDED_TAG

from tests.conftest import ROOT
from trainstack.builders.storage import SUPERSEDED_TAG as BUCKET_RULE_TAG
from trainstack.builders.storage import checkpoint_lifecycle_rules
from trainstack.config import PlatformConfig, load_stack_file

BUCKET = "ckpt"
JOB = "teams/vision/resnet/"


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def _copy(s3: Any, step: int, *, committed: bool = True, prefix: str = JOB) -> str:
    base = f"{prefix}{step_dir_name(step)}/"
    for name in ("__0_0.distcp", ".metadata", "rank-00000.pkl"):
        s3.put_object(Bucket=BUCKET, Key=base + name, Body=b"x")
    if committed:
        s3.put_object(Bucket=BUCKET, Key=base + MANIFEST, Body=b"{}")
    return base


def _tags(s3: Any, key: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=BUCKET, Key=key)["TagSet"]}


def _tagged(s3: Any, prefix: str) -> set[str]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]
    return {k for k in keys if _tags(s3, k).get(SUPERSEDED_TAG) == "true"}


def test_the_tag_is_the_one_the_lifecycle_rule_expires() -> None:
    cfg = load_stack_file(ROOT / "stacks" / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    # One rule per team since issue 44 (its own retention), each on the runtime's tag.
    rules = [r for r in checkpoint_lifecycle_rules(cfg) if "and" in r["filter"]]
    assert len(rules) == len(cfg.registry.teams)
    for rule in rules:
        assert rule["filter"]["and"]["tags"] == {SUPERSEDED_TAG: "true"}
    assert BUCKET_RULE_TAG == SUPERSEDED_TAG


def test_older_copies_are_tagged_and_the_newest_committed_one_is_not(s3: Any) -> None:
    old = _copy(s3, 100)
    abandoned = _copy(s3, 150, committed=False)  # a copy that died half-way, older than 200
    newest = _copy(s3, 200)
    in_flight = _copy(s3, 300, committed=False)  # being copied now: never superseded yet
    other_job = _copy(s3, 50, prefix="teams/vision/other/")
    s3.put_object_tagging(
        Bucket=BUCKET,
        Key=old + MANIFEST,
        Tagging={"TagSet": [{"Key": "owner", "Value": "ana"}]},
    )
    tagged = s3copies.mark_superseded(s3, f"s3://{BUCKET}/{JOB}")
    assert set(tagged) == _tagged(s3, old) | _tagged(s3, abandoned)
    assert len(tagged) == 4 + 3
    assert not _tagged(s3, newest)
    assert not _tagged(s3, in_flight)
    assert not _tagged(s3, other_job)
    assert _tags(s3, old + MANIFEST) == {"owner": "ana", SUPERSEDED_TAG: "true"}
    # Idempotent: a second run tags nothing new.
    assert s3copies.mark_superseded(s3, f"s3://{BUCKET}/{JOB}") == []


def test_keep_counts_committed_copies_and_a_job_without_one_loses_nothing(s3: Any) -> None:
    first = _copy(s3, 10, committed=False)
    assert s3copies.mark_superseded(s3, f"s3://{BUCKET}/{JOB}") == []
    older, kept = _copy(s3, 20), _copy(s3, 30)
    newest = _copy(s3, 40)
    s3copies.mark_superseded(s3, f"s3://{BUCKET}/{JOB}", keep=2)
    assert _tagged(s3, first)
    assert _tagged(s3, older)
    assert not _tagged(s3, kept)
    assert not _tagged(s3, newest)


def test_many_copies_are_listed_past_one_page(s3: Any) -> None:
    """list_objects_v2 returns at most 1,000 keys or prefixes a page."""
    for step in range(1, 1_003):
        s3.put_object(Bucket=BUCKET, Key=f"{JOB}{step_dir_name(step)}/{MANIFEST}", Body=b"{}")
    old = s3copies.superseded(s3, BUCKET, JOB)
    assert old == [f"{JOB}{step_dir_name(step)}/" for step in range(1, 1_002)]


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("/checkpoints/x", "not an s3:// URI"),
        ("s3://bucket", "name a job's prefix"),
        ("s3://bucket/", "name a job's prefix"),
    ],
)
def test_a_uri_that_names_no_job_is_refused(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        s3copies.parse_uri(uri)


def test_keep_zero_would_tag_the_latest_copy_and_is_refused(s3: Any) -> None:
    _copy(s3, 1)
    with pytest.raises(ValueError, match="keep at least the newest copy"):
        s3copies.mark_superseded(s3, f"s3://{BUCKET}/{JOB}", keep=0)
