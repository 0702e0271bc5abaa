"""The capacity arithmetic a platform preview prints: a pure function of the plan's outputs.

`outputs["scheduling"]["capacity"]` (trainstack/config/capacity.py `summary()` plus the
builder's `dimensions`) says what the pools provide, firm and elastic, and what the queues
promise. Rendered here so a reviewer sees it without opening plan.json. Team stacks have no
such output and get nothing; plans written before a key existed render what they have.
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
    return out


def capacity_text(outputs: Mapping[str, Any], width: int = 100) -> str:
    """The capacity section as plain text (tests, logs)."""
    console = Console(
        file=StringIO(),
        width=width,
        color_system=None,
        highlight=False,
        markup=False,
        emoji=False,
    )
    for renderable in capacity_renderables(outputs):
        console.print(renderable)
    file = console.file
    assert isinstance(file, StringIO)
    return file.getvalue()
