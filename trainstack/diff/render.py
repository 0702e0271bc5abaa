"""Markdown and JSON renderings of a diff report (deterministic: same plans, same bytes)."""

from __future__ import annotations

import json
from typing import Any

from trainstack.diff.plans import show
from trainstack.diff.report import DiffReport, Entry, StackDiff

MARKER = "<!-- trainstack-plan-diff -->"  # finds the sticky pull-request comment again


def _cell(value: Any) -> str:
    return show(value).replace("|", "\\|").replace("\n", " ")


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
        for k, v in entry.summary.items():
            rows.append([entry.key, "changed", k, "", v])
        for change in entry.changes:
            rows.append([entry.key, "changed", change.field, change.before, change.after])
        if entry.more:
            rows.append([entry.key, "changed", f"… and {entry.more} more", "", ""])
    return rows


def _losses(stack: StackDiff) -> list[str]:
    if not stack.stateful_losses:
        return []
    out = ["#### ⚠️ Stateful resources replaced or deleted", ""]
    for r in stack.stateful_losses:
        why = "; ".join(r.reasons) if r.reasons else "removed from the plan"
        out.append(f"- **{r.action.upper()}** `{r.type}` `{r.name}`: {r.stateful}. {why}")
    return [*out, ""]


def _teams(stack: StackDiff) -> list[str]:
    out = ["#### Teams", ""]
    if stack.kind != "platform":
        return [*out, "Team stack: quotas live in the platform stack.", ""]
    if not stack.teams:
        return [*out, "No quota, priority or borrowing changes.", ""]
    return out + _table(["team", "change", "field", "before", "after"], _entry_rows(stack.teams))


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


def _resources(stack: StackDiff) -> list[str]:
    out = ["#### Replaced or deleted resources", ""]
    if not stack.resources:
        out += ["None.", ""]
    else:
        rows = [
            [
                ("⚠️ " if r.stateful else "") + r.action,
                r.type,
                r.name,
                "; ".join(r.reasons) or "removed from the plan",
            ]
            for r in stack.resources
        ]
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
        *_policy(stack),
        *_resources(stack),
    ]


def to_markdown(report: DiffReport) -> str:
    lines = [MARKER, "## trainstack plan diff", ""]
    if not report.stacks:
        return "\n".join([*lines, "This change touches no stack: nothing to preview.", ""])
    if not report.has_changes:
        names = ", ".join(s.stack for s in report.stacks) or "none"
        lines += [f"No changes ({len(report.stacks)} stack(s): {names}).", ""]
        return "\n".join(lines)
    lines += [_summary_line(s) for s in report.stacks if s.has_changes]
    unchanged = [s.stack for s in report.stacks if not s.has_changes]
    if unchanged:
        lines.append(f"- unchanged: {', '.join(unchanged)}")
    lines.append("")
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
