"""`trainstack validate` is the preview's pre-flight (issue 41 #1): what it approves, preview
approves; what preview refuses, it refuses, with the same message and the same exit code.

Before: `validate` approved a job sized to a whole p5.48xlarge, two specs with one name, a team
stack naming a missing platform stack or a team not in the registry, and a platform whose API
endpoint is open to 0.0.0.0/0 (preview then exits 3); `validate --stack` exited 1 where
preview exits 3. Each case runs on a copy of the project.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli_errors import DEMO, project, run


def _job(root: Path, text: str, name: str = "demo-train.yaml", team: str = "vision") -> Path:
    path = root / "job_specs" / team / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_everything_valid_is_ok_and_says_what_was_checked(tmp_path: Path) -> None:
    root = project(tmp_path)
    stacks, jobs = root / "stacks", root / "job_specs" / "vision"
    result = run("validate", str(stacks), str(jobs), "--project-dir", str(root))
    assert result.exit_code == 0, result.output
    # prod's pool-blind warnings (test_a_guarantee_reclaim_may_not_free_is_a_warning) aside
    lines = [line for line in result.output.splitlines() if ": warning: " not in line]
    assert f"{stacks}/Pulumi.prod.yaml: ok (platform stack prod, previewed: " in lines[0]
    assert f"{stacks}/Pulumi.vision.yaml: ok (team stack vision, previewed: " in lines[1]
    assert f"{jobs}/demo-train.yaml: ok (job demo-train, fits stack vision)" in lines


def test_a_guarantee_reclaim_may_not_free_is_a_warning(tmp_path: Path) -> None:
    """Issue 46 #5: prod's confined teams, nlp and recsys, may wait while vision holds their
    pools within its fair share (config/capacity.py pool_blind). Valid: exit 0, a warning each
    naming the stack file, the field and the fix."""
    root = project(tmp_path)
    prod = root / "stacks" / "Pulumi.prod.yaml"
    result = run("validate", str(prod), "--project-dir", str(root))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    for index, team in [(1, "nlp"), (2, "recsys")]:
        assert (
            f"{prod}: warning: trainstack:platform.registry.teams[{index}].quota.gpus: team "
            f"{team}'s guarantee of"
        ) in said
    assert said.count("lower vision's deserved to at most 16") == 2


def test_a_job_sized_to_the_catalog_not_to_allocatable_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path)
    text = DEMO.replace('    cpu: "4"\n    memory: 16Gi\n', '    cpu: "192"\n    memory: 2048Gi\n')
    assert text != DEMO
    path = _job(root, text)
    result = run("validate", str(path), "--project-dir", str(root))
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert (
        "job.spec.workers.cpu: 192 CPUs per replica, but a p5.48xlarge node gives pods at most "
        "191450m"
    ) in said
    assert "job.spec.workers.memory: 2048Gi per replica" in said
    preview = run("preview", "vision", "--project-dir", str(root), "--out", str(tmp_path / "o"))
    assert preview.exit_code == 1  # the same verdict


def test_two_specs_with_one_name_are_refused(tmp_path: Path) -> None:
    root = project(tmp_path)
    first = root / "job_specs" / "vision" / "demo-train.yaml"
    second = _job(root, DEMO, "copy.yaml")
    result = run("validate", str(first), str(second), "--project-dir", str(root))
    assert result.exit_code == 1, result.output
    assert (
        f"job.metadata.name: job 'demo-train' of team vision is also defined in {first}; one "
        "of them would replace the other: rename one"
    ) in result.output.replace("\n", " ").replace("  ", " ")


def test_a_spec_in_another_teams_folder_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path)
    path = _job(root, DEMO.replace("team: vision", "team: nlp", 1), "stray.yaml")
    result = run("validate", str(path), "--project-dir", str(root))
    assert result.exit_code == 1, result.output
    assert (
        "job.metadata.team: 'nlp', but the file is in job_specs/vision/, where team vision's "
        "specs live; move it to job_specs/nlp/ or set team: vision"
    ) in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "platformStack: organization/trainstack/prod",
            "platformStack: organization/trainstack/prd",
            "trainstack:team.platformStack: 'organization/trainstack/prd' names stack 'prd', "
            "which has no stack file here (did you mean 'prod'?)",
        ),
        (
            "team: vision",
            "team: visoin",
            "trainstack:team.team: team 'visoin' is not in the registry of platform stack "
            "'prod' (did you mean 'vision'?)",
        ),
    ],
    ids=["missing-platform-stack", "team-not-in-registry"],
)
def test_a_team_stack_is_checked_against_its_platform(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    root = project(tmp_path)
    team = root / "stacks" / "Pulumi.vision.yaml"
    _edit(team, old, new)
    result = run("validate", str(team), "--project-dir", str(root))
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split())


def test_a_policy_violation_exits_3_as_the_preview_does(tmp_path: Path) -> None:
    root = project(tmp_path)
    prod = root / "stacks" / "Pulumi.prod.yaml"
    _edit(
        prod,
        "publicAccessCidrs: [203.0.113.0/24, 198.51.100.0/24]",
        "publicAccessCidrs: [0.0.0.0/0]",
    )
    result = run("validate", str(prod), "--project-dir", str(root))
    preview = run("preview", "prod", "--project-dir", str(root), "--out", str(tmp_path / "o"))
    assert preview.exit_code == 3, preview.output
    assert result.exit_code == 3, result.output
    assert f"{prod}: mandatory policy " in result.output
    assert "0.0.0.0/0" in result.output


def test_a_spec_no_team_stack_lists_says_what_it_was_checked_against(tmp_path: Path) -> None:
    root = project(tmp_path)
    path = _job(root, DEMO.replace("team: vision", "team: nlp", 1), "solo.yaml", team="nlp")
    result = run("validate", str(path), "--project-dir", str(root))
    assert result.exit_code == 0, result.output
    assert (
        f"{path}: ok (job demo-train; no team stack lists it: schema and its own rules only "
        "(name one with --stack))"
    ) in " ".join(result.output.split())


def test_a_stale_policy_pack_config_is_named_by_validate_and_rewritten_by_preview(
    tmp_path: Path,
) -> None:
    """Issue 41 #2: after a platform edit, policies/config/prod.json kept the old settings and
    nothing said so; the real CrossGuard run then judged by them. Validate warns, naming the
    fix; preview writes it (no torch needed: `make policy-config` sets up the platform only)."""
    root = project(tmp_path)
    prod = root / "stacks" / "Pulumi.prod.yaml"
    _edit(
        prod,
        "          pools: [h200-burst]\n",
        "          pools: [h200-burst]\n          maxJobHours: 48\n",
    )
    result = run("validate", str(prod), "--project-dir", str(root))
    assert result.exit_code == 0, result.output  # the edit made it stale; preview rewrites it
    assert (
        f"{prod}: warning: policies/config/prod.json is missing or stale: the policy pack "
        "(`pulumi preview --policy-pack policies`) would judge by other settings than this "
        "stack file's; `trainstack preview prod` rewrites it (or `trainstack policy-config "
        "prod`): commit it with the stack file"
    ) in " ".join(result.output.split())
    preview = run("preview", "prod", "--project-dir", str(root), "--out", str(tmp_path / "o"))
    assert preview.exit_code == 0, preview.output
    assert "policy pack config: wrote " in preview.output
    assert (
        "is missing or stale" not in run("validate", str(prod), "--project-dir", str(root)).output
    )
    again = run("preview", "prod", "--project-dir", str(root), "--out", str(tmp_path / "o"))
    assert "policy pack config" not in again.output  # written only when it changes


@pytest.mark.parametrize(
    ("old", "new", "lines"),
    [
        pytest.param(
            "  maxDurationHours: 24\n",
            "  maxDurationHour: 24\n",
            [
                "job_specs/vision/demo-train.yaml: 1 config error:",
                "  - line 26: job.spec.maxDurationHour: unknown key (did you mean "
                "'maxDurationHours'? it is required)",
            ],
            id="typo-of-a-required-key-once",
        ),
        pytest.param(
            "    replicas: 2\n    gpus: 1\n",
            "    replicas: 4\n    gpus: 16\n",
            [
                "job_specs/vision/demo-train.yaml: 1 config error:",
                "  - line 15: job.spec.workers.gpus: pool h100-reserved: 16 GPUs per replica does "
                "not divide a 8-GPU node; use one of 1, 2, 4, 8",
            ],
            id="gpus-cause-alone",
        ),
        pytest.param(
            "  maxDurationHours: 24\n",
            "  maxDurationHours: 500\n",
            [
                "job_specs/vision/demo-train.yaml: 1 config error:",
                "  - line 26: job.spec.maxDurationHours: 500 hours exceeds team vision's maximum "
                "of 168 (maxJobHours of vision in the platform stack's registry, default 168); "
                "set at most 168, or ask the platform team to raise it",
            ],
            id="limit-and-where-it-is-set",
        ),
    ],
)
def test_errors_name_the_cause_once_with_the_limit_and_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str, lines: list[str]
) -> None:
    """Issue 41 #4: a misspelt required key was two errors, `gpus: 16` led with a derived
    capability error, a team maximum did not say where it is set, no error had a line number,
    and the preview named files by absolute path where validate used the path given."""
    root = project(tmp_path)
    path = root / "job_specs" / "vision" / "demo-train.yaml"
    _edit(path, old, new)
    monkeypatch.chdir(root)
    result = run("validate", "job_specs/vision/demo-train.yaml")
    assert result.exit_code == 1
    assert result.output.splitlines() == lines
    preview = run("preview", "vision", "--out", str(tmp_path / "o"))
    assert preview.exit_code == 1
    assert str(root) not in preview.output
    # The team stack's preview names the spec and the same line.
    assert lines[1].removeprefix("  - line ").split(": ", 1)[1] in " ".join(preview.output.split())
    assert "job_specs/vision/demo-train.yaml: " in preview.output
