"""YAML for stack files and job specs: one strict loader, libyaml's parser where PyYAML has it.

Strict where YAML is lenient and users get hurt: a key written twice in one mapping is an
error (PyYAML keeps the last one silently, so a second `storage:` dropped a file system from
a plan that then said "ok"). Errors name the file, line and column on one line.

Previews parse every stack file and job spec of an organisation; the pure-Python parser was
a tenth of a team stack's preview. Both parsers build the same safe types.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode

from trainstack.config.errors import ConfigError, ConfigIssue

_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping names one key twice."""


class StrictLoader(_Base):  # type: ignore[valid-type,misc]
    """The safe loader, refusing duplicate keys (merge keys `<<` keep YAML's semantics)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[object, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable keys: construct_mapping reports them
            if first is not None:
                raise DuplicateKeyError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first.line + 1}); YAML would keep "
                    "only the last one: remove or rename one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        mapping: dict[Hashable, Any] = super().construct_mapping(node, deep=deep)
        return mapping


class YamlSyntaxError(ConfigError):
    """A file that is not YAML (or repeats a key): one line, `file:line:column: problem`."""

    def __init__(self, source: str, line: int | None, column: int | None, problem: str) -> None:
        self.location = source if line is None else f"{source}:{line}:{column}"
        self.problem = problem
        super().__init__(source, [ConfigIssue("file", problem)])

    def render(self) -> str:
        return f"{self.location}: {self.problem}"


def load(text: str, source: str = "<string>") -> Any:
    """The document in `text`, or YamlSyntaxError naming `source`, the line and the column."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = err.problem or err.context or "not valid YAML"
        if not isinstance(err, DuplicateKeyError):
            what = f"not valid YAML: {what}"
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise YamlSyntaxError(source, line, column, what) from None
    except yaml.YAMLError as err:
        raise YamlSyntaxError(source, None, None, f"not valid YAML: {err}") from None


def read(path: Path) -> Any:
    """A YAML file's document, or one ConfigError naming the file and what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            str(path), [ConfigIssue("file", f"not UTF-8 text (byte {err.start})")]
        ) from None
    except OSError as err:
        raise ConfigError(
            str(path), [ConfigIssue("file", f"cannot read: {err.strerror}")]
        ) from None
    return load(text, str(path))
