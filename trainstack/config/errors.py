"""User-facing configuration errors: every problem at once, each with its JSON path."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class ConfigIssue:
    """One problem in a config document, located by a JSON-path-like string."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(Exception):
    """Raised with every issue found in one pass; its text is what the user sees."""

    def __init__(self, source: str, issues: Iterable[ConfigIssue]) -> None:
        self.source = source
        self.issues = tuple(sorted(set(issues)))
        assert self.issues, "ConfigError needs at least one issue"
        super().__init__(self.render())

    def render(self, where: Callable[[ConfigIssue], str] | None = None) -> str:
        """The text the user reads; `where` prefixes an issue with its place (config/lines.py)."""
        count = len(self.issues)
        noun = "error" if count == 1 else "errors"
        lines = [f"{self.source}: {count} config {noun}:"]
        lines += [f"  - {where(issue) if where else ''}{issue}" for issue in self.issues]
        return "\n".join(lines)


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean 'x'?)' for the closest choice, or '' when none is close."""
    matches = difflib.get_close_matches(value, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean '{matches[0]}'?)" if matches else ""


def join_path(base: str, *parts: str | int) -> str:
    """Append keys and indexes to a JSON path: a.b[2].c."""
    path = base
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else f"{path}.{part}"
    return path
