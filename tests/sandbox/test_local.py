"""The sandbox's state handling (trainstack/sandbox/local.py) without a control plane: what `down`
may signal, what `up` refuses, and the errors that say what to do. tests/e2e/test_sandbox.py runs
the README's try-it steps on the real thing."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainstack.config.project import Project
from trainstack.preview.engine import Previewer
from trainstack.sandbox import local, toolchain


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRAINSTACK_SANDBOX_DIR", str(tmp_path / "sandbox"))
    return tmp_path / "sandbox"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # Until the child has exec'd, /proc shows the parent's command line, not the sleeper's.
    deadline = time.monotonic() + 10
    while local._command_line(process.pid)[1:2] != ["-c"] and time.monotonic() < deadline:
        time.sleep(0.01)
    yield process
    process.kill()
    process.wait()


def _state(folder: Path, pids: dict[str, int], binaries: dict[str, str]) -> local.State:
    folder.mkdir(parents=True, exist_ok=True)
    state = local.State(
        "prod", str(folder / "kubeconfig"), "https://127.0.0.1:1", pids, binaries, []
    )
    state.write(folder)
    return state


def test_down_stops_the_recorded_process_and_removes_the_folder(
    folder: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    _state(folder, {"etcd": sleeper.pid}, {"etcd": sys.executable})
    assert local.down(print)
    assert sleeper.wait(10) is not None
    assert not folder.exists()


def test_down_never_signals_a_pid_that_now_runs_something_else(
    folder: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """The PID was etcd's once; the kernel has since given it to another program."""
    _state(folder, {"etcd": sleeper.pid}, {"etcd": "/somewhere/etcd"})
    assert local.down(print)
    assert sleeper.poll() is None  # still running
    assert not folder.exists()


def test_down_without_a_sandbox_says_so(folder: Path) -> None:
    assert not local.down(print)
    assert not folder.exists()


def test_up_refuses_while_one_is_running(folder: Path, sleeper: subprocess.Popen[bytes]) -> None:
    _state(folder, {"etcd": sleeper.pid}, {"etcd": sys.executable})
    with pytest.raises(local.SandboxError, match=r"already up .* `trainstack sandbox down` first"):
        local.up(Previewer(Project.find(ROOT)), "prod", print)


def test_up_names_the_reference_setting_when_the_crds_are_absent(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    del folder
    monkeypatch.setenv("TRAINSTACK_REFERENCE", str(tmp_path / "nowhere"))
    with pytest.raises(local.SandboxError, match="set TRAINSTACK_REFERENCE"):
        local.up(Previewer(Project.find(ROOT)), "prod", print)


def test_building_the_tools_without_go_says_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRAINSTACK_E2E_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(local.SandboxError, match="`go` is not on PATH; install Go"):
        local.ensure_tools(print)


def test_the_sandbox_runs_the_components_the_e2e_fixture_starts() -> None:
    """One control plane for both: the sandbox builds exactly what ControlPlane.start runs."""
    assert set(local.COMPONENTS) <= set(toolchain.BY_NAME)
    assert {"etcd", "kube-apiserver", "vc-scheduler", "kwok"} <= {
        binary for name in local.COMPONENTS for binary in toolchain.BY_NAME[name].packages
    }


def test_a_first_run_says_it_builds_and_how_long_it_took(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build itself is `make e2e-tools`'s (toolchain.build, exercised by every CI run);
    what the sandbox adds is saying so up front and timing it."""
    built: list[str] = []
    monkeypatch.setattr(toolchain.Component, "built", lambda self: self.name in built)
    monkeypatch.setattr(local.shutil, "which", lambda name: f"/usr/bin/{name}")

    def build(component: toolchain.Component, log: object) -> float:
        del log
        built.append(component.name)
        return 61.0

    monkeypatch.setattr(toolchain, "build", build)
    monkeypatch.setattr(toolchain, "locate", lambda *names: {n: Path(n) for n in names})
    said: list[str] = []
    local.ensure_tools(said.append)
    assert built == list(local.COMPONENTS)
    assert said[0].startswith("first run: building etcd, kubernetes, volcano, kwok from pinned")
    assert "(about 15 minutes on 2 cores; cached afterwards)" in said[0]
    assert said[1:5] == [f"  {name} built in 61 s" for name in local.COMPONENTS]
    assert re.fullmatch(r"tools built in \d+\.\d minutes", said[5]), said[5]
    said.clear()
    local.ensure_tools(said.append)  # cached: nothing built, nothing said
    assert said == []
