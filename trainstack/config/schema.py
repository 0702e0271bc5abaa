"""JSON Schema (2020-12) contract: loading, validation into ConfigIssues, and defaults."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any, cast

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

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


@cache
def validator(filename: str) -> Draft202012Validator:
    """Compiled once per process: previews of many stacks reuse it."""
    schema = load_schema(filename)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=_registry())


@cache
def fast_validator(filename: str) -> jsonschema_rs.Validator | None:
    """A compiled (Rust) validator for the happy path; None for schemas that reference
    other files. jsonschema stays the one source of error reports."""
    schema = load_schema(filename)
    if any(not ref.startswith("#") for ref in _refs(schema)):
        return None
    return jsonschema_rs.Draft202012Validator(schema)


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
    fast = fast_validator(filename)
    if fast is not None:
        try:
            if fast.is_valid(document):
                return []
        except (TypeError, ValueError):
            pass  # a YAML type JSON lacks (dates): the full report says what is wrong
    issues: list[ConfigIssue] = []
    for error in validator(filename).iter_errors(document):
        issues.extend(_to_issues(error, root))
    return issues


def _to_issues(error: ValidationError, root: str) -> Iterator[ConfigIssue]:
    path = join_path(root, *error.absolute_path)
    value = error.instance
    if error.validator == "additionalProperties" and isinstance(value, Mapping):
        schema: Mapping[str, Any] = error.schema if isinstance(error.schema, Mapping) else {}
        known = set(schema.get("properties", {}))
        for key in sorted(set(value) - known):
            hint = did_you_mean(key, known)
            if not hint and known:
                hint = f" (allowed: {', '.join(sorted(known))})"
            yield ConfigIssue(join_path(path, key), f"unknown key{hint}")
    elif error.validator == "required" and isinstance(value, Mapping):
        # jsonschema yields one error per missing name; ConfigError de-duplicates.
        for name in cast(list[str], error.validator_value):
            if name not in value:
                yield ConfigIssue(join_path(path, name), "required field is missing")
    else:
        yield ConfigIssue(path, _message(error))


def _message(error: ValidationError) -> str:
    value, expected = error.instance, error.validator_value
    if error.validator == "enum":
        choices = [str(c) for c in cast(list[object], expected)]
        return f"{value!r} is not one of {', '.join(choices)}{did_you_mean(str(value), choices)}"
    if error.validator == "type":
        return f"expected {expected}, got {json_type(value)} {value!r}"
    if error.validator == "pattern":
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        about = f" ({schema['description']})" if "description" in schema else ""
        return f"{value!r} does not match the expected format {expected}{about}"
    if error.validator == "uniqueItems":
        return "items must be unique; remove the duplicate"
    if error.validator == "const":
        return f"{value!r} must be {expected!r}"
    return error.message


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


def _fill(root: Mapping[str, Any], node: Mapping[str, Any], value: Any) -> Any:
    node = _resolve(root, node)
    if isinstance(value, dict):
        out = dict(value)
        props: Mapping[str, Any] = node.get("properties", {})
        for key, sub in props.items():
            sub_resolved = _resolve(root, sub)
            if key not in out and "default" in sub:
                out[key] = json.loads(json.dumps(sub["default"]))
            elif key not in out and "default" in sub_resolved:
                out[key] = json.loads(json.dumps(sub_resolved["default"]))
            if key in out:
                out[key] = _fill(root, sub, out[key])
        return out
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [_fill(root, node["items"], item) for item in value]
    return value
