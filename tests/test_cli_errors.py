"""Bad input through the command line (issue 18): no traceback, every error names its file
and field, messages print verbatim, one verdict for `validate --stack` and the preview."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.conftest import ROOT, STACKS
from trainstack.cli import app

runner = CliRunner()
DEMO = (ROOT / "job_specs" / "vision" / "demo-train.yaml").read_text()
FINITE = "is not a finite number"
EXPECTED = "a stack file (a config: map) or a job spec (kind: TrainingJob)"


def project(tmp_path: Path) -> Path:
    """The real program with the prod platform, the vision team stack, its job specs and the
    policy pack's config files."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(ROOT / name, root / name)
    (root / "stacks").mkdir()
    for stack in ("prod", "vision"):
        shutil.copy(STACKS / f"Pulumi.{stack}.yaml", root / "stacks" / f"Pulumi.{stack}.yaml")
    shutil.copytree(ROOT / "job_specs", root / "job_specs")
    (root / "policies" / "config").mkdir(parents=True)
    for stack in ("prod", "vision"):  # the CrossGuard pack's config, generated from them
        name = f"{stack}.json"
        shutil.copy(ROOT / "policies" / "config" / name, root / "policies" / "config" / name)
    return root


def run(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    # Exit codes are the CI contract; anything but SystemExit is a crash a user would see.
    assert isinstance(result.exception, SystemExit | None), result.output
    assert "Traceback" not in result.output, result.output
    return result


def spec(tmp_path: Path, old: str, new: str, name: str = "job.yaml") -> Path:
    assert old in DEMO, old
    path = tmp_path / name
    path.write_text(DEMO.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ("maxDurationHours: 24", "maxDurationHours: .nan", "maxDurationHours", f"nan {FINITE}"),
        ("intervalSeconds: 600", "intervalSeconds: .inf", "checkpoint.intervalSeconds",
         f"inf {FINITE}"),
        ("gpus: 1", "gpus: 2.0", "workers.gpus", "expected integer, got number 2.0"),
    ],
    ids=["nan-duration", "inf-interval", "float-gpus"],
)  # fmt: skip
@pytest.mark.parametrize("command", ["validate-stack", "render-job", "preview"])
def test_numbers_that_are_not_counts_are_refused_by_every_command(
    tmp_path: Path, old: str, new: str, field: str, message: str, command: str
) -> None:
    root = project(tmp_path)
    bad = spec(root / "job_specs" / "vision", old, new, "demo-train.yaml")
    where = ["--project-dir", str(root)]
    result = {
        "validate-stack": lambda: run("validate", "--stack", "vision", str(bad), *where),
        "render-job": lambda: run("render-job", str(bad), "--stack", "vision", *where),
        "preview": lambda: run("preview", "vision", "--out", str(tmp_path / "o"), *where),
    }[command]()
    assert result.exit_code == 1, result.output
    assert f"job.spec.{field}: {message}" in result.output
    assert "demo-train.yaml" in result.output  # the file
    assert "also defined" not in result.output


