"""What the enforcer and the platform that deploys it agree on: names, paths, metrics.

The platform's builders (trainstack/builders/deadlines.py) and monitoring rules import these,
as they import the training runtime's contract, so the Deployment, the PodMonitor and the
alerts name exactly what the program serves. One module, two byte-identical copies:
trainstack/contracts/deadlines.py (the platform's) and
images/deadlines/trainstack_deadlines/contract.py (the enforcer image's); standard library only,
and tests/test_contracts.py holds the copies identical.
"""

from __future__ import annotations

from typing import Final

PROG: Final = "trainstack-deadlines"

# Set on every Volcano Job by the job layer (trainstack/jobs/render.py `job_metadata`).
MAX_DURATION_ANNOTATION: Final = "trainstack.io/max-duration-seconds"
TEAM_LABEL: Final = "trainstack.io/team"

JOB_API_VERSION: Final = "batch.volcano.sh/v1alpha1"
COMMAND_API_VERSION: Final = "bus.volcano.sh/v1alpha1"
# Volcano's job controller acts on a Command whose target has this apiVersion and kind
# (volcano v1.15.1 pkg/controllers/job/job_controller.go, the Command informer's FilterFunc).
# TerminateJob, not AbortJob: the runtime's own deadline exit maps to TerminateJob
# (trainstack/jobs/lifecycle.py), and a Terminated job is final, while an Aborted one can be
# resumed with a ResumeJob Command (pkg/controllers/job/state/aborted.go), which teams may issue.
ACTION: Final = "TerminateJob"
# Pending Commands with these actions already stop the job: no second one is needed.
STOPPING_ACTIONS: Final = frozenset({"AbortJob", "TerminateJob", "CompleteJob"})
REASON: Final = "MaxDurationExceeded"
COMMAND_PREFIX: Final = "trainstack-deadline-"  # + the Job's UID: one name per job, ever

SYSTEM_NAMESPACE: Final = "trainstack-system"
SERVICE_ACCOUNT: Final = "trainstack-deadlines"
STATE_CONFIGMAP: Final = "trainstack-deadlines-state"
# The team registry (the platform's trainstack-platform ConfigMap, key registry.json), mounted.
REGISTRY_PATH: Final = "/etc/trainstack/registry.json"
METRICS_PORT: Final = 8080

DEFAULT_INTERVAL_S: Final = 60
DEFAULT_MARGIN_S: Final = 300

# name -> (Prometheus type, help). The exposition adds the labels named in `METRIC_LABELS`.
METRICS: Final[dict[str, tuple[str, str]]] = {
    "trainstack_deadline_terminations_total": (
        "counter",
        "TerminateJob Commands created for jobs past their maximum duration",
    ),
    "trainstack_deadline_job_overdue_seconds": (
        "gauge",
        "Seconds a job still running is past the time the platform stops it "
        "(first Running + maximum duration + termination grace + margin)",
    ),
    "trainstack_deadline_jobs_tracked": (
        "gauge",
        "Jobs of team namespaces that have started and are not finished",
    ),
    "trainstack_deadline_jobs_unlimited": (
        "gauge",
        "Started jobs with no usable maximum duration (annotation nor team maximum)",
    ),
    "trainstack_deadline_passes_total": ("counter", "Passes over the team namespaces"),
    "trainstack_deadline_errors_total": ("counter", "Failed API operations, by operation"),
    "trainstack_deadline_last_success_timestamp_seconds": (
        "gauge",
        "When the last pass without an error ended (Unix time)",
    ),
}
METRIC_LABELS: Final[dict[str, tuple[str, ...]]] = {
    "trainstack_deadline_terminations_total": ("namespace", "team"),
    "trainstack_deadline_job_overdue_seconds": ("namespace", "team", "job_name"),
    "trainstack_deadline_errors_total": ("operation",),
}
