"""`make bench-preview` at toy scale: the generated org previews and the replay is faithful.

No wall-clock assertions: timings are for the benchmark's own run, not for tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainstack.bench import preview as bench
from trainstack.bench.org import OrgSize, generate
from trainstack.config.project import Project
from trainstack.outputs import team_slices
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan
from trainstack.preview.synth import run_mocked


def test_generated_org_previews_with_jobs(tmp_path: Path) -> None:
    with_jobs = bench.jobs_available(ROOT)
    stacks = generate(tmp_path, OrgSize(teams=3, jobs=6), program_dir=ROOT, with_jobs=with_jobs)
    assert stacks == ["org", "team-0000", "team-0001", "team-0002"]
    previewer = Previewer(Project.find(tmp_path))
    platform = previewer.preview("org")
    assert len(platform.outputs["gpuPools"]) == 8
    assert sorted(team_slices(platform.outputs)) == stacks[1:]
    team = previewer.preview("team-0001")
    jobs = [r for r in team.resources if r.type == "kubernetes:batch.volcano.sh/v1alpha1:Job"]
    assert len(jobs) == (2 if with_jobs else 0)


def test_replay_registers_the_same_resources(example_plans: dict[str, Plan]) -> None:
    prod, vision = example_plans["prod"], example_plans["vision"]
    secrets = sorted(k for k, v in prod.outputs.items() if v == "[secret]")
    for plan in (prod, vision):
        result = run_mocked(
            bench.replay_program(plan),
            plan.stack,
            {},
            stack_outputs={"organization/trainstack/prod": (prod.outputs, secrets)},
        )
        replayed = Plan.from_synth(result, plan.kind)
        assert [(r.type, r.name, r.parent, r.provider) for r in replayed.resources] == [
            (r.type, r.name, r.parent, r.provider) for r in plan.resources
        ]
        assert [r.inputs for r in replayed.resources if r.custom] == [
            r.inputs for r in plan.resources if r.custom
        ]
        # The engine sees the same dependency edges (from Outputs and depends_on in the
        # program, declared explicitly in the replay).
        assert [r.dependencies for r in replayed.resources] == [
            r.dependencies for r in plan.resources
        ]
        assert sum(len(r.dependencies) for r in plan.resources) > 0


def test_bench_prints_one_json_line_last(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--teams", "2", "--jobs", "4", "--factor", "2"]) == 0
    printed = capsys.readouterr()
    *lines, last = printed.out.strip().splitlines()
    summary = json.loads(last)
    assert "targets: preview_overhead_ratio <= 1.25, scaling_ratio_2x <= 2.2" in printed.err
    assert lines[-1].startswith(("result: pass (all 2 targets met)", "result: FAIL (")), lines
    assert f"preview_overhead_ratio <= 1.25 (measured {summary['preview_overhead_ratio']})" in (
        "\n".join(lines)
    )
    for key in ("resources", "preview_overhead_ratio", "scaling_ratio_2x", "preview_s"):
        assert key in summary
    assert summary["teams"] == 2
    assert summary["resources_2x"] > summary["resources"]
