"""The one config loader: schema + cross-field checks in one pass, then typed dataclasses.

Input is a stack's config as a mapping of namespaced keys (``trainstack:platform``)
to decoded values, exactly what Pulumi hands a program. Stack files, the CLI and the
Pulumi program all come through here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from trainstack import yamlio
from trainstack.config import model as m
from trainstack.config.addons import addon_checks, build_addons
from trainstack.config.aws import addon_pin_checks, aws_checks, build_aws
from trainstack.config.capacity import capacity_issues, mode_issues
from trainstack.config.checks import dict_items, duplicate_names
from trainstack.config.errors import ConfigError, ConfigIssue, did_you_mean, join_path
from trainstack.config.health import build_health, health_checks
from trainstack.config.images import platform_image_checks, registry_prefix_checks
from trainstack.config.monitoring import build_monitoring, monitoring_checks
from trainstack.config.pools import build_pools, network_zones, pool_checks
from trainstack.config.prepull import build_prepull, prepull_checks
from trainstack.config.schema import apply_defaults, load_schema, schema_issues
from trainstack.config.sharing import sharing_checks
from trainstack.config.storage import build_storage, storage_checks
from trainstack.config.topology import build_topology, topology_checks

PLATFORM_KEY = "trainstack:platform"
TEAM_KEY = "trainstack:team"
STACK_KINDS = {PLATFORM_KEY: "platform.schema.json", TEAM_KEY: "team.schema.json"}


# `trainstack preview` parses a stack's config before it runs the program, and the program
# (which must also work alone under `pulumi up`) parses it again: one validation per document.
_parsed: dict[tuple[str, str], m.StackConfig] = {}
_PARSED_MAX = 64


def forget_parsed() -> None:
    """Drop the stack configs parsed so far (benchmarks that preview as a new process would)."""
    _parsed.clear()


def parse_stack_config(values: Mapping[str, Any], *, stack: str, source: str) -> m.StackConfig:
    """Validate one stack's config and build its typed model, or raise ConfigError."""
    try:
        key: tuple[str, str] | None = (stack, json.dumps(values, sort_keys=True))
    except (TypeError, ValueError):
        key = None  # YAML types JSON lacks (dates): the schema reports them; do not cache
    if key is not None and key in _parsed:
        return _parsed[key]
    config = _parse_stack_config(values, stack=stack, source=source)
    if key is not None:
        if len(_parsed) >= _PARSED_MAX:
            del _parsed[next(iter(_parsed))]
        _parsed[key] = config
    return config


def _parse_stack_config(values: Mapping[str, Any], *, stack: str, source: str) -> m.StackConfig:
    present = [key for key in STACK_KINDS if key in values]
    if len(present) != 1:
        unknown = [k for k in values if k.startswith("trainstack:") and k not in STACK_KINDS]
        issues = [
            ConfigIssue(key, f"unknown config key{did_you_mean(key, STACK_KINDS)}")
            for key in unknown
        ]
        issues += _unnamespaced(values) if not present else []
        found = " and ".join(present) if present else "neither"
        issues.append(
            ConfigIssue(
                "config",
                f"a stack needs exactly one of {PLATFORM_KEY} or {TEAM_KEY}; found {found}",
            )
        )
        raise ConfigError(source, issues)
    key = present[0]
    document = values[key]
    issues = schema_issues(STACK_KINDS[key], document, key)
    if isinstance(document, Mapping):
        checks = _platform_checks if key == PLATFORM_KEY else _team_checks
        issues.extend(checks(document, key))
    if issues:
        raise ConfigError(source, issues)
    filled = apply_defaults(STACK_KINDS[key], document)
    if key == PLATFORM_KEY:
        platform = _build_platform(filled, stack)
        # Quota arithmetic needs the typed pools and teams, so it runs once the
        # document itself is valid.
        arithmetic = capacity_issues(platform)
        if arithmetic:
            raise ConfigError(source, arithmetic)
        return platform
    return m.TeamStackConfig(
        stack=stack,
        team=filled["team"],
        platform_stack=filled["platformStack"],
        jobs=tuple(filled["jobs"]),
    )


def _unnamespaced(values: Mapping[str, Any]) -> list[ConfigIssue]:
    """Settings written without their `trainstack:` section, each with where it belongs."""
    issues = []
    for key, value in values.items():
        name = str(key).split(":")[-1]
        section = f"trainstack:{name}"
        if section in STACK_KINDS and isinstance(value, Mapping):
            issues.append(
                ConfigIssue(
                    join_path("config", str(key)),
                    f"Pulumi config keys are namespaced by project: write {section}:",
                )
            )
            continue
        for section, schema in STACK_KINDS.items():
            if name in load_schema(schema).get("properties", {}):
                issues.append(
                    ConfigIssue(
                        join_path("config", str(key)),
                        f"belongs under {section}: write `{section}:` and indent {name} below it",
                    )
                )
                break
    return issues


