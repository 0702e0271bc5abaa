"""Image pre-pull's recording rules and alert under promtool (issue 48 #4, docs/prepull.md).

The alert fires, with the exact labels, for an image a pre-pull pod cannot pull on a node of its
pool, and not for one still pulling, one pulled, nor a team's own pod with the same error. The
series are shaped as kube-state-metrics exports them (labels namespace, pod, container, reason /
image / node; kube_node_labels with the allow-listed trainstack.io/pool)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.monitoring.conftest import platform, platform_doc, rule_tests_pass
from tests.monitoring.test_objects import _grafana_free, _selectors
from tests.monitoring.test_rules import case, firing, series
from trainstack.builders import dashboards as d
from trainstack.builders import monitoring as b
from trainstack.builders.metric_sources import exported_metrics
from trainstack.builders.monitoring import prepull as p
from trainstack.config.model import PlatformConfig

HOLDER = "registry.example.com/mirror/busybox@sha256:" + "2" * 64
IMAGE = "registry.example.com/vision/train@sha256:" + "3" * 64
POD = "trainstack-prepull-h100-x7k2p"
CONTAINER = "image-0123456789ab"


@pytest.fixture(scope="module")
def pulling() -> PlatformConfig:
    return platform({**platform_doc(), "prePull": {"enabled": True, "holderImage": HOLDER}})


def _container(
    reason: str, *, namespace: str = "trainstack-system", pod: str = POD
) -> list[dict[str, str]]:
    where = {"namespace": namespace, "pod": pod}
    return [
        series(
            "kube_pod_container_status_waiting_reason",
            "1x40",
            container=CONTAINER,
            reason=reason,
            **where,
        ),
        series("kube_pod_container_info", "1x40", container=CONTAINER, image=IMAGE, **where),
        series("kube_pod_info", "1x40", node="n1", **where),
        series("kube_node_labels", "1x40", node="n1", label_trainstack_io_pool="h100"),
    ]


def cases() -> list[dict[str, Any]]:
    missing = {"pool": "h100", "node": "n1", "image": IMAGE, "severity": "warning"}
    alert = p.MISSING_ALERT
    return [
        case(
            _container("ImagePullBackOff"),
            [firing(alert, "10m", None), firing(alert, "20m", missing)],
        ),
        case(_container("ErrImagePull"), [firing(alert, "20m", missing)]),
        # still pulling: not missing
        case(_container("ContainerCreating"), [firing(alert, "30m", None)]),
        # a team's pod with the same error is the team's, not pre-pull's
        case(
            _container("ImagePullBackOff", namespace="vision", pod="train-worker-0"),
            [firing(alert, "30m", None)],
        ),
    ]


def test_the_missing_image_alert(promtool: str, pulling: PlatformConfig, tmp_path: Path) -> None:
    assert [r["alert"] for r in p.prepull_alerts(pulling)] == [p.MISSING_ALERT]
    rule_tests_pass(promtool, pulling, tmp_path, cases())


def test_images_present_and_pull_durations_per_pool(
    promtool: str, pulling: PlatformConfig, tmp_path: Path
) -> None:
    ds = {"namespace": "trainstack-system", "daemonset": "trainstack-prepull-h100"}
    kubelet = {"node": "n1", "image_size_in_bytes": "5GB-10GB"}
    inputs = [
        series("kube_daemonset_status_number_ready", "3x70", **ds),
        series("kube_daemonset_status_desired_number_scheduled", "4x70", **ds),
        # another namespace's DaemonSet of the same name pattern is not counted
        series(
            "kube_daemonset_status_number_ready",
            "9x70",
            namespace="x",
            daemonset="trainstack-prepull-h100",
        ),
        series("kube_node_labels", "1x70", node="n1", label_trainstack_io_pool="h100"),
        # every pull of the hour took between 60 s and 120 s
        series("kubelet_image_pull_duration_seconds_bucket", "0x70", le="60", **kubelet),
        series("kubelet_image_pull_duration_seconds_bucket", "0+1x70", le="120", **kubelet),
        series("kubelet_image_pull_duration_seconds_bucket", "0+1x70", le="+Inf", **kubelet),
    ]
    checks = [
        {
            "expr": "pool:trainstack_prepull_nodes_ready:sum",
            "eval_time": "65m",
            "exp_samples": [
                {
                    "labels": '{__name__="pool:trainstack_prepull_nodes_ready:sum", pool="h100"}',
                    "value": 3,
                }
            ],
        },
        {
            "expr": "pool:trainstack_prepull_nodes:sum",
            "eval_time": "65m",
            "exp_samples": [
                {
                    "labels": '{__name__="pool:trainstack_prepull_nodes:sum", pool="h100"}',
                    "value": 4,
                }
            ],
        },
        {
            "expr": "pool:trainstack_image_pull_seconds:p90_1h",
            "eval_time": "65m",
            # 90% into the 60-120 s bucket, linearly: 114 s
            "exp_samples": [
                {
                    "labels": '{__name__="pool:trainstack_image_pull_seconds:p90_1h", pool="h100"}',
                    "value": 114,
                }
            ],
        },
    ]
    rule_tests_pass(promtool, pulling, tmp_path, [case(inputs, checks)])


def test_the_rules_and_panels_use_documented_metrics(pulling: PlatformConfig) -> None:
    """As test_objects holds for the default config, with pre-pull on: every metric is an
    exporter's (metric_sources.py) or recorded, and the dashboard has the row."""
    recorded = {r["record"] for g in b.rule_groups(pulling) for r in g["rules"] if "record" in r}
    known = set(exported_metrics()) | recorded
    for group in b.rule_groups(pulling):
        for rule in group["rules"]:
            assert _selectors(rule["expr"]) <= known, rule
    exprs = d.dashboard_exprs(pulling)
    assert "pool:trainstack_prepull_nodes_ready:sum" in exprs
    assert all(_selectors(_grafana_free(e)) <= known for e in exprs)


def test_no_rules_without_pre_pull() -> None:
    cfg = platform()
    assert p.prepull_rules(cfg) == []
    assert p.prepull_alerts(cfg) == []
