"""The compiled validator (happy path) and jsonschema (every report) agree on every document.

`schema_issues` trusts `fast_validator` to say "valid"; a document it passed that jsonschema
rejects would slip through unreported. Every fixture, example and generated mutation of them
must get the same verdict from both.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ROOT, STACKS
from trainstack import yamlio
from trainstack.config.loader import PLATFORM_KEY, STACK_KINDS
from trainstack.config.schema import fast_validator, schema_issues, validator
from trainstack.yamlio import YamlSyntaxError

CONFIG_FIXTURES = sorted((ROOT / "tests" / "config" / "fixtures").rglob("*.yaml"))
JOB_FILES = sorted((ROOT / "tests" / "jobs" / "fixtures").rglob("*.yaml")) + sorted(
    (ROOT / "job_specs").rglob("*.yaml")
)


def documents() -> Iterator[tuple[str, str, Any]]:
    """(id, schema file, document) for every stack file, fixture, job spec and the catalog."""
    for path in [*CONFIG_FIXTURES, *sorted(STACKS.glob("Pulumi.*.yaml"))]:
        try:
            config = (yamlio.load(path.read_text(encoding="utf-8")) or {}).get("config") or {}
        except YamlSyntaxError:
            continue  # duplicate keys: refused before any schema runs
        for key, schema in STACK_KINDS.items():
            if key in config:
                yield f"{path.parent.name}/{path.name}", schema, config[key]
    for path in JOB_FILES:
        try:
            doc = yamlio.load(path.read_text(encoding="utf-8"))
        except YamlSyntaxError:
            continue
        yield f"jobs/{path.parent.name}/{path.name}", "job.schema.json", doc
    catalog = ROOT / "trainstack" / "data" / "instances.yaml"
    yield "instances.yaml", "instances.schema.json", yamlio.load(catalog.read_text())


def mutations(doc: Any) -> Iterator[Any]:
    """Each leaf given a wrong type, each map given an unknown key, each list emptied."""
    paths: list[tuple[Any, ...]] = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*path, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, (*path, index))

    walk(doc, ())
    for path in paths:
        mutated = copy.deepcopy(doc)
        parent = mutated
        for step in path[:-1]:
            parent = parent[step]
        node = parent[path[-1]] if path else mutated
        if isinstance(node, dict):
            node["unexpectedKey"] = 1
            yield mutated
        elif isinstance(node, list):
            node.clear()
            yield mutated
        elif path:
            parent[path[-1]] = 7 if isinstance(node, str) else "seven"
            yield mutated
            parent[path[-1]] = -1 if isinstance(node, int | float) else ""
            yield mutated


def has_float(node: Any) -> bool:
    if isinstance(node, dict):
        return any(has_float(v) for v in node.values())
    if isinstance(node, list):
        return any(has_float(v) for v in node)
    return isinstance(node, float)


def test_floats_never_reach_the_compiled_validator() -> None:
    """It counts 2.0 as an integer; a count written 2.0 must still be refused."""
    doc = yamlio.load((ROOT / "job_specs" / "vision" / "demo-train.yaml").read_text())
    doc["spec"]["workers"]["gpus"] = 2.0
    fast = fast_validator("job.schema.json")
    assert fast is not None
    assert fast.is_valid(doc)  # why the strict one must decide
    issues = schema_issues("job.schema.json", doc, "job")
    assert [str(i) for i in issues] == ["job.spec.workers.gpus: expected integer, got number 2.0"]


CASES = list(documents())


@pytest.mark.parametrize(
    ("schema", "doc"), [(s, d) for _, s, d in CASES], ids=[c[0] for c in CASES]
)
def test_compiled_and_reference_validators_agree(schema: str, doc: Any) -> None:
    fast = fast_validator(schema)
    assert fast is not None, f"{schema} has no compiled validator"
    reference = validator(schema)
    checked = 0
    for candidate in [doc, *mutations(doc)]:
        if has_float(candidate):
            continue  # the compiled validator counts 2.0 as an integer: never asked (schema.py)
        expected = not any(True for _ in reference.iter_errors(candidate))
        assert fast.is_valid(candidate) is expected, candidate
        checked += 1
    assert checked > 1 or has_float(doc)


def test_cases_cover_every_schema_and_invalid_documents() -> None:
    schemas = {schema for _, schema, _ in CASES}
    assert schemas == {"platform.schema.json", "team.schema.json", "job.schema.json",
                       "instances.schema.json"}  # fmt: skip
    invalid = [name for name, s, d in CASES if any(True for _ in validator(s).iter_errors(d))]
    assert len(invalid) >= 10, invalid


def test_documents_json_lacks_get_the_full_report() -> None:
    """YAML dates are not JSON: the compiled validator raises, jsonschema reports."""
    platform = yamlio.load((STACKS / "Pulumi.dev.yaml").read_text())["config"][PLATFORM_KEY]
    platform = {**platform, "clusterName": yamlio.load("2025-01-01")}
    issues = schema_issues(STACK_KINDS[PLATFORM_KEY], platform, PLATFORM_KEY)
    assert [i.path for i in issues] == [f"{PLATFORM_KEY}.clusterName"]


@pytest.mark.parametrize("value", ["vision\n", "vision\n\n", "visi\u0661n"])
def test_patterns_follow_ecma_262_not_python(value: str) -> None:
    """Python's `$` also matches before a final newline and its `\\d` takes any Unicode digit;
    JSON Schema's patterns are ECMA-262 (and jsonschema-rs agrees): 'vision\\n' was accepted
    as a team name by the report and refused by the compiled validator."""
    doc = yamlio.load((ROOT / "job_specs" / "vision" / "demo-train.yaml").read_text())
    doc["metadata"]["team"] = value
    fast = fast_validator("job.schema.json")
    assert fast is not None
    assert not fast.is_valid(doc)
    assert [i.path for i in schema_issues("job.schema.json", doc, "job")] == ["job.metadata.team"]


def schema_nodes() -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, node) for every object node of every schema trainstack ships."""
    from trainstack.config.schema import SCHEMA_FILES, load_schema  # noqa: PLC0415

    def walk(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if isinstance(node, dict):
            yield path, node
            for key, value in node.items():
                yield from walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from walk(value, f"{path}[{index}]")

    for name in SCHEMA_FILES:
        yield from walk(load_schema(name), name)


def test_integer_enums_say_integer() -> None:
    """JSON equality makes 365.0 a member of [1, 3, …, 365]: an enum of counts also needs
    "type": "integer" to refuse the float (the fuzzer found logRetentionDays: 365.0)."""
    untyped = [
        path
        for path, node in schema_nodes()
        if node.get("enum")
        and all(type(v) is int for v in node["enum"])
        and node.get("type") != "integer"
    ]
    assert untyped == []


def test_every_pattern_explains_itself() -> None:
    """A pattern error prints the schema's description next to the regex; a pattern without one
    left users reading a bare regex such as ^cr-[0-9a-f]{8,17}$ (issue 41 #4)."""
    bare = [
        f"{path}: {node['pattern']}"
        for path, node in schema_nodes()
        if "pattern" in node and not node.get("description")
    ]
    assert bare == []
