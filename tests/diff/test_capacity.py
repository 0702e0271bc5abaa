"""The diff report's capacity checks run the loader's checker (trainstack/config/capacity.py) on
what plans record (issue 16 #5): the same verdict, the same teams, for old plans too."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.diff.conftest import Preview, as_doc
from tests.diff.test_diff import DESERVED, GUARANTEES, report_for
from trainstack.config import ConfigError, load_stack_file
from trainstack.diff.capacity import capacity_checks, plan_inputs
from trainstack.diff.report import diff_plans
from trainstack.preview.plan import Plan

DEV = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()


def triangle(gpus: int) -> str:
    """The dev platform with four on-demand pools a-d of 8 firm GPUs (2 nodes of 4 L40S; 12
    at their maximum) and three teams guaranteeing `gpus` each on two of a, b, c: t1 on a, b;
    t2 on b, c; t3 on a, c. Every pair holds 16 firm GPUs, the four pools 32, and a, b, c
    together 24."""
    head, rest = DEV.split("    gpuPools:\n")
    _, tail = rest.split("    monitoring:\n")
    pools = "".join(
        f"      - {{name: {name}, instanceType: g6e.12xlarge, fabric: tcp, "
        "capacity: {type: onDemand}, size: {min: 2, max: 3}}\n"
        for name in "abcd"
    )
    teams = "".join(
        f"        - {{name: {name}, owners: [{name}@example.com], quota: {{gpus: {gpus}}}, "
        f"pools: [{pools}]}}\n"
        for name, pools in (("t1", "a, b"), ("t2", "b, c"), ("t3", "a, c"))
    )
    registry = f"    registry:\n      teams:\n{teams}"
    # dev's price row is for its spot pool; these pools are on demand (a pool without a price
    # is a config error, issue 41).
    priced = "{instanceType: g6e.12xlarge, capacity: spot,"
    assert priced in tail
    tail = tail.replace(priced, "{instanceType: g6e.12xlarge, capacity: onDemand,")
    return f"{head}    gpuPools:\n{pools}{registry}    monitoring:\n{tail}"


def claim_texts(texts: list[str], pattern: str) -> list[str]:
    return sorted(m.group(1) for t in texts if (m := re.search(pattern, t)))


def teams_in(texts: list[str]) -> set[str]:
    return {name for t in texts for name in re.findall(r"([\w-]+) \(\d+\)", t)}


def test_teams_on_overlapping_pools_fail_in_the_diff_as_in_the_loader(
    preview: Preview, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16 #5: 9 GPUs each on {a,b}, {b,c}, {a,c}. Each team's pair (16) holds its 9 and
    the four pools (32) hold all 27, so the diff's old per-named-pool-set check passed; but
    the three teams share a, b and c, 24 firm GPUs. The loader refuses it; so must the diff."""
    head_text = triangle(9)
    stack_file = tmp_path / "Pulumi.tri.yaml"
    stack_file.write_text(head_text)
    with pytest.raises(ConfigError) as refused:
        load_stack_file(stack_file)
    loader = [i.message for i in refused.value.issues]

    base = preview("tri", tri=triangle(8))  # 24 on a, b, c: fits exactly
    monkeypatch.setattr("trainstack.config.loader.capacity_issues", lambda _cfg: [])
    diff, markdown = report_for(base, preview("tri", tri=head_text))

    checks = {c.name: c for c in diff.capacity.checks}
    assert (checks[GUARANTEES].need, checks[GUARANTEES].available) == (27, 32)
    assert checks[GUARANTEES].ok
    assert (checks[DESERVED].need, checks[DESERVED].available) == (27, 48)
    [over] = diff.capacity.over
    assert over.name == "guarantees of t1 (9) + t2 (9) + t3 (9) ≤ firm capacity of a, b, c"
    assert (over.need, over.available, over.was_ok) == (27, 24, True)
    assert f"| {over.name} | 27 | 24 | ⛔ **OVER** (was ok) |" in markdown
    assert "⛔ **1 capacity check(s) over**" in markdown

    # One implementation: the same claims, hence the same teams, in the loader's refusal.
    diff_claims = claim_texts([c.name for c in diff.capacity.over], r"^\w[\w ]* of (.+) ≤ ")
    loader_claims = claim_texts(loader, r"exceed [\w ]*capacity: (.+?) = \d+ GPUs")
    assert diff_claims == loader_claims == ["t1 (9) + t2 (9) + t3 (9)"]
    assert teams_in([c.name for c in diff.capacity.over]) == teams_in(loader) == {"t1", "t2", "t3"}


