"""Evaluate the generated admission policies offline with a CEL library (cel-python).

Kubernetes adds the quantity library to CEL; the few functions the expressions use are
provided here over the same quantity parser the Python rules use.
"""

from __future__ import annotations

import functools
from typing import Any

import celpy
from celpy import celtypes

from trainstack.policy.objects import quantity as parse_quantity


class Quantity(celtypes.DoubleType):
    """A parsed Kubernetes quantity; compares and converts like k8s' Quantity type."""


def _quantity(value: celtypes.StringType) -> Quantity:
    return Quantity(parse_quantity(str(value)))


def _is_quantity(value: celtypes.StringType) -> celtypes.BoolType:
    try:
        parse_quantity(str(value))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _as_float(q: Quantity) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(q))


def _compare(a: Quantity, b: Quantity) -> celtypes.IntType:
    return celtypes.IntType((float(a) > float(b)) - (float(a) < float(b)))


def _sum(values: celtypes.ListType) -> celtypes.IntType:
    """Kubernetes' CEL lists library: `[1, 2].sum()` (k8s.io/apiserver pkg/cel/library/
    lists.go; integers only here, all the expressions sum)."""
    return celtypes.IntType(sum(int(v) for v in values))


def _split(value: celtypes.StringType, separator: celtypes.StringType) -> celtypes.ListType:
    """Kubernetes' CEL strings library: `"a,b".split(",")`."""
    return celtypes.ListType([celtypes.StringType(p) for p in str(value).split(str(separator))])


FUNCTIONS = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "asApproximateFloat": _as_float,
    "compareTo": _compare,
    "split": _split,
    "sum": _sum,
}


_ENV = celpy.Environment()


@functools.cache
def _program(expression: str) -> celpy.Runner:
    """Parsing dominates (lark): each expression once per session, evaluated many times."""
    return _ENV.program(_ENV.compile(expression), functions=FUNCTIONS)


def evaluate(
    policy: dict[str, Any],
    obj: dict[str, Any],
    namespace: dict[str, Any],
    *,
    old: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
) -> bool:
    """True when every validation of `policy` admits `obj` in `namespace`: created, or
    replacing `old` (an UPDATE), by `user` (the request's userInfo: username, extra) if given.
    A policy whose matchConditions do not all hold admits."""
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "namespaceObject": celpy.json_to_cel(namespace),
        "request": celpy.json_to_cel(
            {
                "operation": "CREATE" if old is None else "UPDATE",
                **({"userInfo": user} if user is not None else {}),
            }
        ),
    }
    for condition in policy["spec"].get("matchConditions", []):
        if not bool(_program(condition["expression"]).evaluate(activation)):
            return True
    variables: dict[str, Any] = {}
    for variable in policy["spec"].get("variables", []):
        # In order: a variable may use the ones before it, as in the API server.
        earlier = celtypes.MapType({celtypes.StringType(k): v for k, v in variables.items()})
        variables[variable["name"]] = _program(variable["expression"]).evaluate(
            {**activation, "variables": earlier}
        )
    activation["variables"] = celtypes.MapType(
        {celtypes.StringType(k): v for k, v in variables.items()}
    )
    for validation in policy["spec"]["validations"]:
        if not bool(_program(validation["expression"]).evaluate(activation)):
            return False
    return True
