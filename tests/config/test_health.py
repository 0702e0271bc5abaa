"""The `health` section (issue 42): defaults from the schema and the cloud, the typed model.

Invalid settings are table-tested by the fixtures (fixtures/invalid/health-*.yaml, run by
test_loader.py); these tests hold what a fixture cannot: the defaults the loader fills."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainstack.config import PlatformConfig, load_stack_file
from trainstack.config import model as m
from trainstack.config.health import PLATFORM_PROMETHEUS_URL
from trainstack.config.schema import load_schema
from trainstack.contracts import health as contract

FIXTURES = Path(__file__).parent / "fixtures"


def _platform(name: str) -> PlatformConfig:
    config = load_stack_file(FIXTURES / "valid" / name)
    assert isinstance(config, PlatformConfig)
    return config


def test_the_gate_is_off_unless_a_stack_turns_it_on() -> None:
    health = _platform("minimal-aws.yaml").health
    assert not health.enabled
    repair = m.RepairConfig(mode="replace", prometheus_url=PLATFORM_PROMETHEUS_URL)
    assert health == m.HealthConfig(repair=repair)


@pytest.mark.parametrize(
    ("fixture", "mode"), [("minimal-aws.yaml", "replace"), ("existing-cluster.yaml", "none")]
)
def test_the_repair_mode_defaults_by_cloud(fixture: str, mode: str) -> None:
    """AWS pools are Auto Scaling groups a failed instance can be replaced in; an existing
    cluster's nodes are its owners' to repair."""
    assert _platform(fixture).health.repair.mode == mode


def test_every_setting_reaches_the_model() -> None:
    health = _platform("health-hook.yaml").health
    assert health.enabled
    assert (health.dcgm_level, health.recheck_minutes) == (3, 1)
    assert health.repair == m.RepairConfig(
        mode="hook",
        hook_url="https://repair.example.com/nodes",
        delay_minutes=10,
        prometheus_url="http://prometheus.observability.svc:9090",
    )


def test_the_model_defaults_are_the_schemas_and_the_contracts() -> None:
    """The schema holds the defaults; the dataclass repeats them for configs built in code
    (tests, the policy pack), and the DCGM level is the contract's default."""
    props = load_schema("platform.schema.json")["properties"]["health"]["properties"]
    defaults = m.HealthConfig()
    assert defaults.dcgm_level == props["dcgmLevel"]["default"] == contract.DEFAULT_DCGM_LEVEL
    assert defaults.recheck_minutes * 60 == contract.DEFAULT_RECHECK_S
    for field, key in [
        ("enabled", "enabled"),
        ("image", "image"),
        ("recheck_minutes", "recheckMinutes"),
        ("straggler_ratio", "stragglerRatio"),
        ("straggler_minutes", "stragglerMinutes"),
        ("straggler_alerts", "stragglerAlerts"),
    ]:
        assert getattr(defaults, field) == props[key]["default"], field
    repair = props["repair"]["properties"]
    assert m.RepairConfig().delay_minutes == repair["delayMinutes"]["default"]


def test_the_default_prometheus_is_the_platforms_own() -> None:
    """kube-prometheus-stack names its Prometheus Service `<release>-prometheus` on 9090 in
    the monitoring namespace (config/health.py cites the chart)."""
    from trainstack.builders.monitoring.common import KPS_RELEASE, NAMESPACE  # noqa: PLC0415

    assert f"http://{KPS_RELEASE}-prometheus.{NAMESPACE}.svc:9090" == PLATFORM_PROMETHEUS_URL


def test_health_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.HealthConfig().enabled = True  # type: ignore[misc]
