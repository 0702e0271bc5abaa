"""The semantic diff of two plans: what a change means for teams, capacity, storage and jobs.

The report's data lives in model.py, its sections other than resources in sections.py; this
module classifies each resource (create, update, replace, delete) and assembles a StackDiff.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from trainstack.diff.access import access_section
from trainstack.diff.model import (
    NOT_PREVIEWED,
    Capacity,
    DiffReport,
    Policy,
    ResourceChange,
    StackDiff,
)
from trainstack.diff.plans import ABSENT, changed_paths, limited, readable, show
from trainstack.diff.replace import STATEFUL, replacing_paths, trigger_reasons
from trainstack.diff.sections import (
    capacity_section,
    entries,
    group_view,
    jobs_section,
    policy_section,
    storage_section,
    team_view,
)

__all__ = ["DiffReport", "StackDiff", "diff_plans", "not_previewed", "resource_changes"]


def _resource_index(plan: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["type"], r["name"]): r for r in plan["resources"] if r.get("custom", True)}


def _reasons(rtype: str, diffs: list[tuple[str, Any, Any]]) -> list[str]:
    """Why the changed inputs force replacement: one line per rule, naming each changed path
    with its values (a claim whose spec changed in three places is one reason, not three)."""
    by_rule: dict[str, list[str]] = {}
    values = {path: (before, after) for path, before, after in diffs}
    for path, why in replacing_paths(rtype, diffs):
        before, after = values[path]
        by_rule.setdefault(why, []).append(f"{path} {show(before)} → {show(after)}")
    return [f"{', '.join(paths)}: {why}" for why, paths in by_rule.items()]


def _update(rtype: str, name: str, before: dict[str, Any], after: dict[str, Any]) -> ResourceChange:
    diffs = readable(changed_paths(before.get("inputs") or {}, after.get("inputs") or {}))
    if not diffs:
        diffs = [
            (key, before.get(key, ABSENT), after.get(key, ABSENT))
            for key in ("dependencies", "options")
            if before.get(key) != after.get(key)
        ]
    kept, more = limited(diffs)
    return ResourceChange("update", rtype, name, "", (), tuple(kept), more)


def resource_changes(
    base: dict[str, Any], head: dict[str, Any]
) -> tuple[dict[str, int], list[ResourceChange], list[ResourceChange]]:
    """Counts per action; replaced and deleted resources (stateful first); created and updated
    ones, each update with its changed inputs: every counted change is listed (issue 23 #6)."""
    old, new = _resource_index(base), _resource_index(head)
    counts: Counter[str] = Counter({"create": 0, "update": 0, "replace": 0, "delete": 0, "same": 0})
    listed: list[ResourceChange] = []
    others: list[ResourceChange] = []
    for ref in sorted(set(old) | set(new)):
        rtype, name = ref
        stateful = STATEFUL.get(rtype, "")
        if ref not in old:
            counts["create"] += 1
            others.append(ResourceChange("create", rtype, name, ""))
            continue
        if ref not in new:
            counts["delete"] += 1
            listed.append(ResourceChange("delete", rtype, name, stateful))
            continue
        before, after = old[ref], new[ref]
        reasons: list[str] = []
        if (before.get("parent") or "") != (after.get("parent") or ""):
            reasons.append(
                f"parent changed ({before.get('parent')} → {after.get('parent')}): the URN "
                "changes; add an alias to keep the resource"
            )
        if (before.get("provider") or "") != (after.get("provider") or ""):
            reasons.append(f"provider changed ({before.get('provider')} → {after.get('provider')})")
        diffs = changed_paths(before.get("inputs") or {}, after.get("inputs") or {})
        reasons.extend(_reasons(rtype, diffs))
        options = (before.get("options") or {}, after.get("options") or {})
        reasons.extend(f"{path}: {why}" for path, why in trigger_reasons(rtype, *options))
        if reasons:
            counts["replace"] += 1
            forcing = {path for path, _ in replacing_paths(rtype, diffs)}
            also, more = limited(readable([d for d in diffs if d[0] not in forcing]))
            listed.append(
                ResourceChange("replace", rtype, name, stateful, tuple(reasons), tuple(also), more)
            )
        elif diffs or any(before.get(k) != after.get(k) for k in ("dependencies", "options")):
            counts["update"] += 1
            others.append(_update(rtype, name, before, after))
        else:
            counts["same"] += 1
    listed.sort(key=lambda r: (not r.stateful, r.action, r.type, r.name))
    others.sort(key=lambda r: (r.action, r.type, r.name))
    return dict(counts), listed, others


def not_previewed(base: dict[str, Any]) -> StackDiff:
    """A stack with a base plan and none in the head because the head previewed only the
    stacks a change touches (`--changed-since`): unchanged, not removed (issue 23 #6)."""
    counts = {"create": 0, "update": 0, "replace": 0, "delete": 0, "same": 0}
    return StackDiff(
        stack=str(base.get("stack") or ""),
        kind=str(base.get("kind") or ""),
        status=NOT_PREVIEWED,
        counts=counts,
        teams=[],
        capacity=Capacity(),
        storage=[],
        jobs=[],
        policy=Policy(False, note="not previewed"),
        resources=[],
        outputs_changed=[],
    )


def diff_plans(base: dict[str, Any], head: dict[str, Any]) -> StackDiff:
    """The semantic diff of one stack's base and head plans."""
    stack = str(head.get("stack") or base.get("stack") or "")
    kind = str(head.get("kind") or base.get("kind") or "")
    counts, resources, created_updated = resource_changes(base, head)
    outputs_before, outputs_after = base.get("outputs") or {}, head.get("outputs") or {}
    outputs_changed = sorted(
        k
        for k in set(outputs_before) | set(outputs_after)
        if outputs_before.get(k, ABSENT) != outputs_after.get(k, ABSENT)
    )
    status = "changed"
    if not base["resources"] and head["resources"]:
        status = "added"
    elif base["resources"] and not head["resources"]:
        status = "removed"
    diff = StackDiff(
        stack=stack,
        kind=kind,
        status=status,
        counts=counts,
        teams=entries(
            team_view(base), team_view(head), ("group", "quota (guaranteed GPUs)", "pools")
        ),
        capacity=capacity_section(base, head),
        storage=storage_section(
            base, head, {f"{r.type.rsplit(':', 1)[-1]} {r.name}" for r in resources}
        ),
        jobs=jobs_section(base, head),
        policy=policy_section(base, head),
        resources=resources,
        outputs_changed=outputs_changed,
        groups=entries(group_view(base), group_view(head), ("quota (guaranteed GPUs)",)),
        access=access_section(base, head),
        created_updated=created_updated,
    )
    if status == "changed" and not diff.has_changes:
        diff.status = "unchanged"
    return diff
