"""JSON Schema (2020-12) contract: loading, validation into ConfigIssues, and defaults."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any, cast

import jsonschema_rs
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

from trainstack.config import k8s_syntax
from trainstack.config.errors import ConfigIssue, did_you_mean, join_path

SCHEMA_FILES = (
    "platform.schema.json",
    "team.schema.json",
    "stack-file.schema.json",
    "instances.schema.json",
    "job.schema.json",
)
_JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


def schema_text(filename: str) -> str:
    return resources.files("trainstack.schemas").joinpath(filename).read_text(encoding="utf-8")


@cache
def _registry() -> Registry[Any]:
    registry: Registry[Any] = Registry()
    for filename in SCHEMA_FILES:
        contents = json.loads(schema_text(filename))
        registry = registry.with_resource(contents["$id"], Resource.from_contents(contents))
    return registry


@cache
def load_schema(filename: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(schema_text(filename))
    return schema


# Strings bound for Kubernetes fields carry a `format` naming Kubernetes' own rule
# (config/k8s_syntax.py), so the schema layer reports them with their field, in the same pass.
K8S_FORMATS: dict[str, tuple[str, Callable[[str], list[str]]]] = {
    "k8s-label-key": ("Kubernetes label key", k8s_syntax.qualified_name),
    "k8s-label-value": ("Kubernetes label value", k8s_syntax.label_value),
    # ValidateCSIDriverName lower-cases the name before the subdomain check.
    "k8s-csi-driver": ("CSI driver name", lambda v: k8s_syntax.dns1123_subdomain(v.lower())),
    "k8s-image": (
        "image reference (name:tag or name@sha256:<64 lowercase hex>)",
        k8s_syntax.image_reference,
    ),
    "k8s-quantity": ("Kubernetes quantity", k8s_syntax.quantity),
    "k8s-env-name": ("environment variable name", k8s_syntax.env_var_name),
    # A Secret's name: ValidateSecretName is NameIsDNSSubdomain (apimachinery).
    "k8s-name": ("Kubernetes object name", k8s_syntax.dns1123_subdomain),
}


def _format_checker() -> FormatChecker:
    checker = FormatChecker(formats=())
    for name, (_, rule) in K8S_FORMATS.items():
        checker.checks(name)(lambda value, rule=rule: not isinstance(value, str) or not rule(value))
    return checker


def _is_integer(checker: object, instance: object) -> bool:
    """Only ints are integers. JSON Schema counts 2.0 as one (2020-12 core, "integer": "any
    number with a zero fractional part"), and a YAML `gpus: 2.0` then reached torchrun's
    arguments and the device requests as '2.0', failing at run time."""
    del checker
    return isinstance(instance, int) and not isinstance(instance, bool)


@cache
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """A JSON Schema pattern with ECMA-262 semantics where Python's differ (2020-12 core,
    "Regular Expressions"): `$` outside a class is the end of the text (Python's also matches
    before a final newline, so 'vision\\n' passed ^[a-z]...$), and \\d, \\w are ASCII."""
    out, in_class, escaped = [], False, False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "[":
            in_class = True
            out.append(char)
        elif char == "]":
            in_class = False
            out.append(char)
        else:
            out.append("\\Z" if char == "$" and not in_class else char)
    return re.compile("".join(out), re.ASCII)


def _pattern(
    validator: Any, pattern: str, instance: object, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    del validator, schema
    if isinstance(instance, str) and not ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


StrictValidator: Any = validators.extend(  # type: ignore[no-untyped-call]  # untyped upstream
    Draft202012Validator,
    validators={"pattern": _pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@cache
def validator(filename: str) -> Draft202012Validator:
    """Compiled once per process: previews of many stacks reuse it."""
    schema = load_schema(filename)
    Draft202012Validator.check_schema(schema)
    strict: Draft202012Validator = StrictValidator(
        schema, registry=_registry(), format_checker=_format_checker()
    )
    return strict


@cache
def fast_validator(filename: str) -> jsonschema_rs.Validator | None:
    """A compiled (Rust) validator for the happy path; None for schemas that reference
    other files. jsonschema stays the one source of error reports."""
    schema = load_schema(filename)
    if any(not ref.startswith("#") for ref in _refs(schema)):
        return None
    # With formats on it would also check date-time and the like, which the reference
    # validator leaves to the loader's own checks: only Kubernetes' formats, on both.
    return jsonschema_rs.Draft202012Validator(
        _only_k8s_formats(schema),
        formats={name: lambda v, rule=rule: not rule(v) for name, (_, rule) in K8S_FORMATS.items()},
        validate_formats=True,
    )


def _only_k8s_formats(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {
            key: _only_k8s_formats(value)
            for key, value in node.items()
            if not (key == "format" and isinstance(value, str) and value not in K8S_FORMATS)
        }
    if isinstance(node, list):
        return [_only_k8s_formats(item) for item in node]
    return node


def _refs(node: object) -> Iterator[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def schema_issues(filename: str, document: object, root: str) -> list[ConfigIssue]:
    """Every schema violation in `document`, as issues whose paths start at `root`.

    Valid documents, nearly all of them, pass the compiled validator in microseconds (every
    job spec of an organisation is checked on each preview); any other document gets
    jsonschema's full report. tests/config/test_schema_parity.py holds the two to the same
    verdict on every fixture.
    """
    floats = list(_floats(document, ()))
    fast = fast_validator(filename)
    # The compiled validator takes 2.0 for an integer: documents with floats get the strict one.
    if fast is not None and not floats:
        try:
            if fast.is_valid(document):
                return []
        except (TypeError, ValueError):
            pass  # a YAML type JSON lacks (dates): the full report says what is wrong
    # No field wants .inf or .nan, and NaN passes every minimum and maximum: each is refused
    # here, once, instead of crashing arithmetic later (round(nan)).
    bad = {where: value for where, value in floats if not math.isfinite(value)}
    issues = [
        ConfigIssue(join_path(root, *where), f"{value!r} is not a finite number")
        for where, value in bad.items()
    ]
    for error in validator(filename).iter_errors(document):
        if tuple(error.absolute_path) not in bad:
            issues.extend(_to_issues(error, root))
    return _one_cause(issues)


UNKNOWN_KEY = "unknown key"
MISSING = "required field is missing"


def _one_cause(issues: list[ConfigIssue]) -> list[ConfigIssue]:
    """A misspelt required key is one mistake, not two: `maxDurationHour` got "unknown key
    (did you mean 'maxDurationHours'?)" and "maxDurationHours: required field is missing"
    (issue 41 #4). The missing one goes; the unknown key says the right one is required."""
    missing = {i.path: i for i in issues if i.message.startswith(MISSING)}
    out, dropped = [], set()
    for issue in issues:
        found = issue
        if issue.message.startswith(UNKNOWN_KEY):
            parent, _, key = issue.path.rpartition(".")
            for path in missing:
                head, _, name = path.rpartition(".")
                if head == parent and did_you_mean(key, [name]):
                    dropped.add(path)
                    message = f"{UNKNOWN_KEY} (did you mean {name!r}? it is required)"
                    found = ConfigIssue(issue.path, message)
                    break
        out.append(found)
    return [i for i in out if i.path not in dropped or not i.message.startswith(MISSING)]


def _floats(
    node: object, where: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], float]]:
    if isinstance(node, float):
        yield where, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _floats(value, (*where, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _floats(value, (*where, index))


def _to_issues(error: ValidationError, root: str) -> Iterator[ConfigIssue]:
    path = join_path(root, *error.absolute_path)
    if "propertyNames" in error.schema_path and isinstance(error.instance, str):
        path = join_path(path, error.instance)  # a key's own error: name the key
    value = error.instance
    if error.validator == "additionalProperties" and isinstance(value, Mapping):
        schema: Mapping[str, Any] = error.schema if isinstance(error.schema, Mapping) else {}
        known = set(schema.get("properties", {}))
        for key in sorted(set(value) - known):
            hint = did_you_mean(key, known)
            if not hint and known:
                hint = f" (allowed: {', '.join(sorted(known))})"
            yield ConfigIssue(join_path(path, key), f"{UNKNOWN_KEY}{hint}")
    elif error.validator == "required" and isinstance(value, Mapping):
        # jsonschema yields one error per missing name; ConfigError de-duplicates. What the
        # field is for, from its description: "required field is missing" alone left users
        # to find the schema (issue 41 #4).
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        properties: Mapping[str, Any] = schema.get("properties", {})
        for name in cast(list[str], error.validator_value):
            if name not in value:
                about = properties.get(name, {}).get("description")
                message = (
                    f"required field is missing: {about}" if about else "required field is missing"
                )
                yield ConfigIssue(join_path(path, name), message)
    else:
        yield ConfigIssue(path, _message(error))


def _message(error: ValidationError) -> str:
    value, expected = error.instance, error.validator_value
    match error.validator:
        case "enum":
            choices = [str(c) for c in cast(list[object], expected)]
            hint = did_you_mean(str(value), choices)
            message = f"{value!r} is not one of {', '.join(choices)}{hint}"
        case "type":
            message = f"expected {expected}, got {json_type(value)} {value!r}"
        case "pattern":
            schema = error.schema if isinstance(error.schema, Mapping) else {}
            about = f" ({schema['description']})" if "description" in schema else ""
            message = f"{value!r} does not match the expected format {expected}{about}"
        case "format" if expected in K8S_FORMATS and isinstance(value, str):
            what, rule = K8S_FORMATS[expected]
            message = f"{value!r} is not a valid {what}: {'; '.join(rule(value))}"
        case "uniqueItems":
            message = "items must be unique; remove the duplicate"
        case "const":
            message = f"{value!r} must be {expected!r}{did_you_mean(str(value), [str(expected)])}"
        case _:
            message = error.message
    return message


def apply_defaults(filename: str, document: Any) -> Any:
    """Return a copy of `document` with every schema `default` filled in.

    The schema is the single source of default values; dataclass builders never
    invent their own.
    """
    schema = load_schema(filename)
    return _fill(schema, schema, document)


def _resolve(root: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        return _resolve(root, target)
    return node


# Per schema node: its properties' (name, default as JSON text or None, subschema), worked out
# once per node (schemas are loaded once and kept). Every job spec of an organisation fills
# its defaults on each preview; resolving `$ref`s for every field of every spec was a fifth
# of reading one.
_FILL_PLANS: dict[int, tuple[Mapping[str, Any], tuple[tuple[str, str | None, Any], ...]]] = {}


def _fill_plan(
    root: Mapping[str, Any], node: Mapping[str, Any]
) -> tuple[tuple[str, str | None, Any], ...]:
    cached = _FILL_PLANS.get(id(node))
    if cached is not None and cached[0] is node:
        return cached[1]
    plan = []
    for key, sub in node.get("properties", {}).items():
        holder = sub if "default" in sub else _resolve(root, sub)
        default = json.dumps(holder["default"]) if "default" in holder else None
        plan.append((key, default, sub))
    _FILL_PLANS[id(node)] = (node, tuple(plan))  # the node held: its id is not reused
    return tuple(plan)


def _fill(root: Mapping[str, Any], node: Mapping[str, Any], value: Any) -> Any:
    node = _resolve(root, node)
    if isinstance(value, dict):
        out = dict(value)
        for key, default, sub in _fill_plan(root, node):
            if key not in out and default is not None:
                out[key] = json.loads(default)  # a fresh copy of the schema's value
            if key in out:
                out[key] = _fill(root, sub, out[key])
        return out
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [_fill(root, node["items"], item) for item in value]
    return value
