"""Job specs: the JSON Schema contract, intrinsic checks, and the typed model."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from trainstack import yamlio
from trainstack.builders import labels
from trainstack.config import k8s_syntax
from trainstack.config.errors import ConfigError, ConfigIssue, join_path
from trainstack.config.images import MOVING_TAG, is_pinned
from trainstack.config.schema import apply_defaults, schema_issues
from trainstack.contracts.runtime import CHECKPOINT_DIR_DEFAULT, ENV_CHECKPOINT_DIR
from trainstack.jobs.elastic import WorkerRange, range_issues, worker_range
from trainstack.policy.isolation import reserved_key

SCHEMA = "job.schema.json"
API_VERSION = "trainstack.io/v1alpha1"
KIND = "TrainingJob"
MAX_NAME = 40

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def cpu_millis(quantity: str) -> int:
    """`500m` or `1.5` as millicores; exact (Decimal), so a huge value is a big number rather
    than a float overflow. ValueError for anything else."""
    try:
        if quantity.endswith("m"):
            return int(quantity[:-1])
        return int((Decimal(quantity) * 1000).to_integral_value())
    except (InvalidOperation, OverflowError):  # not a number, or Infinity
        raise ValueError(f"not a CPU quantity: {quantity!r}") from None


def memory_bytes(quantity: str) -> int:
    match = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti)", quantity)
    assert match, f"schema guarantees memory quantities: {quantity}"
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    cpu_limit: str
    memory_limit: str


@dataclass(frozen=True)
class Workers:
    replicas: int  # the workers asked for now: `scale.size`
    gpus: int
    resources: Resources
    gpu_memory: str | None
    scale: WorkerRange  # min == max == replicas unless elastic (jobs/elastic.py)
    # May a job of several replicas run on time-shared GPUs (jobs/fractional.py)?
    shared_gpus: bool = False


@dataclass(frozen=True)
class ParameterServers:
    replicas: int
    resources: Resources


@dataclass(frozen=True)
class Data:
    dataset: str
    version: str
    mount_path: str
    source: Literal["lustre", "cache"]
    cache_from: str | None


@dataclass(frozen=True)
class Checkpoint:
    interval_seconds: int
    keep: int
    resume: bool
    grace_seconds: int


@dataclass(frozen=True)
class Topology:
    mode: Literal["hard", "soft"]
    tier: Literal["pool", "zone"]


@dataclass(frozen=True)
class JobSpec:
    name: str
    team: str
    labels: tuple[tuple[str, str], ...]
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    mode: Literal["dataParallel", "parameterServer"]
    pool: str
    workers: Workers
    parameter_servers: ParameterServers | None
    shared_memory: str
    data: Data | None
    checkpoint: Checkpoint
    max_duration_hours: float
    priority: str
    max_retries: int
    max_preemptions: int
    env: tuple[tuple[str, str], ...]
    topology: Topology | None
    source: str

    @property
    def max_duration_seconds(self) -> int:
        return round(self.max_duration_hours * 3600)


def _image_issues(image: object, path: str) -> list[ConfigIssue]:
    """The policy's pinning rule (`is_pinned`), with a message that says what to change."""
    if not isinstance(image, str) or is_pinned(image) or k8s_syntax.image_reference(image):
        return []  # pinned, or not a reference at all (the schema's k8s-image format says so)
    pin = "pin a version tag or a digest (@sha256:…)"
    if "@" in image:
        why = "has a malformed digest (@sha256: and 64 lowercase hex characters)"
    elif ":" not in image.rsplit("/", 1)[-1]:
        why = "has no tag"
    elif image.endswith(":latest"):
        why = "uses :latest, which moves under a running job"
    elif MOVING_TAG.fullmatch(image):
        tag = image.rsplit(":", 1)[1]
        why = f"uses :{tag}, a branch or channel tag that moves under a running job"
    else:
        why = "is not pinned"
    return [ConfigIssue(path, f"{image!r} {why}; {pin}")]


