"""The hand-off at the end of a job: one loadable model, a report, published atomically.

When training completes (``Session.finish``) and ``TRAINSTACK_ARTIFACT_URI`` is set, rank 0:

1. **Consolidates** the final committed checkpoint's model into one ``torch.save`` file that
   ``torch.load(path, weights_only=True)`` reads back as a plain state dict
   (``model.load_state_dict(...)``). It is torch's own recipe,
   ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` (torch 2.13.0: load with
   ``_EmptyStateDictLoadPlanner`` and ``no_dist=True``, then ``torch.save``), with two changes:
   only the ``model`` entry is read (the planner's ``keys``), not the optimizer state, which
   can be twice the model; and the checkpoint's files are read through the runtime's
   restricted readers (ckptpickle.py), as a resume reads them. Sharded (FSDP2/DTensor) models
   come out whole. Like ``dcp_to_torch_save``, it holds the whole model in host memory: the
   pod's memory limit must allow it. A job of per-rank state (``TrainState(replicated=False)``)
   has no single model: its hand-off is the report alone, which says so.
2. Writes a **report**: the job spec, the image (and its digest when the spec pins one), the
   data version, the final metrics the loop passed to ``finish``, the steps, GPU-hours and
   every attempt with its exit class (attempts.py), and the final checkpoint's step.
3. **Publishes** both to the artifact location, ``manifest.json`` last (format, each file's size
   and xxh3_128): a reader that finds the manifest finds complete files (S3's strong
   read-after-write consistency; on a file system the folder appears by one rename). A
   hand-off already published for the same step is not redone: a restart after it is a no-op.
4. **Registers** the model in an MLflow model registry when ``MLFLOW_TRACKING_URI`` is set
   (registry.py), the report's fields as the version's tags.

The job's completion waits for all of it: rank 0's process, and so its pod, ends only after.
A failure is a storage error (retryable): the restarted job resumes at its final step, trains
nothing and hands off again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

# Private, but it is what format_utils.dcp_to_torch_save calls: the public load() copies only
# the keys the caller's state dict already has (state_dict_loader.py), and this one is empty.
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from .attempts import attempts
from .ckptfiles import describe, read_manifest, step_dir_name
from .ckptpickle import SafeReader
from .contract import (
    ENV_ARTIFACT_URI,
    ENV_DATA_VERSION,
    ENV_IMAGE,
    ENV_JOB_INSTANCE,
    ENV_JOB_NAME,
    ENV_JOB_RETRY,
    ENV_JOB_SPEC,
    ENV_MODEL_NAME,
    ENV_TEAM,
)
from .exitcodes import ConfigError, StorageError

log = logging.getLogger("trainstack.handoff")

FORMAT = "trainstack-handoff/1"
REPORT_FORMAT = "trainstack-report/1"
MODEL_FILE = "model.pt"
REPORT_FILE = "report.json"
MANIFEST = "manifest.json"
ENV_MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"  # MLflow's own name for it
_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")
_METRIC_KEY = re.compile(r"[^\w.\- ]")


class _ModelPlanner(_EmptyStateDictLoadPlanner):
    """dcp_to_torch_save's planner, for the model only, with the restricted reader's check of
    non-tensor values (ckptpickle.SafeLoadPlanner does the same for resumes)."""

    def __init__(self) -> None:
        super().__init__(keys={"model"})  # type: ignore[no-untyped-call]

    def load_bytes(self, read_item: ReadItem, value: Any) -> None:
        torch.load(value, weights_only=True)  # raises on anything but plain data
        value.seek(0)
        super().load_bytes(read_item, value)


def consolidate(checkpoint: Path, out: Path) -> dict[str, Any]:
    """Write the model of a committed checkpoint to ``out`` as one torch.save file; what the
    report says of it."""
    tree: dict[str, Any] = {}
    _load_state_dict(
        tree, storage_reader=SafeReader(checkpoint), planner=_ModelPlanner(), no_dist=True
    )
    model = tree.get("model")
    if not isinstance(model, dict) or not model:
        raise ConfigError(
            f"{checkpoint}: no model in the checkpoint to hand off (per-rank state, "
            "TrainState(replicated=False), has no single model)"
        )
    tensors = {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
    torch.save(model, out)
    return {
        "file": MODEL_FILE,
        "tensors": len(tensors),
        "parameters": sum(t.numel() for t in tensors.values()),
        "dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values()}),
        **describe(out),
    }


@dataclass(frozen=True)
class HandoffConfig:
    uri: str  # the artifact location: s3://BUCKET/PREFIX/ or a directory (path or file://)
    job: str
    team: str | None = None
    instance: str | None = None
    spec: Mapping[str, Any] | None = None
    image: str | None = None
    data_version: str | None = None
    model_name: str | None = None
    tracking_uri: str | None = None
    attempt: int = 0

    @property
    def location(self) -> str:
        """Where this job instance's hand-off goes: the instance's folder under ``uri``, so a
        job created again under the same name never overwrites an earlier one's model."""
        if not self.instance:
            return self.uri
        folder = re.sub(r"[^A-Za-z0-9._-]", "_", self.instance)
        return f"{self.uri.rstrip('/')}/{folder}/"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HandoffConfig | None:
        env = os.environ if env is None else env
        uri = env.get(ENV_ARTIFACT_URI)
        if not uri:
            return None
        raw_spec = env.get(ENV_JOB_SPEC)
        spec = None
        if raw_spec:
            try:
                spec = json.loads(raw_spec)
            except ValueError as err:
                raise ConfigError(f"{ENV_JOB_SPEC} is not JSON: {err}") from None
        try:
            attempt = int(env.get(ENV_JOB_RETRY) or 0)
        except ValueError:
            raw = env.get(ENV_JOB_RETRY)
            raise ConfigError(f"{ENV_JOB_RETRY}={raw!r} is not a number") from None
        return cls(
            uri=uri,
            job=env.get(ENV_JOB_NAME) or "job",
            team=env.get(ENV_TEAM) or None,
            instance=env.get(ENV_JOB_INSTANCE) or None,
            spec=spec,
            image=env.get(ENV_IMAGE) or None,
            data_version=env.get(ENV_DATA_VERSION) or None,
            model_name=env.get(ENV_MODEL_NAME) or None,
            tracking_uri=env.get(ENV_MLFLOW_TRACKING_URI) or None,
            attempt=attempt,
        )


