"""The diff report's capacity checks: the loader's checker (trainstack/config/capacity.py,
max-flow over claims and pools) run on what a plan's outputs record, so a plan and the config
it came from are judged by one implementation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from trainstack.config.capacity import Promise, Shortfall, check, claim_text, claims
from trainstack.diff.plans import get

# level -> (what is claimed, which capacity backs it, index in a pool's (firm, total))
LEVELS = {"guarantee": ("guarantees", "firm", 0), "deserved": ("deserved shares", "total", 1)}
OVERALL = {
    "guarantee": "Σ guarantees ≤ firm capacity (all pools; elastic GPUs back no guarantee)",
    "deserved": "Σ deserved ≤ total capacity (all pools)",
}


@dataclass(frozen=True)
class Check:
    """One capacity invariant after the change (and whether it held before)."""

    name: str
    need: int
    available: int
    ok: bool
    was_ok: bool | None  # None: not checkable on the base side


@dataclass(frozen=True)
class Inputs:
    """What the checker needs, read from one plan."""

    teams: list[Promise]
    groups: dict[str, tuple[int, int]]  # group queue -> (guarantee, deserved)
    pools: dict[str, tuple[int, int]]  # pool -> (firm, total) GPUs
    hierarchical: bool


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) else 0


def plan_inputs(
    plan: Mapping[str, Any],
    teams: Mapping[str, Mapping[str, Any]],
    pool_view: Mapping[str, Mapping[str, Any]],
) -> Inputs | None:
    """The checker's inputs from `outputs.scheduling` and the per-team slices (`teams`).

    Plans from before `scheduling.capacity.pools` fall back to `pool_view` (the report's
    `gpuPools` view) with the rule of their time: every GPU firm except spot.
    """
    scheduling = get(plan, "outputs", "scheduling", default={}) or {}
    capacity = scheduling.get("capacity") or {}
    recorded = capacity.get("pools") or {}
    pools = {
        str(name): (_int(p.get("firm")), _int(p.get("firm")) + _int(p.get("elastic")))
        for name, p in recorded.items()
    } or {
        name: (0 if p.get("capacityType") == "spot" else _int(p.get("GPUs")), _int(p.get("GPUs")))
        for name, p in pool_view.items()
    }
    if not pools or not teams:
        return None
    promises = []
    for name, team in sorted(teams.items()):
        sched = team.get("scheduling") or {}
        gpus = sched.get("gpus") or {}
        promises.append(
            Promise(
                name,
                team.get("group") or None,
                _int(gpus.get("guarantee")),
                _int(gpus.get("deserved")),
                frozenset(sched.get("pools") or pools),
            )
        )
    groups = {
        str(name): (_int(g.get("guarantee")), _int(g.get("deserved")))
        for name, g in (capacity.get("groups") or {}).items()
    }
    return Inputs(promises, groups, pools, scheduling.get("queueMode") != "flat")


def _shortfall_check(level: str, short: Shortfall) -> Check:
    what, kind, _ = LEVELS[level]
    name = f"{what} of {claim_text(short.claims)} ≤ {kind} capacity of {', '.join(short.pools)}"
    return Check(name, short.need, short.available, False, None)


def _evaluate(inputs: Inputs) -> dict[str, tuple[Check, list[Check]]]:
    """Per level: the overall sum, and one failing check per shortfall the checker finds."""
    found = check(inputs.teams, inputs.groups, inputs.pools, inputs.hierarchical)
    result: dict[str, tuple[Check, list[Check]]] = {}
    for level, shortfalls in found.items():
        at = LEVELS[level][2]
        need = sum(c.gpus for c in claims(inputs.teams, inputs.groups, level))
        available = sum(p[at] for p in inputs.pools.values())
        overall = Check(OVERALL[level], need, available, need <= available, None)
        # A shortfall of every claim on every pool says what the overall line says.
        parts = [s for s in shortfalls if (s.need, s.available) != (need, available)]
        result[level] = (overall, [_shortfall_check(level, s) for s in parts])
    return result


def capacity_checks(base: Inputs | None, head: Inputs | None) -> list[Check]:
    """The head's checks, each with whether it held on the base: by name, or, for a shortfall
    the base lacks, True when the base carried every claim of that level."""
    if head is None:
        return []
    old = _evaluate(base) if base is not None else {}
    before = {c.name: c.ok for overall, parts in old.values() for c in (overall, *parts)}
    checks: list[Check] = []
    for level, (overall, parts) in _evaluate(head).items():
        held = level in old and old[level][0].ok and not old[level][1]
        checks.append(replace(overall, was_ok=before.get(overall.name)))
        checks += [replace(c, was_ok=before.get(c.name, True if held else None)) for c in parts]
    return checks