def old_capacity(doc: dict[str, Any]) -> dict[str, Any]:
    """The plan as trainstack wrote it before firm and elastic capacity: per capacity type
    totals, no pools, groups or dimensions (a pull request's base plan, once)."""
    old = copy.deepcopy(doc)
    scheduling = old["outputs"]["scheduling"]
    cap = scheduling["capacity"]
    scheduling["capacity"] = {
        "reserved": 96,
        "onDemand": 32,
        "spot": 0,
        "existing": 0,
        "total": cap["total"],
        "guaranteed": cap["guaranteed"],
        "deserved": cap["deserved"],
    }
    return old


def test_plans_from_before_firm_capacity_still_diff(example_plans: dict[str, Plan]) -> None:
    prod = as_doc(example_plans["prod"])
    diff = diff_plans(old_capacity(prod), prod)
    # The old base is read with the old rule (every GPU firm but spot's): 132 firm, and no
    # group queues, so no headroom; both sums held.
    assert {c.name: (c.need, c.available, c.ok, c.was_ok) for c in diff.capacity.checks} == {
        GUARANTEES: (48, 56, True, True),
        DESERVED: (128, 132, True, True),
    }
    totals = {t.field: (t.before, t.after) for t in diff.capacity.totals if t.before != t.after}
    assert totals["firm"][1] == 56
    assert totals["reserved"][0] == 96
    assert not [p for p in diff.capacity.pools if p.status != "changed"]
    assert {c.field for p in diff.capacity.pools for c in p.changes} == {"firm GPUs"}


def test_flat_mode_checks_guarantees_only(example_plans: dict[str, Plan]) -> None:
    """The proportion plugin (flat) derives fair shares from weights: no deserved check."""
    prod = as_doc(example_plans["prod"])
    flat = copy.deepcopy(prod)
    flat["outputs"]["scheduling"]["queueMode"] = "flat"
    names = [c.name for c in diff_plans(prod, flat).capacity.checks]
    assert names == [GUARANTEES]


def test_checks_from_outputs_alone() -> None:
    """Group headroom is a claim on its teams' pools; a shortfall in base and head was not
    ok; without a base, nothing is known of before."""
    assert plan_inputs({"outputs": {}}, {}, {}) is None  # no teams, no pools: nothing to check
    teams = {
        "a": {
            "group": "g",
            "scheduling": {"pools": ["p"], "gpus": {"guarantee": 8, "deserved": 8}},
        },
        "b": {"scheduling": {"pools": ["q"], "gpus": {"guarantee": 4, "deserved": 4}}},
    }
    capacity = {
        "pools": {"p": {"firm": 4, "elastic": 4}, "q": {"firm": 8, "elastic": 0}},
        "groups": {"g": {"guarantee": 10, "deserved": 10}},
    }
    plan = {"outputs": {"scheduling": {"queueMode": "hierarchical", "capacity": capacity}}}
    inputs = plan_inputs(plan, teams, {})
    assert inputs is not None
    checks = capacity_checks(inputs, inputs)
    assert [(c.name, c.need, c.available, c.ok, c.was_ok) for c in checks] == [
        (GUARANTEES, 14, 12, False, False),
        ("guarantees of a (8) + group g headroom (2) ≤ firm capacity of p", 10, 4, False, False),
        (DESERVED, 14, 16, True, True),
        ("deserved shares of a (8) + group g headroom (2) ≤ total capacity of p", 10, 8, False,
         False),
    ]  # fmt: skip
    assert capacity_checks(None, inputs)[1].was_ok is None
