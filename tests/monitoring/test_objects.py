"""Monitoring objects: CRD conformance, metric names against the exporters, dashboards,
Helm values, the Alertmanager config and config errors."""

from __future__ import annotations

import json
from pathlib import Path

import promql_parser
import pytest
import yaml

from tests.conformance.crds import crd_errors
from tests.monitoring.conftest import platform, platform_doc, run_promtool
from trainstack.builders import dashboards as d
from trainstack.builders import monitoring as b
from trainstack.builders.metric_sources import DCGM_COUNTERS, dcgm_counters_csv, exported_metrics
from trainstack.config.errors import ConfigError
from trainstack.config.model import PlatformConfig


def _custom_resources(cfg: PlatformConfig) -> list[dict[str, object]]:
    return [*b.prometheus_rules(cfg), *b.service_monitors(cfg), *b.pod_monitors(cfg)]


@pytest.mark.parametrize("plugin", ["nvidia-device-plugin", "gpu-operator"])
def test_every_monitoring_cr_validates_against_the_operator_crds(
    reference: Path, plugin: str
) -> None:
    doc = platform_doc()
    doc["gpu"] = {"devicePlugin": plugin}
    cfg = platform(doc)
    kinds = set()
    for manifest in _custom_resources(cfg):
        kinds.add(manifest["kind"])
        errors = crd_errors(reference, manifest)
        assert not errors, f"{manifest['kind']} {manifest['metadata']}: {errors}"
    assert kinds == {"PrometheusRule", "ServiceMonitor", "PodMonitor"}


# -- metric names -------------------------------------------------------------------------


