"""Reading plans written by `trainstack preview` and comparing their values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainstack.preview.plan import PLAN_VERSION

VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
ABSENT = "(absent)"


class PlanError(Exception):
    """A plan file that cannot be read; the message names the file and the fix."""


def load_plan(path: Path) -> dict[str, Any]:
    """A plan document, checked just enough to report on it."""
    fix = "run `trainstack preview STACK` and pass build/STACK/plan.json"
    if path.is_dir():
        path = path / "plan.json"
    if not path.is_file():
        raise PlanError(f"{path}: no such plan file; {fix}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlanError(f"{path}: not a readable JSON plan ({err}); {fix}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("resources"), list):
        raise PlanError(f"{path}: not a trainstack plan (no 'resources' list); {fix}")
    if doc.get("version") != PLAN_VERSION:
        raise PlanError(
            f"{path}: plan version {doc.get('version')!r}, this trainstack reads version "
            f"{PLAN_VERSION}; preview both sides with the same trainstack"
        )
    return doc


def empty_plan(stack: str, kind: str) -> dict[str, Any]:
    """The plan of a stack that does not exist on one side (added or removed stack)."""
    return {"version": PLAN_VERSION, "stack": stack, "kind": kind, "resources": [], "outputs": {}}


def _by_name(items: list[Any]) -> dict[str, Any] | None:
    """A list of objects with distinct `name`s (containers, env, volumes, tasks, ports) by
    name, or None for any other list."""
    named = {i["name"]: i for i in items if isinstance(i, dict) and isinstance(i.get("name"), str)}
    return named if items and len(named) == len(items) else None


def changed_paths(before: Any, after: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Leaf-level differences as (path, before, after).

    Lists of named objects pair their items by name (`env[name=FOO].value`, an added item as
    absent before): by position, one added env var shifted every later item, and a reviewer
    read `env[2]` (issue 23 #6). A pure reorder is one change of the name order. Other lists
    of equal length compare element-wise.
    """
    if before == after:
        return []
    if isinstance(before, list) and isinstance(after, list):
        old_named, new_named = _by_name(before), _by_name(after)
        if old_named is not None and new_named is not None:
            return _named_changes(old_named, new_named, prefix)
    if isinstance(before, dict) and isinstance(after, dict):
        found: list[tuple[str, Any, Any]] = []
        for key in sorted(set(before) | set(after)):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in before:
                found.append((path, ABSENT, after[key]))
            elif key not in after:
                found.append((path, before[key], ABSENT))
            else:
                found.extend(changed_paths(before[key], after[key], path))
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        found = []
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            found.extend(changed_paths(old, new, f"{prefix}[{index}]"))
        return found
    return [(prefix or "(value)", before, after)]


def _named_changes(
    before: dict[str, Any], after: dict[str, Any], prefix: str
) -> list[tuple[str, Any, Any]]:
    found: list[tuple[str, Any, Any]] = []
    for name in [*before, *(n for n in after if n not in before)]:
        path = f"{prefix}[name={name}]"
        if name not in after:
            found.append((path, before[name], ABSENT))
        elif name not in before:
            found.append((path, ABSENT, after[name]))
        else:
            found.extend(changed_paths(before[name], after[name], path))
    if not found and list(before) != list(after):
        found.append((f"{prefix} (order)", list(before), list(after)))
    return found


def get(doc: Any, *path: str | int, default: Any = None) -> Any:
    """doc[p0][p1]... or `default` when any step is missing."""
    for step in path:
        in_list = isinstance(step, int) and isinstance(doc, list) and 0 <= step < len(doc)
        in_map = isinstance(step, str) and isinstance(doc, dict) and step in doc
        if not (in_list or in_map):
            return default
        doc = doc[step]
    return doc


def show(value: Any) -> str:
    """A value as a reviewer reads it: compact JSON, strings bare."""
    if isinstance(value, str):
        return value
    text = json.dumps(value, sort_keys=True, separators=(", ", ": "))
    return text if len(text) <= 120 else text[:117] + "..."
