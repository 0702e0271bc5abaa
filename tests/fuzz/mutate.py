"""The mutation engine: named, pure mutations of stack files and job specs.

A mutation takes the text of a YAML file (and, for the document-level ones, the document it
loads to) and a `Chooser` that makes every decision: which node, which variant. Given the same
choices, a mutation always gives the same text, so a failing mutant can be rebuilt from its
description alone. Nothing here touches the file system or trainstack.

Two families:

- document-level (`DOC_MUTATIONS`): load the file, change one node of the document (delete,
  rename, retype, renumber, truncate, swap list and map, ...), dump it again. Comments and
  layout are lost, the change is exactly the one named.
- text-level (`TEXT_MUTATIONS`): splice the text itself, at positions taken from the composed
  YAML node tree: duplicate keys, YAML specials (`~`, `yes`, `.nan`, `0x1F`, dates, tags),
  anchors and aliases, multi-document markers, truncation, deleted lines, broken indentation,
  empty files and bytes that are not UTF-8.

`mutate` chains one or two of them; every step records its name, where it struck (the JSON path
the way trainstack prints it, and the line), what it did, and the text before and after, so
that a failure report can show the source file, the mutation and the mutated excerpt.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml

T = TypeVar("T")
Key = Any  # a mapping key as loaded (str nearly always) or a sequence index (int)
DocPath = tuple[Key, ...]

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class Chooser(Protocol):
    """Every decision a mutation makes goes through this (hypothesis or a seeded Random)."""

    def choice(self, options: Sequence[T]) -> T: ...

    def integer(self, low: int, high: int) -> int: ...


class RandomChooser:
    """A Chooser over `random.Random`, for scripts that want mutants without hypothesis."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)


# -- sources and mutants -------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One example file the mutants start from."""

    rel: str  # path relative to the project root, e.g. stacks/Pulumi.prod.yaml
    kind: str  # "stack" or "job"
    text: str

    @property
    def name(self) -> str:
        return Path(self.rel).name

    @property
    def stack(self) -> str:
        """The stack a stack file belongs to (stacks/Pulumi.<stack>.yaml); '' for job specs."""
        if self.kind != "stack":
            return ""
        return self.name[len("Pulumi.") : -len(".yaml")]


def load_sources(root: Path) -> list[Source]:
    """Every example stack file and every vision job spec, in a stable order."""
    stacks = sorted((root / "stacks").glob("Pulumi.*.yaml"))
    jobs = sorted((root / "job_specs" / "vision").glob("*.yaml"))
    return [
        Source(str(path.relative_to(root)), kind, path.read_text(encoding="utf-8"))
        for kind, paths in (("stack", stacks), ("job", jobs))
        for path in paths
    ]


@dataclass(frozen=True)
class Step:
    """One applied mutation: its name, where it struck, and what it did."""

    mutation: str
    where: str
    detail: str
    before: str
    after: str | bytes

    def describe(self) -> str:
        return f"{self.mutation} at {self.where} ({self.detail})"

    def excerpt(self, limit: int = 14) -> str:
        """The changed lines, as a unified diff with one line of context."""
        after = self.after
        if isinstance(after, bytes):
            after = after.decode("utf-8", errors="backslashreplace")
        lines = [
            line
            for line in difflib.unified_diff(
                self.before.splitlines(), after.splitlines(), lineterm="", n=1
            )
            if not line.startswith(("---", "+++"))
        ]
        if not lines and self.before != after:
            lines = ["(only line endings or trailing characters differ)"]
        if not lines:
            lines = ["(text unchanged)"]
        shown = [line if len(line) <= 160 else line[:157] + "..." for line in lines[:limit]]
        if len(lines) > limit:
            shown.append(f"... {len(lines) - limit} more diff lines")
        return "\n".join(shown)


