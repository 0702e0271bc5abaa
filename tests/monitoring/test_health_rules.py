"""The node health gate's alerts and the straggler alert under promtool (issue 42 #4, #6).

Each alert has a case where it fires, with the exact labels, and one where it must not. The
gate's alerts exist only with `health.enabled`; the straggler alert always (it reads the
training runtime's metrics). The configs come through the loader, as a stack's would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring.conftest import (
    platform,
    platform_doc,
    rule_tests_pass,
    run_promtool,
    write_rule_tests,
)
from tests.monitoring.test_objects import _grafana_free, _recorded, _selectors
from tests.monitoring.test_rules import VISION, case, firing, series
from trainstack.builders import dashboards as d
from trainstack.builders import monitoring as b
from trainstack.builders.metric_sources import exported_metrics
from trainstack.builders.monitoring import health
from trainstack.config.model import PlatformConfig

STRAGGLER = health.STRAGGLER_ALERT
FAILED = health.FAILED_ALERT
UNGATED = health.UNGATED_ALERT
POOL_SHORT = health.POOL_ALERT
REPAIR = health.REPAIR_ALERT
HEALTH_IMAGE = "registry.example.com/trainstack/health@sha256:" + "1" * 64


def health_doc(doc: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
    """A platform document with the gate enabled (and `settings` in its health section)."""
    doc = doc or platform_doc()
    return {**doc, "health": {"enabled": True, "image": HEALTH_IMAGE, **settings}}


def gated_platform(**settings: Any) -> PlatformConfig:
    return platform(health_doc(**settings))


@pytest.fixture
def gated() -> PlatformConfig:
    return gated_platform()


# -- series ----------------------------------------------------------------------------------


def agent(
    node: str, passed: str, last_check: str, *, pool: str = "h100", pod: str = ""
) -> list[dict[str, str]]:
    """The agent's series as its PodMonitor scrapes them: its own `node` and `pool`
    (honorLabels) and the scrape's target labels, which name the agent's pod."""
    target = {
        "namespace": "trainstack-system",
        "pod": pod or f"trainstack-health-agent-{node}",
        "instance": f"10.0.1.{len(node)}:8080",
        "container": "agent",
        "job": "trainstack-system/trainstack-health-agent",
    }
    return [
        series("trainstack_node_health_passed", passed, node=node, pool=pool, **target),
        series(
            "trainstack_node_health_last_check_timestamp_seconds",
            last_check,
            node=node,
            pool=pool,
            **target,
        ),
    ]


def ungated(node: str, values: str) -> dict[str, str]:
    return series(
        "trainstack_node_health_ungated_total",
        values,
        node=node,
        pool="h100",
        pod=f"trainstack-health-agent-{node}",
        container="agent",
    )


def repair_errors(operation: str, values: str) -> dict[str, str]:
    return series(
        "trainstack_node_repair_errors_total",
        values,
        operation=operation,
        pod="trainstack-health-repair-0",
        container="repair",
    )


def rank(
    number: int, node: str, *, steps: str, step_seconds: str, comm: str = "0x60"
) -> list[dict[str, str]]:
    """One rank's runtime counters as the training PodMonitor labels them (its pod's node
    relabelled into `node`; `instance` and `container` are the scrape's own)."""
    labels = {
        **VISION,
        "pool": "h100",
        "node": node,
        "pod": f"llm-worker-{number // 2}",
        "rank": str(number),
        "instance": f"10.0.0.{number // 2}:8080",
        "container": "trainer",
    }
    return [
        series("trainstack_steps_total", steps, **labels),
        series("trainstack_step_seconds_total", step_seconds, **labels),
        series("trainstack_comm_seconds_total", comm, **labels),
    ]


def straggler_labels(number: int, node: str) -> dict[str, str]:
    return {
        **VISION,
        "pool": "h100",
        "node": node,
        "pod": f"llm-worker-{number // 2}",
        "rank": str(number),
        "severity": "warning",
    }


ONE_S = {"steps": "0+60x60", "step_seconds": "0+60x60"}  # a step per second, 1 s each


