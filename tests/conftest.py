"""Shared fixtures: project paths, the upstream reference folder, and recording mocks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from trainstack.config.project import Project
from trainstack.preview.engine import Previewer
from trainstack.preview.mocks import ResourceRecord
from trainstack.preview.plan import Plan
from trainstack.preview.synth import SynthResult, run_mocked
from trainstack.sandbox.local import reference_path

# Tests never assert wall-clock times (docs/testing.md), and Hypothesis's default deadline
# (200 ms per example) is one: it failed a property test on a loaded 2-core CI machine
# (tests/runtime/test_replicated_share.py, 338 ms). Tests that set their own settings keep them.
settings.register_profile("trainstack", deadline=None)
settings.load_profile("trainstack")

ROOT = Path(__file__).resolve().parent.parent
STACKS = ROOT / "stacks"
EXAMPLE_STACKS = sorted(
    p.name[len("Pulumi.") : -len(".yaml")] for p in STACKS.glob("Pulumi.*.yaml")
)


# Goldens `make goldens` rewrote (tests/test_goldens.py), named at the end of the run.
REWRITTEN_GOLDENS = pytest.StashKey[list[Path]]()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    if os.environ.get("TRAINSTACK_UPDATE_GOLDENS") != "1":
        return
    rewritten = config.stash.get(REWRITTEN_GOLDENS, [])
    for path in rewritten:
        terminalreporter.write_line(f"rewrote {path}")
    if not rewritten:
        terminalreporter.write_line("goldens: every one already matches; nothing rewritten")


def reference_dir() -> Path:
    """Upstream schemas and facts; never copied into the repo (TRAINSTACK_REFERENCE)."""
    return reference_path(ROOT)


@pytest.fixture
def reference() -> Path:
    path = reference_dir()
    if not path.is_dir():
        pytest.skip(f"reference folder {path} is absent; set TRAINSTACK_REFERENCE to it")
    return path


SECRET_SIG = ("4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270")


def unsecret(value: Any) -> Any:
    """The plain value of a wire secret; fails if `value` is not marked secret."""
    assert isinstance(value, dict), value
    assert value.get(SECRET_SIG[0]) == SECRET_SIG[1], value
    return value["value"]


class Recorded:
    """What a program registered, with helpers to find resources and their parents."""

    def __init__(self, result: SynthResult) -> None:
        self.result = result
        self.records = result.records
        self._by_urn = {r.urn: r for r in result.records}

    def of_type(self, rtype: str) -> list[ResourceRecord]:
        return [r for r in self.records if r.type == rtype]

    def one(self, rtype: str, name: str | None = None) -> ResourceRecord:
        found = [r for r in self.of_type(rtype) if name is None or r.name == name]
        assert len(found) == 1, (
            f"expected one {rtype} {name or ''}, found {[r.name for r in found]}"
        )
        return found[0]

    def parent_of(self, record: ResourceRecord) -> ResourceRecord | None:
        return self._by_urn.get(record.parent_urn)

    def children_of(self, record: ResourceRecord) -> list[ResourceRecord]:
        return [r for r in self.records if r.parent_urn == record.urn]

    def provider_name(self, record: ResourceRecord) -> str:
        """Name of the explicit provider (`urn::id`), or '' for the default provider."""
        return record.provider.split("::")[-2] if record.provider else ""


@pytest.fixture
def run_program() -> Callable[..., Recorded]:
    """Run a callable that builds resources under the recording mocks."""

    def run(program: Callable[[], Any], stack: str = "test", **kwargs: Any) -> Recorded:
        return Recorded(run_mocked(program, stack, {}, **kwargs))

    return run


@pytest.fixture(scope="session")
def example_plans() -> dict[str, Plan]:
    """Offline previews of every example stack, computed once per test session."""
    previewer = Previewer(Project.find(ROOT))
    return {stack: previewer.preview(stack) for stack in EXAMPLE_STACKS}
