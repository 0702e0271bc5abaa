"""Golden plans for the example stacks. `make goldens` rewrites them after a deliberate change.

A diff here is a review item: it is exactly what a pull request changes in what gets
deployed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_STACKS
from trainstack.preview.plan import Plan

GOLDENS = Path(__file__).parent / "goldens"
UPDATE = os.environ.get("TRAINSTACK_UPDATE_GOLDENS") == "1"


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_plan_matches_golden(stack: str, example_plans: dict[str, Plan]) -> None:
    text = json.dumps(example_plans[stack].to_json(), indent=2, sort_keys=True) + "\n"
    golden = GOLDENS / f"{stack}.plan.json"
    if UPDATE:
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"no golden for {stack}; run `make goldens`"
    assert golden.read_text(encoding="utf-8") == text, (
        f"plan of {stack!r} changed; review the diff and run `make goldens` if intended"
    )


def test_no_stale_goldens() -> None:
    stale = {p.name.removesuffix(".plan.json") for p in GOLDENS.glob("*.plan.json")}
    assert stale <= set(EXAMPLE_STACKS), f"goldens without a stack: {stale - set(EXAMPLE_STACKS)}"