def straggler_cases() -> list[dict[str, Any]]:
    """Four ranks on two nodes; the default ratio 1.25 for 30m (health.stragglerMinutes)."""
    return [
        # rank 3 (node n2) takes 2 s a step, the others 1 s: 2 > 1.25 x median 1. Slow from
        # the start, it has been for under 30m at 25m: pending, not firing.
        case(
            [
                *rank(0, "n1", **ONE_S),
                *rank(1, "n1", **ONE_S),
                *rank(2, "n2", **ONE_S),
                *rank(3, "n2", steps="0+30x60", step_seconds="0+60x60"),
            ],
            [
                firing(STRAGGLER, "25m", None),
                firing(STRAGGLER, "40m", straggler_labels(3, "n2")),
            ],
        ),
        # Synchronous training: every rank's wall step is 2 s, but ranks 0-2 wait 1 s of it in
        # the all-reduce for rank 3. Outside communication rank 3 is the slow one.
        case(
            [
                *(
                    s
                    for r in range(3)
                    for s in rank(r, "n1", steps="0+30x60", step_seconds="0+60x60", comm="0+30x60")
                ),
                *rank(3, "n2", steps="0+30x60", step_seconds="0+60x60"),
            ],
            [firing(STRAGGLER, "40m", straggler_labels(3, "n2"))],
        ),
        # 1.2 s against a median of 1 s: below the ratio, silent
        case(
            [
                *rank(0, "n1", **ONE_S),
                *rank(1, "n1", **ONE_S),
                *rank(2, "n2", **ONE_S),
                *rank(3, "n2", steps="0+50x60", step_seconds="0+60x60"),
            ],
            [firing(STRAGGLER, "40m", None)],
        ),
    ]


def failed_cases() -> list[dict[str, Any]]:
    failed = {"node": "n2", "pool": "h100", "severity": "critical"}
    return [
        # n2 fails its check at 5m; n1 passes
        case(
            [*agent("n1", "1x30", "60+60x30"), *agent("n2", "1x5 0x25", "60+60x30")],
            [
                firing(FAILED, "8m", None),  # failed for 3m: not yet 5m
                firing(FAILED, "15m", failed),
            ],
        ),
        # no check has finished yet (timestamp 0): not a failure, silent
        case([*agent("n2", "0x30", "0x30")], [firing(FAILED, "20m", None)]),
        # the last check ended at 1m and nothing since: the node is still failed and still
        # tainted (a re-check that fails again leaves the series as it was)
        case(
            [*agent("n2", "0x200", "60x200")],
            [firing(FAILED, "20m", failed), firing(FAILED, "200m", failed)],
        ),
        # The agent pod on n2 is replaced at 10m: the new one reports the failure again at
        # 12m. One alert for the node, without the pods' labels, across the change.
        case(
            [
                *agent("n2", "0x10", "60x10", pod="trainstack-health-agent-old"),
                *agent("n2", "_x10 0x30", "_x10 0 0 720x28", pod="trainstack-health-agent-new"),
            ],
            [firing(FAILED, "8m", failed), firing(FAILED, "30m", failed)],
        ),
        # a failed node that passes a re-check at 20m: resolved
        case(
            [*agent("n2", "0x20 1x20", "60x20 1260x20")],
            [firing(FAILED, "15m", failed), firing(FAILED, "22m", None)],
        ),
    ]


def ungated_cases() -> list[dict[str, Any]]:
    n3 = {"node": "n3", "pool": "h100", "severity": "warning"}
    return [
        # The agent creates the counter and increments it at once (no 0 sample): the series
        # appears at 1 when n3 registers at 10m. Fires at once, for an hour.
        case(
            [ungated("n3", "_x10 1x90"), ungated("n1", "0x100")],
            [
                firing(UNGATED, "9m", None),
                firing(UNGATED, "11m", n3),
                firing(UNGATED, "60m", n3),
                firing(UNGATED, "80m", None),
            ],
        ),
        # a counter the agent set to 0 at start, incremented at 20m
        case(
            [ungated("n3", "0x20 1x80")],
            [
                firing(UNGATED, "19m", None),
                firing(UNGATED, "22m", n3),
                firing(UNGATED, "95m", None),
            ],
        ),
        # registered with the taint: the counter stays 0, silent
        case([ungated("n3", "0x100")], [firing(UNGATED, "30m", None)]),
    ]


def pool_cases() -> list[dict[str, Any]]:
    """The queues guarantee 16 GPUs on h100 (two teams x 8): 2 p5 nodes."""
    short = {"pool": "h100", "needed": "2", "severity": "critical"}
    return [
        case(
            [*agent("n1", "1x30", "60+60x30"), *agent("n2", "1x5 0x25", "60+60x30")],
            [
                firing(POOL_SHORT, "12m", None),  # short for 7m: not yet
                firing(POOL_SHORT, "20m", short),
            ],
        ),
        case(
            [*agent("n1", "1x30", "60+60x30"), *agent("n2", "1x30", "60+60x30")],
            [firing(POOL_SHORT, "20m", None)],
        ),
        # n1's agent reports twice (its old and new pod overlap): n1 still counts once
        case(
            [
                *agent("n1", "1x30", "60+60x30", pod="old"),
                *agent("n1", "1x30", "60+60x30", pod="new"),
                *agent("n2", "0x30", "60+60x30"),
            ],
            [firing(POOL_SHORT, "20m", short)],
        ),
        # no node of the pool reports at all: 0 healthy nodes
        case(
            [series("up", "1x30", job="unrelated")],
            [firing(POOL_SHORT, "20m", short)],
        ),
    ]


