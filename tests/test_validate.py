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
    lines = result.output.splitlines()
    assert f"{stacks}/Pulumi.prod.yaml: ok (platform stack prod, previewed: " in lines[0]
    assert f"{stacks}/Pulumi.vision.yaml: ok (team stack vision, previewed: " in lines[1]
    assert f"{jobs}/demo-train.yaml: ok (job demo-train, fits stack vision)" in lines


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
