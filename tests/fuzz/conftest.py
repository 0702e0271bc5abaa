"""Session fixtures of the mutation fuzzer: the CLI, a scratch project, the original plans."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.harness import Cli, Project, Scratch
from tests.fuzz.mutate import load, load_sources

ROOT = Path(__file__).resolve().parents[2]
SOURCES = load_sources(ROOT)
PREVIEW_LIMIT_S = 120.0


@dataclass(frozen=True)
class Baseline:
    """The project as it is: each stack's plan, each example's document."""

    plans: dict[str, dict[str, Any]]
    documents: dict[str, Any]
    out: Path

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        del cycle
        printer.text(f"Baseline(plans of {sorted(self.plans)})")


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli()


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    return Project.copy(tmp_path_factory.mktemp("fuzz-project"))


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Scratch:
    return Scratch(tmp_path_factory.mktemp("fuzz-mutants"))


@pytest.fixture(scope="session")
def baseline(cli: Cli, project: Project, tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """Every example stack previewed once, unmutated: the plans mutants are compared with."""
    out = tmp_path_factory.mktemp("fuzz-plans")
    plans: dict[str, dict[str, Any]] = {}
    for stack in sorted({s.stack for s in SOURCES if s.kind == "stack"}):
        outcome = cli.run(
            ["preview", stack, "--out", str(out), "--project-dir", str(project.root)],
            PREVIEW_LIMIT_S,
        )
        assert outcome.exit_code == 0, outcome.output
        assert outcome.exception is None, outcome.output
        plans[stack] = json.loads((out / stack / "plan.json").read_text(encoding="utf-8"))
    documents = {s.rel: load(s.text) for s in SOURCES}
    return Baseline(plans, documents, out)
