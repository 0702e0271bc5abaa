"""Grafana dashboards as code (grafana-foundation-sdk): cluster, team and job views,
provisioned as ConfigMaps that kube-prometheus-stack's Grafana sidecar loads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable, Row
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

from trainstack.builders import labels
from trainstack.builders.monitoring import DASHBOARD_LABEL, NAMESPACE, fairness, price_expr
from trainstack.builders.monitoring.common import gpu_utilisation
from trainstack.config.model import PlatformConfig

# kube-prometheus-stack provisions its Prometheus data source with this uid.
DATASOURCE: Final = DataSourceRef(type_val="prometheus", uid="prometheus")
FOLDER: Final = "trainstack"

JOB_SEL: Final = 'namespace="$namespace", job_name="$job_name"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    width: int = 12


def _cluster(cfg: PlatformConfig) -> tuple[str, str, list[str], list[tuple[str, list[PanelSpec]]]]:
    rows: list[tuple[str, list[PanelSpec]]] = [
        (
            "GPUs",
            [
                PanelSpec(
                    "GPUs allocated vs used (utilisation-weighted)",
                    (
                        Query("sum(team:trainstack_gpus_allocated:sum)", "allocated"),
                        Query("sum(team:trainstack_gpus_used:sum)", "used"),
                        Query("sum(node:trainstack_gpus_allocatable:max)", "allocatable"),
                    ),
                ),
                PanelSpec(
                    "GPUs allocated by team",
                    (Query("team:trainstack_gpus_allocated:sum", "{{team}}"),),
                ),
                PanelSpec(
                    "Reserved GPUs without a pod",
                    (
                        Query(
                            "sum by (pool) ((node:trainstack_gpus_allocatable:max - "
                            "(node:trainstack_gpus_allocated:sum or "
                            "node:trainstack_gpus_allocatable:max * 0)) * on (node) group_left "
                            "(pool) node:trainstack_node_labels:info"
                            '{capacity=~"reservation|capacityBlock"})',
                            "{{pool}}",
                        ),
                    ),
                ),
                PanelSpec(
                    "GPU utilisation by node",
                    # Whole GPUs, and MIG instances by their engine's activity
                    # (docs/gpu-sharing.md).
                    (
                        Query(
                            "avg by (node) "
                            f"({gpu_utilisation(cfg, in_gpus=False, assigned=False)})",
                            "{{node}}",
                        ),
                    ),
                    unit="percent",
                ),
            ],
        ),
        (
            "Health",
            [
                PanelSpec(
                    "XID errors (last value)",
                    (
                        Query(
                            "max by (node, gpu) (DCGM_FI_DEV_XID_ERRORS) > 0",
                            "{{node}} gpu {{gpu}}",
                        ),
                    ),
                ),
                PanelSpec(
                    "GPU nodes not Ready",
                    (
                        Query(
                            'count(max by (node) (kube_node_status_condition{condition="Ready", '
                            'status="true"}) == 0 and on (node) max by (node) '
                            '(kube_node_status_capacity{resource="nvidia_com_gpu"}) > 0)',
                            "not ready",
                        ),
                    ),
                    kind="stat",
                ),
                PanelSpec(
                    "InfiniBand / RoCE throughput (node-exporter; not EFA)",
                    (
                        Query(
                            "sum by (instance) "
                            "(rate(node_infiniband_port_data_transmitted_bytes_total[5m]))",
                            "tx {{instance}}",
                        ),
                        Query(
                            "sum by (instance) "
                            "(rate(node_infiniband_port_data_received_bytes_total[5m]))",
                            "rx {{instance}}",
                        ),
                    ),
                    unit="Bps",
                ),
            ],
        ),
        (
            "Queues (Volcano)",
            [
                PanelSpec(
                    "PodGroups pending / inqueue / running by queue",
                    (
                        Query("volcano_queue_pod_group_pending_count", "pending {{queue_name}}"),
                        Query("volcano_queue_pod_group_inqueue_count", "inqueue {{queue_name}}"),
                        Query("volcano_queue_pod_group_running_count", "running {{queue_name}}"),
                    ),
                ),
                PanelSpec(
                    "GPUs allocated vs deserved by queue",
                    (
                        Query(
                            'volcano_queue_allocated_scalar_resources{resource="nvidia.com/gpu"}'
                            " / 1000",
                            "allocated {{queue_name}}",
                        ),
                        Query(
                            'volcano_queue_deserved_scalar_resources{resource="nvidia.com/gpu"}'
                            " / 1000",
                            "deserved {{queue_name}}",
                        ),
                    ),
                ),
                PanelSpec(
                    "Scheduling session latency p99",
                    (
                        Query(
                            "histogram_quantile(0.99, sum by (le) "
                            "(rate(volcano_e2e_scheduling_latency_milliseconds_bucket[5m])))",
                            "p99",
                        ),
                    ),
                    unit="ms",
                ),
            ],
        ),
    ]
    if price_expr(cfg) is not None:
        rows.append(
            (
                "Cost",
                [
                    PanelSpec(
                        "Cost per hour by team (allocated GPUs)",
                        (Query("team:trainstack_cost_usd_per_hour:sum", "{{team}}"),),
                        unit="currencyUSD",
                    ),
                    PanelSpec(
                        "Idle cost per hour by team (allocated, not used)",
                        (Query("team:trainstack_idle_cost_usd_per_hour:sum", "{{team}}"),),
                        unit="currencyUSD",
                    ),
                ],
            )
        )
    if cfg.health.enabled and cfg.gpu_pools:
        rows.append(("Node health gate", _health_panels()))
    if cfg.pre_pull.enabled and cfg.gpu_pools:
        rows.append(("Image pre-pull", _prepull_panels()))
    return "trainstack-cluster", "trainstack / Cluster", [], rows


def _prepull_panels() -> list[PanelSpec]:
    """Image pre-pull's recording rules (builders/monitoring/prepull.py, docs/prepull.md)."""
    return [
        PanelSpec(
            "Nodes holding their pool's images, of the pool's nodes",
            (
                Query("pool:trainstack_prepull_nodes_ready:sum", "{{pool}} ready"),
                Query("pool:trainstack_prepull_nodes:sum", "{{pool}} nodes"),
            ),
        ),
        PanelSpec(
            "Image pull time, 90th percentile over an hour, by pool",
            (Query("pool:trainstack_image_pull_seconds:p90_1h", "{{pool}}"),),
            unit="s",
        ),
    ]