def read_stack_file(path: Path) -> dict[str, Any]:
    """The `config:` block of a Pulumi stack file, or ConfigError if it is not YAML."""
    data = yamlio.read(path)
    if data is None:
        raise ConfigError(
            str(path), [ConfigIssue("file", "is empty; a stack file has a config: map")]
        )
    if isinstance(data, dict) and "kind" in data and "config" not in data:
        raise ConfigError(
            str(path),
            [ConfigIssue("kind", f"{data['kind']!r}: this is a job spec, not a stack file")],
        )
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ConfigError(str(path), [ConfigIssue("config", "the stack file has no config: map")])
    return cast(dict[str, Any], data["config"])


def stack_name_from_path(path: Path) -> str:
    name = path.name
    for prefix, suffix in (("Pulumi.", ".yaml"), ("Pulumi.", ".yml")):
        if name.startswith(prefix) and name.endswith(suffix):
            return name[len(prefix) : -len(suffix)]
    return path.stem


def load_stack_file(path: Path) -> m.StackConfig:
    return parse_stack_config(
        read_stack_file(path), stack=stack_name_from_path(path), source=str(path)
    )


# -- cross-field checks ------------------------------------------------------------------
# They run on the raw document in the same pass as the schema, so they must tolerate
# values of the wrong shape (the schema reports those).


def _platform_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    cloud = doc.get("cloud")
    for other in ("aws", "existing"):
        if cloud in ("aws", "existing") and other != cloud and other in doc:
            issues.append(
                ConfigIssue(
                    join_path(root, other),
                    f"only used with cloud: {other}, but cloud is {cloud}; remove it",
                )
            )
    aws = doc.get("aws")
    if isinstance(aws, Mapping):
        issues.extend(aws_checks(aws, join_path(root, "aws")))
        issues.extend(addon_pin_checks(aws, doc.get("storage"), join_path(root, "aws")))
    registry = doc.get("registry")
    if isinstance(registry, Mapping):
        issues.extend(_registry_checks(registry, join_path(root, "registry"), _pool_names(doc)))
    issues.extend(platform_image_checks(doc, root))
    issues.extend(registry_prefix_checks(doc, root))
    issues.extend(mode_issues(doc, root))
    issues.extend(pool_checks(doc, root))
    issues.extend(sharing_checks(doc, root))
    issues.extend(storage_checks(doc, root, network_zones(doc)))
    issues.extend(monitoring_checks(doc, root))
    issues.extend(health_checks(doc, root))
    issues.extend(prepull_checks(doc, root, _pool_names(doc)))
    issues.extend(topology_checks(doc, root))
    issues.extend(addon_checks(doc, root))
    return issues


def _pool_names(doc: Mapping[str, Any]) -> set[str] | None:
    """Names of the declared pools, or None when gpuPools itself is malformed."""
    pools = doc.get("gpuPools", [])
    if not isinstance(pools, list):
        return None
    return {p["name"] for _, p in dict_items(pools) if isinstance(p.get("name"), str)}


def _team_quota_and_pool_checks(
    team: Mapping[str, Any], path: str, pool_names: set[str] | None
) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    quota = team.get("quota")
    if isinstance(quota, Mapping):
        gpus, deserved = quota.get("gpus"), quota.get("deserved")
        if isinstance(gpus, int) and isinstance(deserved, int) and deserved < gpus:
            issues.append(
                ConfigIssue(
                    join_path(path, "quota", "deserved"),
                    f"deserved {deserved} is below the guarantee gpus {gpus}; "
                    "Volcano requires guarantee <= deserved <= capability",
                )
            )
    pools = team.get("pools")
    if isinstance(pools, list) and pool_names is not None:
        for index, pool in enumerate(pools):
            if isinstance(pool, str) and pool not in pool_names:
                known = ", ".join(sorted(pool_names)) or "none defined"
                issues.append(
                    ConfigIssue(
                        join_path(path, "pools", index),
                        f"unknown pool {pool!r}{did_you_mean(pool, pool_names)}; "
                        f"gpuPools has: {known}",
                    )
                )
    wants_gpus = isinstance(quota, Mapping) and (
        (isinstance(quota.get("gpus"), int) and quota["gpus"] > 0)
        or (isinstance(quota.get("deserved"), int) and quota["deserved"] > 0)
    )
    usable = (
        pool_names
        if pools is None
        else ({p for p in pools if isinstance(p, str)} if isinstance(pools, list) else None)
    )
    if wants_gpus and usable is not None and not usable:
        issues.append(
            ConfigIssue(
                join_path(path, "pools"),
                f"team {team.get('name')!r} has a GPU quota but can use no pool; "
                "add a pool to gpuPools or list one here",
            )
        )
    return issues


