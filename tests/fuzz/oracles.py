"""Oracles: what a `trainstack` command may do with a mutated file, and the failure reports.

The contract (issue "Bad input: no traceback, no silent change, every error names its field"):
a command on a mutant either

- exits 0, and then what it accepted is exactly what was written: no key written twice in one
  mapping (`check_accepted`, a), no float where the schema wants an integer and no
  non-finite number (b), and for previews a plan that changes exactly when the document does
  (`check_plan`, c); or
- exits 1 with a message that names the file and, for every problem, a JSON path
  (`job.spec.workers.gpus`, `trainstack:platform.gpuPools[0].size.max`), or for YAML that does
  not parse, the line and column (`check_located`); or
- for `preview` only, exits 3 (mandatory policy violations) naming each violated rule
  (`check_rules_named`).

Never a traceback, never another exit code (`check_clean`). Each broken promise raises its own
`OracleFailure` subclass, so hypothesis reports each kind of failure separately, and each
message shows the source file, the mutation, the mutated excerpt, the command, its exit code
and its output.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend
from referencing import Registry, Resource

from tests.fuzz.mutate import Mutant, display_path
from trainstack.config.schema import apply_defaults

# -- outcomes and failures ------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one CLI invocation did (from typer's CliRunner)."""

    command: tuple[str, ...]
    exit_code: int
    output: str
    exception: BaseException | None
    seconds: float
    timed_out: bool = False


class OracleFailure(AssertionError):
    """A mutant broke the contract; the subclass says which promise."""


class Crash(OracleFailure):
    """An exception other than SystemExit escaped, or a traceback was printed."""


class Hang(OracleFailure):
    """The command ran past its time limit (a loop or allocation sized by the input)."""


class BadExitCode(OracleFailure):
    """An exit code outside the contract (0 or 1; 3 for preview)."""


class Unlocated(OracleFailure):
    """An error message that does not name the file, or a problem without a JSON path."""


class RawError(OracleFailure):
    """An error message that is Python's wording (KeyError, 'object has no attribute', ...)."""


class DuplicateKeyAccepted(OracleFailure):
    """A file with the same key twice in one mapping was accepted (one value silently lost)."""


class FloatForInteger(OracleFailure):
    """An accepted document holds a float where the schema declares an integer."""


class NonFinite(OracleFailure):
    """An accepted document holds .inf or .nan."""


class NotJson(OracleFailure):
    """An accepted document holds a value JSON lacks (date, bytes, set, a non-string key)."""


class SchemaViolationAccepted(OracleFailure):
    """An accepted document does not validate against its own JSON schema."""


class NoOpChangedPlan(OracleFailure):
    """A mutant that loads to the same document produced a different plan."""


class ChangeIgnored(OracleFailure):
    """A mutant that loads to a different document produced the very same plan."""


class RulesUnnamed(OracleFailure):
    """Exit 3 without naming each violated mandatory rule."""


class Inconsistent(OracleFailure):
    """Two commands disagree on one file (validate rejects what preview accepts, ...)."""


def report(
    category: type[OracleFailure], what: str, mutant: Mutant, outcome: Outcome | None
) -> OracleFailure:
    """The failure, with everything needed to reproduce and understand it."""
    lines = [
        f"{category.__name__}: {what}",
        f"source:    {mutant.source.rel}",
        f"mutation:  {mutant.describe()}",
        "excerpt:",
        _indent(printable(mutant.excerpt())),
    ]
    if outcome is not None:
        exception = "none" if outcome.exception is None else repr(outcome.exception)
        lines += [
            f"command:   trainstack {' '.join(outcome.command)}",
            f"exit code: {outcome.exit_code}  exception: {exception}  "
            f"time: {outcome.seconds:.2f}s{'  TIMED OUT' if outcome.timed_out else ''}",
            "output:",
            _indent(_head(outcome.output, 40) or "(none)"),
        ]
    return category("\n".join(lines))


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def printable(text: str) -> str:
    """Control characters (a NUL byte in a mutant) escaped, so reports stay text."""
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def _head(text: str, count: int) -> str:
    lines = printable(text).rstrip().splitlines()
    shown = [line if len(line) <= 300 else line[:297] + "..." for line in lines[:count]]
    if len(lines) > count:
        shown.append(f"... {len(lines) - count} more lines")
    return "\n".join(shown)