def _health_panels() -> list[PanelSpec]:
    """The health agent's and repair controller's metrics (contracts/health.py METRICS), one
    series per node as the alerts count them (builders/monitoring/health.py per_node)."""
    passed = "max by (node, pool) (trainstack_node_health_passed)"
    checked = "max by (node, pool) (trainstack_node_health_last_check_timestamp_seconds) > 0"
    return [
        PanelSpec(
            "Nodes passing their health check, by pool",
            (Query(f"sum by (pool) ({passed})", "{{pool}}"),),
        ),
        PanelSpec(
            "Nodes failing their health check",
            (Query(f"count(({passed} == 0) and on (node, pool) ({checked}))", "failed"),),
            kind="stat",
            width=6,
        ),
        PanelSpec(
            "Node repairs in range",
            (
                Query(
                    "sum by (action) (increase(trainstack_node_repairs_total[$__range]))",
                    "{{action}}",
                ),
            ),
            kind="stat",
            width=6,
        ),
        PanelSpec(
            "Health check duration by check (slowest node)",
            (
                Query(
                    "max by (check) (trainstack_node_health_check_duration_seconds)",
                    "{{check}}",
                ),
            ),
            unit="s",
        ),
        PanelSpec(
            "Intra-node all-reduce bus bandwidth by node",
            (Query("max by (node) (trainstack_node_health_busbw_gbps)", "{{node}}"),),
            # Grafana's "gigabytes/sec" (10^9 B/s, the figure's own unit): grafana
            # packages/grafana-data/src/valueFormats/categories.ts, id 'GBs'.
            unit="GBs",
        ),
    ]


def _team(cfg: PlatformConfig) -> tuple[str, str, list[str], list[tuple[str, list[PanelSpec]]]]:
    sel = 'team="$team"'
    usage = [
        PanelSpec(
            "GPUs allocated vs used",
            (
                Query(f"team:trainstack_gpus_allocated:sum{{{sel}}}", "allocated"),
                Query(f"team:trainstack_gpus_used:sum{{{sel}}}", "used"),
            ),
        ),
        PanelSpec(
            "GPUs by job",
            (Query(f"training_job:trainstack_gpus_allocated:sum{{{sel}}}", "{{job_name}}"),),
        ),
        PanelSpec(
            "GPU-hours allocated in range",
            (
                Query(
                    f"sum(sum_over_time(team:trainstack_gpu_hours_allocated:increase1m{{{sel}}}"
                    "[$__range]))",
                    "GPU-hours",
                ),
            ),
            kind="stat",
            width=6,
        ),
        PanelSpec(
            "GPU-hours used in range",
            (
                Query(
                    f"sum(sum_over_time(team:trainstack_gpu_hours_used:increase1m{{{sel}}}"
                    "[$__range]))",
                    "GPU-hours",
                ),
            ),
            kind="stat",
            width=6,
        ),
    ]
    if price_expr(cfg) is not None:
        usage.append(
            PanelSpec(
                "Estimated cost in range",
                (
                    Query(
                        f"sum(sum_over_time(team:trainstack_cost_usd:increase1m{{{sel}}}"
                        "[$__range]))",
                        "USD",
                    ),
                ),
                unit="currencyUSD",
                kind="stat",
                width=6,
            )
        )
    return (
        "trainstack-team",
        "trainstack / Team",
        ["team"],
        [
            ("Usage", usage),
            (
                "Alerts",
                [
                    PanelSpec(
                        "Firing trainstack alerts",
                        (
                            Query(
                                f'count by (alertname) (ALERTS{{alertstate="firing", {sel}}})',
                                "{{alertname}}",
                            ),
                        ),
                    )
                ],
            ),
        ],
    )


