"""Fairness history (issue 45): per team and queue, the GPUs Volcano allocated, the share it
deserves, what it guarantees, borrowed and lent GPUs, pending gang GPUs and the wait to
start, as recording rules sampled once per `ACCOUNTING_INTERVAL_S`.

Upstream metrics (Volcano v1.15.1, the version trainstack/sandbox/tools/volcano/go.mod pins):

- `volcano_queue_{allocated,deserved,request,capacity}_scalar_resources{queue_name,
  resource}`: pkg/scheduler/metrics/queue.go. Values are milli-units (the scheduler's
  Resource keeps scalars as `quantity.MilliValue()`, pkg/scheduler/api/resource_info.go), so
  8 GPUs read 8000. Deserved and capacity are set by the capacity plugin only
  (plugins/capacity/capacity.go UpdateQueueDeserved/UpdateQueueCapacity): in flat mode (the
  proportion plugin) they do not exist, and neither do borrowed and lent below.
- `request` is the allocated tasks' requests plus the Pending tasks' (capacity.go and
  proportion.go both add `t.Resreq` of both), so request - allocated is what waits.
- `volcano_e2e_job_scheduling_duration{job_name,queue,job_namespace}` (metrics.go): per job,
  milliseconds from the job's creation to its last task assumed; deleted with the job
  (metrics/job.go DeleteJobMetrics).

Volcano exports no guarantee: the guaranteed GPUs are the queue spec trainstack applies
(`scheduling.team_quotas`), written into the rules as constants like the price table.
Volcano counts preemptions only cluster-wide and without the victim's or the preemptor's
queue (`volcano_total_preemption_attempts`, `volcano_pod_preemption_victims`, metrics.go),
and evicts by deleting the pod (cache.go defaultEvictor.Evict), so preemptions and reclaims
per team, suffered or caused, cannot be derived honestly: docs/reports.md says so.
"""

from __future__ import annotations

from typing import Any, Final

from trainstack.builders.monitoring.common import constant_vector
from trainstack.config.model import PlatformConfig

GPU: Final = 'resource="nvidia.com/gpu"'  # the queue metrics' resource label (not sanitised)
WAIT_QUANTILES: Final = ("0.5", "0.9", "0.99")

TEAM_QUEUE: Final = "queue:trainstack_team_queue:info"
ALLOCATED: Final = "queue:trainstack_volcano_gpus_allocated:max"
DESERVED: Final = "queue:trainstack_volcano_gpus_deserved:max"
CAPABILITY: Final = "queue:trainstack_volcano_gpus_capability:max"
GUARANTEED: Final = "queue:trainstack_gpus_guaranteed:max"
PENDING: Final = "queue:trainstack_gpus_pending:max"
BORROWED: Final = "queue:trainstack_gpus_borrowed:max"
UNUSED_SHARE: Final = "queue:trainstack_gpus_unused_share:max"
LENT: Final = "queue:trainstack_gpus_lent:max"
SHARE_RATIO: Final = "queue:trainstack_gpus_allocated_over_deserved:ratio"
WAIT: Final = "queue:trainstack_job_wait_seconds:quantile"


def _queue_gpus(metric: str) -> str:
    """A Volcano queue metric in GPUs, labelled (team, queue) for team queues only: the
    organisation and group queues of hierarchical mode have no team."""
    return (
        f'max by (queue) (label_replace({metric}{{{GPU}}}, "queue", "$1", "queue_name", "(.*)")) '
        f"/ 1000 * on (queue) group_left (team) {TEAM_QUEUE}"
    )


def fairness_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    teams = cfg.registry.teams
    if not teams:
        return []
    rules: list[dict[str, Any]] = [
        {
            "record": TEAM_QUEUE,
            "expr": constant_vector([({"team": t.name, "queue": t.queue}, "1") for t in teams]),
        },
        {
            "record": GUARANTEED,
            "expr": constant_vector(
                [({"team": t.name, "queue": t.queue}, f"{t.quota.gpus:g}") for t in teams]
            ),
        },
        {"record": ALLOCATED, "expr": _queue_gpus("volcano_queue_allocated_scalar_resources")},
        {"record": DESERVED, "expr": _queue_gpus("volcano_queue_deserved_scalar_resources")},
        {"record": CAPABILITY, "expr": _queue_gpus("volcano_queue_capacity_scalar_resources")},
        {
            "record": PENDING,
            "expr": f"clamp_min({_queue_gpus('volcano_queue_request_scalar_resources')} - "
            f"on (team, queue) {ALLOCATED}, 0)",
        },
        # Above its deserved share a queue runs on GPUs other queues deserve (and Volcano may
        # reclaim them); below it, the unused part is what others can borrow.
        {"record": BORROWED, "expr": f"clamp_min({ALLOCATED} - on (team, queue) {DESERVED}, 0)"},
        {
            "record": UNUSED_SHARE,
            "expr": f"clamp_min({DESERVED} - on (team, queue) {ALLOCATED}, 0)",
        },
        # Volcano does not say whose share a borrower uses: what is borrowed in all is
        # attributed to the lenders in proportion to their unused share (never more than it).
        {
            "record": LENT,
            "expr": f"{UNUSED_SHARE} * scalar(clamp_max(sum({BORROWED}) / "
            f"(sum({UNUSED_SHARE}) > 0), 1) or vector(0))",
        },
        {"record": SHARE_RATIO, "expr": f"{ALLOCATED} / on (team, queue) ({DESERVED} > 0)"},
    ]
    wait = f"volcano_e2e_job_scheduling_duration / 1000 * on (queue) group_left (team) {TEAM_QUEUE}"
    rules += [
        {
            "record": WAIT,
            "expr": f"quantile by (team, queue) ({q}, {wait})",
            "labels": {"quantile": q},
        }
        for q in WAIT_QUANTILES
    ]
    return rules
