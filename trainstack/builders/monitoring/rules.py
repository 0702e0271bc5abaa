"""Prometheus rules: label join tables, GPU accounting (GPU-hours, cost) and alerts, as
plain rule groups (promtool) and as PrometheusRule objects."""

from __future__ import annotations

import math
from typing import Any

from trainstack.builders.monitoring.common import (
    ACCOUNTING_INTERVAL_S,
    CRITICAL_XIDS,
    JOB_KEYS,
    LEVELS,
    MAX_DURATION_ANNOTATION,
    NAMESPACE,
    RUNNING_PODS,
    constant_vector,
    gpu_equivalents,
    gpu_utilisation,
    object_meta,
)
from trainstack.builders.monitoring.common import alert_rule as _alert
from trainstack.builders.monitoring.fairness import fairness_rules
from trainstack.builders.monitoring.health import health_alerts
from trainstack.builders.monitoring.prepull import prepull_alerts, prepull_rules
from trainstack.config.model import PlatformConfig

REQUESTS = "kube_pod_container_resource_requests"


def _label_join(series: str, mapping: list[tuple[str, str]]) -> str:
    expr = series
    for target, source in mapping:
        expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.*)")'
    return expr


def label_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Join tables: trainstack labels of pods and nodes, GPU requests and allocatable."""
    pod_labels = _label_join(
        'kube_pod_labels{label_trainstack_io_job!=""}',
        [
            ("team", "label_trainstack_io_team"),
            ("queue", "label_volcano_sh_queue_name"),
            ("job_name", "label_trainstack_io_job"),
            ("pool", "label_trainstack_io_pool"),
        ],
    )
    node_labels = _label_join(
        "kube_node_labels",
        [
            ("pool", "label_trainstack_io_pool"),
            ("capacity", "label_trainstack_io_capacity"),
            ("instance_type", "label_node_kubernetes_io_instance_type"),
        ],
    )
    # Nodes without a capacity label (existing clusters) are priced as on-demand.
    node_labels = f'label_replace({node_labels}, "capacity", "onDemand", "capacity", "")'
    return [
        {
            "record": "namespace_pod:trainstack_job_labels:info",
            "expr": f"max by (namespace, pod, team, queue, job_name, pool) ({pod_labels})",
        },
        {
            "record": "node:trainstack_node_labels:info",
            "expr": f"max by (node, pool, capacity, instance_type) ({node_labels})",
        },
        {
            "record": "node:trainstack_gpus_allocatable:max",
            # In GPUs: a node cut into slices offers its slices' shares (common.py).
            "expr": f"sum by (node) ({gpu_equivalents('kube_node_status_allocatable', cfg)})",
        },
        {
            "record": "node:trainstack_gpus_allocated:sum",
            "expr": f"sum by (node) ({gpu_equivalents(REQUESTS, cfg)} * on (namespace, pod) "
            "group_left () "
            f"{RUNNING_PODS})",
        },
    ]


def price_expr(cfg: PlatformConfig) -> str | None:
    """The price table as a PromQL vector: one sample per (instance_type, capacity)."""
    rows = [
        ({"instance_type": p.instance_type, "capacity": p.capacity}, f"{p.usd_per_gpu_hour:.6g}")
        for p in cfg.monitoring.prices
    ]
    return constant_vector(rows) if rows else None


def accounting_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """GPUs allocated and used (utilisation-weighted) per pod, team, queue and job; GPU-hours
    per evaluation interval; cost from the price table."""
    per_hour = 3600 // ACCOUNTING_INTERVAL_S
    rules: list[dict[str, Any]] = [
        {
            "record": "namespace_pod:trainstack_gpus_allocated:sum",
            "expr": f"(sum by (namespace, pod, node) ({gpu_equivalents(REQUESTS, cfg)}) * on "
            "(namespace, pod) "
            f"group_left () {RUNNING_PODS}) * on (namespace, pod) group_left (team, queue, "
            "job_name, pool) namespace_pod:trainstack_job_labels:info",
        },
        {
            "record": "namespace_pod:trainstack_gpus_used:sum",
            "expr": f"(sum by (namespace, pod) ({gpu_utilisation(cfg, in_gpus=True)})) "
            "* on (namespace, pod) group_left (node, team, queue, job_name, pool) "
            "(namespace_pod:trainstack_gpus_allocated:sum > bool 0)",
        },
    ]
    prices = price_expr(cfg)
    if prices is not None:
        rules += [
            {"record": "trainstack:gpu_price_usd_per_gpu_hour", "expr": prices},
            {
                "record": "node:trainstack_gpu_price_usd_per_gpu_hour:max",
                "expr": "max by (node, capacity, instance_type) (node:trainstack_node_labels:info "
                "* on (instance_type, capacity) group_left () "
                "trainstack:gpu_price_usd_per_gpu_hour)",
            },
            {
                "record": "namespace_pod:trainstack_cost_usd_per_hour:sum",
                "expr": "namespace_pod:trainstack_gpus_allocated:sum * on (node) group_left "
                "(capacity, instance_type) node:trainstack_gpu_price_usd_per_gpu_hour:max",
            },
            {
                "record": "namespace_pod:trainstack_idle_cost_usd_per_hour:sum",
                "expr": "(namespace_pod:trainstack_gpus_allocated:sum - "
                "(namespace_pod:trainstack_gpus_used:sum or "
                "namespace_pod:trainstack_gpus_allocated:sum * 0)) * on (node) group_left "
                "(capacity, instance_type) node:trainstack_gpu_price_usd_per_gpu_hour:max",
            },
        ]
    # Per instance type and capacity, so a report can price GPU-hours with any price table
    # (trainstack/report.py), not only the one these rules were deployed with.
    rules.append(
        {
            "record": "team_instance:trainstack_gpu_hours_allocated:increase1m",
            "expr": "sum by (team, instance_type, capacity) "
            "(namespace_pod:trainstack_gpus_allocated:sum * on (node) group_left "
            f"(instance_type, capacity) node:trainstack_node_labels:info) / {per_hour}",
        }
    )
    measures = ["gpus_allocated", "gpus_used"]
    if prices is not None:
        measures += ["cost_usd_per_hour", "idle_cost_usd_per_hour"]
    for level, keys in LEVELS.items():
        for measure in measures:
            rules.append(
                {
                    "record": f"{level}:trainstack_{measure}:sum",
                    "expr": f"sum by ({keys}) (namespace_pod:trainstack_{measure}:sum)",
                }
            )
        # One sample per interval, so sum_over_time over any window gives GPU-hours / USD.
        for measure, out in (
            ("gpus_allocated", "gpu_hours_allocated"),
            ("gpus_used", "gpu_hours_used"),
            *((("cost_usd_per_hour", "cost_usd"),) if prices is not None else ()),
        ):
            rules.append(
                {
                    "record": f"{level}:trainstack_{out}:increase1m",
                    "expr": f"{level}:trainstack_{measure}:sum / {per_hour}",
                }
            )
    return rules


def _job_elapsed() -> str:
    return (
        "(time() - min by (namespace, team, job_name) (kube_pod_start_time * on (namespace, pod) "
        "group_left (team, job_name) namespace_pod:trainstack_job_labels:info))"
    )


def deadline_alerts(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """What the maximum-duration enforcer (images/deadlines, docs/deadlines.md) reports: a job
    it should have stopped still running, the enforcer not working, and the jobs it stopped."""
    runbook = cfg.monitoring.runbook_url
    job = "{{ $labels.namespace }}/{{ $labels.job_name }}"
    interval = cfg.scheduling.deadlines.interval_seconds
    # Three passes: the Command, Volcano's consumption of it and the job's new phase take one.
    minutes = max(5, math.ceil(3 * interval / 60))
    last = "trainstack_deadline_last_success_timestamp_seconds"
    return [
        _alert(
            runbook,
            "TrainstackJobOverMaxDuration",
            "max by (namespace, team, job_name) (trainstack_deadline_job_overdue_seconds) > 0",
            minutes,
            "critical",
            f"{job} runs past its maximum duration and the platform has not stopped it",
            f"{job} is {{{{ $value | humanizeDuration }}}} past the time the platform stops it "
            f"(first Running + {MAX_DURATION_ANNOTATION} + its termination grace period + "
            f"{cfg.scheduling.deadlines.margin_seconds}s); it still holds its GPUs.",
        ),
        _alert(
            runbook,
            "TrainstackDeadlineEnforcerDown",
            f"absent({last}) or (time() - max({last})) > {3 * interval}",
            minutes,
            "critical",
            "The maximum-duration enforcer has not completed a pass",
            "No pass of trainstack-deadlines (trainstack-system) without errors for "
            f"{3 * interval}s, or it is not scraped: jobs whose entrypoint is not the "
            "trainstack runtime are not stopped at their maximum duration.",
        ),
        _alert(
            runbook,
            "TrainstackJobStoppedAtMaxDuration",
            "sum by (namespace, team) (increase(trainstack_deadline_terminations_total[10m])) > 0",
            0,
            "info",
            "The platform stopped jobs of {{ $labels.namespace }} at their maximum duration",
            "{{ $value | humanize }} TerminateJob Command(s) in the last 10m for jobs of "
            "{{ $labels.namespace }} that ran past their maximum duration (the enforcer's log "
            "and the jobs' CommandIssued events name them).",
        ),
    ]


def _xid_critical() -> str:
    return " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in CRITICAL_XIDS)


def alert_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    t = cfg.monitoring.thresholds
    runbook = cfg.monitoring.runbook_url
    job = "{{ $labels.namespace }}/{{ $labels.job_name }}"
    max_duration = "max by (namespace, job_name) (trainstack_volcano_job_max_duration_seconds)"
    step_mean = "rate(trainstack_step_seconds_total[{w}]{o}) / rate(trainstack_steps_total[{w}]{o})"
    running_jobs = "max by (namespace, job_name) (trainstack_up == 1)"
    last_ckpt_or_start = (
        "(max by (namespace, team, job_name) (trainstack_last_checkpoint_timestamp_seconds > 0) "
        "or min by (namespace, team, job_name) (kube_pod_start_time * on (namespace, pod) "
        "group_left (team, job_name) namespace_pod:trainstack_job_labels:info))"
    )
    interval = (
        f"(max by (namespace, job_name) (trainstack_volcano_job_checkpoint_interval_seconds) or "
        f"{running_jobs} * {t.checkpoint_interval_minutes * 60})"
    )
    return [
        _alert(
            runbook,
            "TrainstackGpuAllocatedIdle",
            f"avg by ({JOB_KEYS}) ({gpu_utilisation(cfg, in_gpus=False)} * on (namespace, pod) "
            "group_left (team, queue, job_name) namespace_pod:trainstack_job_labels:info) "
            f"< {t.gpu_idle_utilization_percent:g}",
            t.gpu_idle_minutes,
            "warning",
            f"GPUs of {job} are allocated but idle",
            f"Average GPU utilisation of {job} (team {{{{ $labels.team }}}}) is "
            f"{{{{ $value | humanize }}}}%, below {t.gpu_idle_utilization_percent:g}% for "
            f"{t.gpu_idle_minutes}m.",
        ),
        _alert(
            runbook,
            "TrainstackReservedCapacityIdle",
            "sum by (pool, capacity, instance_type) ((node:trainstack_gpus_allocatable:max - "
            "(node:trainstack_gpus_allocated:sum or node:trainstack_gpus_allocatable:max * 0)) "
            "* on (node) group_left (pool, capacity, instance_type) "
            'node:trainstack_node_labels:info{capacity=~"reservation|capacityBlock"}) > 0',
            t.reserved_idle_minutes,
            "warning",
            "Reserved GPUs in pool {{ $labels.pool }} are unallocated",
            "{{ $value }} GPUs of pool {{ $labels.pool }} ({{ $labels.capacity }}, paid whether "
            f"used or not) have had no pod for {t.reserved_idle_minutes}m.",
        ),
        _alert(
            runbook,
            "TrainstackGpuXidCritical",
            _xid_critical(),
            0,
            "critical",
            "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $value }}",
            "XID {{ $value }} means the GPU (or its node) needs draining and a reset or "
            "replacement; jobs on it will fail or hang.",
        ),
        _alert(
            runbook,
            "TrainstackGpuXidError",
            f"DCGM_FI_DEV_XID_ERRORS > 0 unless ({_xid_critical()})",
            0,
            "warning",
            "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $value }}",
            "A non-fatal XID: often an application fault (13, 31, 43) or a driver event.",
        ),
        _alert(
            runbook,
            "TrainstackGpuEccUncorrectable",
            "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0 or "
            "increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[10m]) > 0 or "
            "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
            0,
            "critical",
            "Uncorrectable memory errors on GPU {{ $labels.gpu }} of {{ $labels.node }}",
            "Double-bit ECC errors or row remapping on this GPU: drain the node; a row-remap "
            "failure means the GPU must be replaced.",
        ),
        _alert(
            runbook,
            "TrainstackTrainingStalled",
            f"(time() - max by ({JOB_KEYS}) (trainstack_last_step_timestamp_seconds > 0)) "
            f"> {t.stall_minutes * 60}",
            2,
            "critical",
            f"Training {job} has made no step for {t.stall_minutes}m",
            f"No rank of {job} completed a step for {{{{ $value | humanizeDuration }}}}: "
            "the signature of a hung collective (NCCL), a dead peer or a stuck input pipeline.",
        ),
        _alert(
            runbook,
            "TrainstackCheckpointStale",
            f"((time() - {last_ckpt_or_start}) > on (namespace, job_name) group_left () "
            f"(2 * {interval})) and on (namespace, job_name) {running_jobs}",
            5,
            "warning",
            f"{job} has not checkpointed for over twice its interval",
            f"The last checkpoint of {job} (or its start) is {{{{ $value | humanizeDuration }}}} "
            "old; a failure now loses that much work.",
        ),
        _alert(
            runbook,
            "TrainstackJobNearMaxDuration",
            f"({_job_elapsed()} / on (namespace, job_name) group_left () {max_duration}) "
            f"> {t.max_duration_warn_ratio:g} and ({_job_elapsed()} / on (namespace, job_name) "
            f"group_left () {max_duration}) <= 1",
            0,
            "warning",
            f"{job} is close to its maximum duration",
            f"{job} has used {{{{ $value | humanizePercentage }}}} of its maximum duration "
            f"({MAX_DURATION_ANNOTATION}).",
        ),
        *deadline_alerts(cfg),
        _alert(
            runbook,
            "TrainstackJobPendingTooLong",
            f"max by ({JOB_KEYS}) "
            '(trainstack_volcano_podgroup_status_phase{phase=~"Pending|Inqueue"}) == 1',
            t.pending_minutes,
            "warning",
            f"{job} has waited in queue {{{{ $labels.queue }}}} for over {t.pending_minutes}m",
            "The job's PodGroup is still Pending or Inqueue: the queue lacks quota, the pool "
            "lacks capacity, or the gang cannot be placed whole.",
        ),
        _alert(
            runbook,
            "TrainstackStepTimeRegression",
            f"(max by ({JOB_KEYS}) ({step_mean.format(w='15m', o='')}) / max by ({JOB_KEYS}) "
            f"({step_mean.format(w='1h', o=' offset 15m')})) > {t.step_time_regression_ratio:g}",
            15,
            "warning",
            f"Steps of {job} are {{{{ $value | humanize }}}}x slower than an hour ago",
            "Mean step time over 15m compared with the hour before (slowest rank).",
        ),
        _alert(
            runbook,
            "TrainstackStepTimeJitter",
            f"max by ({JOB_KEYS}) (stddev_over_time(trainstack_step_time_seconds[15m]) / "
            f"avg_over_time(trainstack_step_time_seconds[15m])) > {t.step_time_jitter_ratio:g}",
            15,
            "warning",
            f"Step times of {job} vary widely",
            "Coefficient of variation of step time over 15m is {{ $value | humanize }} "
            "(a straggler, a noisy neighbour or an unsteady input pipeline).",
        ),
        _alert(
            runbook,
            "TrainstackDataLoadingBound",
            f"sum by ({JOB_KEYS}) (rate(trainstack_data_wait_seconds_total[10m])) / "
            f"sum by ({JOB_KEYS}) (rate(trainstack_step_seconds_total[10m])) > "
            f"{t.data_wait_ratio:g}",
            t.data_wait_minutes,
            "warning",
            f"{job} spends {{{{ $value | humanizePercentage }}}} of its step time waiting on data",
            f"Input wait above {t.data_wait_ratio:.0%} of step time for {t.data_wait_minutes}m: "
            "the GPUs are starved by the input pipeline.",
        ),
        _alert(
            runbook,
            "TrainstackGpuNodeNotReady",
            '(max by (node) (kube_node_status_condition{condition="Ready", status="true"}) == 0 '
            'and on (node) max by (node) (kube_node_status_capacity{resource="nvidia_com_gpu"}) '
            "> 0) * on (node) group_left (pool, capacity, instance_type) "
            "node:trainstack_node_labels:info",
            t.node_not_ready_minutes,
            "critical",
            "GPU node {{ $labels.node }} (pool {{ $labels.pool }}) is NotReady",
            f"The node has not been Ready for {t.node_not_ready_minutes}m; gang jobs on it are "
            "stuck or failing.",
        ),
        # The node health gate (docs/health.md) and stragglers named by their node.
        *health_alerts(cfg),
        # Image pre-pull (docs/prepull.md): an image missing on a node of its pool.
        *prepull_alerts(cfg),
    ]


def rule_groups(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Plain Prometheus rule groups (what `promtool check rules` reads)."""
    interval = f"{ACCOUNTING_INTERVAL_S}s"
    groups = [
        {"name": "trainstack-labels", "interval": interval, "rules": label_rules(cfg)},
        {"name": "trainstack-accounting", "interval": interval, "rules": accounting_rules(cfg)},
    ]
    pulls = prepull_rules(cfg)
    if pulls:  # images present and pull durations per pool (docs/prepull.md)
        groups.append({"name": "trainstack-prepull", "interval": interval, "rules": pulls})
    fairness = fairness_rules(cfg)
    if fairness:  # per team and queue: the fairness dashboard and `trainstack report`
        groups.append({"name": "trainstack-fairness", "interval": interval, "rules": fairness})
    # The alerts last: prometheus_rules puts every group before them in one object.
    return [*groups, {"name": "trainstack-alerts", "rules": alert_rules(cfg)}]


def prometheus_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    groups = rule_groups(cfg)
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": object_meta(cfg, "trainstack-accounting", NAMESPACE),
            "spec": {"groups": groups[:-1]},
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": object_meta(cfg, "trainstack-alerts", NAMESPACE),
            "spec": {"groups": groups[-1:]},
        },
    ]
