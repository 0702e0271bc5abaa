"""Shared helpers: a small platform config with monitoring, and promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainstack.builders import monitoring as b
from trainstack.config.loader import PLATFORM_KEY, parse_stack_config
from trainstack.config.model import PlatformConfig

THRESHOLDS = {
    "gpuIdleUtilizationPercent": 10,
    "gpuIdleMinutes": 30,
    "reservedIdleMinutes": 60,
    "stallMinutes": 15,
    "checkpointIntervalMinutes": 60,
    "pendingMinutes": 30,
    "maxDurationWarnRatio": 0.9,
    "dataWaitRatio": 0.3,
    "dataWaitMinutes": 15,
    "stepTimeRegressionRatio": 1.5,
    "stepTimeJitterRatio": 0.5,
    "nodeNotReadyMinutes": 5,
}
PRICES = [
    # 80 USD per p5.48xlarge hour = 10 USD per GPU-hour.
    {"instanceType": "p5.48xlarge", "capacity": "reservation", "usdPerInstanceHour": 80},
    {"instanceType": "p5.48xlarge", "capacity": "capacityBlock", "usdPerGpuHour": 4},
]


def platform_doc(**monitoring: Any) -> dict[str, Any]:
    team = {"owners": ["lead@example.com"], "quota": {"gpus": 8}}
    return {
        "cloud": "aws",
        "environment": "production",
        "kubernetesVersion": "1.33",
        "scheduling": {"deadlines": {"image": f"registry.example.com/deadlines@sha256:{'0' * 64}"}},
        "aws": {
            "region": "us-east-1",
            "network": {
                "vpcCidr": "10.0.0.0/16",
                "availabilityZones": ["us-east-1a", "us-east-1b"],
            },
        },
        "gpuPools": [
            {
                "name": "h100",
                "instanceType": "p5.48xlarge",
                "fabric": "efa",
                "availabilityZone": "us-east-1a",
                "capacity": {"type": "reservation", "reservationId": "cr-0a1b2c3d4e5f60718"},
                "size": {"min": 2, "desired": 2, "max": 2},
            }
        ],
        "registry": {
            "groups": [],
            "teams": [{"name": "vision", **team}, {"name": "nlp", **team}],
        },
        "monitoring": {"thresholds": THRESHOLDS, "prices": PRICES, **monitoring},
    }


def platform(doc: dict[str, Any] | None = None) -> PlatformConfig:
    cfg = parse_stack_config(
        {PLATFORM_KEY: doc or platform_doc()}, stack="test", source="test.yaml"
    )
    assert isinstance(cfg, PlatformConfig)
    return cfg


@pytest.fixture(scope="session")
def cfg() -> PlatformConfig:
    return platform()


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def run_promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, check=False, timeout=300
    )


def write_rules(cfg: PlatformConfig, path: Path) -> Path:
    """The rule groups exactly as the PrometheusRule CRs carry them."""
    groups = [g for rule in b.prometheus_rules(cfg) for g in rule["spec"]["groups"]]
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False), encoding="utf-8")
    return path


def write_rule_tests(tmp_path: Path, cfg: PlatformConfig, tests: list[Any]) -> Path:
    """`cfg`'s rules and a `promtool test rules` file of `tests` over them, in `tmp_path`."""
    write_rules(cfg, tmp_path / "rules.yaml")
    path = tmp_path / "rules_test.yaml"
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def rule_tests_pass(promtool: str, cfg: PlatformConfig, tmp_path: Path, tests: list[Any]) -> str:
    """Run `tests` over `cfg`'s rules with promtool; fail with its output unless all pass."""
    result = run_promtool(promtool, "test", "rules", write_rule_tests(tmp_path, cfg, tests))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
