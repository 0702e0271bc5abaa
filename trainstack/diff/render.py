"""Markdown and JSON renderings of a diff report (deterministic: same plans, same bytes)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from trainstack.diff.access import AccessChange
from trainstack.diff.model import NOT_PREVIEWED, DiffReport, Entry, ResourceChange, StackDiff
from trainstack.diff.plans import ABSENT, Change, show
from trainstack.diff.sections import STORAGE_TYPES
from trainstack.diff.twins import kinds as count_kinds

MARKER = "<!-- trainstack-plan-diff -->"  # finds the sticky pull-request comment again


def _cell(value: Any) -> str:
    """One table cell: `|` escaped, line breaks shown as ⏎ (decoded user data, scripts)."""
    return show(value).replace("|", "\\|").replace("\n", " ⏎ ")


def _listed(value: Any) -> str:
    """A summary's value: a list of names as `[a, b]`, without JSON's quotes."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return f"[{', '.join(value)}]"
    return show(value)


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
    if stack.data_paths:
        parts.append(f"⚠️ **{len(stack.data_paths)} data path(s) changed**")
    if stack.widened:
        parts.append(f"⚠️ **{len(stack.widened)} grant(s) widened**")
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
        if entry.status not in ("changed", "replaced"):
            detail = ", ".join(f"{k}: {_listed(v)}" for k, v in entry.summary.items())
            before, after = ("", detail) if entry.status == "added" else (detail, "")
            rows.append([entry.key, entry.status, "", before, after])
            continue
        for change in entry.changes:
            rows.append([entry.key, entry.status, change.field, change.before, change.after])
        if entry.more:
            rows.append([entry.key, entry.status, f"… and {entry.more} more", "", ""])
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


def _risks(stack: StackDiff) -> list[str]:
    """Data paths and widened grants, first, where a reviewer cannot miss them: a dataset
    prefix opened to the whole bucket was "3 access changes" and "No storage changes"
    (issue 41 #3). Grants widened alike (every team's policy) are one line."""
    if not stack.data_paths and not stack.widened:
        return []
    out = ["#### ⚠️ Data paths and widened access", ""]
    for p in stack.data_paths:
        change = f"{p.field} {show(p.before)} → {show(p.after)}"
        out.append(f"- **DATA PATH** `{p.resource}` ({p.action}): {change}: {p.note}")
    alike: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for a in stack.widened:
        alike.setdefault((a.kind, tuple(a.widened)), []).append(a.resource.split(" ", 1)[-1])
    for (kind, wider), resources in alike.items():
        out.append(f"- **WIDENED** {kind} `{names(resources)}`: now allows {'; '.join(wider)}")
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
    twins: dict[str, list[str]] = {}
    for a in stack.access:
        if a.twin and not a.flags:
            twins.setdefault(a.twin, []).append(a.kind)
    for twin, grants in twins.items():
        rows.append(["added", count_kinds(grants), twin, "each the same, renamed", "", "", ""])
    for a in stack.access:
        if a.twin and not a.flags:
            continue
        # The grant once, on its first row: a policy's summary runs to hundreds of characters
        # and was repeated on each changed field (issue 41 #3).
        lead: list[Any] = [_access_change(a), a.kind, a.subject, a.grant]
        if not a.changes:
            rows.append([*lead, "", "", ""])
        for change in a.changes:
            rows.append([*lead, change.field, change.before, change.after])
            lead = ["″", "", "", ""]
        if a.more:
            rows.append([*lead, f"… and {a.more} more", "", ""])
    return out + _table([*header, "before", "after"], rows)


def short_type(rtype: str) -> str:
    """`kubernetes:scheduling.volcano.sh/v1beta1:Queue` as `Queue`: the kind, as the list's
    summary counts them (plan.json and the JSON report have the whole type)."""
    return rtype.rsplit(":", 1)[-1]


def names(items: list[str]) -> str:
    """Names with their common beginning written once: `trainstack-prod-volcano-queue-{group-
    product, trainstack}`."""
    if len(items) < 2:
        return ", ".join(items)
    first = items[0]
    length = min(len(i) for i in items)
    common = next((n for n in range(length) if any(i[n] != first[n] for i in items)), length)
    cut = first.rfind("-", 0, common) + 1
    if cut < 8:  # too little in common to be worth reading twice
        return ", ".join(items)
    return f"{first[:cut]}{{{', '.join(i[cut:] for i in items)}}}"


