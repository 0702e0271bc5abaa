"""YAML for stack files and job specs: one strict loader, libyaml's parser where PyYAML has it.

Strict where YAML is lenient and users get hurt: a key written twice in one mapping is an
error (PyYAML keeps the last one silently, so a second `storage:` dropped a file system from
a plan that then said "ok"). Errors name the file, line and column on one line.

Previews parse every stack file and job spec of an organisation; the pure-Python parser was
a tenth of a team stack's preview. Both parsers build the same safe types.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from trainstack.config.errors import ConfigError, ConfigIssue

_KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number"}
_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RefusedYaml(yaml.MarkedYAMLError):
    """YAML that parses but that trainstack refuses: a key twice, a key that is not text, an
    alias loop or an alias explosion."""


class StrictLoader(_Base):  # type: ignore[valid-type,misc]
    """The safe loader, refusing duplicate and non-text keys (merge keys `<<` keep YAML's
    semantics)."""

    def construct_document(self, node: Node) -> Any:
        _refuse_cycles(node, [])
        return super().construct_document(node)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[str, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                # Every key trainstack reads is text; YAML reads `~`, `on`, `1` or a date as
                # null, true, a number or a date, which no schema path could name.
                raise RefusedYaml(
                    None,
                    None,
                    f"key {_shown_key(key_node, key)}, not text; quote it if it is meant as a name",
                    key_node.start_mark,
                )
            first = seen.get(key)
            if first is not None:
                raise RefusedYaml(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first.line + 1}); YAML would keep "
                    "only the last one: remove or rename one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        mapping: dict[Hashable, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _shown_key(node: Node, key: Any) -> str:
    """What a key that is not text is: as written, and what YAML reads it as."""
    if isinstance(node, SequenceNode | MappingNode):
        return f"is a {'list' if isinstance(node, SequenceNode) else 'map'}"
    return f"{node.value!r} reads as {_KINDS.get(type(key), 'a value')}"


# No stack file or job spec comes near this many values; aliases of aliases can make a few
# lines expand to billions ("billion laughs"), which validation would then walk.
MAX_VALUES = 100_000


def _refuse_cycles(node: Node, open_nodes: list[Node], sizes: dict[int, int] | None = None) -> int:
    """The number of values `node` expands to, once aliases are followed; refuses an alias
    inside the map or list its anchor names (a document that contains itself), and
    documents that expand past MAX_VALUES."""
    sizes = {} if sizes is None else sizes
    if id(node) in sizes:
        return sizes[id(node)]
    if any(node is ancestor for ancestor in open_nodes):
        raise RefusedYaml(
            None,
            None,
            "an alias refers to a map or list that contains it; YAML anchors must not loop",
            node.start_mark,
        )
    size = 1
    if isinstance(node, MappingNode | SequenceNode):
        open_nodes.append(node)
        for child in node.value:
            for part in child if isinstance(child, tuple) else (child,):
                size += _refuse_cycles(part, open_nodes, sizes)
        open_nodes.pop()
    if size > MAX_VALUES:
        raise RefusedYaml(
            None,
            None,
            f"expands to more than {MAX_VALUES} values through aliases; write it out",
            node.start_mark,
        )
    sizes[id(node)] = size
    return size


class YamlSyntaxError(ConfigError):
    """A file that is not YAML (or repeats a key): one line, `file:line:column: problem`."""

    def __init__(self, source: str, line: int | None, column: int | None, problem: str) -> None:
        self.line, self.column = line, column
        self.location = self.at(source)
        self.problem = problem
        super().__init__(source, [ConfigIssue("file", problem)])

    def at(self, name: str) -> str:
        """`name:line:column`, for a report that names the file its own way."""
        return name if self.line is None else f"{name}:{self.line}:{self.column}"

    def render(self, where: Callable[[ConfigIssue], str] | None = None) -> str:
        del where  # one line, its position already in it
        return f"{self.location}: {self.problem}"


class _AliasFreeLoader(StrictLoader):
    """StrictLoader for a text without aliases: every node is constructed once, so there is no
    loop to find and no expansion to bound beyond the text's own length."""

    def construct_document(self, node: Node) -> Any:
        return super(StrictLoader, self).construct_document(node)


def _loader(text: str) -> type[StrictLoader]:
    # An alias is written `*name` (YAML 1.1/1.2, c-ns-alias-node); with no `*` anywhere the
    # text has none, and fewer characters than MAX_VALUES cannot hold more values than that.
    # Walking the node graph for loops was two fifths of reading a job spec.
    return _AliasFreeLoader if "*" not in text and len(text) <= MAX_VALUES else StrictLoader


def load(text: str, source: str = "<string>") -> Any:
    """The document in `text`, or YamlSyntaxError naming `source`, the line and the column."""
    try:
        return yaml.load(text, Loader=_loader(text))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = err.problem or err.context or "not valid YAML"
        if err.problem and err.context:  # what the parser was in, and where that began
            where = f", line {err.context_mark.line + 1}" if err.context_mark else ""
            what = f"{err.problem.removeprefix('but ')} ({err.context}{where})"
        if not isinstance(err, RefusedYaml):
            what = f"not valid YAML: {what}"
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise YamlSyntaxError(source, line, column, what) from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow
        line, column = _position(text, err.position)
        code = err.character if isinstance(err.character, int) else ord(err.character)
        raise YamlSyntaxError(
            source, line, column, f"not valid YAML: {err.reason} (character #x{code:04x})"
        ) from None
    except yaml.YAMLError as err:
        raise YamlSyntaxError(source, None, None, f"not valid YAML: {err}") from None


def _position(text: str | bytes, offset: int) -> tuple[int, int]:
    """1-based line and column of a 0-based offset."""
    before = text[:offset]
    newline = "\n" if isinstance(before, str) else b"\n"
    lines = before.split(newline)  # type: ignore[arg-type]
    return len(lines), len(lines[-1]) + 1


def read(path: Path) -> Any:
    """A YAML file's document, or one ConfigError naming the file and what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line, column = _position(err.object, err.start)
        byte = err.object[err.start : err.start + 1]
        raise YamlSyntaxError(
            str(path), line, column, f"not UTF-8 text (byte {byte!r}); save the file as UTF-8"
        ) from None
    except OSError as err:
        raise ConfigError(
            str(path), [ConfigIssue("file", f"cannot read: {err.strerror}")]
        ) from None
    return load(text, str(path))