def image_digest(image: str | None) -> str | None:
    """The digest an image reference pins (``…@sha256:<64 hex>``), else None: a tag names
    whatever the registry serves today, so only a pinned digest identifies the image."""
    match = _DIGEST.search(image or "")
    return match.group(1) if match else None


def build_report(
    cfg: HandoffConfig,
    *,
    step: int,
    metrics: Mapping[str, Any],
    checkpoint_root: Path,
    model: Mapping[str, Any] | None,
    now: float,
    world_size: int | None = None,
) -> dict[str, Any]:
    runs = attempts(checkpoint_root, cfg.instance, now=now, current=cfg.attempt)
    return {
        "format": REPORT_FORMAT,
        "job": cfg.job,
        "team": cfg.team,
        "instance": cfg.instance,
        "spec": dict(cfg.spec) if cfg.spec is not None else None,
        "image": {"reference": cfg.image, "digest": image_digest(cfg.image)},
        "data_version": cfg.data_version,
        "steps": step,
        "world_size": world_size,
        "final_metrics": dict(metrics),
        "gpu_hours": round(sum(a.gpu_hours for a in runs), 6),
        "attempts": [a.as_dict() for a in runs],
        "checkpoint": {"step": step, "directory": step_dir_name(step)},
        "model": dict(model) if model is not None else None,
        "torch": torch.__version__,
        "created_unix": now,
    }


# ---- publication ----------------------------------------------------------------------------
def _local_dir(uri: str) -> Path | None:
    if uri.startswith("file://"):
        return Path(uri[len("file://") :])
    if "://" not in uri:
        return Path(uri)
    return None


def published(uri: str, client: Any = None) -> dict[str, Any] | None:
    """The manifest of a complete hand-off at ``uri``, or None."""
    local = _local_dir(uri)
    try:
        if local is not None:
            raw = (local / MANIFEST).read_bytes()
        else:
            bucket, prefix = _s3(uri)
            raw = client.get_object(Bucket=bucket, Key=prefix + MANIFEST)["Body"].read()
    except FileNotFoundError:
        return None
    except Exception as err:
        if _is_missing(err):
            return None
        raise
    manifest = json.loads(raw)
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def _is_missing(err: Exception) -> bool:
    code = getattr(err, "response", {}).get("Error", {}).get("Code")
    return code in ("NoSuchKey", "404")


def _s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ConfigError(f"{ENV_ARTIFACT_URI}={uri!r}: an s3:// URI or a directory")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ConfigError(f"{ENV_ARTIFACT_URI}={uri!r}: no bucket")
    return bucket, (prefix.rstrip("/") + "/") if prefix.strip("/") else ""