@dataclass(frozen=True)
class Mutant:
    """A mutated file: its origin, the steps that made it, and its bytes."""

    source: Source
    steps: tuple[Step, ...]
    content: bytes

    @property
    def text(self) -> str | None:
        """The content as text, or None when it is not UTF-8 (a mutation broke that)."""
        try:
            return self.content.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def describe(self) -> str:
        return " then ".join(step.describe() for step in self.steps) or "no mutation"

    def excerpt(self) -> str:
        parts = []
        for index, step in enumerate(self.steps, 1):
            head = f"step {index}: {step.mutation}" if len(self.steps) > 1 else ""
            parts.append((head + "\n" if head else "") + step.excerpt())
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"Mutant({self.source.rel}: {self.describe()})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """What hypothesis prints as the falsifying example (not every field's text)."""
        del cycle
        printer.text(repr(self))


# -- document helpers ----------------------------------------------------------------------


def load(text: str) -> Any:
    """The document as trainstack loads it (yaml safe loader, libyaml where available)."""
    return yaml.load(text, Loader=_Loader)


def dump(doc: Any) -> str:
    """Block-style YAML, keys in document order, one value per line."""
    return yaml.dump(
        doc,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=1 << 20,
    )


def flow(value: Any) -> str:
    """A value as one line of flow YAML (for splicing into a line of text)."""
    text = yaml.dump([value], Dumper=_Dumper, default_flow_style=True, width=1 << 20)
    return text.strip()[1:-1].strip()


def walk(
    doc: Any, path: DocPath = (), _above: frozenset[int] = frozenset()
) -> Iterator[tuple[DocPath, Any]]:
    """Every node of a document with its path, the root first.

    An alias can make a document contain itself; such a node is yielded but not entered.
    """
    yield path, doc
    if id(doc) in _above:
        return
    above = _above | {id(doc)}
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from walk(value, (*path, key), above)
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from walk(value, (*path, index), above)


def get(doc: Any, path: DocPath) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def replaced(doc: Any, path: DocPath, value: Any) -> Any:
    """A deep copy of `doc` with the node at `path` replaced (the root when path is ())."""
    if not path:
        return value
    out = copy.deepcopy(doc)
    get(out, path[:-1])[path[-1]] = value
    return out


def display_path(kind: str, path: Sequence[Key]) -> str:
    """A document path the way trainstack's messages print it.

    Stack files: `trainstack:platform.gpuPools[0].size.max` (the `config:` level dropped);
    job specs: `job.spec.workers.gpus`.
    """
    parts = list(path)
    if kind == "stack":
        if not parts:
            return "(document)"
        if parts[0] == "config":
            parts = parts[1:]
            if not parts:
                return "config"
            text = str(parts.pop(0))
        else:
            text = str(parts.pop(0))
    else:
        text = "job"
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) and not isinstance(part, bool) else f".{part}"
    return text


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "map"}.get(
        type(value), type(value).__name__
    )


def short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- document-level mutations --------------------------------------------------------------

DocResult = tuple[Any, DocPath, str]  # new document, the path it struck, what it did
DocMutation = Callable[[Any, Chooser], DocResult | None]


def _entries(doc: Any) -> list[DocPath]:
    """Paths of every mapping entry."""
    return [p for p, _ in walk(doc) if p and isinstance(get(doc, p[:-1]), dict)]


def _items(doc: Any) -> list[DocPath]:
    """Paths of every list item."""
    return [p for p, _ in walk(doc) if p and isinstance(get(doc, p[:-1]), list)]


def delete_key(doc: Any, ch: Chooser) -> DocResult | None:
    """A mapping entry removed (a required field, or an optional one and its default)."""
    sites = _entries(doc)
    if not sites:
        return None
    path = ch.choice(sites)
    out = copy.deepcopy(doc)
    del get(out, path[:-1])[path[-1]]
    return out, path, f"deleted {short(get(doc, path))}"


def delete_item(doc: Any, ch: Chooser) -> DocResult | None:
    """A list item removed (the last zone, a pool a team names, ...)."""
    sites = _items(doc)
    if not sites:
        return None
    path = ch.choice(sites)
    out = copy.deepcopy(doc)
    del get(out, path[:-1])[path[-1]]
    return out, path, f"deleted item {short(get(doc, path))}"


def duplicate_item(doc: Any, ch: Chooser) -> DocResult | None:
    """A list item repeated right after itself (two pools of one name, ...)."""
    sites = _items(doc)
    if not sites:
        return None
    path = ch.choice(sites)
    out = copy.deepcopy(doc)
    get(out, path[:-1]).insert(path[-1] + 1, copy.deepcopy(get(doc, path)))
    return out, path, f"item repeated: {short(get(doc, path))}"


