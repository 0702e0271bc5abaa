"""A platform's guardrail settings as the pack's config (one source for all three uses)."""

from __future__ import annotations

from typing import Any

from trainstack.builders.pools import pool_selector
from trainstack.builders.scheduling import priority_class_name
from trainstack.config.model import PlatformConfig
from trainstack.policy.objects import Config, Rule
from trainstack.policy.rules import RULES
from trainstack.policy.stack_rules import STACK_RULES, StackRule


def pack_config(cfg: PlatformConfig) -> dict[str, Any]:
    """The pack config `--policy-pack-config` would carry for this platform."""
    policy = cfg.policy
    return {
        "maxCpuLimitRequestRatio": policy.max_cpu_limit_request_ratio,
        "maxMemoryLimitRequestRatio": policy.max_memory_limit_request_ratio,
        "maxDurationHours": max((t.max_job_hours for t in cfg.registry.teams), default=168.0),
        "teamMaxDurationHours": {t.namespace: t.max_job_hours for t in cfg.registry.teams},
        "allowedRegistries": list(policy.allowed_registries),
        "poolSelectors": [pool_selector(cfg, pool) for pool in cfg.gpu_pools],
        "production": cfg.environment == "production",
        "poolsByName": {pool.name: pool_selector(cfg, pool) for pool in cfg.gpu_pools},
        "teamPools": {t.namespace: list(t.pools) for t in cfg.registry.teams},
        "teamPriorityClasses": {
            t.namespace: [priority_class_name(c) for c in t.priority_classes]
            for t in cfg.registry.teams
        },
        "platformStack": cfg.stack,
    }


def levels(cfg: PlatformConfig) -> dict[str, str]:
    """`policy.advisory` lowers rules to advisory; the others keep their own default level."""
    rules: list[Rule | StackRule] = [*RULES, *STACK_RULES]
    return {r.name: "advisory" if r.name in cfg.policy.advisory else r.level for r in rules}


def rule_config(cfg: PlatformConfig) -> Config:
    return Config.from_mapping(pack_config(cfg))
