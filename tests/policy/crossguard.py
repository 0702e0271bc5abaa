"""The analyzer's side of CrossGuard, emulated: the pack's own policy objects, called with
ResourceValidationArgs/StackValidationArgs and props as the analyzer delivers them (numbers
as floats, read-only unknown-checking proxies). `trainstack.policy.pack.evaluate` calls the
rules directly; tests hold the two to the same verdicts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import unknown_checking_proxy

from trainstack.policy.pack import LEVELS, crossguard_policies

Resources = Sequence[tuple[str, str, Mapping[str, Any]]]


def _wire(props: Mapping[str, Any]) -> Any:
    return unknown_checking_proxy(json.loads(json.dumps(props), parse_int=float))


def _opts() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], False, [], PolicyCustomTimeouts(0, 0, 0), [])


def _collector(found: list[tuple[str, str, str]], policy: str, default: str) -> ReportViolation:
    def report(message: str, urn: str | None = None) -> None:
        found.append((policy, str(urn or default), message))

    return report


Wired = list[tuple[str, str, Any]]
Policy = ResourceValidationPolicy | StackValidationPolicy


def _validate(
    policy: Policy, wired: Wired, config: dict[str, Any], found: list[tuple[str, str, str]]
) -> None:
    """One policy over every resource, as the analyzer's Analyze (resource policies, one
    resource at a time) or AnalyzeStack (stack policies, all at once) calls it."""
    if isinstance(policy, ResourceValidationPolicy):
        for rtype, name, props in wired:
            args = ResourceValidationArgs(
                rtype, props, f"urn:{rtype}::{name}", name, _opts(), None, config
            )
            policy.validate(args, _collector(found, policy.name, name))
    else:
        stack = [
            PolicyResource(rtype, props, name, name, _opts(), None, None, [], {})
            for rtype, name, props in wired
        ]
        policy.validate(
            StackValidationArgs(stack, config), _collector(found, policy.name, "(stack)")
        )


def analyze(resources: Resources, config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(policy, resource, message) for every violation, every policy enabled."""
    wired = [(rtype, name, _wire(props)) for rtype, name, props in resources]
    found: list[tuple[str, str, str]] = []
    for policy in crossguard_policies():
        _validate(policy, wired, dict(config), found)
    return sorted(found)


# -- the engine's side: a --policy-pack-config file, as the CLI applies it ---------------------
#
# pkg/v3@v3.274.0 resource/analyzer/config.go: parsePolicyConfigs reads the unversioned file (a
# string is a level; an object's `enforcementLevel` is taken out and the rest are properties),
# ReconcilePolicyPackConfig starts from each policy's level and its schema's defaults
# (createConfigWithDefaults), applies `all` and then each policy's entry (applyConfig, which
# merges properties into the defaults) and validates every policy's properties against its
# schema as an object (validatePolicyPackConfig, convertSchema; gojsonschema there, the
# jsonschema package's draft 7 here). engine/update.go LoadLocalPolicyPackAnalyzers then sends
# the result to the pack's Configure.


@dataclass(frozen=True)
class PolicyConfig:
    level: str
    properties: dict[str, Any]


def parse_config_file(document: Mapping[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """parsePolicyConfigs: name -> (level or "", properties); empty entries dropped."""
    parsed: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, value in document.items():
        if isinstance(value, str):
            level, properties = value, {}
        else:
            assert isinstance(value, Mapping), f"{name}: neither a level nor an object"
            properties = {k: v for k, v in value.items() if k != "enforcementLevel"}
            level = str(value.get("enforcementLevel", ""))
        assert level in ("", *LEVELS), f"{name}: {level!r} is not an enforcement level"
        if level or properties:
            parsed[name] = (level, properties)
    return parsed


def reconcile(document: Mapping[str, Any]) -> dict[str, PolicyConfig]:
    """What the pack is configured with for this file: every policy's level and properties."""
    policies = crossguard_policies()
    result = {
        p.name: PolicyConfig(
            str(p.enforcement_level.value) if p.enforcement_level else "advisory",
            {
                k: v["default"]
                for k, v in (p.config_schema.properties if p.config_schema else {}).items()
                if "default" in v
            },
        )
        for p in policies
    }
    given = parse_config_file(document)
    if "all" in given and given["all"][0]:
        result = {k: PolicyConfig(given["all"][0], v.properties) for k, v in result.items()}
    for name, (level, properties) in given.items():
        current = result.get(name, PolicyConfig("", {}))
        result[name] = PolicyConfig(level or current.level, {**current.properties, **properties})
    errors = []
    for p in policies:
        if p.config_schema is None:
            continue
        schema = {"type": "object", "properties": p.config_schema.properties}
        if p.config_schema.required:
            schema["required"] = p.config_schema.required
        checked = jsonschema.Draft7Validator(schema).iter_errors(result[p.name].properties)
        errors += [f"{p.name}: {e.message}" for e in checked]
    assert not errors, errors
    return result


def analyze_configured(
    resources: Resources, document: Mapping[str, Any]
) -> list[tuple[str, str, str, str]]:
    """(policy, resource, message, level) for every violation, the pack configured from
    `document` as the CLI configures it; each policy reads its own properties, as the
    analyzer's Configure stored them (a Struct: numbers as floats), and disabled ones do not
    run (pulumi_policy's _PolicyAnalyzerServicer.Analyze/AnalyzeStack)."""
    configured = reconcile(document)
    wired = [(rtype, name, _wire(props)) for rtype, name, props in resources]
    found: list[tuple[str, str, str, str]] = []
    for policy in crossguard_policies():
        setting = configured[policy.name]
        if setting.level == "disabled":
            continue
        config = json.loads(json.dumps(setting.properties), parse_int=float)
        hits: list[tuple[str, str, str]] = []
        _validate(policy, wired, config, hits)
        found += [(*hit, setting.level) for hit in hits]
    return sorted(found)