def typos(key: str) -> list[str]:
    """Plausible misspellings of a key: swapped, dropped, doubled, cased, pluralised."""
    found: list[str] = []
    if len(key) > 1:
        found += [key[:i] + key[i + 1] + key[i] + key[i + 2 :] for i in range(min(len(key) - 1, 4))]
        found += [key[:i] + key[i + 1 :] for i in (0, len(key) // 2, len(key) - 1)]
    found += [key[:1] + key[:1] + key[1:], key + "s", key.lower(), key.upper()]
    found += [key[:1].swapcase() + key[1:], key.rstrip("s") if key.endswith("s") else key + "_"]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
    found += [snake, key.replace("-", "_"), key.replace("_", "-")]
    return list(dict.fromkeys(t for t in found if t and t != key))


def rename_key(doc: Any, ch: Chooser) -> DocResult | None:
    """A key misspelled (`typos`), in place."""
    sites = [p for p in _entries(doc) if isinstance(p[-1], str)]
    if not sites:
        return None
    path = ch.choice(sites)
    parent = get(doc, path[:-1])
    options = [t for t in typos(path[-1]) if t not in parent]
    if not options:
        return None
    new_key = ch.choice(options)
    renamed = {new_key if k == path[-1] else k: v for k, v in parent.items()}
    return replaced(doc, path[:-1], renamed), path, f"key {path[-1]!r} -> {new_key!r}"


def _as_int(value: Any) -> int:
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else 0
    if isinstance(value, str):
        digits = "".join(c for c in value if c.isdigit())
        return int(digits[:12]) if digits else len(value)
    return len(value) if isinstance(value, list | dict) else 0


def _as_float(value: Any) -> float:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return float(len(value)) + 0.5
    return float(_as_int(value)) if not isinstance(value, float) else value


def retypings(value: Any) -> list[tuple[str, Any]]:
    """The value as each other YAML type: (type name, converted value)."""
    kind = type_name(value)
    options: list[tuple[str, Any]] = []
    if kind != "string":
        text = json.dumps(value) if isinstance(value, list | dict) else str(value)
        options += [("string", text), ("string", "")]
    if kind != "int":
        options += [("int", _as_int(value)), ("int", -1)]
    if kind != "float":
        options += [("float", _as_float(value)), ("float", _as_float(value) + 0.5)]
    if kind != "bool":
        options += [("bool", bool(value)), ("bool", not bool(value))]
    if kind != "null":
        options.append(("null", None))
    if kind != "list":
        options += [("list", [value]), ("list", [])]
    if kind != "map":
        options += [("map", {"value": value}), ("map", {})]
    return options


def retype(doc: Any, ch: Chooser) -> DocResult | None:
    """Any node, the root included, as another YAML type (`retypings`)."""
    path, value = ch.choice(list(walk(doc)))
    kind, new = ch.choice(retypings(value))
    detail = f"{type_name(value)} {short(value, 24)} -> {kind} {short(new, 24)}"
    return replaced(doc, path, new), path, detail


def renumberings(value: float) -> list[tuple[str, Any]]:
    """Sign, size and type changes of a number."""
    options: list[tuple[str, Any]] = [
        ("negated", -value),
        ("zero", 0 if isinstance(value, int) else 0.0),
        ("plus one", value + 1),
        ("minus one", value - 1),
        ("huge", 10**12),
        ("beyond int64", 2**63),
        ("tiny", 1e-9),
        ("infinite", math.inf),
        ("negative infinite", -math.inf),
        ("not a number", math.nan),
    ]
    if isinstance(value, int):
        options += [("as float", float(value)), ("fraction", value + 0.5)]
    elif math.isfinite(value):
        options += [("as int", int(value)), ("times 1000", value * 1000)]
    return options


def renumber(doc: Any, ch: Chooser) -> DocResult | None:
    """A number's sign, size or type changed (`renumberings`)."""
    sites = [(p, v) for p, v in walk(doc) if isinstance(v, int | float) and not isinstance(v, bool)]
    if not sites:
        return None
    path, value = ch.choice(sites)
    what, new = ch.choice(renumberings(value))
    return replaced(doc, path, new), path, f"{what}: {short(value)} -> {short(new)}"


def truncate_string(doc: Any, ch: Chooser) -> DocResult | None:
    """A string cut short (possibly to nothing)."""
    sites = [(p, v) for p, v in walk(doc) if isinstance(v, str) and v]
    if not sites:
        return None
    path, value = ch.choice(sites)
    keep = ch.integer(0, len(value) - 1)
    return replaced(doc, path, value[:keep]), path, f"{short(value)} -> {short(value[:keep])}"


def string_edits(value: str) -> list[tuple[str, str]]:
    return [
        ("trailing space", value + " "),
        ("leading space", " " + value),
        ("upper case", value.upper()),
        ("appended x", value + "x"),
        ("trailing newline", value + "\n"),
        ("non-ASCII", value + "\u00e9"),
        ("very long", (value or "x") * (2000 // max(len(value), 1) + 1)),
        ("only spaces", "   "),
    ]


def edit_string(doc: Any, ch: Chooser) -> DocResult | None:
    """A string edited at its edges (spaces, a newline, case, length; `string_edits`)."""
    sites = [(p, v) for p, v in walk(doc) if isinstance(v, str)]
    if not sites:
        return None
    path, value = ch.choice(sites)
    what, new = ch.choice([(w, n) for w, n in string_edits(value) if n != value])
    return replaced(doc, path, new), path, f"{what}: {short(value)} -> {short(new)}"


def swap_collection(doc: Any, ch: Chooser) -> DocResult | None:
    """A list written as a map, or a map as a list."""
    sites = [(p, v) for p, v in walk(doc) if isinstance(v, list | dict)]
    if not sites:
        return None
    path, value = ch.choice(sites)
    options: list[tuple[str, Any]]
    if isinstance(value, list):
        options = [("list -> map by index", {str(i): v for i, v in enumerate(value)})]
        if value:
            options.append(("list -> map of its first item", {"item": value[0]}))
    else:
        options = [
            ("map -> list of values", list(value.values())),
            ("map -> list of keys", list(value)),
            ("map -> list of one-entry maps", [{k: v} for k, v in value.items()]),
        ]
    what, new = ch.choice(options)
    return replaced(doc, path, new), path, what


DOC_MUTATIONS: dict[str, DocMutation] = {
    "delete-key": delete_key,
    "delete-item": delete_item,
    "duplicate-item": duplicate_item,
    "rename-key": rename_key,
    "retype": retype,
    "renumber": renumber,
    "truncate-string": truncate_string,
    "edit-string": edit_string,
    "swap-list-map": swap_collection,
}


# -- text-level mutations ------------------------------------------------------------------

TextResult = tuple[str | bytes, str, str]  # new content, where, what it did
TextMutation = Callable[[str, "Composed", Chooser], TextResult | None]


@dataclass(frozen=True)
class Spot:
    """A node of the composed tree with its document path and, for entries, its key."""

    path: tuple[Key, ...]
    node: yaml.Node
    key: yaml.ScalarNode | None  # the key node when this is a mapping value


@dataclass(frozen=True)
class Composed:
    """The composed node tree of a text (positions of every key and value), or nothing."""

    kind: str
    root: yaml.Node | None
    spots: tuple[Spot, ...]

    @classmethod
    def of(cls, text: str, kind: str) -> Composed:
        try:
            root = yaml.compose(text, Loader=_Loader)
        except yaml.YAMLError:
            root = None
        spots: list[Spot] = []
        if root is not None:
            spots.extend(_spots(root, (), None, set()))
        return cls(kind, root, tuple(spots))

    def where(self, spot: Spot) -> str:
        return f"{display_path(self.kind, spot.path)} (line {spot.node.start_mark.line + 1})"


def _spots(
    node: yaml.Node,
    path: tuple[Key, ...],
    key: yaml.ScalarNode | None,
    seen: set[int],
) -> Iterator[Spot]:
    """Each node once: an alias shares its anchor's node (and its position in the text)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    yield Spot(path, node, key)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            yield from _spots(value_node, (*path, key_node.value), key_node, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _spots(item, (*path, index), None, seen)


def _span(text: str, node: yaml.Node) -> str:
    return text[node.start_mark.index : node.end_mark.index]


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _line_end(text: str, index: int) -> int:
    end = text.find("\n", index)
    return len(text) if end < 0 else end


def _starts_line(text: str, node: yaml.Node) -> bool:
    """True when the node is the first thing on its line (not after `- ` or `key: `)."""
    return not text[_line_start(text, node.start_mark.index) : node.start_mark.index].strip()


def _one_line(text: str, node: yaml.Node) -> bool:
    return "\n" not in _span(text, node).rstrip("\n")


def _is_block(node: yaml.Node) -> bool:
    return isinstance(node, yaml.CollectionNode) and not node.flow_style


# YAML 1.1 (PyYAML) specials and tags; each loads to something other than the text it shows.
SPECIALS = (
    "~",
    "null",
    "Null",
    "yes",
    "no",
    "on",
    "off",
    "true",
    "False",
    ".inf",
    "-.inf",
    ".nan",
    ".NaN",
    "0x1F",
    "0o17",
    "017",
    "1e3",
    "1_000",
    "+12",
    "12:30",
    "2030-01-01",
    "2030-01-01 10:00:00",
    "''",
    "'   '",
    "!!binary aGVsbG8=",
    "!!float 2",
    "!!str 5",
    "!!set {a}",
    "!!python/name:os.system",
    "[]",
    "{}",
    "*undefined",
)


def inject_special(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """A scalar's text (a value's, or now and then a key's) replaced by a YAML special."""
    scalars = [s for s in composed.spots if isinstance(s.node, yaml.ScalarNode) and s.path]
    if not scalars:
        return None
    spot = ch.choice(scalars)
    token = ch.choice(SPECIALS)
    on_key = spot.key is not None and ch.choice((False, False, False, True))
    node = spot.key if on_key and spot.key is not None else spot.node
    start, end = node.start_mark.index, node.end_mark.index
    what = f"{'key' if on_key else 'value'} {short(_span(text, node), 30)} -> {token}"
    return text[:start] + token + text[end:], composed.where(spot), what


def duplicate_key(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """The same key twice in one mapping, either copy first."""
    sites = [
        (spot, index)
        for spot in composed.spots
        if isinstance(spot.node, yaml.MappingNode)
        for index in range(len(spot.node.value))
    ]
    if not sites:
        return None
    spot, index = ch.choice(sites)
    mapping = spot.node
    assert isinstance(mapping, yaml.MappingNode)
    key, value = mapping.value[index]
    key_text = _span(text, key)
    copied = _span(text, value) if _one_line(text, value) else flow(_loaded(text, value))
    value_text = ch.choice((copied, copied, "null", "0", "''", "{}", "[]", "changed"))
    where = (
        f"{display_path(composed.kind, (*spot.path, key.value))} (line {key.start_mark.line + 1})"
    )
    if mapping.flow_style:
        if ch.choice((True, False)):
            at, piece, order = key.start_mark.index, f"{key_text}: {value_text}, ", "copy first"
        else:
            at, piece, order = value.end_mark.index, f", {key_text}: {value_text}", "copy last"
        return text[:at] + piece + text[at:], where, f"{order}, copy value {value_text}"
    line = " " * key.start_mark.column + f"{key_text}: {value_text}\n"
    placements: list[tuple[int, str, str]] = []
    if _starts_line(text, key):
        placements.append((_line_start(text, key.start_mark.index), line, "copy first"))
    if index + 1 < len(mapping.value) and _starts_line(text, mapping.value[index + 1][0]):
        following = mapping.value[index + 1][0].start_mark.index
        placements.append((_line_start(text, following), line, "copy last"))
    elif index + 1 == len(mapping.value) and not _is_block(value):
        end = _line_end(text, value.end_mark.index)
        placements.append((end, "\n" + line.rstrip("\n"), "copy last"))
    if not placements:
        return None
    at, piece, order = ch.choice(placements)
    return text[:at] + piece + text[at:], where, f"{order}, copy value {value_text}"


def _loaded(text: str, node: yaml.Node) -> Any:
    """The value of a composed node, by loading its own text (used for flow copies)."""
    try:
        return load(_dedented(_span(text, node), node.start_mark.column))
    except yaml.YAMLError:
        return None


def _dedented(span: str, column: int) -> str:
    lines = span.splitlines()
    return "\n".join([lines[0], *(line[column:] for line in lines[1:])]) if lines else span


def anchor_alias(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """An anchor on one node and an alias (or a merge key) to it somewhere else."""
    values = [s for s in composed.spots if s.key is not None]
    scalars = [s for s in values if isinstance(s.node, yaml.ScalarNode)]
    if len(values) < 2 or not scalars:
        return None
    anchored = ch.choice(values)
    edits: list[tuple[int, int, str]] = []
    if _is_block(anchored.node):
        assert anchored.key is not None
        colon = text.index(":", anchored.key.end_mark.index) + 1
        edits.append((colon, colon, " &fz"))
    else:
        edits.append((anchored.node.start_mark.index, anchored.node.start_mark.index, "&fz "))
    blocks = [
        s
        for s in composed.spots
        if isinstance(s.node, yaml.MappingNode) and _is_block(s.node) and s.node.value
    ]
    use_merge = isinstance(anchored.node, yaml.MappingNode) and blocks and ch.choice((True, False))
    if use_merge:
        target = ch.choice(blocks)
        assert isinstance(target.node, yaml.MappingNode)
        first = next((k for k, _ in target.node.value if _starts_line(text, k)), None)
        if first is None:
            return None
        at = _line_start(text, first.start_mark.index)
        edits.append((at, at, " " * first.start_mark.column + "<<: *fz\n"))
        what = f"merge <<: *fz into {display_path(composed.kind, target.path)}"
    else:
        others = [s for s in scalars if s is not anchored]
        if not others:
            return None
        target = ch.choice(others)
        edits.append((target.node.start_mark.index, target.node.end_mark.index, "*fz"))
        what = f"alias *fz at {composed.where(target)}"
    out = text
    for start, end, piece in sorted(edits, reverse=True):
        out = out[:start] + piece + out[end:]
    return out, composed.where(anchored), f"anchor &fz here, {what}"


def multi_document(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """Document markers: a second document, or markers that leave one document."""
    del composed
    body = text if text.endswith("\n") else text + "\n"
    lines = text.splitlines(keepends=True)
    cut = ch.integer(0, len(lines))
    variants = [
        ("second document after ---", body + "---\n" + ch.choice(("", "config: {}\n", body))),
        ("leading --- (one document)", "---\n" + text),
        ("--- inserted at a line", "".join([*lines[:cut], "---\n", *lines[cut:]])),
        ("document end ... (one document)", body + "...\n"),
        ("%YAML 1.1 directive (one document)", "%YAML 1.1\n---\n" + text),
    ]
    what, new = ch.choice(variants)
    return new, f"line {cut + 1}" if "inserted" in what else "(file)", what


def truncate_file(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """The file cut at a line start or anywhere (an interrupted save)."""
    del composed
    if not text:
        return None
    at = ch.integer(0, len(text) - 1)
    if ch.choice((True, False)):
        at = _line_start(text, at)
    line = text.count("\n", 0, at) + 1
    return text[:at], f"line {line}", f"file cut after {at} of {len(text)} characters"


def delete_line(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """One non-empty line removed (comments included: they must change nothing)."""
    del composed
    lines = text.splitlines(keepends=True)
    content = [i for i, line in enumerate(lines) if line.strip()]
    if not content:
        return None
    index = ch.choice(content)
    return (
        "".join(lines[:index] + lines[index + 1 :]),
        f"line {index + 1}",
        f"deleted {short(lines[index].strip(), 50)}",
    )


def break_indentation(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """One line indented by a space or two more or less, or by a tab."""
    del composed
    lines = text.splitlines(keepends=True)
    content = [
        i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")
    ]
    if not content:
        return None
    index = ch.choice(content)
    line = lines[index]
    body = line.lstrip(" ")
    indent = len(line) - len(body)
    variants = [
        ("one space more", " " * (indent + 1) + body),
        ("two spaces more", " " * (indent + 2) + body),
        ("tab indent", "\t" + " " * max(indent - 2, 0) + body),
    ]
    if indent:
        variants += [
            ("one space less", " " * (indent - 1) + body),
            ("two spaces less", " " * max(indent - 2, 0) + body),
            ("no indentation", body),
        ]
    what, new = ch.choice(variants)
    out = "".join([*lines[:index], new, *lines[index + 1 :]])
    return out, f"line {index + 1}", f"{what}: {short(line.strip(), 50)}"


EMPTY_FILES = ("", "\n", "# only a comment\n", "---\n", "~\n", "config:\n", "config: {}\n", "[]\n")


def empty_file(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """The file replaced by nothing, a comment, a bare marker, null or an empty map/list."""
    del text, composed
    new = ch.choice(EMPTY_FILES)
    return new, "(file)", f"file replaced by {new!r}"


def not_utf8(text: str, composed: Composed, ch: Chooser) -> TextResult | None:
    """Bytes that are not UTF-8 text (or are, but YAML refuses them: NUL, a BOM)."""
    del composed
    data = text.encode("utf-8")
    at = _line_start(text, ch.integer(0, max(len(text) - 1, 0))) if text else 0
    at = len(text[:at].encode("utf-8"))
    variants: list[tuple[str, bytes]] = [
        ("byte 0xff", data[:at] + b"\xff" + data[at:]),
        ("truncated UTF-8 sequence", data[:at] + b"\xc3" + data[at:]),
        ("latin-1 e-acute", data[:at] + "# caf\u00e9\n".encode("latin-1") + data[at:]),
        ("UTF-16 encoded", text.encode("utf-16")),
        ("NUL byte", data[:at] + b"\x00" + data[at:]),
        ("UTF-8 byte order mark", b"\xef\xbb\xbf" + data),
    ]
    what, new = ch.choice(variants)
    return new, f"byte {at}", what


TEXT_MUTATIONS: dict[str, TextMutation] = {
    "duplicate-key": duplicate_key,
    "yaml-special": inject_special,
    "anchor-alias": anchor_alias,
    "multi-document": multi_document,
    "truncate-file": truncate_file,
    "delete-line": delete_line,
    "break-indentation": break_indentation,
    "empty-file": empty_file,
    "not-utf8": not_utf8,
}
_NEEDS_TREE = {"duplicate-key", "yaml-special", "anchor-alias"}
MUTATIONS = (*DOC_MUTATIONS, *TEXT_MUTATIONS)


# -- chaining -------------------------------------------------------------------------------


def _document(text: str) -> Any:
    try:
        return load(text)
    except yaml.YAMLError:
        return None


def apply(source: Source, text: str, name: str, ch: Chooser) -> Step | None:
    """One named mutation of `text` (a file derived from `source`), or None if it has no site."""
    if name in DOC_MUTATIONS:
        doc = _document(text)
        if not isinstance(doc, dict | list):
            return None
        result = DOC_MUTATIONS[name](doc, ch)
        if result is None:
            return None
        new_doc, path, detail = result
        before = dump(doc)
        return Step(name, display_path(source.kind, path), detail, before, dump(new_doc))
    composed = Composed.of(text, source.kind)
    if name in _NEEDS_TREE and composed.root is None:
        return None
    text_result = TEXT_MUTATIONS[name](text, composed, ch)
    if text_result is None:
        return None
    new, where, detail = text_result
    return Step(name, where, detail, text, new)


def mutate(
    source: Source, ch: Chooser, max_steps: int = 2, names: Sequence[str] = MUTATIONS
) -> Mutant:
    """One to `max_steps` named mutations of `source`, each applied to the previous result.

    `names` are the mutations to draw from; a name given twice is drawn twice as often.
    """
    count = ch.choice(tuple(range(1, max_steps + 1)) + (1,) * max_steps)
    text: str | bytes = source.text
    steps: list[Step] = []
    while len(steps) < count and isinstance(text, str):
        # A mutation without a site (no number in the file, ...) gives way to the next one.
        first = ch.integer(0, len(names) - 1)
        for name in dict.fromkeys([*names[first:], *names[:first]]):
            step = apply(source, text, name, ch)
            if step is not None:
                break
        else:
            break
        steps.append(step)
        text = step.after
    content = text if isinstance(text, bytes) else text.encode("utf-8")
    return Mutant(source, tuple(steps), content)
