"""The fairness recording rules (builders/monitoring/fairness.py) under promtool, fed with the
series Volcano v1.15.1 exports (pkg/scheduler/metrics/queue.go, metrics.go): queue scalars
in milli-units labelled `queue_name` and `resource`, per-job scheduling durations in ms."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.monitoring.conftest import platform, platform_doc, rule_tests_pass
from trainstack.builders.dashboards import dashboards
from trainstack.builders.monitoring import fairness as f
from trainstack.builders.monitoring import fairness_rules
from trainstack.config.model import PlatformConfig, Registry

GPU = "nvidia.com/gpu"


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f'{k}="{v}"' for k, v in labels.items())


def queue_metric(kind: str, queue: str, value: float, resource: str = GPU) -> dict[str, str]:
    """One Volcano queue gauge, as scraped (with the scrape's own labels)."""
    labels = {"queue_name": queue, "resource": resource, "job": "volcano-scheduler"}
    return {
        "series": f"volcano_queue_{kind}_scalar_resources{{{_labels(labels)}}}",
        "values": f"{value:g}x30",
    }


def wait(queue: str, job: str, ms: float) -> dict[str, str]:
    labels = {"job_name": job, "queue": queue, "job_namespace": queue, "job": "volcano-scheduler"}
    return {
        "series": f"volcano_e2e_job_scheduling_duration{{{_labels(labels)}}}",
        "values": f"{ms:g}x30",
    }


def per_team(expr: str, values: dict[str, float], **extra: str) -> dict[str, Any]:
    """At 20m, `expr` is exactly one sample per team of `values` (labels team, queue)."""
    return {
        "expr": f"{expr}{{{_labels(extra)}}}" if extra else expr,
        "eval_time": "20m",
        "exp_samples": [
            {"labels": f"{expr}{{{_labels({'team': t, 'queue': t, **extra})}}}", "value": v}
            for t, v in sorted(values.items())
        ],
    }


INPUTS = [
    # vision: 12 GPUs allocated of 8 deserved, 4 more requested by pending tasks.
    queue_metric("allocated", "vision", 12000),
    queue_metric("deserved", "vision", 8000),
    queue_metric("request", "vision", 16000),
    queue_metric("capacity", "vision", 16000),
    # nlp: 2 of 8 deserved, nothing pending: 6 unused, of which vision borrows 4.
    queue_metric("allocated", "nlp", 2000),
    queue_metric("deserved", "nlp", 8000),
    queue_metric("request", "nlp", 2000),
    queue_metric("capacity", "nlp", 16000),
    # Not a team's: the organisation queue (hierarchical mode), and CPU of a team queue.
    queue_metric("allocated", "root", 14000),
    queue_metric("deserved", "root", 16000),
    queue_metric("allocated", "vision", 96000, resource="cpu"),
    wait("vision", "a", 60_000),
    wait("vision", "b", 120_000),
    wait("vision", "c", 300_000),
    wait("nlp", "d", 30_000),
    wait("someone-else", "e", 1_000_000),
]


def checks() -> list[dict[str, Any]]:
    return [
        per_team(f.ALLOCATED, {"vision": 12, "nlp": 2}),
        per_team(f.DESERVED, {"vision": 8, "nlp": 8}),
        per_team(f.CAPABILITY, {"vision": 16, "nlp": 16}),
        per_team(f.GUARANTEED, {"vision": 8, "nlp": 8}),  # the config's quota.gpus
        per_team(f.PENDING, {"vision": 4, "nlp": 0}),
        per_team(f.BORROWED, {"vision": 4, "nlp": 0}),
        per_team(f.UNUSED_SHARE, {"vision": 0, "nlp": 6}),
        # All 4 borrowed GPUs come out of nlp's 6 unused ones.
        per_team(f.LENT, {"vision": 0, "nlp": 4}),
        per_team(f.SHARE_RATIO, {"vision": 1.5, "nlp": 0.25}),
        # Prometheus' quantile interpolates: 60, 120, 300 s -> p50 120, p90 120 + 0.8 * 180.
        per_team(f.WAIT, {"vision": 120, "nlp": 30}, quantile="0.5"),
        per_team(f.WAIT, {"vision": 264, "nlp": 30}, quantile="0.9"),
    ]


def test_fairness_per_team_queue(promtool: str, cfg: PlatformConfig, tmp_path: Path) -> None:
    test = {"interval": "1m", "input_series": INPUTS, "promql_expr_test": checks()}
    rule_tests_pass(promtool, cfg, tmp_path, [test])


def test_lent_is_capped_by_what_is_unused(
    promtool: str, cfg: PlatformConfig, tmp_path: Path
) -> None:
    """More borrowed than unused (deserved shares summing over the cluster): each lender lends
    all its unused share, no more; nobody borrowing: nothing is lent."""
    over = [
        queue_metric("allocated", "vision", 12000),
        queue_metric("deserved", "vision", 4000),
        queue_metric("allocated", "nlp", 2000),
        queue_metric("deserved", "nlp", 4000),
    ]
    idle = [
        queue_metric("allocated", "vision", 0),
        queue_metric("deserved", "vision", 8000),
        queue_metric("allocated", "nlp", 0),
        queue_metric("deserved", "nlp", 8000),
    ]
    tests = [
        {
            "interval": "1m",
            "input_series": over,
            "promql_expr_test": [
                per_team(f.LENT, {"vision": 0, "nlp": 2}),
                per_team(f.BORROWED, {"vision": 8, "nlp": 0}),
            ],
        },
        {
            "interval": "1m",
            "input_series": idle,
            "promql_expr_test": [
                per_team(f.LENT, {"vision": 0, "nlp": 0}),
            ],
        },
    ]
    rule_tests_pass(promtool, cfg, tmp_path, tests)


def test_no_teams_no_fairness_rules_nor_dashboard(cfg: PlatformConfig) -> None:
    bare = replace(cfg, registry=Registry(groups=(), teams=()))
    assert fairness_rules(bare) == []
    assert "trainstack-fairness" not in dashboards(bare)
    assert "trainstack-fairness" in dashboards(cfg)


def test_guarantee_is_each_teams_quota() -> None:
    doc = platform_doc()
    doc["registry"]["teams"][0]["quota"] = {"gpus": 4}
    rules = {r["record"]: r["expr"] for r in fairness_rules(platform(doc))}
    assert 'vector(4), "team", "vision"' in rules[f.GUARANTEED]
    assert 'vector(8), "team", "nlp"' in rules[f.GUARANTEED]
