"""What a preview prints after its resource table, a pure function of the plan.

Platform stacks: the capacity arithmetic. `outputs["scheduling"]["capacity"]`
(trainstack/config/capacity.py `summary()` plus the builder's `dimensions`) says what the pools
provide, firm and elastic, and what the queues promise. Team stacks: their jobs (GPUs, pool,
priority, maximum duration) and their sum against the team's `limits` output (issue 41).
Rendered here so a reviewer sees it without opening plan.json; plans written before a key
existed render what they have.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from io import StringIO
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from trainstack import outputs as out
from trainstack.builders import labels
from trainstack.builders.scheduling import priority_class_name
from trainstack.jobs.elastic import gpus_label, job_gpus
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.policy.rules import MAX_DURATION_ANNOTATION
from trainstack.preview.plan import Plan

_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def _mapping(value: Any) -> Mapping[str, Any]:
    """A map from an output value: outputs are dicts in plans, JSON text from some engines."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _ratio(capabilities: str, cluster: str) -> str:
    """Σ capabilities as a share of the cluster, when both are in the same unit."""
    a, b = _QUANTITY.match(capabilities), _QUANTITY.match(cluster)
    if not a or not b or a[2] != b[2] or float(b[1]) == 0:
        return ""
    return f"{100 * float(a[1]) / float(b[1]):.0f}%"


def _pools(pools: Mapping[str, Any], firm: int | None, elastic: int | None) -> Table:
    table = Table(title="GPU pools: firm backs guarantees, elastic may be absent")
    table.add_column("pool", overflow="fold")
    table.add_column("kind", overflow="fold")
    table.add_column("firm", justify="right")
    table.add_column("elastic", justify="right")
    table.add_column("why", overflow="fold")
    for name in sorted(pools):
        pool = _mapping(pools[name])
        table.add_row(
            Text(name),
            Text(str(pool.get("kind", ""))),
            Text(str(pool.get("firm", "?"))),
            Text(str(pool.get("elastic", "?"))),
            Text(str(pool.get("why", ""))),
        )
    if firm is not None and elastic is not None:
        table.add_section()
        table.add_row(Text("all pools"), Text(""), Text(str(firm)), Text(str(elastic)), Text(""))
    return table


