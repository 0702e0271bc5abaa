"""Markdown and JSON renderings of a diff report (deterministic: same plans, same bytes)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from trainstack.diff.access import AccessChange
from trainstack.diff.model import NOT_PREVIEWED, DiffReport, Entry, ResourceChange, StackDiff
from trainstack.diff.plans import Change, show

MARKER = "<!-- trainstack-plan-diff -->"  # finds the sticky pull-request comment again


def _cell(value: Any) -> str:
    """One table cell: `|` escaped, line breaks shown as ⏎ (decoded user data, scripts)."""
    return show(value).replace("|", "\\|").replace("\n", " ⏎ ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def _summary_line(stack: StackDiff) -> str:
    c = stack.counts
    parts = [
        f"{c['create']} to create, {c['update']} to update, "
        f"{c['replace']} to replace, {c['delete']} to delete"
    ]
    if stack.stateful_losses:
        parts.append(f"⚠️ **{len(stack.stateful_losses)} stateful replaced or deleted**")
    if stack.capacity.over:
        parts.append(f"⛔ **{len(stack.capacity.over)} capacity check(s) over**")
    if stack.policy.new:
        parts.append(f"🚫 {len(stack.policy.new)} new policy violation(s)")
    if stack.access:
        flagged = sum(1 for a in stack.access if a.flags)
        note = f", {flagged} flagged" if flagged else ""
        parts.append(f"🔑 {len(stack.access)} access change(s){note}")
    label = {"added": " (new stack)", "removed": " (stack removed)"}.get(stack.status, "")
    return f"- **{stack.stack}** ({stack.kind}){label}: " + " · ".join(parts)


def _entry_rows(entries: list[Entry]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for entry in entries:
        if entry.status != "changed":
            detail = ", ".join(f"{k}: {show(v)}" for k, v in entry.summary.items())
            before, after = ("", detail) if entry.status == "added" else (detail, "")
            rows.append([entry.key, entry.status, "", before, after])
            continue
        for change in entry.changes:
            rows.append([entry.key, "changed", change.field, change.before, change.after])
        if entry.more:
            rows.append([entry.key, "changed", f"… and {entry.more} more", "", ""])
    return rows


def _why(r: ResourceChange) -> str:
    """Why a resource is replaced (each changed input with its values) or deleted, and what
    else changed with it."""
    why = "; ".join(r.reasons) if r.reasons else "removed from the plan"
    also = [f"{c.field} {show(c.before)} → {show(c.after)}" for c in r.changes]
    if r.more:
        also.append(f"… and {r.more} more")
    return why + (f"; also changed: {', '.join(also)}" if also else "")


def _losses(stack: StackDiff) -> list[str]:
    if not stack.stateful_losses:
        return []
    out = ["#### ⚠️ Stateful resources replaced or deleted", ""]
    for r in stack.stateful_losses:
        why = _why(r).replace("\n", " ⏎ ")
        out.append(f"- **{r.action.upper()}** `{r.type}` `{r.name}`: {r.stateful}. {why}")
    return [*out, ""]


def _teams(stack: StackDiff) -> list[str]:
    out = ["#### Teams", ""]
    if stack.kind != "platform":
        return [*out, "Team stack: quotas live in the platform stack.", ""]
    if not stack.teams and not stack.groups:
        return [*out, "No quota, priority or borrowing changes.", ""]
    if stack.teams:
        out += _table(["team", "change", "field", "before", "after"], _entry_rows(stack.teams))
    if stack.groups:
        out += _table(["group", "change", "field", "before", "after"], _entry_rows(stack.groups))
    return out


def _capacity(stack: StackDiff) -> list[str]:
    out = ["#### Capacity", ""]
    cap = stack.capacity
    if stack.kind != "platform":
        return [*out, "Team stack: capacity lives in the platform stack.", ""]
    if cap.pools:
        out += _table(["pool", "change", "field", "before", "after"], _entry_rows(cap.pools))
    else:
        out += ["No GPU pool changes.", ""]
    changed = [t for t in cap.totals if t.before != t.after]
    if changed:
        out += _table(["GPUs", "before", "after"], [[t.field, t.before, t.after] for t in changed])
    rows = []
    for check in cap.checks:
        state = "ok" if check.ok else "⛔ **OVER**"
        if not check.ok and check.was_ok:
            state += " (was ok)"
        rows.append([check.name, check.need, check.available, state])
    if rows:
        out += _table(["after the change", "need", "available", ""], rows)
    return out


def _listing(title: str, column: str, entries: list[Entry], empty: str) -> list[str]:
    out = [f"#### {title}", ""]
    if not entries:
        return [*out, empty, ""]
    return out + _table([column, "change", "field", "before", "after"], _entry_rows(entries))


def _policy(stack: StackDiff) -> list[str]:
    out = ["#### Policy violations", ""]
    policy = stack.policy
    if policy.note:
        out += [f"_{policy.note}_", ""]
    if not policy.present:
        return out
    rows = [["new", v.level, v.rule, v.resource, v.message] for v in policy.new]
    rows += [["fixed", v.level, v.rule, v.resource, v.message] for v in policy.fixed]
    if not rows:
        return [*out, "No new or fixed violations.", ""]
    return out + _table(["", "level", "rule", "resource", "message"], rows)


def _access_change(change: AccessChange) -> str:
    flags = f" **⚠️ {'; '.join(change.flags)}**" if change.flags else ""
    return change.change + flags


def _access(stack: StackDiff) -> list[str]:
    """Who gets or loses what: each change names its principal or subject and its policy,
    role, groups or rule (issue 23 #5)."""
    out = ["#### Access", ""]
    if not stack.access:
        return [*out, "No access changes.", ""]
    header = ["change", "access", "principal / subject", "policy / role / rule", "field"]
    rows: list[list[Any]] = []
    for a in stack.access:
        lead = [_access_change(a), a.kind, a.subject, a.grant]
        if not a.changes:
            rows.append([*lead, "", "", ""])
        for change in a.changes:
            rows.append([*lead, change.field, change.before, change.after])
        if a.more:
            rows.append([*lead, f"… and {a.more} more", "", ""])
    return out + _table([*header, "before", "after"], rows)


def _created_updated(stack: StackDiff) -> list[str]:
    """Every created and updated resource, collapsed: the summary's counts, each one listed."""
    if not stack.created_updated:
        return []
    created = sum(1 for r in stack.created_updated if r.action == "create")
    updated = len(stack.created_updated) - created
    kinds = Counter(r.type.rsplit(":", 1)[-1] for r in stack.created_updated)
    by_kind = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    rows: list[list[Any]] = []
    for r in stack.created_updated:
        changes = list(r.changes) or [Change("", "", "")]
        rows += [[r.action, r.type, r.name, c.field, c.before, c.after] for c in changes]
        if r.more:
            rows.append([r.action, r.type, r.name, f"… and {r.more} more", "", ""])
    return [
        "#### Created and updated resources",
        "",
        f"<details><summary>{created} created, {updated} updated: {by_kind}</summary>",
        "",
        *_table(["action", "type", "name", "field", "before", "after"], rows),
        "</details>",
        "",
    ]


def _resources(stack: StackDiff) -> list[str]:
    out = ["#### Replaced or deleted resources", ""]
    stateless = [r for r in stack.resources if not r.stateful]
    if not stack.resources:
        out += ["None.", ""]
    elif not stateless:
        out += ["Only the stateful ones above.", ""]
    else:
        if stack.stateful_losses:
            out += ["Stateful ones are listed above.", ""]
        rows = [[r.action, r.type, r.name, _why(r)] for r in stateless]
        out += _table(["action", "type", "name", "why"], rows)
    if stack.outputs_changed:
        keys = ", ".join(f"`{k}`" for k in stack.outputs_changed)
        out += [f"Stack outputs changed: {keys}", ""]
    return out


def _stack_markdown(stack: StackDiff) -> list[str]:
    out = [f"### {stack.stack} ({stack.kind} stack)", ""]
    if not stack.has_changes:
        return [*out, "No changes.", ""]
    return [
        *out,
        *_losses(stack),
        *_teams(stack),
        *_capacity(stack),
        *_listing("Storage", "resource", stack.storage, "No storage changes."),
        *_listing("Jobs", "job", stack.jobs, "No jobs added, removed or changed."),
        *_access(stack),
        *_policy(stack),
        *_resources(stack),
        *_created_updated(stack),
    ]


def _skipped(report: DiffReport) -> list[str]:
    """Stacks the head did not preview (not in its changed set) though they still exist."""
    names = [s.stack for s in report.stacks if s.status == NOT_PREVIEWED]
    if not names:
        return []
    return [
        f"- unchanged (not previewed: no head plan, and the stack file is still there): "
        f"{', '.join(names)}"
    ]


def to_markdown(report: DiffReport) -> str:
    lines = [MARKER, "## trainstack plan diff", ""]
    if not report.stacks:
        return "\n".join([*lines, "This change touches no stack: nothing to preview.", ""])
    if not report.has_changes:
        names = ", ".join(s.stack for s in report.stacks) or "none"
        lines += [f"No changes ({len(report.stacks)} stack(s): {names}).", *_skipped(report), ""]
        return "\n".join(lines)
    lines += [_summary_line(s) for s in report.stacks if s.has_changes]
    unchanged = [s.stack for s in report.stacks if not s.has_changes and s.status != NOT_PREVIEWED]
    if unchanged:
        lines.append(f"- unchanged: {', '.join(unchanged)}")
    lines += [*_skipped(report), ""]
    for stack in report.stacks:
        if stack.has_changes:
            lines += _stack_markdown(stack)
    lines += [
        "<sub>Offline plans (`trainstack preview`); replacement inferred from the changed "
        "inputs (docs/diff.md).</sub>",
        "",
    ]
    return "\n".join(lines)


def to_json(report: DiffReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
