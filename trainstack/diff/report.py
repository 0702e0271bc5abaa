"""The semantic diff of two plans: what a change means for teams, capacity, storage and jobs.

The report's data lives in model.py, its sections other than resources in sections.py; this
module classifies each resource (create, update, replace, delete) and assembles a StackDiff.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
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
from trainstack.diff.plans import ABSENT, Change, changed_paths, limited, readable, show
from trainstack.diff.replace import STATEFUL, replacing_paths, trigger_reasons
from trainstack.diff.sections import (
    capacity_section,
    data_paths,
    entries,
    group_view,
    jobs_section,
    policy_section,
    storage_section,
    team_view,
)
from trainstack.diff.twins import twins

__all__ = ["DiffReport", "StackDiff", "diff_plans", "not_previewed", "resource_changes"]


# What a team added or removed shows: a new team's share, borrowing and owners were missing,
# only its guarantee and pools were there (issue 41 #3).
TEAM_SUMMARY = (
    "group",
    "owners",
    "quota (guaranteed GPUs)",
    "deserved GPUs",
    "borrowLimit GPUs",
    "pools",
)


def _resource_index(plan: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["type"], r["name"]): r for r in plan["resources"] if r.get("custom", True)}


def _reasons(rtype: str, diffs: list[tuple[str, Any, Any]]) -> list[str]:
    """Why the changed inputs force replacement: one line per rule, naming each changed path
    with its values (a claim whose spec changed in three places is one reason, not three).

    Values are decoded as everywhere else: the registry ConfigMap's JSON document is replaced
    on every team change, and its reason showed the whole document twice (issue 41 #3); now
    it is the team that changed, `data.registry.json (json) teams[name=speech]`.
    """
    by_rule: dict[str, list[str]] = {}
    values = {path: (before, after) for path, before, after in diffs}
    for path, why in replacing_paths(rtype, diffs):
        shown, more = limited(readable([(path, *values[path])]))
        texts = [_reason_text(c) for c in shown]
        by_rule.setdefault(why, []).extend([*texts, *([f"… and {more} more"] if more else [])])
    return [f"{', '.join(paths)}: {why}" for why, paths in by_rule.items()]


def _key(r: ResourceChange) -> str:
    """A resource as the Storage section names it: kind and name."""
    return f"{r.type.rsplit(':', 1)[-1]} {r.name}"


def _reason_text(change: Change) -> str:
    """A changed input in a reason; an item added to or removed from a document by its path
    alone (the registry's new team is in the Teams section, with its numbers)."""
    if change.before == ABSENT and isinstance(change.after, dict):
        return f"{change.field} added"
    if change.after == ABSENT and isinstance(change.before, dict):
        return f"{change.field} removed"
    return f"{change.field} {show(change.before)} → {show(change.after)}"


def _ref(urn: str) -> str:
    """`kubernetes:scheduling.volcano.sh/v1beta1:Queue::name` as `Queue name`."""
    rtype, _, name = urn.partition("::")
    return f"{rtype.rsplit(':', 1)[-1]} {name}" if name else urn


def _dependency_changes(before: list[str], after: list[str]) -> list[tuple[str, Any, Any]]:
    """Dependencies added and removed: the whole lists, cut to the same length, looked the same
    before and after on ten rows of one report (issue 41 #3)."""
    added = [_ref(d) for d in after if d not in before]
    removed = [_ref(d) for d in before if d not in after]
    found: list[tuple[str, Any, Any]] = []
    if added:
        found.append(("dependencies added", ABSENT, ", ".join(added)))
    if removed:
        found.append(("dependencies removed", ", ".join(removed), ABSENT))
    if not found and before != after:
        found.append(
            ("dependencies (order)", ", ".join(map(_ref, before)), ", ".join(map(_ref, after)))
        )
    return found


def _update(rtype: str, name: str, before: dict[str, Any], after: dict[str, Any]) -> ResourceChange:
    diffs = readable(
        changed_paths(before.get("inputs") or {}, after.get("inputs") or {}, fold=True)
    )
    only_dependencies = False
    if not diffs:
        diffs = changed_paths(before.get("options") or {}, after.get("options") or {}, "options")
        only_dependencies = not diffs
        diffs += _dependency_changes(
            before.get("dependencies") or [], after.get("dependencies") or []
        )
    kept, more = limited(diffs)
    return ResourceChange(
        "update", rtype, name, "", (), tuple(kept), more, only_dependencies=only_dependencies
    )


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
                ResourceChange(
                    "replace",
                    rtype,
                    name,
                    stateful,
                    tuple(reasons),
                    tuple(also),
                    more,
                    forcing=tuple(sorted(forcing)),
                )
            )
        elif diffs or any(before.get(k) != after.get(k) for k in ("dependencies", "options")):
            counts["update"] += 1
            others.append(_update(rtype, name, before, after))
        else:
            counts["same"] += 1
    listed.sort(key=lambda r: (not r.stateful, r.action, r.type, r.name))
    found = twins(base, head, [(r.type, r.name) for r in others if r.action == "create"])
    others = [replace(r, twin=found.get((r.type, r.name), "")) for r in others]
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
    twinned = {(r.type, r.name): r.twin for r in created_updated if r.twin}
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
        teams=entries(team_view(base), team_view(head), TEAM_SUMMARY, recorded_only=True),
        capacity=capacity_section(base, head),
        storage=storage_section(
            base,
            head,
            {_key(r) for r in resources if r.stateful},
            twinned,
            {
                _key(r): list(r.forcing)
                for r in resources
                if not r.stateful and r.action == "replace"
            },
        ),
        jobs=jobs_section(base, head),
        policy=policy_section(base, head),
        resources=resources,
        outputs_changed=outputs_changed,
        groups=entries(group_view(base), group_view(head), ("quota (guaranteed GPUs)",)),
        access=access_section(base, head, twinned),
        data_paths=data_paths(
            base, head, {(r.type, r.name) for r in resources if r.action == "replace"}
        ),
        created_updated=created_updated,
    )
    if status == "changed" and not diff.has_changes:
        diff.status = "unchanged"
    return diff