def _promises(capacity: Mapping[str, Any], mode: str) -> Table | None:
    """What the queues promise in sum, against what the pools provide."""
    firm, total = _int(capacity.get("firm")), _int(capacity.get("total"))
    rows: list[tuple[str, str, str, str]] = []
    guaranteed = _int(capacity.get("guaranteed"))
    if guaranteed is not None:
        against = f"{firm} firm" if firm is not None else ""
        rows.append(("Σ guarantees", str(guaranteed), against, "only firm GPUs back them"))
    deserved = _int(capacity.get("deserved"))
    if mode == "flat":
        rows.append(("Σ deserved", "-", "", "flat: shares come from weights"))
    elif deserved is not None:
        rows.append(
            (
                "Σ deserved",
                str(deserved),
                f"{total} in all" if total is not None else "",
                "fair shares",
            )
        )
    capability = _int(capacity.get("capability"))
    if capability is not None:
        against = f"{total} in all" if total is not None else ""
        rows.append(
            ("Σ capabilities", str(capability), against, "borrowing: may exceed the cluster")
        )
    if not rows:
        return None
    table = Table(title="what the queues promise")
    table.add_column("")
    table.add_column("GPUs", justify="right")
    table.add_column("against", justify="right")
    table.add_column("note", overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _groups(groups: Mapping[str, Any]) -> Table:
    table = Table(title="group queues (GPUs)")
    table.add_column("group", overflow="fold")
    table.add_column("guarantee", justify="right")
    table.add_column("deserved", justify="right")
    for name in sorted(groups):
        group = _mapping(groups[name])
        table.add_row(
            Text(name),
            Text(str(group.get("guarantee", "?"))),
            Text(str(group.get("deserved", "?"))),
        )
    return table


def _dimensions(dimensions: Mapping[str, Any]) -> Table:
    table = Table(title="per resource: cluster vs Σ team capabilities")
    table.add_column("resource", overflow="fold")
    table.add_column("cluster", justify="right")
    table.add_column("Σ capabilities", justify="right")
    table.add_column("of cluster", justify="right")
    for name in sorted(dimensions):
        dim = _mapping(dimensions[name])
        cluster, summed = str(dim.get("cluster", "?")), str(dim.get("capabilities", "?"))
        table.add_row(Text(name), Text(cluster), Text(summed), Text(_ratio(summed, cluster)))
    return table


def capacity_renderables(outputs: Mapping[str, Any]) -> list[RenderableType]:
    """The capacity section for a plan's outputs; empty when it has none (team stacks)."""
    scheduling = _mapping(outputs.get("scheduling"))
    capacity = _mapping(scheduling.get("capacity"))
    if not capacity:
        return []
    mode = str(scheduling.get("queueMode") or "")
    firm, elastic = _int(capacity.get("firm")), _int(capacity.get("elastic"))
    total = _int(capacity.get("total"))
    head = f"capacity{f' ({mode} queues)' if mode else ''}: "
    if firm is not None and elastic is not None:
        head += f"{firm} firm, {elastic} elastic GPUs"
        if total is not None:
            head += f" ({total} at maximum size)"
    elif total is not None:
        head += f"{total} GPUs at maximum size"
    else:
        head += "no GPU totals in this plan"
    out: list[RenderableType] = [Text(head)]
    pools = _mapping(capacity.get("pools"))
    if pools:
        out.append(_pools(pools, firm, elastic))
    promises = _promises(capacity, mode)
    if promises is not None:
        out.append(promises)
    groups = _mapping(capacity.get("groups"))
    if groups:
        out.append(_groups(groups))
    dimensions = _mapping(capacity.get("dimensions"))
    if dimensions:
        out.append(_dimensions(dimensions))
    blind = capacity.get("poolBlind")
    if isinstance(blind, list) and blind:
        out += _pool_blind(blind)
    return out


def _pool_blind(entries: list[Any]) -> list[RenderableType]:
    """Confined teams' guarantees that other teams may hold off within their fair shares
    (config/capacity.py pool_blind), and each warning with its fix."""
    table = Table(title="guarantees reclaim may not free: Volcano's queues do not know pools")
    table.add_column("team", overflow="fold")
    table.add_column("guarantee", justify="right")
    table.add_column("firm on its pools", overflow="fold")
    table.add_column("others keep within their shares", overflow="fold")
    table.add_column("left", justify="right")
    warnings: list[RenderableType] = []
    for entry in map(_mapping, entries):
        kept = _mapping(entry.get("kept"))
        pools = entry.get("pools")
        table.add_row(
            Text(str(entry.get("team", "?"))),
            Text(str(entry.get("guarantee", "?"))),
            Text(
                f"{entry.get('firm', '?')}"
                + (f" ({', '.join(map(str, pools))})" if isinstance(pools, list) else "")
            ),
            Text(", ".join(f"{team} {gpus}" for team, gpus in sorted(kept.items()))),
            Text(str(entry.get("left", "?"))),
        )
        if entry.get("warning"):
            warnings.append(Text.assemble(("warning: ", "bold yellow"), str(entry["warning"])))
    return [table, *warnings]


def _job_row(job: Mapping[str, Any]) -> tuple[str, int, int, str, str, float | None]:
    """(name, least GPUs, GPUs, pool, priority, maximum hours) of a rendered Volcano Job: an
    elastic job's least is its minimum (jobs/elastic.py job_gpus), a gang job's its GPUs."""
    meta, spec = _mapping(job.get("metadata")), _mapping(job.get("spec"))
    least, gpus = job_gpus(spec)
    seconds = _number(_mapping(meta.get("annotations")).get(MAX_DURATION_ANNOTATION))
    return (
        str(meta.get("name", "?")),
        least,
        gpus,
        str(_mapping(meta.get("labels")).get(labels.POOL, "?")),
        # The spec's own word (`normal`), not the PriorityClass it becomes.
        str(spec.get("priorityClassName", "?")).removeprefix(priority_class_name("")),
        None if seconds is None else seconds / 3600,
    )


def _number(value: Any) -> float | int | None:
    """A count or quantity as written in a manifest: 8, 8.0, "8"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    try:
        return float(str(value))
    except ValueError:
        return None


def _hours(value: float | None) -> str:
    return "?" if value is None else f"{value:g}h"


def jobs_renderables(plan: Plan) -> list[RenderableType]:
    """A team stack's jobs and their sum against the team's limits; empty for a platform."""
    if plan.kind != "team":
        return []
    rows = sorted(_job_row(r.inputs) for r in plan.resources if r.type == VOLCANO_JOB)
    team = plan.outputs.get(out.TEAM, plan.stack)
    if not rows:
        return [Text(f"team {team}: no jobs")]
    table = Table(title=f"jobs of team {team}")
    table.add_column("job", overflow="fold")
    table.add_column("GPUs", justify="right")
    table.add_column("pool", overflow="fold")
    table.add_column("priority")
    table.add_column("max duration", justify="right")
    for name, least, count, pool, priority, hours in rows:
        table.add_row(
            Text(name), Text(gpus_label(least, count)), Text(pool), Text(priority),
            Text(_hours(hours)),
        )  # fmt: skip
    least_total, total = sum(row[1] for row in rows), sum(row[2] for row in rows)
    longest = max((row[5] for row in rows if row[5] is not None), default=None)
    limits = _mapping(plan.outputs.get(out.LIMITS))
    gpus = _mapping(limits.get("gpus"))
    capability, guarantee = _int(gpus.get("capability")), _int(gpus.get("guarantee"))
    max_hours = _number(limits.get("maxJobHours"))
    table.add_section()
    table.add_row(
        Text("all jobs"), Text(gpus_label(least_total, total)), Text(""), Text(""),
        Text(_hours(longest)),
    )  # fmt: skip
    if limits:
        table.add_row(
            Text("team's limit"),
            Text("?" if capability is None else str(capability)),
            Text(""),
            Text(""),
            Text(_hours(None if max_hours is None else float(max_hours))),
        )
    found: list[RenderableType] = [table]
    if not limits:
        found.append(
            Text("the team's limits are not in this plan (written before trainstack exported them)")
        )
        return found
    deserved = _int(gpus.get("deserved"))
    note = (
        f"team {team}: {'?' if guarantee is None else guarantee} GPUs guaranteed, "
        f"{'?' if deserved is None else deserved} deserved, at most "
        f"{'?' if capability is None else capability} at once (its queue's capability)"
    )
    # What Volcano does with the sum (docs/scheduling.md, "What a guarantee does"): beyond the
    # capability nothing is allocated; above the fair share pods are what reclaim takes; only
    # the guarantee is kept free for the team.
    if capability is not None and least_total > capability:
        note += (
            f"; all jobs together need {least_total}, more than {capability}: they cannot all "
            "run at once, the rest wait in the queue"
        )
    elif capability is not None and total > capability:
        # Elastic jobs (docs/jobs.md): their minimums fit, their sizes do not.
        note += (
            f"; all jobs together need {gpus_label(least_total, total)}: at their minimums "
            f"they fit in {capability}, and elastic jobs grow only as far as the rest leaves"
        )
    elif deserved is not None and total > deserved:
        note += (
            f"; all jobs together need {total}, {total - deserved} above its fair share: "
            "teams below theirs may reclaim those"
        )
    elif guarantee is not None and total > guarantee:
        note += (
            f"; all jobs together need {total}, {total - guarantee} beyond the guarantee: "
            f"only {guarantee} are held for the team"
        )
    found.append(Text(note))
    return found


def _text(renderables: list[RenderableType], width: int) -> str:
    console = Console(
        file=StringIO(),
        width=width,
        color_system=None,
        highlight=False,
        markup=False,
        emoji=False,
    )
    for renderable in renderables:
        console.print(renderable)
    file = console.file
    assert isinstance(file, StringIO)
    return file.getvalue()


def capacity_text(outputs: Mapping[str, Any], width: int = 100) -> str:
    """The capacity section as plain text (tests, logs)."""
    return _text(capacity_renderables(outputs), width)


def jobs_text(plan: Plan, width: int = 100) -> str:
    """A team stack's jobs section as plain text (tests, logs)."""
    return _text(jobs_renderables(plan), width)
