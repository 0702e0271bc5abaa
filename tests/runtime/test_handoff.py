"""The hand-off at the end of a job, for real: a torchrun job (two workers, gloo, the supervisor)
completes, and rank 0 publishes the consolidated model and the report to a real S3 API (moto's
server on loopback) while a reader polls; attempts and GPU-hours from the supervisors' records.

The consolidated model is compared with torch's own conversion of the same checkpoint
(``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``), for a DDP and a sharded
(FSDP2) model, and loaded into the example's module. MLflow registration: test_registry.py
starts the server; ``test_handoff_registers_the_model_with_its_tags`` uses it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.runtime.harness import HAVE_TORCH, TRAIN_SCRIPT, RunJob
from tests.s3server import AWS_ENV, PollingReader, moto_s3

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from trainstack_runtime import attempts, handoff
    from trainstack_runtime.checkpoint import (
        CheckpointConfig,
        CheckpointManager,
        committed_steps,
        step_dir_name,
    )
    from trainstack_runtime.contract import ExitCode

    from tests.runtime.test_checkpoint import _state, _train
    from tests.runtime.test_registry import mlflow_server, rest  # noqa: F401 - a fixture

DIGEST = "sha256:" + hashlib.sha256(b"image").hexdigest()
SPEC = {"name": "demo-train", "team": "vision", "data": {"dataset": "imagenet", "version": "v3"}}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3(endpoint_env=True) as url:
        yield url


@pytest.fixture
def artifacts(endpoint: str) -> str:
    bucket = f"art-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/artifacts/teams/vision/demo-train/run-1/"


def _env(uri: str, endpoint: str, attempt: int) -> dict[str, str]:
    return {
        **AWS_ENV,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "TRAINSTACK_ARTIFACT_URI": uri,
        "TRAINSTACK_JOB": "demo-train",
        "TRAINSTACK_TEAM": "vision",
        "TRAINSTACK_JOB_SPEC": json.dumps(SPEC),
        "TRAINSTACK_IMAGE": f"registry.example.com/vision/train@{DIGEST}",
        "DATA_VERSION": "v3",
        "TRAINSTACK_JOB_RETRY": str(attempt),
    }


class Poller(PollingReader):
    """Reads the artifact location while the job runs: once a manifest is there, every file
    it lists must be there, whole."""

    def __init__(self, uri: str) -> None:
        super().__init__(boto3.client("s3"))
        self.bucket, self.prefix = handoff._s3(uri)
        self.uri = uri
        self.seen_complete = 0

    def poll_once(self) -> None:
        manifest = handoff.published(self.uri, self.client)
        if manifest is not None:
            self.seen_complete += 1
            self.check_files(self.bucket, self.prefix, manifest, "")


def _get(uri: str, name: str) -> bytes:
    bucket, prefix = handoff._s3(uri)
    body: bytes = boto3.client("s3").get_object(Bucket=bucket, Key=prefix + name)["Body"].read()
    return body


@pytest.mark.faults
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_completed_job_hands_off_model_and_report(
    tmp_path: Path, run_job: RunJob, artifacts: str, endpoint: str, parallel: str
) -> None:
    args = ("--parallel", parallel, "--step-sleep", "0.05")
    first = run_job(tmp_path, fault="sigkill@13,rank=1", args=args, **_env(artifacts, endpoint, 0))
    assert first.code == ExitCode.KILLED, first.output[-3000:]
    assert handoff.published(artifacts, boto3.client("s3")) is None  # nothing before completion
    with Poller(artifacts) as poller:
        second = run_job(tmp_path, args=args, **_env(artifacts, endpoint, 1))
    assert second.code == ExitCode.OK, second.output[-3000:]
    assert not poller.failures, poller.failures

    manifest = handoff.published(artifacts, boto3.client("s3"))
    assert manifest is not None
    assert manifest["step"] == 20
    # The model: what torch's own DCP conversion reads from the final checkpoint, whole.
    final = second.checkpoints / step_dir_name(20)
    assert committed_steps(second.checkpoints)[-1] == 20
    dcp_to_torch_save(final, tmp_path / "reference.pt")
    reference = torch.load(tmp_path / "reference.pt", weights_only=False)["model"]
    model = torch.load(io.BytesIO(_get(artifacts, "model.pt")), weights_only=True)
    assert set(model) == set(reference)
    for key, tensor in reference.items():
        assert torch.equal(model[key], tensor), key
    assert all(
        isinstance(t, torch.Tensor) and not hasattr(t, "device_mesh") for t in model.values()
    )

    spec = importlib.util.spec_from_file_location("train_main", TRAIN_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    main = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = main  # its dataclasses look their module up there
    spec.loader.exec_module(main)
    net = main.MLP(16, 32)
    net.load_state_dict(model)  # strict: every key, every shape

    report = json.loads(_get(artifacts, "report.json"))
    assert report == manifest["report"]
    assert report["job"] == "demo-train"
    assert report["team"] == "vision"
    assert report["spec"] == SPEC
    assert report["image"] == {
        "reference": f"registry.example.com/vision/train@{DIGEST}",
        "digest": DIGEST,
    }
    assert report["data_version"] == "v3"
    assert report["steps"] == 20
    assert report["world_size"] == 2
    losses = second.losses()[0][20]
    assert report["final_metrics"] == {"loss": float.fromhex(losses[-1])}
    assert [(a["attempt"], a["class"]) for a in report["attempts"]] == [(0, "killed"), (1, "ok")]
    assert report["gpu_hours"] == 0.0  # CPU workers; the arithmetic: test_attempts_* below
    assert report["model"]["parameters"] == sum(t.numel() for t in reference.values())
    assert report["checkpoint"]["step"] == 20


def test_attempts_count_gpu_hours_and_name_each_attempts_class(tmp_path: Path) -> None:
    def start(incarnation: int, pod: str, at: float) -> Path:
        path = attempts.record_start(tmp_path, "uid-1", incarnation, pod=pod, gpus=8, now=at)
        assert path is not None
        return path.rename(path.with_name(f"{pod}.json"))  # one pid here: one name per pod

    a0 = start(0, "job-worker-0", 1000.0)
    a1 = start(0, "job-worker-1", 1000.0)
    attempts.record_end(a0, ExitCode.HARDWARE, now=1000.0 + 3600)
    attempts.record_end(a1, ExitCode.PEER_LOST, now=1000.0 + 3600)
    b0 = start(1, "job-worker-0", 10_000.0)
    start(1, "job-worker-1", 10_000.0)  # killed before it could write its end
    attempts.record_end(b0, ExitCode.PREEMPTED, now=10_000.0 + 1800)
    start(2, "job-worker-0", 20_000.0)
    start(2, "job-worker-1", 20_000.0)
    runs = attempts.attempts(tmp_path, "uid-1", now=20_000.0 + 900, current=2)
    assert [(r.attempt, r.exit_class, r.pods) for r in runs] == [
        (0, "hardware", 2),  # the cause, not its collateral
        (1, "preempted", 2),  # the pod without an end: unknown, the other says why
        (2, "ok", 2),
    ]
    # 2 pods x 8 GPUs x 1 h; then 8 x 0.5 h for each pod of attempt 1 (the silent one counts
    # up to the last sign of life, 20,000 s: longer; see below); then 2 x 8 x 0.25 h.
    assert runs[0].gpu_hours == pytest.approx(16.0)
    assert runs[2].gpu_hours == pytest.approx(4.0)
    silent = (20_000.0 - 10_000.0) * 8 / 3600
    assert runs[1].gpu_hours == pytest.approx(4.0 + silent)
    assert attempts.attempts(tmp_path, "another-uid") == []


def test_a_hand_off_to_a_directory_appears_whole_and_is_not_redone(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    state = _state()
    mgr = CheckpointManager(CheckpointConfig(root=root))
    _train(state, 2)
    mgr.save(2, state, blocking=True)
    mgr.close()
    dest = tmp_path / "artifacts" / "run-1"
    cfg = handoff.HandoffConfig(uri=f"file://{dest}", job="j", image="repo/img:1.0")
    report = handoff.hand_off(cfg, root, 2, {"loss": 0.5}, now=123.0)
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "model.pt", "report.json"]
    assert [p.name for p in dest.parent.iterdir()] == ["run-1"]  # no leftovers
    assert report["image"] == {"reference": "repo/img:1.0", "digest": None}  # a tag: no digest
    loaded = torch.load(dest / "model.pt", weights_only=True)
    for key, tensor in state.model.state_dict().items():
        assert torch.equal(loaded[key], tensor), key
    before = (dest / "manifest.json").stat().st_mtime_ns
    assert handoff.hand_off(cfg, root, 2, {"loss": 0.5}) == report  # already there
    assert (dest / "manifest.json").stat().st_mtime_ns == before


def test_per_rank_state_hands_off_the_report_alone(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    state = _state()
    state.replicated = False
    mgr = CheckpointManager(CheckpointConfig(root=root))
    _train(state, 1)
    mgr.save(1, state, blocking=True)
    mgr.close()
    dest = tmp_path / "out"
    report = handoff.hand_off(handoff.HandoffConfig(uri=str(dest), job="j"), root, 1)
    assert report["model"] is None
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "report.json"]


def test_registry_tags_carry_the_reports_fields() -> None:
    report: dict[str, Any] = {
        "job": "demo-train",
        "team": "vision",
        "instance": "uid-1",
        "image": {"reference": f"r/i@{DIGEST}", "digest": DIGEST},
        "data_version": "v3",
        "steps": 20,
        "gpu_hours": 1.5,
        "attempts": [{"class": "preempted"}, {"class": "ok"}],
        "final_metrics": {"loss": 0.25, "accuracy": 0.9, "top1@5": 0.5},
        "spec": SPEC,
    }
    assert handoff.registry_tags(report, "s3://b/p/") == {
        "trainstack.job": "demo-train",
        "trainstack.team": "vision",
        "trainstack.instance": "uid-1",
        "trainstack.image": f"r/i@{DIGEST}",
        "trainstack.image_digest": DIGEST,
        "trainstack.data_version": "v3",
        "trainstack.steps": "20",
        "trainstack.gpu_hours": "1.5",
        "trainstack.attempts": "2",
        "trainstack.exit_classes": '["preempted", "ok"]',
        "trainstack.handoff": "s3://b/p/",
        "trainstack.spec_sha256": hashlib.sha256(
            json.dumps(SPEC, sort_keys=True).encode()
        ).hexdigest(),
        "trainstack.metric.accuracy": "0.9",
        "trainstack.metric.top1_5": "0.5",
        "trainstack.metric.loss": "0.25",
    }


def test_handoff_registers_the_model_with_its_tags(
    tmp_path: Path, artifacts: str, mlflow_server: str
) -> None:
    """With MLFLOW_TRACKING_URI, the published model becomes a version in a real MLflow
    registry, the report's fields as its tags; into the job instance's own folder."""
    root = tmp_path / "ckpt"
    state = _state()
    mgr = CheckpointManager(CheckpointConfig(root=root))
    _train(state, 2)
    mgr.save(2, state, blocking=True)
    mgr.close()
    cfg = handoff.HandoffConfig.from_env(
        {
            **_env(artifacts, "", 0),
            "TRAINSTACK_JOB_INSTANCE": "demo-train-0b1c",
            "MLFLOW_TRACKING_URI": mlflow_server,
            "TRAINSTACK_MODEL_NAME": "vision-demo",
        }
    )
    assert cfg is not None
    assert cfg.location == artifacts + "demo-train-0b1c/"
    report = handoff.hand_off(cfg, root, 2, {"loss": 0.5}, client=boto3.client("s3"))
    assert handoff.published(cfg.location, boto3.client("s3")) is not None
    version = rest(mlflow_server, "model-versions/get", name="vision-demo", version="1")
    got = version["model_version"]
    assert got["source"] == cfg.location + "model.pt"
    tags = {t["key"]: t["value"] for t in got.get("tags", [])}
    assert tags == handoff.registry_tags(report, cfg.location)
    assert tags["trainstack.image_digest"] == DIGEST
    assert tags["trainstack.metric.loss"] == "0.5"