def repair_cases() -> list[dict[str, Any]]:
    drain = {"operation": "drain", "severity": "warning"}
    replace = {"operation": "replace", "severity": "warning"}
    return [
        # one failed drain at 10m on a counter initialised at 0
        case(
            [repair_errors("drain", "0x10 1x30"), repair_errors("replace", "0x40")],
            [
                firing(REPAIR, "9m", None),
                firing(REPAIR, "12m", drain),
                firing(REPAIR, "30m", None),  # no new error in 15m
            ],
        ),
        # the first failed replace creates the series at 1
        case(
            [repair_errors("replace", "_x10 1x30")],
            [firing(REPAIR, "11m", replace), firing(REPAIR, "30m", None)],
        ),
    ]


def gate_cases() -> list[dict[str, Any]]:
    return [*failed_cases(), *ungated_cases(), *pool_cases(), *repair_cases()]


def test_gate_alerts_fire_when_they_should_and_not_otherwise(
    promtool: str, gated: PlatformConfig, tmp_path: Path
) -> None:
    tests = [*gate_cases(), *straggler_cases()]
    covered = {c["expr"].split('"')[1] for t in tests for c in t["promql_expr_test"]}
    wanted = {r["alert"] for r in health.health_alerts(gated)}
    assert wanted == {FAILED, UNGATED, POOL_SHORT, REPAIR, STRAGGLER}
    assert covered == wanted
    rule_tests_pass(promtool, gated, tmp_path, tests)


def test_the_straggler_alert_fires_without_the_gate(
    promtool: str, cfg: PlatformConfig, tmp_path: Path
) -> None:
    assert [r["alert"] for r in health.health_alerts(cfg)] == [STRAGGLER]
    rule_tests_pass(promtool, cfg, tmp_path, straggler_cases())


@pytest.mark.parametrize(
    ("settings", "case_index"),
    [
        # 1.2 s against 1 s fires at a ratio of 1.1 (the silent case expects nothing)
        pytest.param({"stragglerRatio": 1.1}, 2, id="ratio"),
        # a 2 s rank has been slow for 25m at 25m: firing when 20m is enough
        pytest.param({"stragglerMinutes": 20}, 0, id="minutes"),
    ],
)
def test_the_straggler_settings_reach_the_rule(
    promtool: str, tmp_path: Path, settings: dict[str, Any], case_index: int
) -> None:
    """The harness can fail, and the config's settings are the rule's: under other settings
    the default's case fails."""
    cfg = gated_platform(**settings)
    path = write_rule_tests(tmp_path, cfg, [straggler_cases()[case_index]])
    result = run_promtool(promtool, "test", "rules", path)
    assert result.returncode != 0
    assert STRAGGLER in result.stdout + result.stderr


def test_the_gate_has_no_alerts_and_no_monitors_when_disabled(cfg: PlatformConfig) -> None:
    assert not cfg.health.enabled  # the default
    assert [r["alert"] for r in health.health_alerts(cfg)] == [STRAGGLER]
    assert health.pod_monitors(cfg) == []


def test_needed_nodes_follow_the_capacity_arithmetic() -> None:
    """Guarantees over whole nodes; a team that may use two pools needs on each only what the
    other's firm capacity cannot carry."""
    doc = platform_doc()
    a100 = {
        "name": "a100",
        "instanceType": "p4d.24xlarge",
        "fabric": "efa",
        "availabilityZone": "us-east-1a",
        "capacity": {"type": "onDemand"},
        "size": {"min": 1, "desired": 1, "max": 4},
    }
    doc["gpuPools"] = [*doc["gpuPools"], a100]
    doc["monitoring"]["prices"] = [
        *doc["monitoring"]["prices"],
        {"instanceType": "p4d.24xlarge", "capacity": "onDemand", "usdPerGpuHour": 4},
    ]
    teams = doc["registry"]["teams"]
    # vision: 12 GPUs on h100 only (2 nodes of 8); nlp: 10 on either pool. h100's firm 16
    # GPUs less vision's 12 leave 4 of nlp's; a100 (1 firm node) takes 8 of them; so h100
    # must carry 2 of nlp's: 14 GPUs, 2 nodes; a100 must carry 10 - 4 = 6: 1 node.
    teams[0] = {**teams[0], "quota": {"gpus": 12}, "pools": ["h100"]}
    teams[1] = {**teams[1], "quota": {"gpus": 10}}
    assert health.needed_nodes(platform(doc)) == {"h100": 2, "a100": 1}
    alert = next(
        r for r in health.health_alerts(platform(health_doc(doc))) if r["alert"] == POOL_SHORT
    )
    assert 'vector(2), "pool", "h100"' in alert["expr"]
    assert 'vector(1), "pool", "a100"' in alert["expr"]