# -- never a traceback, never another exit code -----------------------------------------------


def check_clean(outcome: Outcome, mutant: Mutant, allowed: Sequence[int] = (0, 1)) -> None:
    """The command ended through its own exit path, with a contract exit code.

    Proves: no exception but SystemExit left the command (CliRunner keeps it in
    `result.exception`: a traceback for a user), no "Traceback" was printed, the command
    finished within its time limit, and the exit code is one the CLI documents.
    Cannot prove: that the exit code is the right one; the other checks judge that.
    """
    if outcome.timed_out:
        raise report(Hang, f"no result after {outcome.seconds:.0f}s", mutant, outcome)
    exception = outcome.exception
    if exception is not None and not isinstance(exception, SystemExit):
        where = _origin(exception)
        raise report(
            Crash, f"{type(exception).__name__}: {exception} ({where})", mutant, outcome
        ) from exception
    if "Traceback" in outcome.output:
        raise report(Crash, "a traceback was printed", mutant, outcome)
    if outcome.exit_code not in allowed:
        raise report(
            BadExitCode, f"exit code {outcome.exit_code}, allowed {list(allowed)}", mutant, outcome
        )


_PROJECT = Path(__file__).resolve().parents[2]


def _origin(exception: BaseException) -> str:
    """The innermost frame of trainstack's own code (not a library, not these tests)."""
    frame = exception.__traceback__
    found = "no frame of the project"
    while frame is not None:
        filename = Path(frame.tb_frame.f_code.co_filename)
        outside = (_PROJECT / "tests", _PROJECT / ".venv")
        if filename.is_relative_to(_PROJECT) and not any(map(filename.is_relative_to, outside)):
            found = f"{filename.relative_to(_PROJECT)}:{frame.tb_lineno}"
        frame = frame.tb_next
    return found


# -- exit 1: the file and the JSON path of every problem ---------------------------------------

_ISSUE = re.compile(r"^\s+- (?P<body>.*)$")
_FILE_PREFIX = re.compile(r"^[\w./-]+\.ya?ml: ")
_LINE_PREFIX = re.compile(r"^line \d+: ")  # the CLI's line of the path (config/lines.py)
_FILE_POSITION = re.compile(r"^[\w./-]+\.ya?ml:\d+:\d+: ")  # a YAML error inside an issue
_PATH = re.compile(r"^(?:job|config|trainstack:[A-Za-z_-]*)(?:[.\[].*)?$")
_ROOT_LEVEL = {"file", "kind"}  # the document itself, or its kind: nothing deeper to name
_POSITION = re.compile(r"\bline \d+, column \d+|\b(?:byte|position) \d+")
_PYTHON_WORDING = re.compile(
    r"\b(?:KeyError|TypeError|AttributeError|IndexError|RecursionError|AssertionError|"
    r"UnicodeDecodeError|OverflowError|ZeroDivisionError)\b|object has no attribute|"
    r"is not subscriptable|unhashable type|not supported between instances|"
    r"object is not iterable|unsupported operand|codec can't decode|Circular reference"
)


def issues_of(output: str) -> list[str]:
    """The `  - <path>: <message>` lines of a ConfigError as the CLI prints it."""
    return [m.group("body") for line in output.splitlines() if (m := _ISSUE.match(line))]


def positions_of(output: str, file_name: str) -> list[str]:
    """`<file>:<line>:<column>: <problem>` lines (how YAML errors are reported) for the file."""
    pattern = re.compile(rf"{re.escape(file_name)}:\d+:\d+: \S")
    return [line for line in output.splitlines() if pattern.search(line)]


