"""`make bench-preview` at toy scale: the generated org previews and the replay is faithful.

No wall-clock assertions: timings are for the benchmark's own run, not for tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.e2e import bench_preview
from trainstack.bench import preview as bench
from trainstack.bench.org import OrgSize, generate
from trainstack.config import loader
from trainstack.config.project import Project
from trainstack.jobs import spec as spec_module
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
    for plan in (prod, vision):
        result = run_mocked(
            bench.replay_program(plan),
            plan.stack,
            {},
            stack_outputs={"organization/trainstack/prod": prod.as_referenced()},
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
        # And the stack's outputs, secret ones secret.
        assert Plan.from_synth(result, plan.kind).outputs == plan.outputs
        assert result.secret_outputs == {k for k, v in plan.outputs.items() if v == "[secret]"}
    # ... declared as a program declares them: a component for all it holds.
    declared = bench.declared_dependencies(prod.resources)
    assert sum(map(len, declared.values())) < sum(len(r.dependencies) for r in prod.resources)


def test_bench_prints_one_json_line_last(capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark's tiny variant: every part of `make bench-preview`'s offline run."""
    argv = ["--teams", "2", "--jobs", "4", "--factor", "2", "--repeats", "2"]
    assert bench.main([*argv, "--repeats-large", "1"]) == 0
    printed = capsys.readouterr()
    *lines, last = printed.out.strip().splitlines()
    summary = json.loads(last)
    assert (
        "targets: preview_overhead_ratio <= 1.1, preview_overhead_ratio_2x <= 1.1, "
        "scaling_ratio_2x <= 2.2"
    ) in printed.err
    assert lines[-1].startswith(("result: pass (all 3 targets met)", "result: FAIL (")), lines
    assert f"preview_overhead_ratio <= 1.1 (measured {summary['preview_overhead_ratio']})" in (
        "\n".join(lines)
    )
    for key in ("resources", "preview_overhead_ratio", "scaling_ratio_2x", "preview_s"):
        assert key in summary
    assert summary["teams"] == 2
    assert summary["resources_2x"] > summary["resources"]
    assert summary["replay_scaling_ratio_2x"] > 0
    # Two repeats at 1x, one at 2x: the median and the spread of what was measured.
    assert summary["repeats"] == 2
    assert summary["repeats_2x"] == 1
    low, high = summary["preview_overhead_ratio_spread"]
    assert low <= summary["preview_overhead_ratio"] <= high
    assert summary["preview_overhead_ratio_2x_spread"] == [summary["preview_overhead_ratio_2x"]] * 2
    # Where the time goes: every phase of a preview measured, per repeat.
    assert "where the time goes" in printed.err


def test_each_repeat_previews_as_a_new_process_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing parsed in one repeat is reused by the next: each pays for its job specs."""
    stacks = generate(tmp_path, OrgSize(teams=2, jobs=4), program_dir=ROOT, with_jobs=True)
    parsed: list[Path] = []
    real = spec_module._parse_job

    def counting(path: Path) -> Any:
        parsed.append(path)
        return real(path)

    configs: list[str] = []
    real_config = loader._parse_stack_config

    def counting_config(values: Any, *, stack: str, source: str) -> Any:
        configs.append(stack)
        return real_config(values, stack=stack, source=source)

    monkeypatch.setattr(spec_module, "_parse_job", counting)
    monkeypatch.setattr(loader, "_parse_stack_config", counting_config)
    measured = bench.measure(tmp_path, stacks, repeats=2)
    # 4 specs, each parsed once per repeat (the program reuses the pre-check's parse).
    assert len(parsed) == 8
    assert len(set(parsed)) == 4
    # Stack configs too: each stack's once per repeat, whoever reads it.
    assert sorted(configs) == sorted(stacks * 2)
    first, _ = measured.phase_s
    assert set(first) == {"load", "jobs", "program", "plan", "policy"}
    assert all(first[phase] > 0 for phase in first)
    assert len(measured.ratios) == 2
    assert measured.stacks == 3


def test_make_bench_preview_reports_a_skipped_engine_as_a_missed_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`make bench-preview`'s own entry point (tests/e2e/bench_preview.py), offline only: the
    engine's figures are absent with the reason, and their target is not claimed."""
    argv = ["--teams", "1", "--jobs", "2", "--factor", "1", "--repeats", "1", "--no-engine"]
    assert bench_preview.main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(printed[-1])
    assert summary["engine_skipped"] == "--no-engine"
    assert "engine_preview_s" not in summary
    assert "  MISSED offline_speedup >= 2.0 (measured None)" in printed
