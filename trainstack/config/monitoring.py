"""The `monitoring` section: cross-field checks on the raw document and the typed model.

The schema (`platform.schema.json`, `properties.monitoring`) holds every default; this module
only checks what the schema cannot express and builds `model.Monitoring`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainstack.catalog import catalog
from trainstack.config import model as m
from trainstack.config.checks import dict_items, duplicate_names
from trainstack.config.errors import ConfigIssue, did_you_mean, join_path

# The namespace kube-prometheus-stack, dcgm-exporter and the dashboards live in.
MONITORING_NAMESPACE = "trainstack-monitoring"


def monitoring_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    """Receivers, team routing and the price table; tolerant of wrongly shaped values."""
    section = doc.get("monitoring")
    if not isinstance(section, Mapping):
        return []
    path = join_path(root, "monitoring")
    issues: list[ConfigIssue] = []
    teams = _team_names(doc)
    for index, team in dict_items(_teams(doc)):
        if team.get("name") == MONITORING_NAMESPACE:
            issues.append(
                ConfigIssue(
                    join_path(root, "registry", "teams", index, "name"),
                    f"{MONITORING_NAMESPACE!r} is the monitoring namespace; choose another "
                    "team name",
                )
            )
    alertmanager = section.get("alertmanager")
    if isinstance(alertmanager, Mapping):
        receivers = list(dict_items(alertmanager.get("receivers")))
        rpath = join_path(path, "alertmanager", "receivers")
        issues += duplicate_names(receivers, rpath, "receiver")
        for index, receiver in receivers:
            issues += _receiver_issues(receiver, join_path(rpath, index), teams)
    prices = list(dict_items(section.get("prices")))
    issues += _price_issues(prices, join_path(path, "prices"))
    issues += _unpriced_pools(doc, root, [p for _, p in prices])
    return issues


def _unpriced_pools(
    doc: Mapping[str, Any], root: str, prices: list[Mapping[str, Any]]
) -> list[ConfigIssue]:
    """Issue 41: with a price table, an AWS pool without a row would cost nothing: the cost
    rules join a node's (instance type, capacity) labels with the table, and a node without a
    match drops out of the join (builders/monitoring/rules.py accounting_rules). No table at
    all is different: no cost series exist. Existing clusters declare no instance types, so
    their nodes cannot be checked here (docs/monitoring.md)."""
    if doc.get("cloud") != "aws" or not prices:
        return []
    # Only well-formed rows: the schema reports the others, and a list or mapping there (an
    # alias of another node, say) is not hashable (found by tests/fuzz).
    priced = {
        (p.get("instanceType"), p.get("capacity"))
        for p in prices
        if isinstance(p.get("instanceType"), str) and isinstance(p.get("capacity"), str)
    }
    unpriced: dict[tuple[str, str], list[str]] = {}  # one issue per missing row, all its pools
    for index, pool in dict_items(doc.get("gpuPools")):
        instance, capacity = pool.get("instanceType"), pool.get("capacity", {"type": "onDemand"})
        kind = capacity.get("type") if isinstance(capacity, Mapping) else None
        if not isinstance(instance, str) or not isinstance(kind, str):
            continue  # the schema reports the wrong shape
        if (instance, kind) not in priced:
            where = join_path(root, "gpuPools", index)
            unpriced.setdefault((instance, kind), []).append(f"{pool.get('name')!r} ({where})")
    issues = []
    for (instance, kind), pools in unpriced.items():
        issues.append(
            ConfigIssue(
                join_path(root, "monitoring", "prices"),
                f"no price for {instance} capacity {kind}, so accounting would count the GPUs "
                f"of pool{'s' if len(pools) > 1 else ''} {', '.join(pools)} at 0 USD; add "
                f"{{instanceType: {instance}, capacity: {kind}, usdPerInstanceHour: …}} "
                "(or usdPerGpuHour)",
            )
        )
    return issues


def _teams(doc: Mapping[str, Any]) -> object:
    registry = doc.get("registry")
    return registry.get("teams") if isinstance(registry, Mapping) else None


def _team_names(doc: Mapping[str, Any]) -> set[str]:
    return {t["name"] for _, t in dict_items(_teams(doc)) if isinstance(t.get("name"), str)}


def _receiver_issues(receiver: Mapping[str, Any], path: str, teams: set[str]) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    if not any(k in receiver for k in ("slack", "webhook", "pagerduty")):
        issues.append(
            ConfigIssue(
                path,
                f"receiver {receiver.get('name')!r} has no channel; add slack, webhook or "
                "pagerduty",
            )
        )
    webhook = receiver.get("webhook")
    if isinstance(webhook, Mapping) and ("url" in webhook) == ("urlSecret" in webhook):
        issues.append(
            ConfigIssue(
                join_path(path, "webhook"),
                "give exactly one of url (not secret) or urlSecret (a Secret holding the URL)",
            )
        )
    wanted = receiver.get("teams")
    if isinstance(wanted, list):
        for index, team in enumerate(wanted):
            if isinstance(team, str) and team not in teams:
                known = ", ".join(sorted(teams)) or "none defined"
                issues.append(
                    ConfigIssue(
                        join_path(path, "teams", index),
                        f"unknown team {team!r}{did_you_mean(team, teams)}; "
                        f"registry.teams has: {known}",
                    )
                )
    return issues


def _price_issues(prices: list[tuple[int, Mapping[str, Any]]], path: str) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    seen: dict[tuple[object, object], int] = {}
    known = catalog()
    for index, price in prices:
        here = join_path(path, index)
        given = [k for k in ("usdPerInstanceHour", "usdPerGpuHour") if k in price]
        if len(given) != 1:
            issues.append(
                ConfigIssue(
                    here,
                    "give exactly one of usdPerInstanceHour or usdPerGpuHour"
                    + (f" (both given: {price[given[0]]} and {price[given[1]]})" if given else ""),
                )
            )
        instance = price.get("instanceType")
        if "usdPerInstanceHour" in price and isinstance(instance, str) and instance not in known:
            issues.append(
                ConfigIssue(
                    join_path(here, "instanceType"),
                    f"{instance!r} is not in the instance catalog{did_you_mean(instance, known)}, "
                    "so its GPU count is unknown; use usdPerGpuHour instead",
                )
            )
        key = (instance, price.get("capacity"))
        if not all(isinstance(k, str | None) for k in key):
            continue  # the schema reports the wrong type
        if key in seen:
            issues.append(
                ConfigIssue(
                    here,
                    f"duplicate price for {instance} {price.get('capacity')} "
                    f"(also prices[{seen[key]}]); keep one",
                )
            )
        seen.setdefault(key, index)
    return issues


def build_monitoring(doc: dict[str, Any]) -> m.Monitoring:
    """The typed section from a document whose schema defaults are filled in."""
    t = doc["thresholds"]
    return m.Monitoring(
        retention=doc["retention"],
        storage_gib=doc["storageGiB"],
        storage_class=doc["storageClass"],
        grafana_admin_secret=doc["grafanaAdminSecret"],
        runbook_url=doc["runbookUrl"],
        thresholds=m.AlertThresholds(
            gpu_idle_utilization_percent=float(t["gpuIdleUtilizationPercent"]),
            gpu_idle_minutes=t["gpuIdleMinutes"],
            reserved_idle_minutes=t["reservedIdleMinutes"],
            stall_minutes=t["stallMinutes"],
            checkpoint_interval_minutes=t["checkpointIntervalMinutes"],
            pending_minutes=t["pendingMinutes"],
            max_duration_warn_ratio=float(t["maxDurationWarnRatio"]),
            data_wait_ratio=float(t["dataWaitRatio"]),
            data_wait_minutes=t["dataWaitMinutes"],
            step_time_regression_ratio=float(t["stepTimeRegressionRatio"]),
            step_time_jitter_ratio=float(t["stepTimeJitterRatio"]),
            node_not_ready_minutes=t["nodeNotReadyMinutes"],
        ),
        receivers=tuple(_receiver(r) for r in doc["alertmanager"]["receivers"]),
        prices=tuple(_price(p) for p in doc["prices"]),
    )


def _secret(ref: Mapping[str, str] | None) -> m.SecretRef | None:
    return m.SecretRef(name=ref["name"], key=ref["key"]) if ref is not None else None


def _receiver(doc: dict[str, Any]) -> m.AlertReceiver:
    slack = doc.get("slack", {})
    webhook = doc.get("webhook", {})
    return m.AlertReceiver(
        name=doc["name"],
        severities=tuple(doc["severities"]),
        teams=tuple(doc["teams"]),
        slack_channel=slack.get("channel"),
        slack_webhook=_secret(slack.get("webhookSecret")),
        webhook_url=webhook.get("url"),
        webhook_url_secret=_secret(webhook.get("urlSecret")),
        pagerduty_routing_key=_secret(doc.get("pagerduty", {}).get("routingKeySecret")),
    )


def _price(doc: dict[str, Any]) -> m.GpuPrice:
    if "usdPerGpuHour" in doc:
        per_gpu = float(doc["usdPerGpuHour"])
    else:
        per_gpu = float(doc["usdPerInstanceHour"]) / catalog()[doc["instanceType"]].gpus
    return m.GpuPrice(
        instance_type=doc["instanceType"], capacity=doc["capacity"], usd_per_gpu_hour=per_gpu
    )
