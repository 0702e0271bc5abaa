"""Line numbers for issues (issue 41 #4): the line a JSON path points at in its YAML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainstack.config.errors import ConfigError, ConfigIssue
from trainstack.config.lines import line_of, parts, with_lines

STACK = """\
config:
  trainstack:platform:
    registry:
      teams:
        - name: vision
          quota: {gpus: 8}
        - name: nlp
          quota:
            gpus: eight
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("job.spec.workers.cpu", ("spec", "workers", "cpu")),
        ("job", ()),
        ("trainstack:platform.registry.teams[1].quota", ("config", "trainstack:platform",
                                                          "registry", "teams", 1, "quota")),
        ("trainstack:team", ("config", "trainstack:team")),
        ("stack", None),
        ("file", None),
    ],
)  # fmt: skip
def test_paths_become_keys(path: str, expected: tuple[str | int, ...] | None) -> None:
    assert parts(path) == expected


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("trainstack:platform.registry.teams[1].quota.gpus", 9),  # a key of its own
        ("trainstack:platform.registry.teams[0].quota.gpus", 6),  # inside a flow map
        ("trainstack:platform.registry.teams[1]", 7),  # a list item: its first line
        ("trainstack:platform.registry.teams[1].owners", 7),  # missing: the map it belongs in
        ("trainstack:platform.clusterName", 2),
        ("trainstack:team.team", 1),  # nothing of it in the file: where it belongs
    ],
)
def test_a_path_points_at_its_line(tmp_path: Path, path: str, line: int | None) -> None:
    stack = tmp_path / "Pulumi.x.yaml"
    stack.write_text(STACK)
    assert line_of(stack, path) == line


def test_issues_of_another_file_are_looked_up_there(tmp_path: Path) -> None:
    """A team stack's preview reports its jobs' errors under the stack, each issue naming
    the spec relative to the project."""
    spec = tmp_path / "job_specs" / "vision" / "a.yaml"
    spec.parent.mkdir(parents=True)
    spec.write_text("kind: TrainingJob\nspec:\n  workers:\n    gpus: 3\n")
    err = ConfigError(
        "stack vision",
        [ConfigIssue("job_specs/vision/a.yaml: job.spec.workers.gpus", "does not divide")],
    )
    assert with_lines(err, tmp_path) == (
        "stack vision: 1 config error:\n"
        "  - line 4: job_specs/vision/a.yaml: job.spec.workers.gpus: does not divide"
    )
