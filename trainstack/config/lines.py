"""Line numbers for issues: which line of a YAML file a JSON path like `job.spec.workers.cpu`
or `trainstack:platform.registry.teams[1].quota` points at (issue 41 #4: schema errors
carried no line numbers, so a user counted keys in a long stack file).

Only for display: the issues themselves stay paths (tests and tools compare those). A path
that does not reach a key (a required field that is missing) gets the line of the nearest
map above it, where the key belongs.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from trainstack.config.errors import ConfigError, ConfigIssue

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Where a document's paths start: a job spec's at its root ("job"), a stack file's under
# `config` (`trainstack:platform`, `trainstack:team` are keys there).
ROOTS = {"job": ()}
_PART = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
_FILE_PREFIX = re.compile(r"^(?P<file>[^:\s]+\.ya?ml): (?P<path>.+)$")

Key = tuple[str | int, ...]


def parts(path: str) -> Key | None:
    """`job.spec.workers.cpu` -> ("spec", "workers", "cpu"); a stack file's
    `trainstack:platform.x[0]` -> ("config", "trainstack:platform", "x", 0); None for a
    path that names no place in a file."""
    head, dot, rest = path.partition(".")
    head, bracket, index = head.partition("[")
    if head in ROOTS:
        start: Key = ROOTS[head]
    elif head.startswith("trainstack:"):
        start = ("config", head)
    else:
        return None
    tail = (f"[{index}" if bracket else "") + (f".{rest}" if dot else "")
    found: list[str | int] = list(start)
    for key, number in _PART.findall(tail):
        found.append(int(number) if number else key)
    return tuple(found)


@cache
def _lines(path: Path, mtime: int) -> dict[Key, int]:
    del mtime  # the cache key: a file changed on disk is read again
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    found: dict[Key, int] = {}
    if root is not None:
        _walk(root, (), found)
    return found


def _walk(node: Node, where: Key, found: dict[Key, int]) -> None:
    found.setdefault(where, node.start_mark.line + 1)
    if isinstance(node, MappingNode):
        for key, value in node.value:
            here = (*where, str(key.value))
            found[here] = key.start_mark.line + 1
            _walk(value, here, found)
            found[here] = key.start_mark.line + 1  # the key's line, not its value's
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*where, index), found)


def line_of(file: Path, path: str) -> int | None:
    """The line `path` points at in `file`, or the nearest map above it; None if unknown."""
    key = parts(path)
    if key is None or not file.is_file():
        return None
    lines = _lines(file.resolve(), file.stat().st_mtime_ns)
    while key:
        if key in lines:
            return lines[key]
        key = key[:-1]
    return None


def with_lines(err: ConfigError, *bases: Path) -> str:
    """The error's text, each issue with the line it points at: `line N: path: message`.
    Issues of another file name it first (`job_specs/x.yaml: job.spec…`, as a team stack's
    preview reports its jobs); relative names are looked for under each of `bases`."""
    source = Path(err.source)

    def where(issue: ConfigIssue) -> str:
        file, path = source, issue.path
        if match := _FILE_PREFIX.match(issue.path):
            path = match["path"]
            candidates = [base / match["file"] for base in bases] + [Path(match["file"])]
            file = next((c for c in candidates if c.is_file()), Path(match["file"]))
        line = line_of(file, path)
        return "" if line is None else f"line {line}: "

    return err.render(where)
