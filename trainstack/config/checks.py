"""Small cross-field rules shared by the loader's checks (they tolerate wrong shapes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from trainstack.config.errors import ConfigIssue, join_path


def dict_items(value: object) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(index, item) for the mapping items of a list; anything else yields nothing."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, Mapping):
                yield index, item


def duplicate_names(
    items: list[tuple[int, Mapping[str, Any]]], path: str, what: str
) -> list[ConfigIssue]:
    seen: dict[str, int] = {}
    issues = []
    for index, item in items:
        name = item.get("name")
        if not isinstance(name, str):
            continue
        if name in seen:
            issues.append(
                ConfigIssue(
                    join_path(path, index, "name"),
                    f"{what} {name!r} is already defined at {join_path(path, seen[name])}; "
                    "names must be unique",
                )
            )
        else:
            seen[name] = index
    return issues


def size_issues(
    sizes: Mapping[str, Any], path: str, keys: tuple[str, str, str], default_min: int | None = None
) -> list[ConfigIssue]:
    """min <= desired <= max for a node-group size, named as the config names them."""
    low_key, want_key, high_key = keys
    low, want, high = sizes.get(low_key, default_min), sizes.get(want_key), sizes.get(high_key)
    issues = []
    if isinstance(low, int) and isinstance(high, int) and low > high:
        issues.append(ConfigIssue(path, f"{low_key} {low} is greater than {high_key} {high}"))
    if isinstance(want, int) and isinstance(low, int) and want < low:
        issues.append(ConfigIssue(path, f"{want_key} {want} is below {low_key} {low}"))
    if isinstance(want, int) and isinstance(high, int) and want > high:
        issues.append(ConfigIssue(path, f"{want_key} {want} is above {high_key} {high}"))
    return issues
