"""How a Volcano Job lives: what ends or restarts it, how retries count, what can change in
place. Each rule is Volcano's behaviour at v1.15.1, cited where it is used.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trainstack.contracts import runtime as contract

# Exit code -> Volcano action: retryable classes restart (and resume from the last
# checkpoint), fatal ones stop the job; a deadline ends it for good.
# A container killed by a signal the runtime did not turn into a code of its own exits
# 128 + the signal (the runtime itself crashing, or a command that is not a Python entry
# point): retryable like every code >= 128 (docs/runtime.md). SIGKILL is the contract's 137.
# Volcano cannot count retries per code, so the runtime bounds crashes itself: `crash` (205)
# restarts, and after TRAINSTACK_MAX_CRASHES of them without a new checkpoint the runtime
# exits `crash_loop` (5, fatal) instead (docs/runtime.md, "Failure classes and node evidence").
SIGNAL_EXITS: dict[int, str] = {134: "SIGABRT", 135: "SIGBUS", 139: "SIGSEGV", 143: "SIGTERM"}
EXIT_ACTIONS: dict[int, str] = {
    **{int(code): "RestartJob" for code in contract.RETRYABLE},
    **dict.fromkeys(SIGNAL_EXITS, "RestartJob"),
    **{int(code): "AbortJob" for code in contract.FATAL},
    int(contract.ExitCode.DEADLINE_EXCEEDED): "TerminateJob",
}


def lifecycle_policies() -> list[dict[str, Any]]:
    """The Job's policies, in the order Volcano tries them: the first that matches acts
    (v1.15.1 job_controller_util.go applyPolicies, one policy at a time, event or exit code).

    - an exit code with a documented action (EXIT_ACTIONS);
    - `PodEvicted`: the pod was deleted by preemption, reclaim or a drain: restart;
    - `PodFailed`, anything else: a failed pod whose code no policy names, or none at all: a
      kubelet eviction for node pressure leaves the pod Failed (reason Evicted), maybe with no
      terminated container, and Volcano then reports exit code 0 (job_controller_handler.go
      updatePod reads containerStatuses[0] only). Without this policy the job's default
      action is SyncJob, which does not recreate the pod (restartPolicy Never): a
      single-pod job failed, a gang waited for its peers to fail. Restarting is bounded by
      volcano_max_retry, and fatal codes are matched first.
    """
    policies: list[dict[str, Any]] = [
        {"exitCode": code, "action": action} for code, action in sorted(EXIT_ACTIONS.items())
    ]
    policies.append({"event": "PodEvicted", "action": "RestartJob"})
    policies.append({"event": "PodFailed", "action": "RestartJob"})
    return policies


def elastic_worker_policies() -> list[dict[str, Any]]:
    """An elastic job's worker task: the job's policies, with a restart of the one pod where
    the job's would restart the whole job (issue 43; jobs/elastic.py).

    A worker pod lost to reclaim, preemption, a drain or a retryable failure must not take its
    peers down: their torchrun agents re-form the group without it (the c10d rendezvous, at
    or above the job's minimum) and Volcano recreates the pod, Pending until capacity frees.
    Volcano v1.15.1 tries a task's policies before the job's and acts on the first that
    matches (job_controller_util.go applyPolicies, "Overwrite Job level policies"), so the
    order is the job's: fatal codes and the deadline first, still ending the job. RestartPod
    deletes that pod alone and counts one retry (state/running.go and pending.go: KillTarget,
    `RetryCount++`), so every lost worker spends one of the job's preemptions (maxRetry,
    volcano_max_retry). Its killPods also deletes the job's PodGroup and, through the svc
    plugin's OnJobDelete, its headless Service, which the next sync makes again
    (job_controller_actions.go; docs/jobs.md, "What Volcano does not protect"). Not
    ResumeJob, which syncs in Running but kills the whole job while the job is Restarting
    (state/restarting.go Execute, `default: KillJob`), and not SyncJob, which the webhook
    refuses as a policy action (webhooks/admission/jobs/validate/util.go policyActionMap).
    A worker that exits `below_minimum` (206) still restarts the whole job: the survivors'
    rendezvous waited its join timeout for the minimum (WHOLE_JOB_EXITS).
    The rendezvous task keeps the job's policies: it hosts the store, and losing it (a
    drain: Volcano never preempts it) restarts every worker anyway."""
    return [
        {**policy, "action": "RestartPod"}
        if policy["action"] == "RestartJob" and policy.get("exitCode") not in WHOLE_JOB_EXITS
        else policy
        for policy in lifecycle_policies()
    ]


# Exit codes after which an elastic job restarts whole, as a gang, even from a worker: the
# workers left could not gather the job's minimum (the runtime's join timed out), and held on
# their own they would keep their GPUs idle.
WHOLE_JOB_EXITS = frozenset({int(contract.ExitCode.BELOW_MINIMUM)})


def volcano_max_retry(retries: int, preemptions: int) -> int:
    """Volcano's `maxRetry`: room for `retries` failed runs and `preemptions` other restarts.

    A RestartJob counts one (state/running.go: `status.RetryCount++`) and the restarting
    state fails the job once `RetryCount >= maxRetry` (state/restarting.go, Volcano v1.15.1),
    so `maxRetry: N` allows N-1 restarts. Every RestartJob counts, whatever caused it: an exit
    code, a `PodEvicted` (preemption, reclaim, node drain) or the peers of an evicted pod.
    Volcano has no restart that does not count, so `maxRetries` is the runtime's to keep: it
    counts failed runs itself and exits `retries_exhausted` (6 -> AbortJob) after `retries`
    of them (trainstack_runtime/crashes.py); preempted runs do not count there. Volcano's
    count is then a ceiling on all restarts: `retries` failures and `preemptions` more.
    """
    return retries + preemptions + 1


# What Volcano's webhook lets an update of a Job change: everything else under `spec` is
# refused ("job updates may not change fields other than ...", and adding or removing a task:
# v1.15.1 pkg/webhooks/admission/jobs/validate/admit_job.go, validateJobUpdate).
UPDATABLE_JOB_FIELDS = ("minAvailable", "priorityClassName")
UPDATABLE_TASK_FIELDS = ("replicas", "minAvailable")


def fixed_part(job: dict[str, Any]) -> dict[str, Any]:
    """The part of a Job's spec that Volcano never updates in place (task count included)."""
    fixed = {k: v for k, v in job.items() if k not in UPDATABLE_JOB_FIELDS}
    fixed["tasks"] = [
        {k: v for k, v in task.items() if k not in UPDATABLE_TASK_FIELDS}
        for task in job.get("tasks", [])
    ]
    return fixed


