"""Resources a new team or pool gets that are another team's or pool's, renamed.

A new team brings a namespace, quota, queue, volumes, role, bindings, policies and monitors,
and a new pool its node group, launch template and security group. Most of them are an
existing team's or pool's with the name changed, and listing each, with its whole grant, made
adding a team and a pool a 23 KB report (issue 41 #3). What a reviewer needs is which ones
differ: a resource is a twin when some existing team's (or pool's) resource of the same type,
in the head plan, is exactly it with the new name written in place of the old one, inputs,
options, parent and provider alike (not dependencies: the order resources are created in, and
a team's monitor depends on every team's queue). Twins are counted under their team or pool;
everything else is listed as before.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from trainstack.diff.plans import get
from trainstack.outputs import team_slices

Ref = tuple[str, str]  # (type, name)


def _renamed(text: str, old: str, new: str) -> str:
    """`old` written as `new` wherever it stands as a whole name (not inside another word)."""
    return re.sub(rf"(?<![A-Za-z0-9]){re.escape(old)}(?![A-Za-z0-9])", new, text)


def _units(plan: dict[str, Any]) -> dict[str, set[str]]:
    """Teams and pools of a plan, by its outputs."""
    outputs = plan.get("outputs") or {}
    teams = set(team_slices(outputs)) or {
        str(t.get("name")) for t in get(outputs, "registry", "teams", default=[]) or []
    }
    pools = {str(p.get("name")) for p in get(outputs, "gpuPools", default=[]) or []}
    return {"team": teams, "pool": pools}


def _body(resource: dict[str, Any]) -> str:
    keys = ("inputs", "options", "parent", "provider")
    return json.dumps({k: resource.get(k) for k in keys}, sort_keys=True)


def _best_twin(
    created: Iterable[Ref], unit: str, others: list[str], head: dict[Ref, dict[str, Any]]
) -> tuple[str, list[Ref]]:
    """The existing unit whose resources, renamed, are most of `unit`'s, and which those are."""
    mine = [ref for ref in created if _renamed(ref[1], unit, "\0") != ref[1]]
    best: tuple[str, list[Ref]] = ("", [])
    for other in others:
        same = []
        for rtype, name in mine:
            twin = head.get((rtype, _renamed(name, unit, other)))
            if twin is not None and _renamed(_body(head[(rtype, name)]), unit, other) == _body(
                twin
            ):
                same.append((rtype, name))
        if len(same) > len(best[1]):
            best = (other, same)
    return best


def twins(base: dict[str, Any], head: dict[str, Any], created: list[Ref]) -> dict[Ref, str]:
    """Created resources that are another team's or pool's, renamed: each with its label,
    `team speech (as recsys's)`."""
    old, new = _units(base), _units(head)
    index = {(r["type"], r["name"]): r for r in head["resources"] if r.get("custom", True)}
    found: dict[Ref, str] = {}
    for kind in ("team", "pool"):
        existing = sorted(new[kind] & old[kind])
        for unit in sorted(new[kind] - old[kind]):
            other, same = _best_twin(
                [ref for ref in created if ref not in found], unit, existing, index
            )
            for ref in same:
                found[ref] = f"{kind} {unit} (as {other}'s)"
    return found


def kinds(refs: Iterable[str]) -> str:
    """`LimitRange, 2 NetworkPolicy`: the kinds, with how many where more than one."""
    return ", ".join(f"{n} {k}" if n > 1 else k for k, n in sorted(Counter(refs).items()))
