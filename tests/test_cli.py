"""The command line as a user meets it (issue 20): version, help, where output goes, stack and
file arguments, and one error per problem."""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from tests.conftest import ROOT
from tests.diff.test_changed import git
from trainstack import cli, yamlio
from trainstack.cli import app, short_type, stack_names, summary_table
from trainstack.config import ConfigError
from trainstack.config.project import Project
from trainstack.diff.changed import ref_problem
from trainstack.preview.plan import Plan, Resource

runner = CliRunner()
COMMANDS = ["preview", "validate", "render-job", "policy-config", "diff", "changed-stacks"]


def run(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert isinstance(result.exception, SystemExit | None), result.output
    return result


def project(tmp_path: Path) -> Path:
    """The real program with every example stack and the job specs."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "stacks", root / "stacks")
    shutil.copytree(ROOT / "job_specs", root / "job_specs")
    return root


def test_version_comes_from_the_package_metadata() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert result.output == f"trainstack {version('trainstack')}\n"


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["main", *COMMANDS])
def test_help_shows_no_type_for_flags(command: list[str]) -> None:
    result = run(*command, "--help")
    assert result.exit_code == 0
    assert "--help" in result.output
    assert "<bool>" not in result.output


def test_main_help_lists_the_exit_codes_the_commands_return() -> None:
    text = " ".join(run("--help").output.split())
    assert (
        "Exit codes: 0 success; 1 a config or input error (each problem once, with its file and "
        "field, no traceback); 2 bad command-line usage (an unknown option, a stack name with no "
        "stack file); 3 mandatory policy violations in a preview (the plan is still written)."
    ) in text
    assert (cli.EXIT_OK, cli.EXIT_USER_ERROR, cli.EXIT_POLICY_VIOLATION) == (0, 1, 3)
    assert run("preview", "--no-such-option").exit_code == cli.EXIT_USAGE == 2
    # A stack name that names no stack file is bad usage too (issue 41 #6: it exited 1).
    assert run("preview", "nosuchstack", "--project-dir", str(ROOT)).exit_code == cli.EXIT_USAGE


def test_docstring_paragraphs_are_wrapped_not_broken_at_source_lines() -> None:
    result = runner.invoke(app, ["policy-config", "--help"], env={"COLUMNS": "200"})
    assert "--policy-pack-config, from the stack files (a team stack's" in result.output


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_describes_every_target() -> None:
    listed = subprocess.run(
        ["make", "--no-print-directory", "-s", "help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert listed[0].startswith("usage: make TARGET")
    described = {line.split()[0]: line.split(None, 1)[1] for line in listed[1:]}
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*?)(?<!\\)\n", makefile, re.S | re.M)
    assert phony is not None
    assert set(described) == set(phony[1].replace("\\", " ").split())
    assert "rewrite tests/goldens/" in described["goldens"]


def test_preview_from_a_subfolder_writes_under_the_project_and_prints_the_real_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path)
    monkeypatch.chdir(root / "stacks")
    # The summary at 80 columns (rich reads COLUMNS once, when the console is made).
    monkeypatch.setattr(cli, "console", Console(width=80, highlight=False, markup=False))
    result = run("preview", "Pulumi.dev.yaml")  # a stack file where a name is expected
    assert result.exit_code == 0, result.output
    out = root / "build" / "dev"
    assert (out / "plan.json").is_file()
    assert not (root / "stacks" / "build").exists()
    assert f"outputs -> {out} (" in result.output  # absolute: the folder is not below here
    table = result.output[: result.output.index(" resources, ")]
    assert max(len(line) for line in table.splitlines()) <= 80
    assert re.search(r"│ EksCluster trainstack-dev-cluster\s+│\s+\d+ │", table)
    assert re.search(r"│   aws:eks:Cluster\s+│\s+1 │", table)


def _plan(*types: str) -> Plan:
    component = Resource("trainstack:aws:EksCluster", "trainstack-x-cluster", "", "", False, {}, ())
    return Plan(
        "x",
        "platform",
        (
            component,
            *(Resource(t, f"r{i}", component.ref, "", True, {}, ()) for i, t in enumerate(types)),
        ),
        {},
    )


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (200, r"│ trainstack:aws:EksCluster::trainstack-x-cluster │ aws:eks/cluster:Cluster\s+│"),
        (80, r"│   aws:eks:Cluster\s+│\s+1 │"),
    ],
    ids=["wide", "compact"],
)
def test_summary_table_is_compact_when_the_terminal_is_narrow(width: int, expected: str) -> None:
    plan = _plan(
        "aws:eks/cluster:Cluster", "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    )
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(summary_table(plan, width))
    text = console.export_text()
    assert re.search(expected, text), text
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize(
    ("rtype", "short"),
    [
        ("aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2:LaunchTemplate"),
        ("kubernetes:core/v1:ConfigMap", "kubernetes:core/v1:ConfigMap"),
        ("pulumi:providers:kubernetes", "pulumi:providers:kubernetes"),
    ],
)
def test_short_type_drops_only_a_module_part_that_repeats_the_type(rtype: str, short: str) -> None:
    assert short_type(rtype) == short


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["dev", "stacks/Pulumi.prod.yaml", "dev"], ["dev", "prod"]),
        ([str(ROOT / "stacks" / "Pulumi.vision.yaml")], ["vision"]),
        (["prdo"], "prdo: no stack file for 'prdo' (did you mean 'prod'?); stacks: dev, onprem"),
        (["stacks/Pulumi.prdo.yaml"], "stacks/Pulumi.prdo.yaml: no such file"),
        (["job_specs/vision/demo-train.yaml"], "not a stack file: stack files are named Pulumi."),
        (["tests/goldens/../../Pulumi.yaml"], "not a stack file"),
    ],
    ids=["names-and-paths", "absolute-path", "did-you-mean", "missing-file", "a-job", "other"],
)
def test_stack_arguments_are_names_or_stack_files(
    given: list[str], expected: list[str] | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    if isinstance(expected, list):
        assert stack_names(Project.find(ROOT), given) == expected
        return
    with pytest.raises(ConfigError) as caught:
        stack_names(Project.find(ROOT), given)
    assert expected in str(caught.value)


def test_a_stack_file_outside_the_stack_folder_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "Pulumi.dev.yaml"
    shutil.copy(ROOT / "stacks" / "Pulumi.dev.yaml", copy)
    with pytest.raises(ConfigError, match="not in this project's stack folder"):
        stack_names(Project.find(ROOT), [str(copy)])


def test_preview_checks_every_name_before_previewing_any(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run("preview", "dev", "prdo", "visoin", "--project-dir", str(ROOT), "--out", str(out))
    assert result.exit_code == 2  # usage (issue 41 #6: it was 1, a config error)
    assert result.output.startswith("error: stack arguments: 2 config errors:\n")
    assert "  - prdo: no stack file for 'prdo' (did you mean 'prod'?)" in result.output
    assert "  - visoin: no stack file for 'visoin' (did you mean 'vision'?)" in result.output
    assert not out.exists()  # dev was not previewed


def test_validate_takes_a_folder_for_its_yaml_files(tmp_path: Path) -> None:
    result = run("validate", str(ROOT / "job_specs" / "vision"))
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (ROOT / "job_specs" / "vision").glob("*.yaml"))
    assert [line.split(": ok (")[0].rsplit("/", 1)[-1] for line in result.output.splitlines()] == (
        names
    )
    empty = run("validate", str(tmp_path))
    assert empty.exit_code == 1
    assert f"{tmp_path}: 1 config error:\n  - folder: holds no *.yaml file" in empty.output


def test_a_job_that_cannot_preempt_is_valid_but_warned_about(tmp_path: Path) -> None:
    """issue 39 #4: Volcano skips preemptors with a network topology (v1.15.1
    actions/preempt/preempt.go Execute, `job.ContainsNetworkTopology()`), so `priority: high`
    with `topology` would wait where its author expects it to evict. Valid, with a warning on
    stderr, from validate (with and without --stack) and render-job; stdout stays the result."""
    root = project(tmp_path)
    spec = root / "job_specs" / "vision" / "embeddings-ps.yaml"
    quiet = run("validate", str(spec))
    assert quiet.exit_code == 0, quiet.output
    assert "warning" not in quiet.output
    spec.write_text(spec.read_text() + "  priority: high\n")
    for args in (
        ["validate", str(spec)],
        ["validate", "--stack", "vision", str(spec), "--project-dir", str(root)],
        ["render-job", str(spec), "--stack", "vision", "--project-dir", str(root)],
    ):
        result = run(*args)
        assert result.exit_code == 0, result.output
        assert f"{spec}: warning: spec.priority: 'high' with spec.topology: Volcano never " in (
            result.stderr
        ), args
        assert "warning" not in result.stdout, args
    soft = spec.read_text().replace("mode: hard", "mode: soft").replace("high", "normal")
    spec.write_text(soft)
    assert "warning" not in run("validate", str(spec)).output  # normal: not warned, documented


@pytest.mark.parametrize(
    ("stack", "message", "code"),
    [
        ("prod", "'prod' is a platform stack; name a team stack", 1),
        ("visoin", "no stack file for 'visoin' (did you mean 'vision'?)", 2),  # usage
    ],
)
def test_a_stack_problem_is_reported_once_not_once_per_file(
    stack: str, message: str, code: int
) -> None:
    result = run("validate", "--stack", stack, str(ROOT / "job_specs" / "vision"), "--project-dir",
                 str(ROOT))  # fmt: skip
    assert result.exit_code == code
    assert result.output.count(message) == 1, result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [1, 2\n", "2:1: not valid YAML: did not find expected ',' or ']' (while parsing a "
         "flow sequence, line 1)"),
        ("a: 1\n---\nb: 2\n", "2:1: not valid YAML: found another document (expected a single "
         "document in the stream, line 1)"),
        ("? [a]\n: b\n", "1:3: key is a list, not text; quote it if it is meant as a name"),
        ("1: b\n", "1:1: key '1' reads as a number, not text; quote it if it is meant as a name"),
    ],
    ids=["unclosed-list", "two-documents", "list-key", "number-key"],
)  # fmt: skip
def test_yaml_errors_are_one_line_naming_file_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(yamlio.YamlSyntaxError) as caught:
        yamlio.read(path)
    assert str(caught.value) == f"{path}:{message}"
    result = run("validate", str(path))
    assert result.output == f"{path}:{message}\n"


@pytest.mark.parametrize(
    ("remote", "ref", "message"),
    [
        (True, "origin/mian", "(did you mean 'origin/main'?); to fetch it: git fetch origin mian"),
        (True, "origin/feature-x", "; to fetch it: git fetch origin feature-x"),
        (True, "v2", "; to fetch it: git fetch origin v2"),
        (True, "mian", "(did you mean 'main'?)"),
        (True, "HEAD~40", "if this clone is shallow, fetch the older commits: git fetch "
         "--unshallow"),
        (False, "no-such-ref", "this repository has no remote to fetch it from; pass a branch, tag "
         "or commit SHA"),
    ],
)  # fmt: skip
def test_a_wrong_ref_gets_a_valid_suggestion(
    tmp_path: Path, remote: bool, ref: str, message: str
) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: trainstack\n")
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "one")
    if remote:
        git(tmp_path, "remote", "add", "origin", "https://example.com/repo.git")
        git(tmp_path, "update-ref", "refs/remotes/origin/main", "HEAD")
    problem = ref_problem(Project.find(tmp_path), ref)
    assert problem.startswith(f"{ref!r} is not a commit in this repository")
    assert message in problem
    result = run("changed-stacks", ref, "--project-dir", str(tmp_path))
    assert result.exit_code == 1
    assert message in " ".join(result.output.split())