def _selectors(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
        for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                visit(child)
        for arg in getattr(node, "args", None) or []:
            visit(arg)

    visit(promql_parser.parse(expr))
    return names


def _grafana_free(expr: str) -> str:
    """Grafana variables replaced by values PromQL accepts."""
    return (
        expr.replace("$__range", "1h")
        .replace("$__rate_interval", "5m")
        .replace("$team", "t")
        .replace("$namespace", "n")
        .replace("$job_name", "j")
    )


def _recorded(cfg: PlatformConfig) -> set[str]:
    return {r["record"] for g in b.rule_groups(cfg) for r in g["rules"] if "record" in r}


def test_the_parser_walks_nested_expressions() -> None:
    expr = (
        "sum by (a) (rate(x_total[5m])) / on (a) group_left () "
        'max(label_replace(y, "b", "$1", "c", "(.*)"))'
    )
    assert _selectors(expr) == {"x_total", "y"}


def test_rule_metrics_come_from_documented_exporters(cfg: PlatformConfig) -> None:
    known = exported_metrics()
    recorded = _recorded(cfg)
    unknown = {}
    for group in b.rule_groups(cfg):
        for rule in group["rules"]:
            missing = _selectors(rule["expr"]) - set(known) - recorded
            if missing:
                unknown[rule.get("alert") or rule.get("record")] = sorted(missing)
    assert not unknown, f"metrics no documented exporter produces: {unknown}"


def test_dashboard_expressions_parse_and_use_known_metrics(
    cfg: PlatformConfig, promtool: str, tmp_path: Path
) -> None:
    known = set(exported_metrics()) | _recorded(cfg)
    exprs = d.dashboard_exprs(cfg)
    assert len(exprs) > 20
    unknown = {e: sorted(_selectors(_grafana_free(e)) - known) for e in exprs}
    assert not {e: m for e, m in unknown.items() if m}
    assert set(d.variable_metrics()) <= known
    # promtool parses them too (Prometheus' own parser), as a synthetic rule file.
    rules = [
        {"record": f"dashboard:expr_{i}:check", "expr": _grafana_free(e)}
        for i, e in enumerate(exprs)
    ]
    path = tmp_path / "dashboards.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = run_promtool(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stderr


def test_dcgm_csv_is_the_allow_list() -> None:
    lines = [line for line in dcgm_counters_csv().splitlines() if not line.startswith("#")]
    assert [line.split(",")[0] for line in lines] == [name for name, _, _ in DCGM_COUNTERS]


# -- dashboards -----------------------------------------------------------------------------


def test_dashboards_are_configmaps_for_the_sidecar(cfg: PlatformConfig) -> None:
    maps = d.dashboard_configmaps(cfg)
    assert [m["metadata"]["name"] for m in maps] == [
        "trainstack-cluster-dashboard",
        "trainstack-team-dashboard",
        "trainstack-job-dashboard",
        "trainstack-fairness-dashboard",
    ]
    for manifest in maps:
        assert manifest["metadata"]["namespace"] == b.NAMESPACE
        assert manifest["metadata"]["labels"]["grafana_dashboard"] == "1"
        (text,) = manifest["data"].values()
        model = json.loads(text)
        assert model["uid"].startswith("trainstack-")
        assert all(
            p["datasource"]["uid"] == "prometheus" for p in model["panels"] if "targets" in p
        )
    assert d.dashboards(cfg) == d.dashboards(cfg)  # deterministic


# -- values and config ----------------------------------------------------------------------


def test_stack_values(cfg: PlatformConfig) -> None:
    values = b.kps_values(cfg)
    assert values["alertmanager"]["enabled"] is True
    spec = values["prometheus"]["prometheusSpec"]
    assert spec["retention"] == "15d"
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "gp3-encrypted"
    assert claim["resources"]["requests"]["storage"] == "100Gi"
    assert spec["ruleSelectorNilUsesHelmValues"] is False
    assert values["grafana"]["sidecar"]["dashboards"]["label"] == "grafana_dashboard"
    assert values["grafana"]["adminPassword"] == ""  # never the chart's well-known default
    dcgm = b.dcgm_values(cfg)
    assert dcgm["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    terms = dcgm["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"


def test_alertmanager_routes_keep_secrets_out_of_the_plan() -> None:
    doc = platform_doc(
        alertmanager={
            "receivers": [
                {
                    "name": "pager",
                    "severities": ["critical"],
                    "pagerduty": {"routingKeySecret": {"name": "am-pd", "key": "key"}},
                },
                {
                    "name": "vision",
                    "teams": ["vision"],
                    "slack": {
                        "channel": "#vision",
                        "webhookSecret": {"name": "am-slack", "key": "vision"},
                    },
                },
            ]
        }
    )
    cfg = platform(doc)
    values = b.kps_values(cfg)["alertmanager"]
    assert values["alertmanagerSpec"]["secrets"] == ["am-pd", "am-slack"]
    conf = values["config"]
    routes = {r["receiver"]: r["matchers"] for r in conf["route"]["routes"]}
    assert routes["pager"] == ['severity=~"critical"']
    assert routes["vision"] == ['severity=~"critical|warning"', 'team=~"vision"']
    slack = next(r for r in conf["receivers"] if r["name"] == "vision")["slack_configs"][0]
    assert slack["api_url_file"] == "/etc/alertmanager/secrets/am-slack/vision"
    assert "api_url" not in slack


@pytest.mark.parametrize(
    ("monitoring", "message"),
    [
        (
            {
                "alertmanager": {
                    "receivers": [
                        {"name": "x", "teams": ["visoin"], "webhook": {"url": "https://h/x"}}
                    ]
                }
            },
            "monitoring.alertmanager.receivers[0].teams[0]: unknown team 'visoin' "
            "(did you mean 'vision'?); registry.teams has: nlp, vision",
        ),
        (
            {"alertmanager": {"receivers": [{"name": "x"}]}},
            "monitoring.alertmanager.receivers[0]: receiver 'x' has no channel; "
            "add slack, webhook or pagerduty",
        ),
        (
            {"prices": [{"instanceType": "p9.huge", "capacity": "spot", "usdPerInstanceHour": 3}]},
            "monitoring.prices[0].instanceType: 'p9.huge' is not in the instance catalog, "
            "so its GPU count is unknown; use usdPerGpuHour instead",
        ),
        (
            {"prices": [{"instanceType": "p5.48xlarge", "capacity": "spot"}]},
            "monitoring.prices[0]: give exactly one of usdPerInstanceHour or usdPerGpuHour",
        ),
        (
            {"retention": "15 days"},
            "trainstack:platform.monitoring.retention: '15 days' does not match",
        ),
    ],
)
def test_config_errors_name_field_value_and_fix(
    monitoring: dict[str, object], message: str
) -> None:
    doc = platform_doc()
    doc["monitoring"] = {**doc["monitoring"], **monitoring}
    with pytest.raises(ConfigError) as err:
        platform(doc)
    assert message in str(err.value)