def _job(cfg: PlatformConfig) -> tuple[str, str, list[str], list[tuple[str, list[PanelSpec]]]]:
    return (
        "trainstack-job",
        "trainstack / Job",
        ["namespace", "job_name"],
        [
            (
                "Progress",
                [
                    PanelSpec(
                        "Step (per rank)",
                        (Query(f"trainstack_step{{{JOB_SEL}}}", "{{pod}} rank {{rank}}"),),
                    ),
                    PanelSpec(
                        "Mean step time (slowest rank, 5m)",
                        (
                            Query(
                                f"max(rate(trainstack_step_seconds_total{{{JOB_SEL}}}[5m]) / "
                                f"rate(trainstack_steps_total{{{JOB_SEL}}}[5m]))",
                                "step time",
                            ),
                        ),
                        unit="s",
                    ),
                    PanelSpec(
                        "Samples per second",
                        (Query(f"sum(trainstack_samples_per_second{{{JOB_SEL}}})", "samples/s"),),
                    ),
                    PanelSpec(
                        "Seconds since last step",
                        (
                            Query(
                                "time() - max(trainstack_last_step_timestamp_seconds"
                                f"{{{JOB_SEL}}})",
                                "since last step",
                            ),
                        ),
                        unit="s",
                        kind="stat",
                        width=6,
                    ),
                ],
            ),
            (
                "Where the time goes",
                [
                    PanelSpec(
                        "Data-wait and communication share of step time",
                        (
                            Query(
                                f"sum(rate(trainstack_data_wait_seconds_total{{{JOB_SEL}}}[5m])) "
                                f"/ sum(rate(trainstack_step_seconds_total{{{JOB_SEL}}}[5m]))",
                                "data wait",
                            ),
                            Query(
                                f"sum(rate(trainstack_comm_seconds_total{{{JOB_SEL}}}[5m])) / "
                                f"sum(rate(trainstack_step_seconds_total{{{JOB_SEL}}}[5m]))",
                                "communication",
                            ),
                        ),
                        unit="percentunit",
                    ),
                    PanelSpec(
                        "GPU utilisation per pod",
                        (
                            Query(
                                f"avg by (pod) ({gpu_utilisation(cfg, in_gpus=False)} * on "
                                "(namespace, pod) group_left () "
                                f"namespace_pod:trainstack_job_labels:info{{{JOB_SEL}}})",
                                "{{pod}}",
                            ),
                        ),
                        unit="percent",
                    ),
                    PanelSpec(
                        "Tensor-core activity per pod",
                        (
                            Query(
                                "avg by (pod) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE * on (namespace, "
                                "pod) group_left () namespace_pod:trainstack_job_labels:info"
                                f"{{{JOB_SEL}}})",
                                "{{pod}}",
                            ),
                        ),
                        unit="percentunit",
                    ),
                ],
            ),
            (
                "Checkpoints and restarts",
                [
                    PanelSpec(
                        "Age of the last checkpoint",
                        (
                            Query(
                                "time() - max(trainstack_last_checkpoint_timestamp_seconds"
                                f"{{{JOB_SEL}}} > 0)",
                                "age",
                            ),
                        ),
                        unit="s",
                    ),
                    PanelSpec(
                        "Checkpoint stall per checkpoint",
                        (Query(f"max(trainstack_checkpoint_stall_seconds{{{JOB_SEL}}})", "stall"),),
                        unit="s",
                    ),
                    PanelSpec(
                        "In-pod worker restarts",
                        (Query(f"max(trainstack_worker_restarts{{{JOB_SEL}}})", "restarts"),),
                        kind="stat",
                        width=6,
                    ),
                ],
            ),
        ],
    )


