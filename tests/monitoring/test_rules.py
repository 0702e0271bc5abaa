"""Alert and accounting rules under promtool: syntax, and unit tests on synthetic series.

Each case feeds series for one situation and checks, through the ALERTS series, that the
alert fires when it should and stays silent when it should not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring.conftest import platform, run_promtool, write_rule_tests
from trainstack.builders import monitoring as b
from trainstack.builders.monitoring.health import health_alerts
from trainstack.config.model import PlatformConfig

VISION = {"namespace": "vision", "team": "vision", "queue": "vision", "job_name": "llm"}


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f'{k}="{v}"' for k, v in labels.items())


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    return {"series": f"{name}{{{_labels(labels)}}}", "values": values}


def firing(alert: str, at: str, labels: dict[str, str] | None) -> dict[str, Any]:
    """At `at`, ALERTS for `alert` is exactly one firing series with `labels` (or none)."""
    samples = []
    if labels is not None:
        full = {"__name__": "ALERTS", "alertname": alert, "alertstate": "firing", **labels}
        samples.append({"labels": f"{{{_labels(full)}}}", "value": 1})
    return {
        "expr": f'ALERTS{{alertname="{alert}", alertstate="firing"}}',
        "eval_time": at,
        "exp_samples": samples,
    }


def pod(team: str, pod_name: str, job: str, node: str, *, gpus: int, minutes: int) -> list[Any]:
    """kube-state-metrics series of one running training pod."""
    n = f"1x{minutes}"
    return [
        series(
            "kube_pod_labels",
            n,
            namespace=team,
            pod=pod_name,
            label_trainstack_io_team=team,
            label_trainstack_io_job=job,
            label_volcano_sh_queue_name=team,
            label_trainstack_io_pool="h100",
        ),
        series("kube_pod_status_phase", n, namespace=team, pod=pod_name, phase="Running"),
        series(
            "kube_pod_status_phase", f"0x{minutes}", namespace=team, pod=pod_name, phase="Pending"
        ),
        series(
            "kube_pod_container_resource_requests",
            f"{gpus}x{minutes}",
            namespace=team,
            pod=pod_name,
            container="trainer",
            node=node,
            resource="nvidia_com_gpu",
            unit="integer",
        ),
        series("kube_pod_start_time", f"0x{minutes}", namespace=team, pod=pod_name),
    ]


def node(name: str, capacity: str, minutes: int, gpus: int = 8) -> list[Any]:
    return [
        series(
            "kube_node_labels",
            f"1x{minutes}",
            node=name,
            label_trainstack_io_pool="h100",
            label_trainstack_io_capacity=capacity,
            label_node_kubernetes_io_instance_type="p5.48xlarge",
        ),
        series(
            "kube_node_status_allocatable",
            f"{gpus}x{minutes}",
            node=name,
            resource="nvidia_com_gpu",
            unit="integer",
        ),
    ]


def gpu_util(team: str, pod_name: str, node_name: str, values: str, gpus: int = 1) -> list[Any]:
    return [
        series(
            "DCGM_FI_DEV_GPU_UTIL",
            values,
            namespace=team,
            pod=pod_name,
            node=node_name,
            gpu=str(g),
            Hostname=node_name,
        )
        for g in range(gpus)
    ]


def runtime(name: str, values: str, **extra: str) -> dict[str, str]:
    return series(name, values, **VISION, pod="llm-worker-0", rank="0", **extra)


def case(inputs: list[Any], checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"interval": "1m", "input_series": inputs, "promql_expr_test": checks}


def step_function(every: int, minutes: int) -> str:
    """A timestamp gauge that jumps to `now` every `every` minutes (checkpoint times)."""
    return " ".join(str(60 * every * (i // every) + 60) for i in range(minutes + 1))


def alert_cases() -> list[dict[str, Any]]:
    idle = "GpuAllocatedIdle"
    return [
        # -- GPUs allocated to a job but idle (10% for 30m) --------------------------------
        case(
            [
                *pod("vision", "llm-worker-0", "llm", "n1", gpus=8, minutes=60),
                *gpu_util("vision", "llm-worker-0", "n1", "2x60"),
            ],
            [
                firing(f"Trainstack{idle}", "20m", None),
                firing(f"Trainstack{idle}", "45m", {**VISION, "severity": "warning"}),
            ],
        ),
        case(
            [
                *pod("vision", "llm-worker-0", "llm", "n1", gpus=8, minutes=60),
                *gpu_util("vision", "llm-worker-0", "n1", "55x60"),
            ],
            [firing(f"Trainstack{idle}", "45m", None)],
        ),
        # -- reserved GPUs without a pod (60m) ---------------------------------------------
        case(
            [*node("n1", "reservation", 90)],
            [
                firing("TrainstackReservedCapacityIdle", "30m", None),
                firing(
                    "TrainstackReservedCapacityIdle",
                    "80m",
                    {
                        "pool": "h100",
                        "capacity": "reservation",
                        "instance_type": "p5.48xlarge",
                        "severity": "warning",
                    },
                ),
            ],
        ),
        case(  # fully used reserved node, and an idle spot node: both silent
            [
                *node("n1", "reservation", 90),
                *node("n2", "spot", 90),
                *pod("vision", "llm-worker-0", "llm", "n1", gpus=8, minutes=90),
            ],
            [firing("TrainstackReservedCapacityIdle", "80m", None)],
        ),
        # -- XID and ECC -------------------------------------------------------------------
        case(
            [series("DCGM_FI_DEV_XID_ERRORS", "0 0 79x10", node="n1", gpu="3")],
            [
                firing("TrainstackGpuXidCritical", "1m", None),
                firing(
                    "TrainstackGpuXidCritical",
                    "5m",
                    {"node": "n1", "gpu": "3", "severity": "critical"},
                ),
                firing("TrainstackGpuXidError", "5m", None),
            ],
        ),
        case(
            [series("DCGM_FI_DEV_XID_ERRORS", "0 0 13x10", node="n1", gpu="3")],
            [
                firing(
                    "TrainstackGpuXidError", "5m", {"node": "n1", "gpu": "3", "severity": "warning"}
                ),
                firing("TrainstackGpuXidCritical", "5m", None),
            ],
        ),
        case(
            [series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x5 1x10", node="n1", gpu="0")],
            [
                firing("TrainstackGpuEccUncorrectable", "4m", None),
                firing(
                    "TrainstackGpuEccUncorrectable",
                    "8m",
                    {"node": "n1", "gpu": "0", "severity": "critical"},
                ),
            ],
        ),
        case(
            [series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x15", node="n1", gpu="0")],
            [firing("TrainstackGpuEccUncorrectable", "10m", None)],
        ),
        # -- training stalled: no step for 15m (last step at 11m) ---------------------------
        case(
            [runtime("trainstack_last_step_timestamp_seconds", "60+60x10 660x40")],
            [
                firing("TrainstackTrainingStalled", "20m", None),
                firing("TrainstackTrainingStalled", "35m", {**VISION, "severity": "critical"}),
            ],
        ),
        case(
            [runtime("trainstack_last_step_timestamp_seconds", "60+60x50")],
            [firing("TrainstackTrainingStalled", "45m", None)],
        ),
        # -- checkpoint stale: > 2x the job's 10m interval ---------------------------------
        case(
            [
                runtime("trainstack_last_checkpoint_timestamp_seconds", "60x60"),
                runtime("trainstack_up", "1x60"),
                series(
                    "trainstack_volcano_job_checkpoint_interval_seconds",
                    "600x60",
                    namespace="vision",
                    job_name="llm",
                ),
            ],
            [
                firing("TrainstackCheckpointStale", "15m", None),
                firing(
                    "TrainstackCheckpointStale",
                    "40m",
                    {
                        "namespace": "vision",
                        "team": "vision",
                        "job_name": "llm",
                        "severity": "warning",
                    },
                ),
            ],
        ),
        case(  # checkpoints every 10 minutes: never more than 2x late
            [
                runtime("trainstack_last_checkpoint_timestamp_seconds", step_function(10, 60)),
                runtime("trainstack_up", "1x60"),
                series(
                    "trainstack_volcano_job_checkpoint_interval_seconds",
                    "600x60",
                    namespace="vision",
                    job_name="llm",
                ),
            ],
            [firing("TrainstackCheckpointStale", "50m", None)],
        ),
        case(  # no annotation: the default interval (60m) applies; never checkpointed
            [
                *pod("vision", "llm-worker-0", "llm", "n1", gpus=8, minutes=150),
                runtime("trainstack_last_checkpoint_timestamp_seconds", "0x150"),
                runtime("trainstack_up", "1x150"),
            ],
            [
                firing("TrainstackCheckpointStale", "100m", None),
                firing(
                    "TrainstackCheckpointStale",
                    "140m",
                    {
                        "namespace": "vision",
                        "team": "vision",
                        "job_name": "llm",
                        "severity": "warning",
                    },
                ),
            ],
        ),
        # -- maximum duration: 1h, started at 0 --------------------------------------------
        case(
            [
                *pod("vision", "llm-worker-0", "llm", "n1", gpus=8, minutes=80),
                series(
                    "trainstack_volcano_job_max_duration_seconds",
                    "3600x80",
                    namespace="vision",
                    job_name="llm",
                ),
            ],
            [
                firing("TrainstackJobNearMaxDuration", "50m", None),
                firing(
                    "TrainstackJobNearMaxDuration",
                    "57m",
                    {
                        "namespace": "vision",
                        "team": "vision",
                        "job_name": "llm",
                        "severity": "warning",
                    },
                ),
                firing("TrainstackJobNearMaxDuration", "70m", None),
            ],
        ),
        # -- past the platform's stop time (the enforcer's gauge): the Command had no effect --
        # Overdue from 10m; the alert waits three passes (5m at the default interval).
        case(
            [
                series(
                    "trainstack_deadline_job_overdue_seconds",
                    "_x10 60+60x30",
                    namespace="vision",
                    team="vision",
                    job_name="llm",
                ),
                series("trainstack_deadline_last_success_timestamp_seconds", "0+60x40"),
            ],
            [
                firing("TrainstackJobOverMaxDuration", "13m", None),
                firing(
                    "TrainstackJobOverMaxDuration",
                    "16m",
                    {
                        "namespace": "vision",
                        "team": "vision",
                        "job_name": "llm",
                        "severity": "critical",
                    },
                ),
                firing("TrainstackDeadlineEnforcerDown", "30m", None),
            ],
        ),
        # -- the enforcer: passes stop at 20m; then never scraped (absent) --------------------
        case(
            [series("trainstack_deadline_last_success_timestamp_seconds", "0+60x20 1200x40")],
            [
                firing("TrainstackDeadlineEnforcerDown", "23m", None),
                firing("TrainstackDeadlineEnforcerDown", "30m", {"severity": "critical"}),
            ],
        ),
        case(
            [series("up", "1x30", job="unrelated")],
            [
                firing("TrainstackDeadlineEnforcerDown", "4m", None),
                firing("TrainstackDeadlineEnforcerDown", "6m", {"severity": "critical"}),
            ],
        ),
        # -- a job stopped at 10m (the series starts at 0 for every team) ---------------------
        case(
            [
                series(
                    "trainstack_deadline_terminations_total",
                    "0x10 1x30",
                    namespace="vision",
                    team="vision",
                ),
                series(
                    "trainstack_deadline_terminations_total", "0x40", namespace="nlp", team="nlp"
                ),
            ],
            [
                firing("TrainstackJobStoppedAtMaxDuration", "9m", None),
                firing(
                    "TrainstackJobStoppedAtMaxDuration",
                    "12m",
                    {"namespace": "vision", "team": "vision", "severity": "info"},
                ),
                firing("TrainstackJobStoppedAtMaxDuration", "25m", None),
            ],
        ),
        # -- pending in the queue (30m) ----------------------------------------------------
        case(
            [
                series(
                    "trainstack_volcano_podgroup_status_phase",
                    "1x60",
                    **VISION,
                    podgroup="llm-1",
                    phase="Pending",
                ),
                series(
                    "trainstack_volcano_podgroup_status_phase",
                    "0x60",
                    **VISION,
                    podgroup="llm-1",
                    phase="Running",
                ),
            ],
            [
                firing("TrainstackJobPendingTooLong", "20m", None),
                firing("TrainstackJobPendingTooLong", "40m", {**VISION, "severity": "warning"}),
            ],
        ),
        case(
            [
                series(
                    "trainstack_volcano_podgroup_status_phase",
                    "0x60",
                    **VISION,
                    podgroup="llm-1",
                    phase="Pending",
                ),
                series(
                    "trainstack_volcano_podgroup_status_phase",
                    "1x60",
                    **VISION,
                    podgroup="llm-1",
                    phase="Running",
                ),
            ],
            [firing("TrainstackJobPendingTooLong", "40m", None)],
        ),
        # -- step time: 1s, then 3s from 60m ------------------------------------------------
        case(
            [
                runtime("trainstack_steps_total", "0+60x120"),
                runtime("trainstack_step_seconds_total", "0+60x60 3780+180x60"),
            ],
            [
                firing("TrainstackStepTimeRegression", "55m", None),
                firing("TrainstackStepTimeRegression", "80m", {**VISION, "severity": "warning"}),
            ],
        ),
        case(
            [
                runtime("trainstack_steps_total", "0+60x120"),
                runtime("trainstack_step_seconds_total", "0+60x120"),
            ],
            [firing("TrainstackStepTimeRegression", "80m", None)],
        ),
        case(
            [runtime("trainstack_step_time_seconds", " ".join(["1 5"] * 30))],
            [
                firing("TrainstackStepTimeJitter", "10m", None),
                firing("TrainstackStepTimeJitter", "40m", {**VISION, "severity": "warning"}),
            ],
        ),
        case(
            [runtime("trainstack_step_time_seconds", "1x60")],
            [firing("TrainstackStepTimeJitter", "40m", None)],
        ),
        # -- data-loading bound: 50% of step time waiting on input (threshold 30%) -----------
        case(
            [
                runtime("trainstack_data_wait_seconds_total", "0+30x60"),
                runtime("trainstack_step_seconds_total", "0+60x60"),
            ],
            [
                firing("TrainstackDataLoadingBound", "10m", None),
                firing("TrainstackDataLoadingBound", "40m", {**VISION, "severity": "warning"}),
            ],
        ),
        case(
            [
                runtime("trainstack_data_wait_seconds_total", "0+6x60"),
                runtime("trainstack_step_seconds_total", "0+60x60"),
            ],
            [firing("TrainstackDataLoadingBound", "40m", None)],
        ),
        # -- GPU node NotReady (5m) ----------------------------------------------------------
        case(
            [
                *node("n1", "reservation", 40),
                series(
                    "kube_node_status_condition",
                    "1x5 0x35",
                    node="n1",
                    condition="Ready",
                    status="true",
                ),
                series(
                    "kube_node_status_capacity",
                    "8x40",
                    node="n1",
                    resource="nvidia_com_gpu",
                    unit="integer",
                ),
                # a CPU node NotReady is not this alert's business
                series(
                    "kube_node_status_condition",
                    "0x40",
                    node="cpu1",
                    condition="Ready",
                    status="true",
                ),
                series("kube_node_labels", "1x40", node="cpu1"),
            ],
            [
                firing("TrainstackGpuNodeNotReady", "8m", None),
                firing(
                    "TrainstackGpuNodeNotReady",
                    "20m",
                    {
                        "node": "n1",
                        "pool": "h100",
                        "capacity": "reservation",
                        "instance_type": "p5.48xlarge",
                        "severity": "critical",
                    },
                ),
            ],
        ),
    ]


def test_promtool_checks_every_rule_group(
    promtool: str, cfg: PlatformConfig, tmp_path: Path
) -> None:
    for rule in b.prometheus_rules(cfg):
        for group in rule["spec"]["groups"]:
            path = tmp_path / f"{group['name']}.yaml"
            path.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False), encoding="utf-8")
            result = run_promtool(promtool, "check", "rules", path)
            assert result.returncode == 0, result.stderr + result.stdout


def test_alerts_fire_when_they_should_and_not_otherwise(
    promtool: str, cfg: PlatformConfig, tmp_path: Path
) -> None:
    tests = alert_cases()
    covered = {c["expr"].split('"')[1] for t in tests for c in t["promql_expr_test"]}
    # The health alerts (the straggler alert is there without the gate) have their cases in
    # test_health_rules.py, which holds them to the same rule.
    alerts = {r["alert"] for r in b.alert_rules(cfg)} - {r["alert"] for r in health_alerts(cfg)}
    assert covered == alerts, f"alerts without a promtool case: {sorted(alerts - covered)}"
    result = run_promtool(promtool, "test", "rules", write_rule_tests(tmp_path, cfg, tests))
    assert result.returncode == 0, result.stdout + result.stderr


def test_accounting_two_teams(promtool: str, cfg: PlatformConfig, tmp_path: Path) -> None:
    """vision: 8 GPUs on a reserved node (10 USD/GPU-h) at 50%; nlp: 4 GPUs on a capacity
    block (4 USD/GPU-h) at 25%. After one hour: GPU-hours and cost per team."""
    inputs = [
        *node("n1", "reservation", 70),
        *node("n2", "capacityBlock", 70),
        *pod("vision", "v-0", "vit", "n1", gpus=8, minutes=70),
        *pod("nlp", "n-0", "gpt", "n2", gpus=4, minutes=70),
        *gpu_util("vision", "v-0", "n1", "50x70", gpus=8),
        *gpu_util("nlp", "n-0", "n2", "25x70", gpus=4),
    ]

    def per_team(expr: str, vision: float, nlp: float, **extra: str) -> dict[str, Any]:
        return {
            "expr": expr,
            "eval_time": "60m",
            "exp_samples": [
                {"labels": f"{{{_labels({'team': 'nlp', **extra})}}}", "value": nlp},
                {"labels": f"{{{_labels({'team': 'vision', **extra})}}}", "value": vision},
            ],
        }

    window = "[59m59s]"  # exactly the 60 one-minute samples of the last hour
    checks = [
        per_team("sum by (team) (team:trainstack_gpus_allocated:sum)", 8, 4),
        per_team("sum by (team) (team:trainstack_gpus_used:sum)", 4, 1),
        per_team(
            "sum by (team) "
            f"(sum_over_time(team:trainstack_gpu_hours_allocated:increase1m{window}))",
            8,
            4,
        ),
        per_team(
            f"sum by (team) (sum_over_time(team:trainstack_gpu_hours_used:increase1m{window}))",
            4,
            1,
        ),
        per_team(
            f"sum by (team) (sum_over_time(team:trainstack_cost_usd:increase1m{window}))", 80, 16
        ),
        per_team("sum by (team) (team:trainstack_idle_cost_usd_per_hour:sum)", 40, 12),
        {
            "expr": "queue:trainstack_gpus_allocated:sum",
            "eval_time": "60m",
            "exp_samples": [
                {
                    "labels": 'queue:trainstack_gpus_allocated:sum{team="nlp", queue="nlp"}',
                    "value": 4,
                },
                {
                    "labels": 'queue:trainstack_gpus_allocated:sum{team="vision", queue="vision"}',
                    "value": 8,
                },
            ],
        },
        {
            "expr": "training_job:trainstack_gpus_used:sum",
            "eval_time": "60m",
            "exp_samples": [
                {
                    "labels": "training_job:trainstack_gpus_used:sum"
                    '{namespace="nlp", team="nlp", queue="nlp", job_name="gpt"}',
                    "value": 1,
                },
                {
                    "labels": "training_job:trainstack_gpus_used:sum"
                    '{namespace="vision", team="vision", queue="vision", job_name="vit"}',
                    "value": 4,
                },
            ],
        },
    ]
    result = run_promtool(
        promtool, "test", "rules", write_rule_tests(tmp_path, cfg, [case(inputs, checks)])
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("alert", sorted(r["alert"] for r in b.alert_rules(platform())))
def test_runbook_links_resolve(alert: str) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "monitoring.md").read_text(
        encoding="utf-8"
    )
    assert f"### {alert}" in docs, f"docs/monitoring.md has no runbook section for {alert}"