def _resource_issues(replica: Mapping[str, Any], path: str) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    limits = replica.get("limits")
    if not isinstance(limits, Mapping):
        return issues
    for key, parse in (("cpu", cpu_millis), ("memory", memory_bytes)):
        request, limit = replica.get(key), limits.get(key)
        if not (isinstance(request, str) and isinstance(limit, str)):
            continue
        try:
            if parse(request) > parse(limit):
                issues.append(
                    ConfigIssue(
                        join_path(path, "limits", key),
                        f"limit {limit} is below the request {request}; raise the limit or "
                        "lower the request",
                    )
                )
        except (ValueError, AssertionError):
            continue  # the schema reports malformed quantities
    return issues


def intrinsic_issues(doc: Mapping[str, Any], root: str = "job") -> list[ConfigIssue]:
    """Rules that need no platform: names, image pinning, mode-specific fields, limits."""
    issues: list[ConfigIssue] = []
    meta = doc.get("metadata")
    spec = doc.get("spec")
    if (
        isinstance(meta, Mapping)
        and isinstance(meta.get("name"), str)
        and len(meta["name"]) > MAX_NAME
    ):
        issues.append(
            ConfigIssue(
                join_path(root, "metadata", "name"),
                f"{meta['name']!r} is longer than {MAX_NAME} characters; pod names add the "
                "task and index and must stay within 63",
            )
        )
    issues += _reserved_label_issues(meta, join_path(root, "metadata", "labels"))
    if not isinstance(spec, Mapping):
        return issues
    spath = join_path(root, "spec")
    env = spec.get("env")
    if isinstance(env, Mapping) and ENV_CHECKPOINT_DIR in env:
        issues.append(
            ConfigIssue(
                join_path(spath, "env", ENV_CHECKPOINT_DIR),
                f"set by trainstack to the checkpoint volume's mount ({CHECKPOINT_DIR_DEFAULT}); "
                "a value here would be replaced, so remove it",
            )
        )
    issues += _image_issues(spec.get("image"), join_path(spath, "image"))
    checkpoint = spec.get("checkpoint")
    if isinstance(checkpoint, Mapping) and checkpoint.get("resume") is False:
        # Nothing renders it into the pod: whether a run restores is the training program's
        # call (Session.restore), so `false` was silently ignored (issue 41, found in review).
        issues.append(
            ConfigIssue(
                join_path(spath, "checkpoint", "resume"),
                "false is not honoured: the pod resumes as its training program decides "
                "(Session.restore, docs/runtime.md); remove the field, and skip the restore "
                "in the program to start fresh",
            )
        )
    issues += structural_issues(doc, root)
    issues += range_issues(spec, spath)
    for key in ("workers", "parameterServers"):
        replica = spec.get(key)
        if isinstance(replica, Mapping):
            issues += _resource_issues(replica, join_path(spath, key))
    data = spec.get("data")
    if (
        isinstance(data, Mapping)
        and "cacheFrom" in data
        and data.get("source", "lustre") != "cache"
    ):
        issues.append(
            ConfigIssue(
                join_path(spath, "data", "cacheFrom"), "only used with source: cache; remove it"
            )
        )
    issues += _checkpoint_issues(spec, spath)
    shm, workers = spec.get("sharedMemory"), spec.get("workers")
    if isinstance(shm, str) and isinstance(workers, Mapping):
        limits = workers.get("limits") if isinstance(workers.get("limits"), Mapping) else {}
        memory = (limits or {}).get("memory", workers.get("memory"))
        try:
            if isinstance(memory, str) and memory_bytes(shm) >= memory_bytes(memory):
                issues.append(
                    ConfigIssue(
                        join_path(spath, "sharedMemory"),
                        f"{shm} of /dev/shm does not fit in the workers' memory limit {memory} "
                        "(shared memory counts against it); lower it or raise the memory",
                    )
                )
        except AssertionError:
            pass  # malformed quantities are schema errors
    return issues


# Labels the job layer sets on every Job and pod (trainstack/jobs/render.py job_labels); a
# spec's own value would be overwritten without a word, so they are refused instead.
RESERVED_LABEL_PREFIX = f"{labels.PREFIX}/"
RESERVED_LABELS = (labels.MANAGED_BY,)


