"""Golden plans for the example stacks. `make goldens` rewrites them after a deliberate change
and names each file it rewrote.

A diff here is a review item: it is exactly what a pull request changes in what gets
deployed.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_STACKS, REWRITTEN_GOLDENS, ROOT
from trainstack.preview.plan import Plan

GOLDENS = Path(__file__).parent / "goldens"
UPDATE = os.environ.get("TRAINSTACK_UPDATE_GOLDENS") == "1"
DIFF_LINES = 80  # a failure shows this much of the diff; `git diff` after `make goldens` all


def golden_diff(golden: Path, expected: str, actual: str, limit: int = DIFF_LINES) -> str:
    """Unified diff from the golden (expected, `-`) to the plan the code makes now (actual,
    `+`), as `git diff` would show it after `make goldens`."""
    name = golden.relative_to(ROOT) if golden.is_relative_to(ROOT) else golden
    lines = list(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"{name} (expected: the golden)",
            tofile=f"{name} (actual: the preview now)",
            n=2,
        )
    )
    more = f"... {len(lines) - limit} more diff lines\n" if len(lines) > limit else ""
    return "".join(lines[:limit]) + more


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_plan_matches_golden(
    stack: str, example_plans: dict[str, Plan], request: pytest.FixtureRequest
) -> None:
    actual = json.dumps(example_plans[stack].to_json(), indent=2, sort_keys=True) + "\n"
    golden = GOLDENS / f"{stack}.plan.json"
    expected = golden.read_text(encoding="utf-8") if golden.is_file() else None
    if UPDATE and expected != actual:
        golden.write_text(actual, encoding="utf-8")
        request.config.stash.setdefault(REWRITTEN_GOLDENS, []).append(golden.relative_to(ROOT))
        return
    if expected is None:
        pytest.fail(f"no golden for {stack}; run `make goldens`", pytrace=False)
    if expected != actual:
        pytest.fail(
            f"plan of {stack!r} changed; review the diff and run `make goldens` if intended\n"
            + golden_diff(golden, expected, actual),
            pytrace=False,
        )


def test_no_stale_goldens() -> None:
    stale = {p.name.removesuffix(".plan.json") for p in GOLDENS.glob("*.plan.json")}
    assert stale <= set(EXAMPLE_STACKS), f"goldens without a stack: {stale - set(EXAMPLE_STACKS)}"


def test_a_golden_failure_shows_expected_then_actual(tmp_path: Path) -> None:
    text = golden_diff(tmp_path / "x.plan.json", '{"count": 1}\n', '{"count": 2}\n')
    lines = text.splitlines()
    assert lines[0] == f"--- {tmp_path / 'x.plan.json'} (expected: the golden)"
    assert lines[1] == f"+++ {tmp_path / 'x.plan.json'} (actual: the preview now)"
    assert lines[3:] == ['-{"count": 1}', '+{"count": 2}']
    many = golden_diff(tmp_path / "x", "a\n" * 100, "b\n" * 100, limit=10)
    assert many.splitlines()[-1] == "... 193 more diff lines"
