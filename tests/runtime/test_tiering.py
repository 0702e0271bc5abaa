"""Checkpoints tiered to a real S3 API (moto's server on loopback, a real boto3 client).

In one process: the copy's commit rule (manifest last, never complete before it), the bytes
checked against the manifest on the way out, a hostile manifest refused before anything is
written, resume from the store when the file system lost its copies, older copies tagged for
expiry. Then a real torchrun job (two workers, gloo, the supervisor): its checkpoints reach the
store while a reader polls and never sees a partial copy as complete, and after every local
copy is deleted the job resumes from the store bit-exactly and ends with its final checkpoint
in the store.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import xxhash

from tests.runtime.harness import HAVE_TORCH, Baseline, RunJob, assert_matches_baseline
from tests.s3server import AWS_ENV, PollingReader, moto_s3

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch
    from trainstack_runtime.checkpoint import (
        MANIFEST,
        CheckpointConfig,
        CheckpointManager,
        committed_steps,
        step_dir_name,
    )
    from trainstack_runtime.contract import SUPERSEDED_TAG, ExitCode
    from trainstack_runtime.exitcodes import StorageError
    from trainstack_runtime.s3copies import step_prefixes
    from trainstack_runtime.tiering import ObjectTier

    from tests.runtime.test_checkpoint import _state, _train


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3(endpoint_env=True) as url:
        yield url


@pytest.fixture
def client(endpoint: str) -> Any:
    return boto3.client("s3")


@pytest.fixture
def uri(client: Any) -> str:
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return f"s3://{bucket}/teams/vision/job-a/"


def _committed(root: Path, steps: tuple[int, ...]) -> None:
    state = _state()
    mgr = CheckpointManager(CheckpointConfig(root=root, keep=5))
    for step in steps:
        _train(state, 1)
        mgr.save(step, state, blocking=True)
    mgr.close()


class Spy:
    """A real client whose writes are recorded; before each write, a second reader asks
    whether the copy looks complete yet."""

    def __init__(self, client: Any, reader: ObjectTier, step: int) -> None:
        self._client, self._reader, self._step = client, reader, step
        self.writes: list[str] = []
        self.complete_before_write: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _before(self, key: str) -> None:
        self.complete_before_write.append(self._reader.complete_copy(self._step) is not None)
        self.writes.append(key.rsplit("/", 1)[1])

    def upload_fileobj(self, fileobj: Any, bucket: str, key: str, **kw: Any) -> None:
        self._before(key)
        self._client.upload_fileobj(fileobj, bucket, key, **kw)

    def put_object(self, **kw: Any) -> Any:
        self._before(kw["Key"])
        return self._client.put_object(**kw)


def test_copy_is_complete_only_once_its_manifest_is_uploaded_last(
    tmp_path: Path, client: Any, uri: str
) -> None:
    _committed(tmp_path, (1,))
    spy = Spy(client, ObjectTier(uri, client), 1)
    assert ObjectTier(uri, spy).upload(1, tmp_path / step_dir_name(1))
    manifest = json.loads((tmp_path / step_dir_name(1) / MANIFEST).read_text())
    assert spy.writes[-1] == MANIFEST
    assert sorted(spy.writes[:-1]) == sorted(manifest["files"])
    assert spy.complete_before_write == [False] * len(spy.writes)
    assert ObjectTier(uri, client).complete_copy(1) == manifest
    assert not ObjectTier(uri, client).upload(1, tmp_path / step_dir_name(1))  # already there


def test_a_copy_missing_a_file_is_not_complete(tmp_path: Path, client: Any, uri: str) -> None:
    _committed(tmp_path, (1, 2))
    tier = ObjectTier(uri, client, keep=5)
    for step in (1, 2):
        tier.upload(step, tmp_path / step_dir_name(step))
    bucket, key = tier.bucket, f"{tier.prefix}{step_dir_name(2)}/.metadata"
    client.delete_object(Bucket=bucket, Key=key)
    assert tier.complete_copy(2) is None
    newest = tier.newest_complete()
    assert newest is not None
    assert newest[0] == 1
    client.put_object(Bucket=bucket, Key=key, Body=b"short")  # present, wrong size
    assert tier.complete_copy(2) is None


def test_bytes_that_changed_since_the_commit_are_not_uploaded_as_complete(
    tmp_path: Path, client: Any, uri: str
) -> None:
    _committed(tmp_path, (1,))
    directory = tmp_path / step_dir_name(1)
    target = next(directory.glob("__0_*.distcp"))
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only the checksum tells
    target.write_bytes(bytes(raw))
    tier = ObjectTier(uri, client)
    with pytest.raises(StorageError, match=r"read for upload as .* committed as"):
        tier.upload(1, directory)
    assert tier.complete_copy(1) is None
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=tier.bucket).get("Contents", [])]
    assert not any(k.endswith(MANIFEST) for k in keys)


def test_resume_from_the_store_when_the_file_system_lost_its_copies(
    tmp_path: Path, client: Any, uri: str
) -> None:
    ref = _state()
    _train(ref, 3)
    mgr = CheckpointManager(CheckpointConfig(root=tmp_path / "fs", s3_uri=uri), s3_client=client)
    mgr.save(3, ref, blocking=True)
    mgr.drain_uploads(timeout=60)
    mgr.close()
    expected = _train(ref, 4)

    shutil.rmtree(tmp_path / "fs")  # the file system's copy is gone
    fresh = _state(seed=7)
    resumed = CheckpointManager(
        CheckpointConfig(root=tmp_path / "fs", s3_uri=uri), s3_client=client
    )
    assert resumed.restore(fresh) == 3
    assert committed_steps(tmp_path / "fs") == [3]
    assert _train(fresh, 4) == expected
    for a, b in zip(
        ref.model.state_dict().values(), fresh.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    resumed.close()


def test_the_file_systems_newer_copy_wins_and_is_uploaded_after_resume(
    tmp_path: Path, client: Any, uri: str
) -> None:
    _committed(tmp_path, (1, 2))
    tier = ObjectTier(uri, client)
    tier.upload(1, tmp_path / step_dir_name(1))  # a run preempted before step 2's upload
    mgr = CheckpointManager(CheckpointConfig(root=tmp_path, s3_uri=uri), s3_client=client)
    assert mgr.restore(_state(seed=3)) == 2
    mgr.drain_uploads(timeout=60)
    assert tier.complete_copy(2) is not None
    mgr.close()


def test_a_hostile_manifest_in_the_store_writes_nothing_outside_the_checkpoint(
    tmp_path: Path, client: Any, uri: str
) -> None:
    tier = ObjectTier(uri, client)
    manifest = {
        "format": "trainstack-checkpoint/2",
        "step": 9,
        "world_size": 1,
        "files": {"../../escaped": {"size": 1, "xxh3_128": xxhash.xxh3_128_hexdigest(b"x")}},
    }
    step_prefix = f"{tier.prefix}{step_dir_name(9)}/"
    client.put_object(Bucket=tier.bucket, Key=step_prefix + "../../escaped", Body=b"x")
    client.put_object(Bucket=tier.bucket, Key=step_prefix + MANIFEST, Body=json.dumps(manifest))
    root = tmp_path / "a" / "b"
    root.mkdir(parents=True)
    with pytest.raises(StorageError, match="names paths outside the checkpoint"):
        tier.download(9, manifest, root)
    assert not (tmp_path / "escaped").exists()
    assert not (tmp_path / "a" / "escaped").exists()


def test_older_copies_are_tagged_for_expiry_after_each_upload(
    tmp_path: Path, client: Any, uri: str
) -> None:
    _committed(tmp_path, (1, 2, 3))
    tier = ObjectTier(uri, client, keep=2)
    for step in (1, 2, 3):
        tier.upload(step, tmp_path / step_dir_name(step))

    def tagged(step: int) -> set[bool]:
        prefix = f"{tier.prefix}{step_dir_name(step)}/"
        out = set()
        for obj in client.list_objects_v2(Bucket=tier.bucket, Prefix=prefix)["Contents"]:
            tags = client.get_object_tagging(Bucket=tier.bucket, Key=obj["Key"])["TagSet"]
            out.add({"Key": SUPERSEDED_TAG, "Value": "true"} in tags)
        return out

    assert tagged(1) == {True}
    assert tagged(2) == {False}
    assert tagged(3) == {False}


class Poller(PollingReader):
    """Reads the store while a job writes it: every copy it finds complete must download and
    match every size and checksum of its manifest."""

    def __init__(self, uri: str) -> None:
        super().__init__(boto3.client("s3"))
        self.tier = ObjectTier(uri, self.client)
        self.complete: set[int] = set()
        self.incomplete_seen = 0

    def poll_once(self) -> None:
        for step in step_prefixes(self.client, self.tier.bucket, self.tier.prefix):
            manifest = self.tier.complete_copy(step)
            if manifest is None:
                self.incomplete_seen += 1
                continue
            self.complete.add(step)
            folder = f"{self.tier.prefix}{step_dir_name(step)}/"
            self.check_files(self.tier.bucket, folder, manifest, f"step {step}: ")


@pytest.mark.faults
def test_torchrun_job_tiers_its_checkpoints_and_resumes_from_the_store(
    tmp_path: Path, run_job: RunJob, baseline: Baseline, uri: str, endpoint: str
) -> None:
    env = {"TRAINSTACK_CHECKPOINT_S3_URI": uri, **AWS_ENV, "AWS_ENDPOINT_URL_S3": endpoint}
    slow = ("--step-sleep", "0.15")  # uploads take a few tenths of a second; steps as long
    with Poller(uri) as poller:
        first = run_job(tmp_path, fault="sigkill@13,rank=1", args=slow, **env)
    assert first.code == ExitCode.KILLED, first.output[-3000:]
    assert not poller.failures, poller.failures
    assert poller.complete & {5, 10}, "no copy reached the store"
    uploaded = {s for s in (5, 10) if poller.tier.complete_copy(s) is not None}
    assert uploaded, first.output[-3000:]

    shutil.rmtree(first.checkpoints)  # the file system lost every copy
    with Poller(uri) as poller:
        second = run_job(tmp_path, args=slow, **env)
    assert second.code == ExitCode.OK, second.output[-3000:]
    assert not poller.failures, poller.failures
    assert f"fetching step {max(uploaded)} from {uri}" in second.output
    assert_matches_baseline(second, baseline, replayed_from=max(uploaded))
    # The job ended only once its final checkpoint was in the store.
    assert poller.tier.complete_copy(20) is not None
    assert committed_steps(second.checkpoints)[-1] == 20