def _reserved_label_issues(meta: object, path: str) -> list[ConfigIssue]:
    given = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(given, Mapping):
        return []
    issues = [
        ConfigIssue(
            join_path(path, str(key)),
            "is set by trainstack on every job and pod; a value here would be replaced, so "
            "remove it or use a key outside trainstack.io/",
        )
        for key in given
        if str(key).startswith(RESERVED_LABEL_PREFIX) or key in RESERVED_LABELS
    ]
    # Volcano reads these to schedule and preempt (policy rule scheduling-keys, issue 37).
    issues += [
        ConfigIssue(
            join_path(path, str(key)),
            "is a key Volcano reads to schedule or preempt, which the platform sets through "
            "the queue and spec.priority; remove it",
        )
        for key in given
        if reserved_key(str(key))
    ]
    return issues


def structural_issues(doc: Mapping[str, Any], root: str = "job") -> list[ConfigIssue]:
    """Fields that must go together for the spec to have a shape at all (no spec is built
    without them, so the platform checks and the renderer never see such a document)."""
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        return []
    spath = join_path(root, "spec")
    mode = spec.get("mode", "dataParallel")
    if mode == "parameterServer" and "parameterServers" not in spec:
        return [
            ConfigIssue(join_path(spath, "parameterServers"), "required with mode: parameterServer")
        ]
    if mode == "dataParallel" and "parameterServers" in spec:
        return [
            ConfigIssue(
                join_path(spath, "parameterServers"),
                "only used with mode: parameterServer; remove it or set the mode",
            )
        ]
    return []


def _checkpoint_issues(spec: Mapping[str, Any], path: str) -> list[ConfigIssue]:
    """A job must be able to checkpoint before its maximum duration ends it."""
    checkpoint, hours = spec.get("checkpoint"), spec.get("maxDurationHours")
    interval = checkpoint.get("intervalSeconds") if isinstance(checkpoint, Mapping) else None
    if not (
        isinstance(interval, int)
        and not isinstance(interval, bool)
        and isinstance(hours, int | float)
        and not isinstance(hours, bool)
        and math.isfinite(hours)
    ):
        return []  # the schema reports wrong types and non-finite numbers
    if interval < hours * 3600:
        return []
    return [
        ConfigIssue(
            join_path(path, "checkpoint", "intervalSeconds"),
            f"{interval} s is not shorter than maxDurationHours {hours} ({round(hours * 3600)} "
            "s): the job would end before its first checkpoint; lower the interval or raise "
            "the duration",
        )
    ]


def _resources(replica: Mapping[str, Any]) -> Resources:
    limits = replica.get("limits", {})
    return Resources(
        cpu=replica["cpu"],
        memory=replica["memory"],
        cpu_limit=limits.get("cpu", replica["cpu"]),
        memory_limit=limits.get("memory", replica["memory"]),
    )


def build(doc: Mapping[str, Any], source: str) -> JobSpec:
    filled = apply_defaults(SCHEMA, doc)
    meta, spec = filled["metadata"], filled["spec"]
    workers = spec["workers"]
    scale = worker_range(workers["replicas"])
    ps = spec.get("parameterServers")
    data = spec.get("data")
    ckpt = spec["checkpoint"]
    topology = spec.get("topology")
    return JobSpec(
        name=meta["name"],
        team=meta["team"],
        labels=tuple(sorted(meta["labels"].items())),
        image=spec["image"],
        command=tuple(spec["command"]),
        args=tuple(spec["args"]),
        mode=spec["mode"],
        pool=spec["pool"],
        workers=Workers(
            replicas=scale.size,
            gpus=workers["gpus"],
            resources=_resources(workers),
            gpu_memory=workers.get("gpuMemory"),
            scale=scale,
            shared_gpus=bool(workers.get("sharedGpus", False)),
        ),
        parameter_servers=(
            ParameterServers(replicas=ps["replicas"], resources=_resources(ps)) if ps else None
        ),
        shared_memory=spec["sharedMemory"],
        data=(
            Data(
                dataset=data["dataset"],
                version=data["version"],
                mount_path=data["mountPath"],
                source=data["source"],
                cache_from=data.get("cacheFrom"),
            )
            if data
            else None
        ),
        checkpoint=Checkpoint(
            interval_seconds=ckpt["intervalSeconds"],
            keep=ckpt["keep"],
            resume=ckpt["resume"],
            grace_seconds=ckpt["graceSeconds"],
        ),
        max_duration_hours=spec["maxDurationHours"],
        priority=spec["priority"],
        max_retries=spec["retry"]["maxRetries"],
        max_preemptions=spec["retry"]["maxPreemptions"],
        env=tuple(sorted(spec["env"].items())),
        topology=Topology(mode=topology["mode"], tier=topology["tier"]) if topology else None,
        source=source,
    )