def replacement_key(job: dict[str, Any]) -> str:
    """Changes exactly when an update of the Job would be refused, so Pulumi replaces it then
    (TrainingJob's `replacementTrigger`) and updates it in place otherwise."""
    canonical = json.dumps(fixed_part(job), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# Volcano's mutating webhook fills a task's `maxRetry` with 3 when it is unset, at creation
# only (v1.15.1 pkg/webhooks/admission/jobs/mutate/mutate_job.go, mutateSpec). Server-side
# apply attributes that default to the applier, so a later apply without it removes it and
# Volcano refuses the update as a change of the task. Rendering the default itself keeps an
# in-place update (replicas, priority) an update. It bounds container restarts of a task's
# running pods (pkg/controllers/cache/cache.go TaskFailed), which restartPolicy Never rules out.
TASK_MAX_RETRY = 3


# No `ttlSecondsAfterFinished`. Volcano's collector deletes Completed, Failed and Terminated
# jobs after it, but never Aborted ones (v1.15.1 pkg/controllers/garbagecollector
# isJobFinished), so fatal exits (AbortJob) were kept for ever anyway; and a job the team stack
# manages that the collector deleted is gone at the next `pulumi refresh`, so the next
# `pulumi up` creates it again and the training runs a second time. A finished job stays
# until its spec leaves the team stack (or, submitted with kubectl, until it is deleted).