MAX_NAMED_ORDERING = 3  # updates of dependencies alone named one by one; more are one row


def _ordering_row(ordering: list[ResourceChange]) -> list[Any]:
    """Updates of dependencies alone, many of them: one row of kinds and what they now depend
    on (ten monitors that came to depend on a new queue were ten rows, issue 41 #3). The
    engine updates none of them (ResourceChange.only_dependencies); plan.json and the JSON
    report name each."""
    added = {c.after: None for r in ordering for c in r.changes if c.field == "dependencies added"}
    removed = {
        c.before: None for r in ordering for c in r.changes if c.field == "dependencies removed"
    }
    return [
        "update",
        count_kinds([short_type(r.type) for r in ordering]),
        f"{len(ordering)} resources: dependencies only, nothing to update in the cloud",
        "dependencies added" if added and not removed else "dependencies",
        "; ".join(removed) or ABSENT,
        "; ".join(added) or ("(order)" if not removed else ABSENT),
    ]


def _created_updated(stack: StackDiff) -> list[str]:
    """Every created and updated resource, collapsed: the summary's counts, each one named.

    One row per change, naming every resource of that type it was made to, and one per type
    of created resources: the group queues' capabilities grew alike, and ten monitors gained
    the same dependencies, each on rows of its own (issue 41 #3).
    """
    if not stack.created_updated:
        return []
    created = sum(1 for r in stack.created_updated if r.action == "create")
    updated = len(stack.created_updated) - created
    kinds = Counter(r.type.rsplit(":", 1)[-1] for r in stack.created_updated if not r.twin)
    by_kind = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    renamed = sum(1 for r in stack.created_updated if r.twin)
    if renamed:
        by_kind += f"; and {renamed} another team's or pool's, renamed"
    rows: dict[tuple[str, ...], tuple[list[Any], list[str]]] = {}
    twins: dict[str, list[str]] = {}
    ordering = [r for r in stack.created_updated if r.only_dependencies]
    for r in stack.created_updated:
        if r.twin:
            twins.setdefault(r.twin, []).append(short_type(r.type))
            continue
        if r.only_dependencies and len(ordering) > MAX_NAMED_ORDERING:
            continue
        changes = list(r.changes) or [Change("", "", "")]
        if r.more:
            changes.append(Change(f"… and {r.more} more", "", ""))
        for c in changes:
            # Updates alike share a row whatever their types; created ones, their type's.
            kind = r.type if r.action == "create" else ""
            key = (r.action, kind, c.field, json.dumps(c.before), json.dumps(c.after))
            row, named = rows.setdefault(key, ([r.action, [], "", c.field, c.before, c.after], []))
            if short_type(r.type) not in row[1]:
                row[1].append(short_type(r.type))
            named.append(r.name)
    table = [
        ["create", count_kinds(types), f"{len(types)} of {twin}, each renamed", "", "", ""]
        for twin, types in twins.items()
    ]
    table += [[row[0], ", ".join(row[1]), names(named), *row[3:]] for row, named in rows.values()]
    if len(ordering) > MAX_NAMED_ORDERING:
        table.append(_ordering_row(ordering))
    return [
        "#### Created and updated resources",
        "",
        f"<details><summary>{created} created, {updated} updated: {by_kind}</summary>",
        "",
        *_table(["action", "type", "name", "field", "before", "after"], table),
        "</details>",
        "",
    ]


def _resources(stack: StackDiff) -> list[str]:
    """Replaced and deleted resources, each once: stateful ones are in the ⚠️ list, storage
    ones in Storage (with the inputs that force a replacement), the rest here."""
    out = ["#### Replaced or deleted resources", ""]
    stateless = [r for r in stack.resources if not r.stateful and r.type not in STORAGE_TYPES]
    elsewhere = [
        text
        for text, shown in (
            ("the stateful ones above", stack.stateful_losses),
            (
                "storage ones under Storage",
                len(stack.resources) - len(stateless) - len(stack.stateful_losses),
            ),
        )
        if shown
    ]
    if not stack.resources:
        out += ["None.", ""]
    elif not stateless:
        out += [f"Only {' and '.join(elsewhere)}.", ""]
    else:
        if elsewhere:
            out += [f"Besides {' and '.join(elsewhere)}:", ""]
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
        *_risks(stack),
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