# Classes above `normal`: what a team picks them for is to get GPUs ahead of running work.
PREEMPTING_PRIORITIES = ("critical", "high")


def advice(spec: JobSpec) -> list[str]:
    """What a valid spec will not do that its author likely expects (printed, not refused).

    A job with a network topology never preempts: Volcano v1.15.1 skips every job whose spec
    has `networkTopology` when it collects preemptors (pkg/scheduler/actions/preempt/
    preempt.go, Execute: `job.ContainsNetworkTopology()`, volcano-sh/volcano#4374). Its
    priority still orders it first in its queue and keeps lower classes from preempting it,
    and reclaim across queues still works for it, so this is a warning, not an error.
    """
    notes: list[str] = []
    if spec.topology is not None and spec.priority in PREEMPTING_PRIORITIES:
        notes.append(
            f"spec.priority: {spec.priority!r} with spec.topology: Volcano never lets a job "
            "with a network topology preempt (v1.15.1 actions/preempt/preempt.go; "
            "volcano-sh/volcano#4374), so it waits for GPUs to free instead of evicting "
            "lower-priority jobs of its team; it still runs first in its queue's order. Drop "
            'spec.topology if it must preempt (docs/scheduling.md, "Topology")'
        )
    return notes


def is_job_document(doc: object) -> bool:
    return isinstance(doc, Mapping) and doc.get("kind") == KIND


# A team stack's preview loads its specs twice, in the pre-check and in the program (which
# must also work alone under `pulumi up`); both get one parse per file version.
_parsed: dict[tuple[str, int, int], tuple[JobSpec | None, tuple[ConfigIssue, ...]]] = {}


def forget_parsed() -> None:
    """Drop the specs parsed so far (benchmarks that preview as a new process would)."""
    _parsed.clear()


def parse_job(path: Path) -> tuple[JobSpec | None, list[ConfigIssue]]:
    """The spec and every problem found without a platform, in one pass.

    The spec is built whenever the document matches the schema, even if it breaks an
    intrinsic rule (an unpinned image, say), so the platform checks can run on it too and a
    user sees every error at once, not one pass per fix.
    """
    try:
        stat = path.stat()
    except OSError:
        return _parse_job(path)  # yamlio.read reports it
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _parsed:  # a file that is not YAML raises here, each time
        spec, issues = _parse_job(path)
        _parsed[key] = (spec, tuple(issues))
    spec, found = _parsed[key]
    return spec, list(found)


def load_job(path: Path) -> JobSpec:
    """The typed spec, or one ConfigError with every problem found without a platform."""
    spec, issues = parse_job(path)
    if issues or spec is None:
        raise ConfigError(str(path), issues)
    return spec


def _parse_job(path: Path) -> tuple[JobSpec | None, list[ConfigIssue]]:
    doc = yamlio.read(path)
    issues = schema_issues(SCHEMA, doc, "job")
    intrinsic = intrinsic_issues(doc) if isinstance(doc, Mapping) else []
    if issues or (isinstance(doc, Mapping) and structural_issues(doc)):
        return None, [*issues, *intrinsic]
    return build(doc, str(path)), intrinsic