def test_a_non_finite_platform_setting_is_refused_by_the_preview(tmp_path: Path) -> None:
    root = project(tmp_path)
    prod = root / "stacks" / "Pulumi.prod.yaml"
    text = prod.read_text()
    assert "    policy:\n" in text  # prod's own policy section (its allowed registries)
    prod.write_text(
        text.replace("    policy:\n", "    policy:\n      maxCpuLimitRequestRatio: .inf\n", 1)
    )
    result = run("preview", "prod", "--project-dir", str(root), "--out", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert (
        "trainstack:platform.policy.maxCpuLimitRequestRatio: inf is not a finite number"
        in result.output
    )
    assert not (tmp_path / "o").exists()  # nothing registered, nothing written


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", f"file: is empty; expected {EXPECTED}"),
        (DEMO.replace("kind: TrainingJob", "kind: TraningJob"),
         "kind: 'TraningJob' is not a trainstack document kind; a job spec has kind: TrainingJob "
         "(did you mean 'TrainingJob'?)"),
        ("- a\n- b\n", f"file: is a YAML array, not a map; expected {EXPECTED}"),
        ("name: x\n", f"file: has neither config: nor kind: (keys: name); expected {EXPECTED}"),
    ],
    ids=["empty", "misspelled-kind", "a-list", "neither"],
)  # fmt: skip
def test_a_file_is_recognised_by_its_kind_and_says_what_was_expected(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "thing.yaml"
    path.write_text(text)
    result = run("validate", str(path))
    assert result.exit_code == 1
    assert f"{path}: 1 config error:\n  - {message}\n" in result.output


def test_yaml_errors_are_one_line_with_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("apiVersion: a\nkind: TrainingJob\n  bad: [\n")
    result = run("validate", str(path))
    assert result.exit_code == 1
    assert result.output == (
        f"{path}:3:6: not valid YAML: mapping values are not allowed in this context\n"
    )


def test_duplicate_keys_are_refused_where_yaml_would_keep_the_last(tmp_path: Path) -> None:
    path = spec(tmp_path, "  pool: h100-reserved\n", "  pool: h100-reserved\n  pool: h200-burst\n")
    result = run("validate", str(path))
    assert result.exit_code == 1
    line = DEMO.splitlines().index("  pool: h100-reserved") + 2
    assert result.output == (
        f"{path}:{line}:3: duplicate key 'pool' (first at line {line - 1}); YAML would keep "
        "only the last one: remove or rename one\n"
    )


def test_messages_print_patterns_and_values_verbatim(tmp_path: Path) -> None:
    """rich's markup took `[a-z]` for a style tag and dropped it, so the pattern shown was one
    the rejected value matches."""
    prod = (STACKS / "Pulumi.prod.yaml").read_text()
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(prod.replace("- name: vision\n", "- name: '[bold]Vision'\n", 1))
    result = run("validate", str(path))
    assert result.exit_code == 1
    assert (
        "'[bold]Vision' does not match the expected format ^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"
        in result.output
    )


def test_validate_with_a_stack_gives_the_previews_verdict(tmp_path: Path) -> None:
    """Schema, intrinsic, platform and mandatory policy findings in one report: `validate
    --stack` no longer says "fits" for a job the preview then refuses, and exits as the
    preview does: 3 for mandatory policy violations (issue 41 #1: it exited 1)."""
    root = project(tmp_path)
    bad = spec(
        root / "job_specs" / "vision",
        "    memory: 16Gi\n",
        "    memory: 16Gi\n    limits: {cpu: '16'}\n",
        "demo-train.yaml",
    )
    result = run("validate", "--stack", "vision", str(bad), "--project-dir", str(root))
    assert result.exit_code == 3, result.output
    assert (
        "policy request-limit-ratio: tasks master, worker, container trainer: cpu limit 16 is 4 x "
        "the request 4, more than the 2 x that trainstack:platform.policy.maxCpuLimitRequestRatio "
        "of platform stack prod allows: set the cpu limit at most 8" in result.output
    )
    assert "fits" not in result.output
    preview = run("preview", "vision", "--project-dir", str(root), "--out", str(tmp_path / "o"))
    assert preview.exit_code == 3
    assert "request-limit-ratio" in preview.output
    # The finding names the spec the user wrote, not only the Pulumi resource (issue 41 #4).
    column = "".join(
        cells[3].strip()
        for line in preview.output.splitlines()
        if len(cells := line.split("│")) == 6
    )
    assert "job_specs/vision/demo-train.yaml(team-vision-demo-train-volcano)" in column


def test_every_error_of_a_job_in_one_pass(tmp_path: Path) -> None:
    root = project(tmp_path)
    text = re.sub(r"image: .*", "image: registry.example.com/vision/demo:latest", DEMO)
    text = text.replace("gpus: 1", "gpus: 3")
    bad = root / "job_specs" / "vision" / "demo-train.yaml"
    bad.write_text(text.replace("maxDurationHours: 24", "maxDurationHours: 2000"))
    result = run("validate", "--stack", "vision", str(bad), "--project-dir", str(root))
    assert result.exit_code == 1
    assert "3 config errors" in result.output
    # Each with the line it points at (issue 41 #4: schema errors had none).
    for line, field in ((9, "job.spec.image"), (26, "job.spec.maxDurationHours"),
                        (15, "job.spec.workers.gpus")):  # fmt: skip
        assert f"  - line {line}: {field}: " in result.output


def test_a_missing_platform_stack_names_the_team_stack_and_its_field(tmp_path: Path) -> None:
    root = project(tmp_path)
    team = root / "stacks" / "Pulumi.vision.yaml"
    team.write_text(team.read_text().replace("/trainstack/prod", "/trainstack/prd"))
    result = run("preview", "vision", "--project-dir", str(root), "--out", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert f"{team}: 1 config error" in result.output
    assert re.search(
        r"trainstack:team\.platformStack: 'organization/trainstack/prd' names stack 'prd', which "
        r"has no stack file here \(did you mean 'prod'\?\)",
        result.output,
    )


def test_line_numbers_and_keys_are_not_read_as_emoji_codes(tmp_path: Path) -> None:
    """rich turned `:100:` (line 100) and `trainstack:tea:` into emoji."""
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text("config:\n" + "  # filler\n" * 98 + "  a: 1\n  a: 2\n")
    result = run("validate", str(path))
    assert f"{path}:101:3: duplicate key 'a' (first at line 100)" in result.output
    path.write_text("config:\n  trainstack:tea: {}\n")
    result = run("validate", str(path))
    assert (
        "  - line 2: trainstack:tea: unknown config key (did you mean 'trainstack:team'?)"
        in result.output
    )