def _fairness(cfg: PlatformConfig) -> tuple[str, str, list[str], list[tuple[str, list[PanelSpec]]]]:
    """Fairness over time (issue 45): each team's Volcano queue against its deserved share and
    guarantee, what it borrows and lends, and what waits (builders/monitoring/fairness.py).
    Without teams there are no team queues and so no dashboard."""
    if not cfg.registry.teams:
        return "trainstack-fairness", "trainstack / Fairness", [], []
    team = "{{team}}"
    shares = [
        PanelSpec(
            "Allocated over deserved share, by team (1 = exactly its share)",
            (Query(fairness.SHARE_RATIO, team),),
            unit="percentunit",
        ),
        PanelSpec("GPUs allocated by team (Volcano)", (Query(fairness.ALLOCATED, team),)),
        PanelSpec(
            "GPUs deserved and guaranteed by team",
            (
                Query(fairness.DESERVED, f"deserved {team}"),
                Query(fairness.GUARANTEED, f"guaranteed {team}"),
            ),
        ),
        PanelSpec(
            "GPUs borrowed (above deserved) and lent (estimate) by team",
            (
                Query(fairness.BORROWED, f"borrowed {team}"),
                Query(fairness.LENT, f"lent {team}"),
            ),
        ),
    ]
    waiting = [
        PanelSpec("GPUs of pending tasks by team", (Query(fairness.PENDING, team),)),
        PanelSpec(
            "Job wait to start (creation to last task placed), p50 and p90",
            (
                Query(f'{fairness.WAIT}{{quantile="0.5"}}', f"p50 {team}"),
                Query(f'{fairness.WAIT}{{quantile="0.9"}}', f"p90 {team}"),
            ),
            unit="s",
        ),
        # Volcano v1.15.1 counts these for the whole cluster only (no queue label).
        PanelSpec(
            "Preemption attempts, all queues (Volcano)",
            (
                Query(
                    "sum(increase(volcano_total_preemption_attempts[$__rate_interval]))",
                    "attempts",
                ),
                Query("max(volcano_pod_preemption_victims)", "victims (last session)"),
            ),
        ),
    ]
    return (
        "trainstack-fairness",
        "trainstack / Fairness",
        [],
        [("Shares", shares), ("Waiting and preemption", waiting)],
    )


_VARIABLE_QUERIES: Final = {
    "team": "label_values(team:trainstack_gpus_allocated:sum, team)",
    "namespace": "label_values(trainstack_up, namespace)",
    "job_name": 'label_values(trainstack_up{namespace="$namespace"}, job_name)',
}
DEFINITIONS: Final = (_cluster, _team, _job, _fairness)


def _build(
    uid: str, title: str, variables: list[str], rows: list[tuple[str, list[PanelSpec]]]
) -> Dashboard:
    dash = (
        Dashboard(title)
        .uid(uid)
        .tags(["trainstack"])
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("utc")
        .readonly()
    )
    for name in variables:
        dash = dash.with_variable(
            QueryVariable(name)
            .label(name)
            .query(_VARIABLE_QUERIES[name])
            .datasource(DATASOURCE)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
    for row_title, panels in rows:
        dash = dash.with_row(Row(row_title))
        for spec in panels:
            panel: timeseries.Panel | stat.Panel = (
                stat.Panel() if spec.kind == "stat" else timeseries.Panel()
            )
            panel = panel.title(spec.title).unit(spec.unit).datasource(DATASOURCE)
            panel = panel.height(8).span(spec.width)
            for index, query in enumerate(spec.queries):
                panel = panel.with_target(
                    prometheus.Dataquery()
                    .expr(query.expr)
                    .legend_format(query.legend or "__auto")
                    .ref_id(chr(ord("A") + index))
                )
            dash = dash.with_panel(panel)
    return dash


def dashboards(cfg: PlatformConfig) -> dict[str, dict[str, Any]]:
    """uid -> dashboard JSON model."""
    out: dict[str, dict[str, Any]] = {}
    for definition in DEFINITIONS:
        uid, title, variables, rows = definition(cfg)
        if not rows:
            continue
        text = JSONEncoder(sort_keys=True).encode(_build(uid, title, variables, rows).build())
        out[uid] = json.loads(text)
    return out


def dashboard_exprs(cfg: PlatformConfig) -> list[str]:
    """Every PromQL expression of every panel (Grafana variables still in)."""
    exprs: list[str] = []
    for model in dashboards(cfg).values():
        for panel in model["panels"]:
            exprs += [t["expr"] for t in panel.get("targets", [])]
    return exprs


def variable_metrics() -> list[str]:
    """Metric names the template variables query (`label_values(<metric>..., label)`)."""
    return sorted(
        {
            re.findall(r"label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)", q)[0]
            for q in _VARIABLE_QUERIES.values()
        }
    )


def dashboard_configmaps(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard, labelled for the Grafana sidecar."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{uid}-dashboard",
                "namespace": NAMESPACE,
                "labels": {**labels.base_labels(cfg.stack), DASHBOARD_LABEL[0]: DASHBOARD_LABEL[1]},
                "annotations": {"grafana_folder": FOLDER},
            },
            "data": {f"{uid}.json": json.dumps(model, sort_keys=True, indent=1)},
        }
        for uid, model in dashboards(cfg).items()
    ]
