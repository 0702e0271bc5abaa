"""The analyzer's side of CrossGuard, emulated: the pack's own policy objects, called with
ResourceValidationArgs/StackValidationArgs and props as the analyzer delivers them (numbers
as floats, read-only unknown-checking proxies). `trainstack.policy.pack.evaluate` calls the
rules directly; tests hold the two to the same verdicts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

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

from trainstack.policy.pack import crossguard_policies

Resources = Sequence[tuple[str, str, Mapping[str, Any]]]


def _wire(props: Mapping[str, Any]) -> Any:
    return unknown_checking_proxy(json.loads(json.dumps(props), parse_int=float))


def _opts() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], False, [], PolicyCustomTimeouts(0, 0, 0), [])


def _collector(found: list[tuple[str, str, str]], policy: str, default: str) -> ReportViolation:
    def report(message: str, urn: str | None = None) -> None:
        found.append((policy, str(urn or default), message))

    return report


def analyze(resources: Resources, config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(policy, resource, message) for every violation, every policy enabled."""
    wired = [(rtype, name, _wire(props)) for rtype, name, props in resources]
    found: list[tuple[str, str, str]] = []
    for policy in crossguard_policies():
        if isinstance(policy, ResourceValidationPolicy):
            for rtype, name, props in wired:
                args = ResourceValidationArgs(
                    rtype, props, f"urn:{rtype}::{name}", name, _opts(), None, dict(config)
                )
                policy.validate(args, _collector(found, policy.name, name))
        else:
            assert isinstance(policy, StackValidationPolicy)
            stack = [
                PolicyResource(rtype, props, name, name, _opts(), None, None, [], {})
                for rtype, name, props in wired
            ]
            policy.validate(
                StackValidationArgs(stack, dict(config)),
                _collector(found, policy.name, "(stack)"),
            )
    return sorted(found)
