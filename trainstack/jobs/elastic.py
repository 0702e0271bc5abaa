"""Elastic jobs (issue 43; docs/jobs.md, "Elastic jobs"): what a worker range means for the
spec's checks and for the rendered Volcano Job.

`workers.replicas: {min, max, size}`:

- The job has two tasks: `rendezvous`, one CPU pod hosting the c10d store that torchrun's
  agents rendezvous on (trainstack_runtime/rendezvous.py), and `worker`, `size` GPU pods,
  each a torchrun node like any other (rank 0's included).
- The gang is the rendezvous pod and `min` workers: the Job's `minAvailable` is `min + 1`,
  so Volcano starts it once those fit (gang plugin, v1.15.1 pkg/scheduler/plugins/gang/
  gang.go: a job is ready at minAvailable). The worker task's `minAvailable` is `min`
  (rendered: Volcano's webhook would default it to the task's replicas, and with task
  minimums above the job's every per-role check is skipped, api/job_info.go CheckTaskValid).
- The rest stay Pending and Volcano binds them as capacity frees, one per allocate pass,
  into the running job (actions/allocate/allocate.go: "put the job back" while tasks are
  left); they never preempt or reclaim for themselves, as a job at its minimum is not
  starving (gang.go, JobStarvingFn).
- Reclaim and preempt take only workers above the minimum while the job runs:
  - the rendezvous pod is annotated `volcano.sh/preemptable: "false"`, which takes it off
    every victim list before any plugin is asked (api/pod_info.go GetPodPreemptable;
    actions/reclaim/reclaim.go and actions/preempt/preempt.go, `!Preemptable`), under the
    policy's exception for one small CPU pod (policy/isolation.py scheduling_keys);
  - reclaim asks the gang plugin first, which permits at most `ready - minAvailable` of a
    job's pods (gang.go reclaimableFn): with the store out of the list, workers above `min`;
  - at the minimum the gang plugin permits none and reclaim falls through to capacity or
    proportion (framework/session_plugins.go Reclaimable: an empty tier answer is not a
    veto), which may take a worker of a job that borrowed, as from any gang: the survivors
    then wait in the rendezvous for the minimum, and the job restarts whole when the join
    timeout passes (docs/jobs.md, "What Volcano does not protect").
- torchrun runs `--nnodes=min:max` on that store: a joining worker restarts the workers at
  the larger world size and a lost one at the smaller, each resuming from the last
  checkpoint (trainstack_runtime topology.py node_plan).
- Completion: the Job's `minSuccess` is `min`, so it completes when the workers that
  finished training are at least the minimum, whatever is still Pending above it
  (controllers/job/state/running.go: `status.Succeeded >= minSuccess` -> Completed; without
  it a job needs every replica Succeeded or Failed), and Volcano then deletes the rest, the
  rendezvous pod among them (state/finished.go, KillJob).
- `size` changes in place (Volcano updates task replicas: jobs/lifecycle.py
  UPDATABLE_TASK_FIELDS); `min` and `max` are torchrun's `--nnodes` in the pods'
  environment, which Volcano never updates, so changing either replaces the Job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trainstack.config.errors import ConfigIssue, join_path
from trainstack.contracts import runtime as contract
from trainstack.slices import WHOLE_GPU_RESOURCE, is_gpu_resource


@dataclass(frozen=True)
class WorkerRange:
    """How many workers: `min == max == size` for a fixed gang."""

    min: int
    max: int
    size: int

    @property
    def elastic(self) -> bool:
        return self.min < self.max


def worker_range(replicas: int | Mapping[str, Any]) -> WorkerRange:
    """From a schema-valid `workers.replicas`."""
    if isinstance(replicas, int):
        return WorkerRange(replicas, replicas, replicas)
    lo, hi = int(replicas["min"]), int(replicas["max"])
    return WorkerRange(lo, hi, int(replicas.get("size", hi)))


def range_issues(spec: Mapping[str, Any], spath: str) -> list[ConfigIssue]:
    """What the schema cannot say about a range: its order, and the modes it works in."""
    workers = spec.get("workers")
    replicas = workers.get("replicas") if isinstance(workers, Mapping) else None
    if not isinstance(replicas, Mapping):
        return []
    path = join_path(spath, "workers", "replicas")
    lo, hi, size = replicas.get("min"), replicas.get("max"), replicas.get("size")
    if not (isinstance(lo, int) and isinstance(hi, int)):
        return []  # the schema reports the missing or mistyped bound
    issues: list[ConfigIssue] = []
    if lo > hi:
        issues.append(ConfigIssue(join_path(path, "min"), f"{lo} is more than max {hi}; swap them"))
    elif lo == hi:
        issues.append(
            ConfigIssue(
                path,
                f"min and max are both {lo}: that is a fixed gang; write replicas: {lo}",
            )
        )
    elif isinstance(size, int) and not lo <= size <= hi:
        issues.append(
            ConfigIssue(
                join_path(path, "size"),
                f"{size} is outside min {lo} .. max {hi}; ask for a size in the range",
            )
        )
    if spec.get("mode", "dataParallel") != "dataParallel":
        issues.append(
            ConfigIssue(
                path,
                "an elastic range needs mode: dataParallel (torchrun's elastic rendezvous); "
                "parameter-server jobs take a number of workers",
            )
        )
    return issues


def elastic_env(
    scale: WorkerRange, *, endpoint: str, store_host: bool, restarts: int
) -> dict[str, str]:
    """The pod's rendezvous for an elastic job, set after the author's env (a PET_NNODES of
    their own would leave torchrun waiting for workers that never come).

    The store is the rendezvous pod's, said explicitly to every pod: torch decides it
    otherwise by matching the endpoint to the machine's host name (trainstack_runtime
    topology.py _store_host). The restart budget counts the restarts a lost worker costs
    (joins restart the workers without counting: torch elastic agent/server/api.py
    SimpleElasticAgent._invoke_run)."""
    return {
        "PET_NNODES": f"{scale.min}:{scale.max}",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": endpoint,
        contract.ENV_RDZV_STORE_HOST: "1" if store_host else "0",
        contract.ENV_MAX_RESTARTS: str(restarts),
    }


def _count(value: object) -> int:
    """A count as a plan holds it (8, 8.0, "8"); anything else is 0."""
    if isinstance(value, bool):
        return 0
    try:
        return int(float(str(value)))
    except (TypeError, ValueError):
        return 0


def _container_resources(spec: Mapping[str, Any]) -> Iterator[tuple[int, int, Mapping[str, Any]]]:
    """(replicas, minAvailable, resources) of every container of a rendered Volcano Job's
    spec, one walk for job_gpus and job_slices. Tolerant of any plan: what is not a count
    counts 0, what is not a mapping is skipped."""
    for task in spec.get("tasks") or []:
        if not isinstance(task, Mapping):
            continue
        replicas = _count(task.get("replicas"))
        minimum = task.get("minAvailable")
        floor = replicas if minimum is None else _count(minimum)
        pod = (task.get("template") or {}).get("spec") or {}
        for container in pod.get("containers") or []:
            if isinstance(container, Mapping):
                yield replicas, floor, container.get("resources") or {}


def job_gpus(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(least, asked): the GPUs of a rendered Volcano Job's spec at its tasks' minAvailable
    (the gang Volcano starts it with, which reclaim leaves while the job runs) and at their
    replicas.
    Equal for a gang job. Tolerant of any plan: what is not a count counts 0."""
    least = asked = 0
    for replicas, floor, resources in _container_resources(spec):
        per_pod = _count(
            (resources.get("limits") or {}).get("nvidia.com/gpu")
            or (resources.get("requests") or {}).get("nvidia.com/gpu")
        )
        asked += replicas * per_pod
        least += floor * per_pod
    return least, asked


def job_slices(spec: Mapping[str, Any]) -> str | None:
    """The GPU slices a rendered Job's spec asks for at its replicas, as `2 x mig-1g.10gb`
    (docs/gpu-sharing.md); None for a job of whole GPUs. Tolerant of any plan."""
    counts: dict[str, int] = {}
    for replicas, _, resources in _container_resources(spec):
        limits = resources.get("limits") or {}
        for name, amount in limits.items() if isinstance(limits, Mapping) else ():
            if is_gpu_resource(str(name)) and name != WHOLE_GPU_RESOURCE:
                counts[str(name)] = counts.get(str(name), 0) + replicas * _count(amount)
    if not counts:
        return None
    return ", ".join(
        f"{n} x {name.removeprefix('nvidia.com/')}" for name, n in sorted(counts.items())
    )


def gpus_label(least: int, asked: int) -> str:
    return str(asked) if least == asked else f"{least}..{asked}"
