"""Volcano's scrape objects select Services and ports that the pinned chart really creates.

Read at test time from `volcano.sh/volcano@v1.15.1` in the Go module cache:
`installer/helm/chart/volcano/templates/{controllers,scheduler}.yaml` (the Deployments and the
`<release>-controllers-service` / `<release>-scheduler-service` Services) and
`cmd/controller-manager/app/options/options.go` (`defaultListenAddress = ":8081"`, metrics
served only with `--enable-metrics`). The controller container declares no `ports`, and
prometheus-operator's PodMonitor `portNumber` "cannot be used to enable scraping of an
undeclared port" (../shared/reference/prometheus-operator/monitoring.coreos.com_podmonitors.yaml,
v0.93.0), so the controllers are scraped through their Service.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.volcano_chart import CHART_DIR, template_documents, volcano_source
from trainstack.builders import monitoring as b
from trainstack.builders.metric_sources import VOLCANO_CONTROLLER_METRICS, VOLCANO_SCHEDULER_METRICS
from trainstack.builders.scheduling import VOLCANO_NAMESPACE, volcano_values
from trainstack.config.model import PlatformConfig

COMPONENTS = {"controllers": "volcano-controller", "scheduler": "volcano-scheduler"}


def chart(template: str) -> list[dict[str, Any]]:
    path = volcano_source() / CHART_DIR / "templates" / template
    return template_documents(path.read_text(encoding="utf-8"), VOLCANO_NAMESPACE)


def volcano_monitors(cfg: PlatformConfig) -> list[dict[str, Any]]:
    return [
        m
        for m in [*b.service_monitors(cfg), *b.pod_monitors(cfg)]
        if VOLCANO_NAMESPACE in m["spec"].get("namespaceSelector", {}).get("matchNames", [])
    ]


def selected(monitor: dict[str, Any], obj: dict[str, Any]) -> bool:
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    return wanted <= (obj["metadata"].get("labels") or {}).items()


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_each_volcano_component_is_scraped_through_a_chart_service(
    cfg: PlatformConfig, component: str
) -> None:
    services = [d for d in chart(f"{component}.yaml") if d["kind"] == "Service"]
    monitors = [
        m
        for m in volcano_monitors(cfg)
        if any(selected(m, s) for s in services) and m["kind"] == "ServiceMonitor"
    ]
    assert len(monitors) == 1, f"no ServiceMonitor selects the chart's {component} Service"
    (monitor,) = monitors
    service = next(s for s in services if selected(monitor, s))
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports, (endpoint, sorted(ports))
        assert endpoint["path"] == "/metrics"


def test_no_volcano_pod_monitor_relies_on_an_undeclared_container_port(
    cfg: PlatformConfig,
) -> None:
    declared = {
        (doc["metadata"]["labels"]["app"], port["containerPort"])
        for component in COMPONENTS
        for doc in chart(f"{component}.yaml")
        if doc["kind"] == "Deployment"
        for container in doc["spec"]["template"]["spec"]["containers"]
        for port in container.get("ports") or []
    }
    assert ("volcano-controller", 8081) not in declared  # the reason for the Service
    for monitor in volcano_monitors(cfg):
        if monitor["kind"] != "PodMonitor":
            continue
        app = monitor["spec"]["selector"]["matchLabels"]["app"]
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert (app, endpoint.get("portNumber")) in declared, monitor["metadata"]["name"]


def test_the_controller_service_reaches_the_metrics_listener(cfg: PlatformConfig) -> None:
    """The Service's targetPort is where the controller serves /metrics, and it does serve."""
    source = volcano_source()
    options = source / "cmd/controller-manager/app/options/options.go"
    match = re.search(r'defaultListenAddress\s*=\s*":(\d+)"', options.read_text(encoding="utf-8"))
    assert match, "controller-manager's default listen address moved"
    (service,) = [d for d in chart("controllers.yaml") if d["kind"] == "Service"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [int(match.group(1))]
    template = (source / CHART_DIR / "templates" / "controllers.yaml").read_text(encoding="utf-8")
    assert re.search(
        r"if \.Values\.custom\.controller_metrics_enable \}\}\s*- --enable-metrics=true", template
    )
    assert volcano_values(cfg)["custom"]["controller_metrics_enable"] is True


def test_volcano_metrics_come_from_the_component_credited_with_them() -> None:
    """The dashboards' queue PodGroup counts are the controllers' (pkg/controllers/metrics),
    the rest the scheduler's (pkg/scheduler/metrics): each needs its own scrape object."""
    source = volcano_source()
    defined = {
        component: " ".join(
            f.read_text(encoding="utf-8")
            for f in (source / "pkg" / component / "metrics").glob("*.go")
        )
        for component in ("scheduler", "controllers")
    }
    credited = {
        "scheduler": VOLCANO_SCHEDULER_METRICS,
        "controllers": VOLCANO_CONTROLLER_METRICS,
    }
    for component, names in credited.items():
        for name in names:
            base = re.sub(r"_bucket$", "", name.removeprefix("volcano_"))
            assert re.search(rf'Name:\s*"{base}"', defined[component]), (component, name)
