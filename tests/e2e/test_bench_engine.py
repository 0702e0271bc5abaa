"""`tests/e2e/bench_engine.py` at its smallest, so that `make e2e` keeps the benchmark working:
one team with one job, one repeat of the real `pulumi preview` of both stacks and of one
`trainstack preview` of both. Only that each side ran and previewed what it should is
asserted; the timings are the benchmark's to report, not a test's to judge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.bench_engine import bench_job_spec, measure_engine
from tests.e2e.test_pulumi_stacks import PLATFORM, TEAM
from trainstack.sandbox.cluster import ControlPlane

KEYS = {
    "engine_preview_s",
    "engine_preview_spread",
    "offline_preview_s",
    "offline_preview_spread",
    "offline_speedup",
    "offline_speedup_spread",
    "engine_stacks",
    "engine_teams",
    "engine_jobs",
    "engine_resources",
    "engine_changes",
}


def test_engine_and_offline_previews_of_the_same_stacks(
    control_plane: ControlPlane, tools: dict[str, Path], tmp_path: Path, record_property: Any
) -> None:
    result = measure_engine(control_plane, tools, tmp_path, teams=1, jobs_per_team=1, repeats=1)
    record_property("bench_engine", result)
    assert result.keys() >= KEYS, sorted(KEYS - result.keys())
    for key in ("engine_preview_s", "offline_preview_s"):
        seconds = result[key]
        assert isinstance(seconds, float), key
        assert seconds > 0, key
    assert (result["engine_stacks"], result["engine_teams"], result["engine_jobs"]) == (2, 1, 1)

    # The engine previewed both stacks: the deployed platform with nothing to create, the
    # team stack with its objects to create, the job among them (the CLI's own lines).
    changes = result["engine_changes"]
    assert isinstance(changes, dict)
    assert set(changes) == {PLATFORM, TEAM}, changes
    assert not changes[PLATFORM].get("create"), changes
    assert changes[TEAM].get("create"), changes
    logs = result["engine_logs"]
    assert isinstance(logs, dict)
    job = bench_job_spec(TEAM, 1)["metadata"]["name"]
    created = [
        line
        for line in Path(logs[TEAM]).read_text().splitlines()
        if "kubernetes:batch.volcano.sh/v1alpha1:Job" in line and job in line
    ]
    assert any("create" in line for line in created), Path(logs[TEAM]).read_text()[-4000:]

    # The offline side wrote a plan of each stack, and they hold resources.
    for stack in (PLATFORM, TEAM):
        assert (tmp_path / "project" / "build" / stack / "plan.json").is_file(), stack
    by_stack = result["engine_resources_by_stack"]
    assert isinstance(by_stack, dict)
    assert all(n > 0 for n in by_stack.values()), by_stack
    assert result["engine_resources"] == sum(by_stack.values())
