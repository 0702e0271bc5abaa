"""Reading plans written by `trainstack preview` and comparing their values."""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainstack.preview.plan import PLAN_VERSION

VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
ABSENT = "(absent)"
MAX_FIELD_CHANGES = 25  # per resource, job or grant in a report; the rest is counted


@dataclass(frozen=True)
class Change:
    """One changed field, as the report shows it."""

    field: str
    before: Any
    after: Any


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


FOLD = 3  # sibling values changed together that a report shows on one row


def _scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def changed_paths(
    before: Any, after: Any, prefix: str = "", *, fold: bool = False
) -> list[tuple[str, Any, Any]]:
    """Leaf-level differences as (path, before, after).

    Lists of named objects pair their items by name (`env[name=FOO].value`, an added item as
    absent before): by position, one added env var shifted every later item, and a reviewer
    read `env[2]` (issue 23 #6). A pure reorder is one change of the name order. Other lists
    of equal length compare element-wise; lists that grew or shrank, by the runs of items
    that differ.

    With `fold` (reports only: replacement rules read every leaf), FOLD or more plain values
    changed in one map are one change of that map, `spec.capability` with `cpu: 3072,
    memory: 32768Gi, …` before: a new pool changed five resources of three Queues alike,
    fifteen rows (issue 41 #3).
    """
    if before == after:
        return []
    if isinstance(before, list) and isinstance(after, list):
        old_named, new_named = _by_name(before), _by_name(after)
        if old_named is not None and new_named is not None:
            return _named_changes(old_named, new_named, prefix, fold)
    if isinstance(before, dict) and isinstance(after, dict):
        return _dict_changes(before, after, prefix, fold)
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        found: list[tuple[str, Any, Any]] = []
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            found.extend(changed_paths(old, new, f"{prefix}[{index}]", fold=fold))
        return found
    if isinstance(before, list) and isinstance(after, list):
        return _slice_changes(before, after, prefix)
    return [(prefix or "(value)", before, after)]


def _dict_changes(
    before: dict[str, Any], after: dict[str, Any], prefix: str, fold: bool
) -> list[tuple[str, Any, Any]]:
    found: list[tuple[str, Any, Any]] = []
    plain = [
        k
        for k in sorted(set(before) & set(after))
        if before[k] != after[k] and _scalar(before[k]) and _scalar(after[k])
    ]
    if not (fold and prefix and len(plain) >= FOLD):
        plain = []
    else:
        found.append(
            (
                prefix,
                ", ".join(f"{k}: {show(before[k])}" for k in plain),
                ", ".join(f"{k}: {show(after[k])}" for k in plain),
            )
        )
    for key in sorted(set(before) | set(after)):
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in before:
            found.append((path, ABSENT, after[key]))
        elif key not in after:
            found.append((path, before[key], ABSENT))
        elif key not in plain:
            found.extend(changed_paths(before[key], after[key], path, fold=fold))
    return found


