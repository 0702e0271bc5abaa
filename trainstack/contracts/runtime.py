"""The runtime <-> platform contract: exit codes, paths, ports, env vars, metric names.

One module, two byte-identical copies: trainstack/contracts/runtime.py, which the platform
package imports to wire retry policies, volumes, probes and alerts, and
images/runtime/trainstack_runtime/contract.py, which the runtime image ships. The platform never
installs the runtime (it needs torch), nor the runtime the platform (Pulumi); so this module
imports the standard library only, and tests/test_contracts.py holds the copies identical.
docs/runtime.md documents every value here; changing one is a breaking change for running jobs.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class ExitCode(IntEnum):
    """Container exit codes. Retryable codes are >= 128 (Kubeflow ExitCode policy semantics)."""

    OK = 0
    USER_ERROR = 1  # uncaught exception in user code
    CONFIG_ERROR = 2  # bad arguments, environment or checkpoint/world-size mismatch
    DEVICE_OOM = 3  # accelerator out of memory: a retry with the same config fails again
    KILLED = 137  # SIGKILL: host OOM-killer or an external kill
    COMM_ERROR = 200  # collective timeout, NCCL/gloo error, watchdog abort (SIGABRT)
    HARDWARE = 201  # the node's DCGM evidence (Xid, ECC), a CUDA ECC error: retry elsewhere
    STORAGE = 202  # EIO/ESTALE/ETIMEDOUT on the checkpoint or data path
    PREEMPTED = 203  # SIGTERM: emergency checkpoint taken, resume on restart
    PEER_LOST = 204  # a peer process or node vanished (connection closed/reset, store gone)
    DEADLINE_EXCEEDED = 4  # the job's maximum duration passed: checkpointed, do not retry
    CRASH = 205  # SIGSEGV/SIGBUS, illegal memory access, launch failure: retried, a few times
    CRASH_LOOP = 5  # crashed again without a new checkpoint, beyond the limit: do not retry
    RETRIES_EXHAUSTED = 6  # failed in more incarnations than the job's maxRetries: do not retry
    # The c10d rendezvous could not gather its minimum of nodes within the join timeout (an
    # elastic job that lost workers below its minimum): restart the whole job, as a gang.
    BELOW_MINIMUM = 206


RETRYABLE: Final[frozenset[ExitCode]] = frozenset(
    {
        ExitCode.KILLED,
        ExitCode.COMM_ERROR,
        ExitCode.HARDWARE,
        ExitCode.STORAGE,
        ExitCode.PREEMPTED,
        ExitCode.PEER_LOST,
        ExitCode.CRASH,
        ExitCode.BELOW_MINIMUM,
    }
)
FATAL: Final[frozenset[ExitCode]] = frozenset(
    {
        ExitCode.USER_ERROR,
        ExitCode.CONFIG_ERROR,
        ExitCode.DEVICE_OOM,
        ExitCode.DEADLINE_EXCEEDED,
        ExitCode.CRASH_LOOP,
        ExitCode.RETRIES_EXHAUSTED,
    }
)

# Human-readable class names, used in the termination message and in docs.
EXIT_CLASS: Final[dict[ExitCode, str]] = {
    ExitCode.OK: "ok",
    ExitCode.USER_ERROR: "user_error",
    ExitCode.CONFIG_ERROR: "config_error",
    ExitCode.DEVICE_OOM: "device_oom",
    ExitCode.KILLED: "killed",
    ExitCode.COMM_ERROR: "comm_error",
    ExitCode.HARDWARE: "hardware",
    ExitCode.STORAGE: "storage",
    ExitCode.PREEMPTED: "preempted",
    ExitCode.PEER_LOST: "peer_lost",
    ExitCode.DEADLINE_EXCEEDED: "deadline_exceeded",
    ExitCode.CRASH: "crash",
    ExitCode.CRASH_LOOP: "crash_loop",
    ExitCode.RETRIES_EXHAUSTED: "retries_exhausted",
    ExitCode.BELOW_MINIMUM: "below_minimum",
}

# Codes after which the node itself is suspect (the job layer may cordon it).
NODE_SUSPECT: Final[frozenset[ExitCode]] = frozenset({ExitCode.HARDWARE})


def is_retryable(code: int) -> bool:
    """True if the job layer should restart the job after this container exit code."""
    try:
        return ExitCode(code) in RETRYABLE
    except ValueError:
        # Unknown codes: 128+signal deaths are infrastructure-shaped, 1..127 are not.
        return code >= 128


# --- paths, ports, defaults --------------------------------------------------------------
CHECKPOINT_DIR_DEFAULT: Final = "/checkpoints"
HEALTH_PORT_DEFAULT: Final = 8080  # serves both /healthz and /metrics
HEALTH_PATH: Final = "/healthz"
METRICS_PATH: Final = "/metrics"
TERMINATION_LOG_DEFAULT: Final = "/dev/termination-log"
RUN_DIR_DEFAULT: Final = "/tmp/trainstack"  # progress and per-rank exit files (pod-local)
HEALTH_STALE_S_DEFAULT: Final = 600.0
HEALTH_STARTUP_S_DEFAULT: Final = 1800.0
# A declared long phase (Session.phase: evaluation, export) is alive while it heartbeats, up to
# this long; past it the pod is unhealthy, so a hang inside the phase is still caught.
HEALTH_PHASE_S_DEFAULT: Final = 14400.0
SHUTDOWN_TIMEOUT_S_DEFAULT: Final = 90
COMM_TIMEOUT_S_DEFAULT: Final = 600.0
KEEP_LAST_DEFAULT: Final = 3
MAX_CRASHES_DEFAULT: Final = 2  # crash exits retried without a new checkpoint in between
# Xids after which a GPU needs draining (NVIDIA's Xid catalogue): double-bit ECC (48), row
# remap event/failure (63, 64), NVLink (74), fallen off the bus (79), contained/uncontained
# ECC (94, 95), GSP (119, 120). The platform's alerts use the same list.
CRITICAL_XIDS: Final = (48, 63, 64, 74, 79, 94, 95, 119, 120)

# --- environment variables the runtime reads ---------------------------------------------
ENV_CHECKPOINT_DIR: Final = "TRAINSTACK_CHECKPOINT_DIR"  # durable location (mounted volume)
# S3 object tag of a checkpoint copy a newer one superseded: the checkpoint bucket's lifecycle
# rule expires only tagged copies (builders/storage.py), so a job's latest copy never expires;
# trainstack_runtime.s3copies sets it (docs/runtime.md, "Copies in S3").
SUPERSEDED_TAG: Final = "trainstack.io/superseded"
ENV_CHECKPOINT_LOCAL_DIR: Final = "TRAINSTACK_CHECKPOINT_LOCAL_DIR"  # optional fast local tier
# The job's prefix in the object store its committed checkpoints are copied to (s3://BUCKET/
# teams/TEAM/JOB/), manifest last, and resumed from when the file system has nothing newer
# (tiering.py; docs/runtime.md, "Copies in S3"); and how many complete copies stay untagged.
ENV_CHECKPOINT_S3_URI: Final = "TRAINSTACK_CHECKPOINT_S3_URI"
ENV_CHECKPOINT_S3_KEEP: Final = "TRAINSTACK_CHECKPOINT_S3_KEEP"
ENV_CHECKPOINT_EVERY: Final = "TRAINSTACK_CHECKPOINT_EVERY"  # steps between checkpoints
ENV_CHECKPOINT_INTERVAL_S: Final = "TRAINSTACK_CHECKPOINT_INTERVAL_S"  # seconds between them
ENV_CHECKPOINT_CHECK_EVERY: Final = "TRAINSTACK_CHECKPOINT_CHECK_EVERY"  # steps between checks
ENV_CHECKPOINT_KEEP: Final = "TRAINSTACK_CHECKPOINT_KEEP"  # committed checkpoints to keep
ENV_COMMIT_TIMEOUT_S: Final = "TRAINSTACK_CHECKPOINT_COMMIT_TIMEOUT_S"
ENV_HEALTH_PORT: Final = "TRAINSTACK_HEALTH_PORT"  # 0 picks a free port; -1 disables
ENV_HEALTH_STALE_S: Final = "TRAINSTACK_HEALTH_STALE_S"
ENV_HEALTH_STARTUP_S: Final = "TRAINSTACK_HEALTH_STARTUP_S"
ENV_HEALTH_PHASE_S: Final = "TRAINSTACK_HEALTH_PHASE_S"
ENV_RUN_DIR: Final = "TRAINSTACK_RUN_DIR"
ENV_TERMINATION_LOG: Final = "TRAINSTACK_TERMINATION_LOG"
ENV_COMM_TIMEOUT_S: Final = "TRAINSTACK_COMM_TIMEOUT_S"
ENV_NPROC_PER_NODE: Final = "TRAINSTACK_NPROC_PER_NODE"
ENV_MAX_RESTARTS: Final = "TRAINSTACK_MAX_RESTARTS"
# Elastic jobs (PET_NNODES=MIN:MAX, PET_RDZV_BACKEND=c10d; docs/runtime.md "Elastic jobs"):
# "1" on the one pod that hosts the c10d rendezvous store (the pod PET_RDZV_ENDPOINT names), "0"
# on every other: rendered "0" on every worker, the store being the job's rendezvous pod's
# (rendezvous.py). Unset, torch guesses from the endpoint's host name.
ENV_RDZV_STORE_HOST: Final = "TRAINSTACK_RDZV_STORE_HOST"
# The c10d rendezvous' timeouts, whole seconds (torch's join_timeout and last_call_timeout,
# defaults 600 and 30): how long a node waits for MIN nodes, and how long a round waits for
# more nodes once MIN are there.
ENV_RDZV_JOIN_TIMEOUT_S: Final = "TRAINSTACK_RDZV_JOIN_TIMEOUT_S"
ENV_RDZV_LAST_CALL_TIMEOUT_S: Final = "TRAINSTACK_RDZV_LAST_CALL_TIMEOUT_S"
# The global batch (samples per optimizer step, all workers) to keep when the world size
# changes: gradient accumulation makes up the difference. Unset: the per-worker batch is kept.
ENV_GLOBAL_BATCH: Final = "TRAINSTACK_GLOBAL_BATCH"
ENV_SHUTDOWN_TIMEOUT_S: Final = "TRAINSTACK_SHUTDOWN_TIMEOUT_S"
ENV_VOLCANO_MASTER_TASK: Final = "TRAINSTACK_VOLCANO_MASTER_TASK"
ENV_VOLCANO_WORKER_TASK: Final = "TRAINSTACK_VOLCANO_WORKER_TASK"
ENV_MAX_DURATION_S: Final = "TRAINSTACK_MAX_DURATION_S"  # job deadline, across restarts
ENV_JOB_INSTANCE: Final = "TRAINSTACK_JOB_INSTANCE"  # this job, not its name: keys the deadline
ENV_FAULT: Final = "TRAINSTACK_FAULT"  # chaos testing only, see faults.py
# The node's GPU health, Prometheus text (dcgm-exporter's /metrics): an http(s) URL or a file.
ENV_GPU_EVIDENCE: Final = "TRAINSTACK_GPU_EVIDENCE"
ENV_MAX_CRASHES: Final = "TRAINSTACK_MAX_CRASHES"  # crash retries without a new checkpoint
# The job's failure budget (its maxRetries): incarnations that may fail before the runtime
# exits retries_exhausted; preemptions do not count (docs/jobs.md, "Retries and preemption").
ENV_MAX_FAILURES: Final = "TRAINSTACK_MAX_FAILURES"
# This pod's incarnation: Volcano's retry count when it created the pod, the same for every
# pod of one run of the job (annotation volcano.sh/job-retry-count, via the downward API).
ENV_JOB_RETRY: Final = "TRAINSTACK_JOB_RETRY"
# The hand-off at the end of a job (handoff.py; docs/runtime.md, "Hand-off"): where the model
# and report go (s3://BUCKET/PREFIX/ or a directory; the job instance's folder below it), and
# what the report says of the job. The platform renders them from the job spec;
# MLFLOW_TRACKING_URI (MLflow's own variable) adds the model to a registry, under
# TRAINSTACK_MODEL_NAME (default: the job's name).
ENV_ARTIFACT_URI: Final = "TRAINSTACK_ARTIFACT_URI"
ENV_JOB_NAME: Final = "TRAINSTACK_JOB"
ENV_TEAM: Final = "TRAINSTACK_TEAM"
ENV_JOB_SPEC: Final = "TRAINSTACK_JOB_SPEC"  # the job spec as JSON
ENV_IMAGE: Final = "TRAINSTACK_IMAGE"  # the image reference; its digest when pinned
ENV_DATA_VERSION: Final = "DATA_VERSION"  # the spec's data.version, as the job reads it
ENV_MODEL_NAME: Final = "TRAINSTACK_MODEL_NAME"

# --- Prometheus metrics served on /metrics (all gauges/counters carry a `rank` label) ----
METRIC_PREFIX: Final = "trainstack_"
METRICS: Final[dict[str, tuple[str, str]]] = {
    # name: (type, help)
    "trainstack_up": ("gauge", "1 while the pod-level health server runs"),
    "trainstack_healthy": ("gauge", "1 if every rank made progress within the staleness limit"),
    "trainstack_ranks_reporting": ("gauge", "ranks with a progress record on this pod"),
    "trainstack_step": ("gauge", "last completed optimizer step"),
    "trainstack_last_step_timestamp_seconds": ("gauge", "unix time the last step completed"),
    "trainstack_step_time_seconds": ("gauge", "wall time of the last step"),
    "trainstack_data_wait_seconds": ("gauge", "time the last step was blocked on input data"),
    "trainstack_comm_time_seconds": ("gauge", "exposed communication time of the last step"),
    "trainstack_samples_per_second": ("gauge", "samples per second over the last step"),
    "trainstack_checkpoint_stall_seconds": (
        "gauge",
        "training-loop time blocked by the last checkpoint",
    ),
    "trainstack_last_checkpoint_step": ("gauge", "step of the last committed checkpoint"),
    "trainstack_last_checkpoint_timestamp_seconds": (
        "gauge",
        "unix time the last checkpoint committed",
    ),
    "trainstack_worker_restarts": ("gauge", "in-pod restarts of the worker group so far"),
    "trainstack_steps_total": ("counter", "steps completed by this process since it started"),
    "trainstack_step_seconds_total": ("counter", "sum of step wall times"),
    "trainstack_data_wait_seconds_total": ("counter", "sum of data-wait times"),
    "trainstack_comm_seconds_total": ("counter", "sum of exposed communication times"),
    "trainstack_checkpoint_stall_seconds_total": ("counter", "sum of checkpoint stalls"),
    "trainstack_checkpoints_total": ("counter", "checkpoints committed by this process"),
}