def is_located(issue: str, document_loads: bool) -> bool:
    """True when an issue names where: a JSON path, or a line and column (or byte).

    `file` and `kind` name the document itself; they locate a problem only when the text is
    YAML (a document without `config:`, an empty one); a YAML error needs its position.
    """
    if _FILE_POSITION.match(issue):
        return True
    body = _FILE_PREFIX.sub("", _LINE_PREFIX.sub("", issue, count=1), count=1)
    path, sep, message = body.partition(": ")
    if not sep:
        return False
    if _POSITION.search(message) or message.startswith("cannot read"):
        return True
    if path in _ROOT_LEVEL:
        return document_loads
    return bool(_PATH.match(path))


def check_located(output: str, file_name: str, mutant: Mutant, outcome: Outcome) -> None:
    """An exit-1 message names the file, and every problem in it where it is.

    Proves: the user is told which file (its name appears) and, for each problem, where in
    the document: a path from `job`, `config` or `trainstack:<kind>`, or `file`/`kind` for
    the document as a whole; for YAML that does not parse (or repeats a key), the line and
    column (`file:line:column: problem`); and that no message is Python's own wording.
    Cannot prove: that the path is the right one or the message helpful; a wrong but
    well-formed path passes.
    """
    if file_name not in output:
        raise report(Unlocated, f"the message does not name the file {file_name}", mutant, outcome)
    issues = issues_of(output)
    if not issues and not positions_of(output, file_name):
        raise report(
            Unlocated,
            "neither '  - <path>: <message>' nor '<file>:<line>:<column>: ...' in the message",
            mutant,
            outcome,
        )
    loads = loads_as_yaml(mutant)
    unlocated = [issue for issue in issues if not is_located(issue, loads)]
    if unlocated:
        raise report(Unlocated, f"problems without a JSON path: {unlocated[:3]}", mutant, outcome)
    raw = _PYTHON_WORDING.search(output)
    if raw:
        raise report(
            RawError, f"Python's wording in the message: {raw.group(0)!r}", mutant, outcome
        )


def loads_as_yaml(mutant: Mutant) -> bool:
    """True when the mutant is UTF-8 text that YAML's safe loader loads to one document."""
    text = mutant.text
    if text is None:
        return False
    try:
        yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return False
    return True


def check_rules_named(
    output: str, plan: Mapping[str, Any], mutant: Mutant, outcome: Outcome
) -> None:
    """Exit 3 names every mandatory rule the plan violates.

    Proves: each mandatory violation recorded in the written plan.json appears by rule name in
    the output. Cannot prove: that the violations are right.
    """
    violations = plan.get("policy", {}).get("violations", [])
    mandatory = sorted({v["rule"] for v in violations if v.get("level") == "mandatory"})
    if not mandatory:
        raise report(
            RulesUnnamed, "exit 3 but plan.json has no mandatory violation", mutant, outcome
        )
    flat = "".join(output.split())
    missing = [rule for rule in mandatory if rule not in flat]
    if missing:
        raise report(RulesUnnamed, f"rules not named: {missing}", mutant, outcome)


# -- exit 0: what was accepted is what was written ---------------------------------------------


class _PairsLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader, recording every key that appears twice in one mapping."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Before the merge keys (<<) are flattened: an explicit key may override a merged one.
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                marker = f"{type(key).__name__}:{key!r}"
                line = key_node.start_mark.line + 1
                if marker in seen:
                    self.duplicates.append(f"{key!r} on lines {seen[marker]} and {line}")
                seen.setdefault(marker, line)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result


def load_recording_duplicates(text: str) -> tuple[Any, list[str]]:
    """The document (as the safe loader builds it) and its keys written twice in one mapping,
    e.g. ["'replicas' on lines 14 and 15"]."""
    loader = _PairsLoader(text)
    try:
        document = loader.get_single_data()
    finally:
        loader.dispose()
    return document, loader.duplicates


def is_job(document: object) -> bool:
    """How the CLI tells a job spec from a stack file (`kind: TrainingJob`)."""
    return isinstance(document, Mapping) and document.get("kind") == "TrainingJob"


