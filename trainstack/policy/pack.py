"""The rules as CrossGuard policies, and running them in-process over a plan.

`policies/__main__.py` builds the PolicyPack from `crossguard_policies()`; `trainstack
preview` calls `evaluate()`, which runs the same rules directly over the plan. Tests run the
pack's policy objects the way the analyzer does (tests/policy/crossguard.py) and hold both to
the same findings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from trainstack.policy.objects import Config, Rule, Violation
from trainstack.policy.rules import RULES
from trainstack.policy.stack_rules import STACK_RULES, StackResource, StackRule

PACK_NAME = "trainstack"
LEVELS = {
    "advisory": EnforcementLevel.ADVISORY,
    "mandatory": EnforcementLevel.MANDATORY,
    "disabled": EnforcementLevel.DISABLED,
}
# One config schema for the whole pack: every policy reads the same thresholds.
CONFIG_SCHEMA = PolicyConfigSchema(
    properties={
        "maxCpuLimitRequestRatio": {"type": "number", "minimum": 1, "default": 2},
        "maxMemoryLimitRequestRatio": {"type": "number", "minimum": 1, "default": 1},
        "maxDurationHours": {"type": "number", "exclusiveMinimum": 0, "default": 168},
        "teamMaxDurationHours": {"type": "object", "additionalProperties": {"type": "number"}},
        "allowedRegistries": {"type": "array", "items": {"type": "string"}, "default": []},
        "poolSelectors": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": {"type": "string"}},
            "default": [],
        },
        "production": {"type": "boolean", "default": False},
        "teamPriorityClasses": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
        "poolsByName": {
            "type": "object",
            "additionalProperties": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "teamPools": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
        # Where the settings are set, for messages (issue 41).
        "platformStack": {"type": "string", "default": ""},
    }
)


def _with_fix(message: str, fix: str) -> str:
    return f"{message}. Fix: {fix}"


def _resource_policy(rule: Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        if args.resource_type not in rule.resource_types:
            return
        cfg = Config.from_mapping(args.get_config())
        for message in rule.check(args.props, cfg):
            report(_with_fix(message, rule.remediation_for(cfg)), None)

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=LEVELS[rule.level],
        config_schema=CONFIG_SCHEMA,
    )


def _stack_policy(rule: StackRule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        # Keyed by URN (issue 19 #6: by name, a bucket's five companions took its findings)
        # and linked by the engine's property dependencies, known while ids are not.
        resources = [
            StackResource(
                r.resource_type,
                r.name,
                r.props,
                r.urn,
                {k: tuple(d.urn for d in deps) for k, deps in r.property_dependencies.items()},
            )
            for r in args.resources
            if r.resource_type in rule.resource_types
        ]
        for urn, message in rule.check(resources):
            report(_with_fix(message, rule.remediation), urn)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=LEVELS[rule.level],
        config_schema=CONFIG_SCHEMA,
    )


def crossguard_policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    return [*(_resource_policy(r) for r in RULES), *(_stack_policy(r) for r in STACK_RULES)]


def evaluate(
    resources: Sequence[tuple[str, str, Mapping[str, Any]]],
    config: Mapping[str, Any],
    levels: Mapping[str, str] | None = None,
    depends_on: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None,
) -> list[Violation]:
    """Run every rule of the pack over (type, name, inputs), like `--policy-pack`.

    The rules' checks run directly; the CrossGuard wrappers around them only filter by type
    and append the fix (`_with_fix`). `depends_on` gives, per `type::name`, the property
    dependencies (as `type::name`) that link a stack rule's resources, as the engine's do.
    """
    depends_on = depends_on or {}
    levels = levels or {}
    cfg = Config.from_mapping(config)
    active = [(r, lv) for r in RULES if (lv := levels.get(r.name, r.level)) != "disabled"]
    active_stack = [
        (r, lv) for r in STACK_RULES if (lv := levels.get(r.name, r.level)) != "disabled"
    ]
    read = {t for r, _ in active for t in r.resource_types}
    read |= {t for r, _ in active_stack for t in r.resource_types}
    # Only resources some rule reads (most of a plan, components and Helm releases, none
    # does). Props go in as the plan has them; the analyzer sends numbers as floats inside
    # read-only proxies, and tests/policy/crossguard.py holds both paths to the same findings.
    relevant = [(rtype, name, props) for rtype, name, props in resources if rtype in read]
    found: list[Violation] = []
    for rule, level in active:
        found += [
            Violation(rule.name, name, _with_fix(message, rule.remediation_for(cfg)), level)
            for rtype, name, props in relevant
            if rtype in rule.resource_types
            for message in rule.check(props, cfg)
        ]
    for stack_rule, level in active_stack:
        mine = [
            StackResource(
                rtype, name, props, f"{rtype}::{name}", depends_on.get(f"{rtype}::{name}", {})
            )
            for rtype, name, props in relevant
            if rtype in stack_rule.resource_types
        ]
        names = {r.identity: r.name for r in mine}
        found += [
            Violation(
                stack_rule.name,
                names.get(key, key),
                _with_fix(message, stack_rule.remediation),
                level,
            )
            for key, message in stack_rule.check(mine)
        ]
    return found