def _slice_changes(before: list[Any], after: list[Any], prefix: str) -> list[tuple[str, Any, Any]]:
    """A list that grew or shrank, by the runs of items inserted, removed or replaced: one more
    `--team-dir /checkpoints/speech` in a command line showed the whole list twice, cut at the
    same length, and the two looked alike (issue 41 #3). A run is named by its slice of the
    base, `args[15:15]` for an insertion after item 14."""
    found: list[tuple[str, Any, Any]] = []
    keys = (
        [json.dumps(v, sort_keys=True) for v in before],
        [json.dumps(v, sort_keys=True) for v in after],
    )
    matcher = difflib.SequenceMatcher(a=keys[0], b=keys[1], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            found.append((f"{prefix}[{i1}:{i2}]", before[i1:i2] or ABSENT, after[j1:j2] or ABSENT))
    return found


def _named_changes(
    before: dict[str, Any], after: dict[str, Any], prefix: str, fold: bool = False
) -> list[tuple[str, Any, Any]]:
    found: list[tuple[str, Any, Any]] = []
    for name in [*before, *(n for n in after if n not in before)]:
        path = f"{prefix}[name={name}]"
        if name not in after:
            found.append((path, before[name], ABSENT))
        elif name not in before:
            found.append((path, ABSENT, after[name]))
        else:
            found.extend(changed_paths(before[name], after[name], path, fold=fold))
    if not found and list(before) != list(after):
        found.append((f"{prefix} (order)", list(before), list(after)))
    return found


_BASE64 = re.compile(r"^[A-Za-z0-9+/]{16,}={0,2}$")


def _unbase64(text: str) -> str | None:
    """`text` decoded when it is base64 of readable text (node user data), else None."""
    if len(text) % 4 or not _BASE64.match(text):
        return None
    try:
        decoded = base64.b64decode(text, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded if all(c.isprintable() or c in "\n\r\t" for c in decoded) else None


def _structured(text: str) -> Any:
    """A JSON document, or a multi-line YAML mapping or list, parsed; None for other text."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            pass
    if "\n" in stripped:
        try:
            doc = yaml.safe_load(stripped)
        except yaml.YAMLError:
            return None
        return doc if isinstance(doc, dict | list) else None
    return None


def _line_changes(path: str, before: str, after: str) -> list[tuple[str, Any, Any]]:
    """Changed runs of lines, numbered as in the base (as in the head for pure insertions)."""
    old, new = before.splitlines(), after.splitlines()
    found: list[tuple[str, Any, Any]] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        first, last = (i1, i2) if i2 > i1 else (j1, j2)
        lines = f"line {first + 1}" if last - first <= 1 else f"lines {first + 1}-{last}"
        where = lines if i2 > i1 else f"{lines} (head)"
        found.append(
            (
                f"{path} {where}",
                "\n".join(old[i1:i2]) if i2 > i1 else ABSENT,
                "\n".join(new[j1:j2]) if j2 > j1 else ABSENT,
            )
        )
    return found


LONG_TEXT = 160  # characters: a one-line string longer than this changes by its edits
CONTEXT = 16  # characters of unchanged text shown before each edit
MAX_EDITS = 5  # distinct edits of one long string in a report; the rest are counted
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")


def _text_edits(path: str, before: str, after: str) -> list[tuple[str, Any, Any]]:
    """A long one-line string (a CEL expression) by its edits, one line each, after a little
    of the unchanged text before it; an edit made in several places is one line, counted.

    A new pool lengthened the GPU-placement policy's 3 KB expression in six places, and the
    report showed it whole, before and after (issue 41 #3).
    """
    old, new = _TOKEN.findall(before), _TOKEN.findall(after)
    edits: dict[tuple[str, str], list[str]] = {}
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            context = "".join(old[:i1])
            context = "…" + context[-CONTEXT:] if len(context) > CONTEXT else context
            key = ("".join(old[i1:i2]), "".join(new[j1:j2]))
            edits.setdefault(key, []).append(context)
    lines: tuple[list[str], list[str]] = ([], [])
    for (removed, added), contexts in list(edits.items())[:MAX_EDITS]:
        times = f" ({len(contexts)} places)" if len(contexts) > 1 else ""
        lines[0].append(contexts[0] + removed + times)
        lines[1].append(contexts[0] + added + times)
    more = f", {len(edits) - MAX_EDITS} more not shown" if len(edits) > MAX_EDITS else ""
    count = f"{len(edits)} edit" + ("s" if len(edits) > 1 else "")
    return [(f"{path} (text, {count}{more})", "\n".join(lines[0]), "\n".join(lines[1]))]


def _decoded_change(path: str, before: str, after: str) -> list[tuple[str, Any, Any]] | None:
    """A change of one encoded string as a reviewer reads it, or None when it is plain text.

    Node user data is base64 and the Volcano scheduler configuration one YAML string, IAM
    policies one JSON string (issue 23 #6): structured text changes by path inside it
    (`… (yaml) tiers[1].plugins[name=binpack].arguments.weight`), other multi-line text by
    line (`userData (base64) line 24`).
    """
    old64, new64 = _unbase64(before), _unbase64(after)
    if old64 is not None and new64 is not None:
        path, before, after = f"{path} (base64)", old64, new64
    old_doc, new_doc = _structured(before), _structured(after)
    if old_doc is not None and new_doc is not None:
        kind = "json" if before.strip().startswith(("{", "[")) else "yaml"
        return readable(changed_paths(old_doc, new_doc), f"{path} ({kind}) ")
    if "\n" in before or "\n" in after or path.endswith("(base64)"):
        return _line_changes(path, before, after)
    if max(len(before), len(after)) > LONG_TEXT:
        return _text_edits(path, before, after)
    return None


def readable(changes: list[tuple[str, Any, Any]], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """`changed_paths` for a reader: encoded strings decoded (replacement rules read the raw
    paths; this is for the report only)."""
    found: list[tuple[str, Any, Any]] = []
    for path, before, after in changes:
        decoded = (
            _decoded_change(path, before, after)
            if isinstance(before, str) and isinstance(after, str)
            else None
        )
        if decoded is None:
            found.append((prefix + path, before, after))
        else:
            found.extend((prefix + p, b, a) for p, b, a in decoded)
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


def limited(changes: list[tuple[str, Any, Any]]) -> tuple[list[Change], int]:
    """The first MAX_FIELD_CHANGES changes, and how many were left out."""
    kept = [Change(p, b, a) for p, b, a in changes[:MAX_FIELD_CHANGES]]
    return kept, max(0, len(changes) - MAX_FIELD_CHANGES)