def checked_parts(document: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """The parts of a document trainstack validates: the job, or each trainstack: config value."""
    if is_job(document):
        return [((), document)]
    config = document.get("config") if isinstance(document, Mapping) else None
    if not isinstance(config, Mapping):
        return []
    return [
        (("config", key), value)
        for key, value in config.items()
        if key in ("trainstack:platform", "trainstack:team")
    ]


def check_accepted(mutant: Mutant, outcome: Outcome) -> Any:
    """A mutant a command accepted holds exactly what its text says; returns its document.

    Proves (a): no mapping in the text has a key twice (YAML keeps the last and drops the
    other without a word); (b): the document validates against its JSON schema read as JSON
    Schema specifies (ECMA-262 patterns: "32Gi\\n" does not match ^[0-9]+Gi$, though Python's
    re says it does), no value the schema types "integer" is a float (2.0: JSON Schema's
    integer admits it, the text says float), no number is .inf or .nan, and every value is
    plain JSON (no dates, bytes or sets, only string keys), so what a stack or job receives is
    what the text shows.
    Cannot prove: that a valid, plain value means what the user meant (`12:30` is the integer
    750 in YAML 1.1, `on` is true); nor anything about values outside the checked parts
    (stack config keys of other namespaces).
    """
    text = mutant.text
    if text is None:
        raise report(SchemaViolationAccepted, "accepted a file that is not UTF-8", mutant, outcome)
    try:
        document, duplicates = load_recording_duplicates(text)
    except yaml.YAMLError as err:
        raise report(
            SchemaViolationAccepted, f"accepted text that is not YAML: {err}", mutant, outcome
        ) from None
    if duplicates:
        raise report(
            DuplicateKeyAccepted,
            f"keys written twice: {', '.join(duplicates[:3])}",
            mutant,
            outcome,
        )
    kind = "job" if is_job(document) else "stack"
    parts = checked_parts(document)
    if not parts:
        what = "accepted a document that is neither a job spec nor a trainstack stack file"
        raise report(SchemaViolationAccepted, what, mutant, outcome)
    for base, part in parts:
        for path, value in _leaves(part, base):
            where = display_path(kind, path)
            if isinstance(value, float) and not math.isfinite(value):
                raise report(NonFinite, f"{where} is {value!r}", mutant, outcome)
            if not _is_json(value) or (path[-1:] == ("(key)",) and not isinstance(value, str)):
                raise report(
                    NotJson, f"{where} is {type(value).__name__} {value!r}", mutant, outcome
                )
        # Each part against its own schema: jsonschema switches to the stock validator class
        # when a $ref lands on a document with its own $schema (stack-file -> platform).
        schema = _KIND_SCHEMAS[base[-1]] if base else "job.schema.json"
        strict_errors = list(_strict(schema).iter_errors(part))
        if not strict_errors:
            continue  # the common case: one pass of the stricter validator
        violations = [_describe(e, kind, base) for e in validator(schema).iter_errors(part)]
        if violations:
            raise report(
                SchemaViolationAccepted, f"schema errors: {violations[:3]}", mutant, outcome
            )
        floats = [_describe(e, kind, base) for e in _float_integers(strict_errors)]
        what = "; ".join(floats[:3]) or _describe(strict_errors[0], kind, base)
        raise report(FloatForInteger, what, mutant, outcome)
    return document


def _is_json(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


def _leaves(
    value: Any, path: tuple[Any, ...], above: frozenset[int] = frozenset()
) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every scalar of a document, and every mapping key (at `<path>.<key>.(key)`)."""
    if id(value) in above:
        yield path, value
        return
    above = above | {id(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key, "(key)"), key
            yield from _leaves(item, (*path, key), above)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index), above)
    else:
        yield path, value


def _describe(error: ValidationError, kind: str, base: tuple[Any, ...] = ()) -> str:
    return f"{display_path(kind, (*base, *error.absolute_path))}: {error.message}"


@cache
def schemas() -> dict[str, dict[str, Any]]:
    """trainstack's JSON schemas by file name, as shipped in the package."""
    folder = resources.files("trainstack.schemas")
    return {
        entry.name: json.loads(entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".schema.json")
    }


@cache
def _registry() -> Registry[Any]:
    registry: Registry[Any] = Registry()
    for contents in schemas().values():
        registry = registry.with_resource(contents["$id"], Resource.from_contents(contents))
    return registry


@cache
def validator(filename: str) -> Draft202012Validator:
    """The schema's validator with JSON Schema's own regex semantics (see `_ecma_pattern`)."""
    checker: Draft202012Validator = _EcmaValidator(schemas()[filename], registry=_registry())
    return checker


_DOLLAR = re.compile(r"(?<!\\)\$")


def _ecma_pattern(
    checker: Draft202012Validator, pattern: str, instance: object, schema: object
) -> Iterator[ValidationError]:
    r"""`pattern` as ECMA-262 reads it: `$` is the end of the string.

    Python's `$` also matches before a final newline, so Python's jsonschema accepts "32Gi\n"
    for ^[0-9]+(Ki|Mi|Gi|Ti)$; JSON Schema (ECMA-262 regexes) does not.
    """
    del checker, schema
    if isinstance(instance, str) and not re.search(_DOLLAR.sub(r"\\Z", pattern), instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r} ($: end of string)")


_EcmaValidator = extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, validators={"pattern": _ecma_pattern}
)


def _strict_integer(checker: object, instance: object) -> bool:
    del checker
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = extend(  # type: ignore[no-untyped-call]
    _EcmaValidator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
)


@cache
def _strict(filename: str) -> Draft202012Validator:
    """The schema's validator whose "integer" is a Python int: 2.0 fails it."""
    strict: Draft202012Validator = _StrictValidator(schemas()[filename], registry=_registry())
    return strict


def _float_integers(errors: list[ValidationError]) -> list[ValidationError]:
    """The errors (or their causes, under anyOf/oneOf) that are floats typed "integer"."""
    found: list[ValidationError] = []
    pending = list(errors)
    while pending:
        error = pending.pop()
        pending.extend(error.context or [])
        expected = error.validator_value
        types = expected if isinstance(expected, list) else [expected]
        if error.validator == "type" and isinstance(error.instance, float) and "integer" in types:
            found.append(error)
    return sorted(found, key=lambda e: list(map(str, e.absolute_path)))


# -- previews: the plan changes exactly when the document does ---------------------------------


_SCALARS: dict[type, str] = {bool: "bool", int: "int", str: "str", type(None): "null"}


def canonical(value: Any, above: frozenset[int] = frozenset()) -> Any:
    """A form where equal means the same YAML data: 2, 2.0 and true all differ, maps unordered."""
    if type(value) in _SCALARS:
        return (_SCALARS[type(value)], value)
    if isinstance(value, float):
        return ("float", repr(value))  # nan equals nan here
    if id(value) in above:
        return ("cycle",)
    inner = above | {id(value)}
    if isinstance(value, list):
        return ("list", tuple(canonical(v, inner) for v in value))
    if isinstance(value, dict):
        items = ((canonical(k, inner), canonical(v, inner)) for k, v in value.items())
        return ("map", tuple(sorted(items, key=repr)))
    return ("other", type(value).__name__, repr(value))


def with_defaults(document: Any) -> Any:
    """The document with every schema default filled in (a key at its default is no change),
    by the loader's own `apply_defaults`."""
    out = json_copy(document)
    for path, part in checked_parts(out):
        name = "job.schema.json" if not path else _KIND_SCHEMAS[path[-1]]
        filled = apply_defaults(name, part)
        if path:
            out["config"][path[-1]] = filled
        else:
            out = filled
    return out


_KIND_SCHEMAS = {
    "trainstack:platform": "platform.schema.json",
    "trainstack:team": "team.schema.json",
}


def json_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value


def differences(a: Any, b: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths where two documents differ (a list of another length differs as a whole)."""
    if isinstance(a, dict) and isinstance(b, dict):
        found: list[tuple[Any, ...]] = []
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                found.append((*path, key))
            else:
                found += differences(a[key], b[key], (*path, key))
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            p
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for p in differences(x, y, (*path, i))
        ]
    return [] if canonical(a) == canonical(b) else [path]


@dataclass(frozen=True)
class Neutral:
    """A document path whose change may leave the plan as it is, and why."""

    source: str  # regex over the source file (stacks/Pulumi.prod.yaml)
    path: str  # regex over the display path (trainstack:platform.tags.x)
    reason: str


def check_plan(
    mutant: Mutant,
    subject: Any,
    original: Any,
    plan: Mapping[str, Any],
    original_plan: Mapping[str, Any],
    neutral: Sequence[Neutral],
    outcome: Outcome,
    kind: str,
    computed: Callable[[Any], Any] = lambda document: document,
) -> None:
    """An accepted preview's plan differs from the original's exactly when the document does.

    `subject` and `original` are the documents the preview reads from the mutated file and
    from the example (the stack's `config:`, or the job spec), compared with schema defaults
    and then `computed` defaults (those trainstack derives in code) filled in, and types kept
    apart (2 is not 2.0). Proves: a mutant that loads to the same document plans the same
    (formatting, comments, anchors, key order and spelled-out defaults change nothing), and a
    mutant that loads to another document plans differently (no field is silently ignored),
    except where every difference lies on a `Neutral` path.
    Cannot prove: that the plan changed in the right way, or enough (a renamed pool that
    changes one label passes); nor catch an ignored field next to one that is honoured.
    """
    changed = differences(computed(with_defaults(original)), computed(with_defaults(subject)))
    if not changed:
        if plan != original_plan:
            raise report(
                NoOpChangedPlan,
                f"same document, but the plan differs: {plan_differences(original_plan, plan)}",
                mutant,
                outcome,
            )
        return
    if plan != original_plan:
        return
    shown = [display_path(kind, p) for p in changed]
    ignored = [
        p
        for p in shown
        if not any(re.search(n.source, mutant.source.rel) and re.search(n.path, p) for n in neutral)
    ]
    if ignored:
        raise report(
            ChangeIgnored,
            f"the document changed at {ignored[:4]}, the plan is identical",
            mutant,
            outcome,
        )


def plan_differences(a: Mapping[str, Any], b: Mapping[str, Any], limit: int = 4) -> list[str]:
    """Resources (type::name) and outputs that differ between two plans."""
    resources_a = {f"{r['type']}::{r['name']}": r for r in a.get("resources", [])}
    resources_b = {f"{r['type']}::{r['name']}": r for r in b.get("resources", [])}
    found = [
        ref
        for ref in sorted(set(resources_a) | set(resources_b))
        if resources_a.get(ref) != resources_b.get(ref)
    ]
    found += [
        f"output {key}"
        for key in sorted(set(a.get("outputs", {})) | set(b.get("outputs", {})))
        if a.get("outputs", {}).get(key) != b.get("outputs", {}).get(key)
    ]
    if a.get("policy") != b.get("policy"):
        found.append("policy violations")
    return found[:limit] + ([f"... {len(found) - limit} more"] if len(found) > limit else [])


# -- several files in one `validate` --------------------------------------------------------


def split_by_file(output: str, paths: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Each file's part of a multi-file `validate` output, and the lines no file owns.

    A file's part starts with a line `<path>: ok (...)`, `<path>: N config error(s):` or
    `<path>:<line>:<column>: ...` and runs through the indented lines after it.
    """
    parts: dict[str, list[str]] = {path: [] for path in paths}
    stray: list[str] = []
    owner: str | None = None
    for line in output.splitlines():
        owner_now = next((p for p in paths if line.startswith(f"{p}:")), None)
        if owner_now is not None:
            owner = owner_now
            parts[owner].append(line)
        elif owner is not None and line.startswith("  "):
            parts[owner].append(line)
        elif line.strip():
            owner = None
            stray.append(line)
    return {path: "\n".join(lines) for path, lines in parts.items()}, stray


def verdict(part: str, path: str) -> str:
    """'ok', 'error' or 'none' (no line about the file) for its part of a `validate` output."""
    if part.startswith(f"{path}: ok ("):
        return "ok"
    return "error" if part.startswith(f"{path}:") else "none"
