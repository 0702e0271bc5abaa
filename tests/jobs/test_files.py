"""Finding a team stack's job specs (trainstack/jobs/files.py): every pattern's files once, in
order, and every problem of every file at once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainstack.config import ConfigError
from trainstack.jobs.files import collect_jobs, job_files, load_jobs

DEMO = ROOT / "job_specs" / "vision" / "demo-train.yaml"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for folder, name in (("a", "x.yaml"), ("a", "y.yaml"), ("b", "z.yaml")):
        (tmp_path / folder).mkdir(exist_ok=True)
        shutil.copy(DEMO, tmp_path / folder / name)
    return tmp_path


def test_files_are_sorted_per_pattern_and_listed_once(root: Path) -> None:
    found = job_files(root, ("b/*.yaml", "a/*.yaml", "a/x.yaml"))
    assert [p.relative_to(root).as_posix() for p in found] == ["b/z.yaml", "a/x.yaml", "a/y.yaml"]


def test_every_unmatched_pattern_and_every_duplicate_name_is_reported(root: Path) -> None:
    specs, issues = collect_jobs(root, ("none/*.yaml", "a/*.yaml", "also-none/*.yaml"))
    # The two files hold the same job: both are built (their platform checks still run).
    assert [s.name for s in specs] == ["demo-train", "demo-train"]
    assert [str(i) for i in issues] == [
        "trainstack:team.jobs: 'none/*.yaml' matches no file",
        "trainstack:team.jobs: 'also-none/*.yaml' matches no file",
        "a/y.yaml: job.metadata.name: job 'demo-train' is also defined in a/x.yaml; "
        "names must be unique",
    ]


def test_load_jobs_raises_every_problem_at_once(root: Path) -> None:
    (root / "b" / "z.yaml").write_text("metadata: [\n")
    with pytest.raises(ConfigError) as raised:
        load_jobs(root, ("none/*.yaml", "b/*.yaml"), "Pulumi.team.yaml")
    # The YAML error names the file, line and column.
    assert sorted(i.path for i in raised.value.issues) == ["b/z.yaml:2:1", "trainstack:team.jobs"]