def test_no_pool_alert_without_guarantees() -> None:
    doc = platform_doc()
    # nothing guaranteed (quota.gpus), only fair shares
    doc["registry"]["teams"] = [
        {**t, "quota": {"gpus": 0, "deserved": 8}} for t in doc["registry"]["teams"]
    ]
    cfg = platform(health_doc(doc))
    assert health.needed_nodes(cfg) == {}
    assert POOL_SHORT not in {r["alert"] for r in health.health_alerts(cfg)}


def test_monitors_keep_the_programs_node_and_pool_labels(gated: PlatformConfig) -> None:
    monitors = {m["metadata"]["name"]: m for m in b.pod_monitors(gated)}
    for app in (health.AGENT_APP, health.REPAIR_APP):
        spec = monitors[app]["spec"]
        assert spec["namespaceSelector"] == {"matchNames": ["trainstack-system"]}
        assert spec["selector"] == {"matchLabels": {"app.kubernetes.io/name": app}}
        (endpoint,) = spec["podMetricsEndpoints"]
        assert endpoint["port"] == "metrics"
        assert endpoint["honorLabels"] is True
        assert "relabelings" not in endpoint  # nothing may overwrite node or pool


def test_runtime_series_carry_the_pods_node(cfg: PlatformConfig) -> None:
    """The straggler alert names the node from the runtime PodMonitor's relabelling."""
    training = [m for m in b.pod_monitors(cfg) if m["metadata"]["name"] == "trainstack-training"]
    assert training
    for monitor in training:
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
        } in endpoint["relabelings"]


def test_every_health_alert_has_a_runbook_link(gated: PlatformConfig) -> None:
    for rule in health.health_alerts(gated):
        assert rule["annotations"]["runbook_url"] == (f"docs/monitoring.md#{rule['alert'].lower()}")


@pytest.mark.parametrize(
    "alert", sorted(r["alert"] for r in health.health_alerts(gated_platform()))
)
def test_health_runbooks_resolve(alert: str) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "monitoring.md").read_text(
        encoding="utf-8"
    )
    assert f"### {alert}" in docs, f"docs/monitoring.md has no runbook section for {alert}"


def test_the_repair_controller_counts_the_straggler_alerts_firings_by_node(
    promtool: str, gated: PlatformConfig, tmp_path: Path
) -> None:
    """The repair controller's query (images/health repair/decide.py straggler_query) over the
    ALERTS series this rule writes: one episode of rank 3 straggling on n2, after both nodes'
    last checks (at 1m), counts once for n2, and n1 (no straggler) is not named."""
    from trainstack_health.repair.decide import (  # noqa: PLC0415 - the image's package
        STRAGGLER_ALERT,
        straggler_query,
    )

    assert STRAGGLER_ALERT == STRAGGLER
    episode = straggler_cases()[0]
    checked = [s for node in ("n1", "n2") for s in agent(node, "1x60", "60x60")]
    episode = {**episode, "input_series": [*episode["input_series"], *checked]}
    check = {
        "expr": straggler_query(),
        "eval_time": "55m",
        "exp_samples": [{"labels": '{node="n2"}', "value": 1}],
    }
    rule_tests_pass(promtool, gated, tmp_path, [{**episode, "promql_expr_test": [check]}])


def test_the_cluster_dashboard_shows_the_gate_when_it_is_on(
    cfg: PlatformConfig, gated: PlatformConfig, promtool: str, tmp_path: Path
) -> None:
    """A "Node health gate" row of known metrics (the contract's), which Prometheus parses."""
    extra = sorted(set(d.dashboard_exprs(gated)) - set(d.dashboard_exprs(cfg)))
    assert len(extra) == 5
    used = set().union(*(_selectors(_grafana_free(e)) for e in extra))
    assert used <= set(exported_metrics()) | _recorded(gated)
    assert {m for m in used if m.startswith("trainstack_node_")} == {
        "trainstack_node_health_passed",
        "trainstack_node_health_last_check_timestamp_seconds",
        "trainstack_node_repairs_total",
        "trainstack_node_health_check_duration_seconds",
        "trainstack_node_health_busbw_gbps",
    }
    rules = [
        {"record": f"dashboard:expr_{i}:check", "expr": _grafana_free(e)}
        for i, e in enumerate(extra)
    ]
    path = tmp_path / "dashboards.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = run_promtool(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stderr