def _registry_checks(
    registry: Mapping[str, Any], root: str, pool_names: set[str] | None
) -> list[ConfigIssue]:
    groups = list(dict_items(registry.get("groups")))
    teams = list(dict_items(registry.get("teams")))
    groups_path, teams_path = join_path(root, "groups"), join_path(root, "teams")
    issues = duplicate_names(groups, groups_path, "group") + duplicate_names(
        teams, teams_path, "team"
    )
    group_names = {g["name"] for _, g in groups if isinstance(g.get("name"), str)}
    for index, team in teams:
        name, group = team.get("name"), team.get("group")
        if isinstance(name, str) and name in m.RESERVED_NAMESPACES:
            issues.append(
                ConfigIssue(
                    join_path(teams_path, index, "name"),
                    f"{name!r} is a reserved namespace; choose another team name",
                )
            )
        issues += _team_quota_and_pool_checks(team, join_path(teams_path, index), pool_names)
        if isinstance(group, str) and group not in group_names:
            known = ", ".join(sorted(group_names)) or "none defined"
            issues.append(
                ConfigIssue(
                    join_path(teams_path, index, "group"),
                    f"unknown group {group!r}{did_you_mean(group, group_names)}; "
                    f"registry.groups has: {known}",
                )
            )
    return issues


def _team_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    del doc, root  # the team document has no cross-field rules of its own yet
    return []


# -- building the typed model -------------------------------------------------------------


def _build_platform(doc: dict[str, Any], stack: str) -> m.PlatformConfig:
    pools = build_pools(doc)
    scheduling = doc["scheduling"]
    cluster_name = doc.get("clusterName", f"trainstack-{stack}")
    aws = doc.get("aws")
    existing = doc.get("existing")
    return m.PlatformConfig(
        stack=stack,
        cloud=doc["cloud"],
        environment=doc["environment"],
        cluster_name=cluster_name,
        kubernetes_version=doc["kubernetesVersion"],
        tags=tuple(sorted(doc.get("tags", {}).items())),
        aws=build_aws(aws, doc["storage"]) if aws is not None else None,
        existing=(
            m.ExistingCluster(kubeconfig=existing.get("kubeconfig"), context=existing["context"])
            if existing is not None
            else None
        ),
        registry=_build_registry(doc["registry"], tuple(p.name for p in pools)),
        gpu_device_plugin=doc["gpu"]["devicePlugin"],
        gpu_device_list_strategy=doc["gpu"].get(
            "deviceListStrategy", "volume-mounts" if doc["cloud"] == "aws" else "envvar"
        ),
        gpu_pools=pools,
        scheduling=m.Scheduling(
            queue_mode=scheduling["queueMode"],
            preemption=scheduling["preemption"],
            topology_aware=scheduling["topologyAware"],
            deadlines=m.Deadlines(
                image=scheduling["deadlines"]["image"],
                interval_seconds=scheduling["deadlines"]["intervalSeconds"],
                margin_seconds=scheduling["deadlines"]["marginSeconds"],
            ),
            topology=build_topology(doc),
        ),
        policy=m.PolicySettings(
            allowed_registries=tuple(doc["policy"]["allowedRegistries"]),
            max_cpu_limit_request_ratio=doc["policy"]["maxCpuLimitRequestRatio"],
            max_memory_limit_request_ratio=doc["policy"]["maxMemoryLimitRequestRatio"],
            advisory=tuple(doc["policy"]["advisory"]),
        ),
        storage=build_storage(doc, cluster_name, pools, tuple(sorted(network_zones(doc) or ()))),
        monitoring=build_monitoring(doc["monitoring"]),
        addons=build_addons(doc["addons"]),
        health=build_health(doc),
        pre_pull=build_prepull(doc),
    )


def _build_registry(doc: dict[str, Any], pool_names: tuple[str, ...]) -> m.Registry:
    return m.Registry(
        groups=tuple(
            m.Group(
                name=g["name"],
                owners=tuple(g.get("owners", ())),
                quota_gpus=g["quota"]["gpus"] if "quota" in g else None,
                deserved_gpus=g.get("quota", {}).get("deserved"),
            )
            for g in doc["groups"]
        ),
        teams=tuple(
            m.Team(
                name=t["name"],
                group=t.get("group"),
                owners=tuple(t["owners"]),
                quota=m.TeamQuota(
                    gpus=t["quota"]["gpus"],
                    deserved=t["quota"].get("deserved"),
                    borrow_limit=t["quota"]["borrowLimit"],
                    reclaimable=t["quota"]["reclaimable"],
                    weight=t["quota"].get("weight"),
                ),
                pools=tuple(t.get("pools", pool_names)),
                priority_classes=tuple(t["priorityClasses"]),
                max_job_hours=t["maxJobHours"],
                iam_principals=tuple(t["access"]["iamPrincipalArns"]),
                groups=tuple(t["access"]["groups"]),
                checkpoint_retention_days=t["retention"].get("checkpointDays"),
                log_retention_days=t["retention"].get("logDays"),
            )
            for t in doc["teams"]
        ),
    )
