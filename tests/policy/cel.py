"""Evaluate the generated admission policies offline with a CEL library (cel-python).

Kubernetes adds the quantity library to CEL; the few functions the expressions use are
provided here over the same quantity parser the Python rules use.
"""

from __future__ import annotations

from typing import Any

import celpy
from celpy import celtypes

from trainstack.policy.rules import quantity as parse_quantity


class Quantity(celtypes.DoubleType):
    """A parsed Kubernetes quantity; compares and converts like k8s' Quantity type."""


def _quantity(value: celtypes.StringType) -> Quantity:
    return Quantity(parse_quantity(str(value)))


def _as_float(q: Quantity) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(q))


def _compare(a: Quantity, b: Quantity) -> celtypes.IntType:
    return celtypes.IntType((float(a) > float(b)) - (float(a) < float(b)))


FUNCTIONS = {"quantity": _quantity, "asApproximateFloat": _as_float, "compareTo": _compare}


def evaluate(policy: dict[str, Any], obj: dict[str, Any], namespace: dict[str, Any]) -> bool:
    """True when every validation of `policy` admits `obj` (created in `namespace`)."""
    env = celpy.Environment()
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(obj),
        "namespaceObject": celpy.json_to_cel(namespace),
    }
    variables: dict[str, Any] = {}
    for variable in policy["spec"].get("variables", []):
        program = env.program(env.compile(variable["expression"]), functions=FUNCTIONS)
        variables[variable["name"]] = program.evaluate(
            {**activation, "variables": celpy.json_to_cel({})}
        )
    activation["variables"] = celtypes.MapType(
        {celtypes.StringType(k): v for k, v in variables.items()}
    )
    for validation in policy["spec"]["validations"]:
        program = env.program(env.compile(validation["expression"]), functions=FUNCTIONS)
        if not bool(program.evaluate(activation)):
            return False
    return True