def publish(files: Mapping[str, Path], manifest: Mapping[str, Any], uri: str, client: Any) -> str:
    """Every file, then the manifest; the location of the hand-off."""
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    local = _local_dir(uri)
    if local is not None:
        # A sibling folder renamed into place: the hand-off appears whole or not at all.
        tmp = local.with_name(f".{local.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, path in files.items():
            shutil.copyfile(path, tmp / name)
        (tmp / MANIFEST).write_bytes(body)
        if local.exists():
            shutil.rmtree(local)  # a hand-off of an earlier, different step
        os.replace(tmp, local)
        return str(local)
    bucket, prefix = _s3(uri)
    for name, path in files.items():
        with open(path, "rb") as fh:
            client.upload_fileobj(fh, bucket, prefix + name)
    client.put_object(
        Bucket=bucket, Key=prefix + MANIFEST, Body=body, ContentType="application/json"
    )
    return f"s3://{bucket}/{prefix}"


def hand_off(
    cfg: HandoffConfig,
    checkpoint_root: Path,
    step: int,
    metrics: Mapping[str, Any] | None = None,
    *,
    client: Any = None,
    now: float | None = None,
    world_size: int | None = None,
) -> dict[str, Any]:
    """Consolidate, report, publish (manifest last), register; returns the report."""
    now = time.time() if now is None else now
    location = cfg.location
    if _local_dir(location) is None and client is None:
        from .tiering import make_client  # noqa: PLC0415 - boto3 only where it is used

        client = make_client()
    done = published(location, client)
    if done is not None and done.get("step") == step:
        log.info("hand-off of step %d already at %s", step, location)
        return dict(done.get("report") or {})
    checkpoint = checkpoint_root / step_dir_name(step)
    if read_manifest(checkpoint)[0] is None:
        raise StorageError(f"hand-off: no committed checkpoint {checkpoint}")
    work = checkpoint_root / f".handoff-{step_dir_name(step)}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        t0 = time.perf_counter()
        files: dict[str, Path] = {}
        model: dict[str, Any] | None = None
        try:
            model = consolidate(checkpoint, work / MODEL_FILE)
            files[MODEL_FILE] = work / MODEL_FILE
        except ConfigError as err:
            log.warning("hand-off without a model: %s", err)
        report = build_report(
            cfg,
            step=step,
            metrics=metrics or {},
            checkpoint_root=checkpoint_root,
            model=model,
            now=now,
            world_size=world_size,
        )
        (work / REPORT_FILE).write_bytes(json.dumps(report, indent=1, sort_keys=True).encode())
        files[REPORT_FILE] = work / REPORT_FILE
        manifest = {
            "format": FORMAT,
            "job": cfg.job,
            "step": step,
            "files": {name: describe(path) for name, path in files.items()},
            "report": report,
        }
        where = publish(files, manifest, location, client)
        log.info("hand-off of step %d at %s in %.1f s", step, where, time.perf_counter() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if cfg.tracking_uri and model is not None:
        if where.startswith("s3://"):
            register(cfg, report, where)
        else:  # an MLflow server refuses a local source without a run (registry.py)
            log.warning(
                "not registered in %s: %s is not in object storage", cfg.tracking_uri, where
            )
    return report


def registry_tags(report: Mapping[str, Any], location: str) -> dict[str, str]:
    """The report's fields as MLflow tags (strings; nested values as JSON)."""
    tags = {
        "trainstack.job": report["job"],
        "trainstack.team": report.get("team") or "",
        "trainstack.instance": report.get("instance") or "",
        "trainstack.image": report["image"]["reference"] or "",
        "trainstack.image_digest": report["image"]["digest"] or "",
        "trainstack.data_version": report.get("data_version") or "",
        "trainstack.steps": str(report["steps"]),
        "trainstack.gpu_hours": str(report["gpu_hours"]),
        "trainstack.attempts": str(len(report["attempts"])),
        "trainstack.exit_classes": json.dumps([a["class"] for a in report["attempts"]]),
        "trainstack.handoff": location,
        # The spec itself is in the report (it can exceed a tag's 5,000 characters): its hash
        # finds the versions trained from one spec.
        "trainstack.spec_sha256": hashlib.sha256(
            json.dumps(report.get("spec"), sort_keys=True).encode()
        ).hexdigest(),
    }
    for name, value in sorted(report["final_metrics"].items()):
        # MLflow's tag keys: letters, digits and _ - . : / space (registry.py check_tags).
        tags[f"trainstack.metric.{_METRIC_KEY.sub('_', str(name))}"] = str(value)
    return {k: v for k, v in tags.items() if v != ""}


def register(cfg: HandoffConfig, report: Mapping[str, Any], location: str) -> Any:
    from .registry import register_model  # noqa: PLC0415 - only with a registry configured

    assert cfg.tracking_uri is not None
    source = location.rstrip("/") + "/" + MODEL_FILE
    version = register_model(
        cfg.tracking_uri,
        cfg.model_name or cfg.job,
        source,
        registry_tags(report, location),
        description=f"trainstack job {cfg.job}, step {report['steps']}",
    )
    log.info("registered %s at %s", version, cfg.tracking_uri)
    return version
