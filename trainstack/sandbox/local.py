"""The local sandbox: `trainstack sandbox up [STACK]` and `trainstack sandbox down`.

`up` builds the control-plane tools on first use (from pinned Go modules, cached; it says how
long that took), starts the control plane the e2e suite uses (`cluster.ControlPlane`) with its
processes detached, deploys the platform stack and its team stacks (`stacks`), writes the
state file and prints the kubeconfig. `down` stops exactly the processes the state file names
(each checked against its command line first, so a PID reused since is never signalled) and
removes the sandbox's folder. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainstack.preview.engine import Previewer
from trainstack.sandbox import toolchain
from trainstack.sandbox.cluster import ControlPlane
from trainstack.sandbox.stacks import deploy_platform, deploy_team_stack, team_stacks

# What the control plane runs; the other components (Pulumi, actionlint, the log collector)
# serve only tests.
COMPONENTS = ("etcd", "kubernetes", "volcano", "kwok")
STATE = "sandbox.json"


class SandboxError(Exception):
    """A sandbox problem the user can act on; the message says what to do."""


def home() -> Path:
    default = Path.home() / ".cache" / "trainstack" / "sandbox"
    return Path(os.environ.get("TRAINSTACK_SANDBOX_DIR", default))


def reference_path(root: Path) -> Path:
    """The reference folder of upstream schemas and facts, never copied into the repository:
    TRAINSTACK_REFERENCE, else ../shared/reference next to the checkout `root` (the tests read
    it from here too, tests/conftest.py)."""
    default = root.resolve().parent / "shared" / "reference"
    return Path(os.environ.get("TRAINSTACK_REFERENCE", default))


def reference(root: Path) -> Path:
    """Upstream CRDs (Volcano's, prometheus-operator's), from the reference folder."""
    path = reference_path(root)
    if not (path / "volcano" / "crd-bases").is_dir():
        raise SandboxError(
            f"the upstream CRDs are not at {path} (volcano/crd-bases, prometheus-operator); "
            "set TRAINSTACK_REFERENCE to the reference folder"
        )
    return path


@dataclass(frozen=True)
class State:
    stack: str
    kubeconfig: str
    server: str
    pids: dict[str, int]
    binaries: dict[str, str]
    jobs: list[str]

    @classmethod
    def read(cls, folder: Path) -> State | None:
        try:
            data = json.loads((folder / STATE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return cls(**data)

    def write(self, folder: Path) -> None:
        (folder / STATE).write_text(json.dumps(self.__dict__, indent=2) + "\n", encoding="utf-8")


def _command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _ours(pid: int, binary: str) -> bool:
    """Whether `pid` still runs `binary` (not a PID the kernel has since given to another)."""
    line = _command_line(pid)
    return bool(line) and line[0] == binary


def running(state: State) -> dict[str, int]:
    return {name: pid for name, pid in state.pids.items() if _ours(pid, state.binaries[name])}


def ensure_tools(say: Callable[[str], None]) -> dict[str, Path]:
    """The control plane's binaries, built first when absent (minutes; said up front)."""
    missing = [toolchain.BY_NAME[n] for n in COMPONENTS if not toolchain.BY_NAME[n].built()]
    if missing:
        if shutil.which("go") is None:
            raise SandboxError(
                "the sandbox builds its tools from Go modules and `go` is not on PATH; "
                "install Go (https://go.dev/doc/install), then run this again"
            )
        if not toolchain.TOOLS.is_dir():
            raise SandboxError(
                f"the tools' Go modules ({toolchain.TOOLS}) are not here: the sandbox runs "
                "from a clone of the trainstack repository"
            )
        names = ", ".join(c.name for c in missing)
        say(
            f"first run: building {names} from pinned Go modules into {toolchain.cache_root()} "
            "(about 15 minutes on 2 cores; cached afterwards)"
        )
        began = time.monotonic()
        for component in missing:
            seconds = toolchain.build(component, say)
            say(f"  {component.name} built in {seconds:.0f} s")
        say(f"tools built in {(time.monotonic() - began) / 60:.1f} minutes")
    return toolchain.locate(*COMPONENTS)


def up(previewer: Previewer, stack: str, say: Callable[[str], None], *, jobs: bool = True) -> State:
    folder = home()
    existing = State.read(folder)
    if existing is not None and running(existing):
        raise SandboxError(
            f"a sandbox of {existing.stack} is already up (state in {folder / STATE}); "
            "`trainstack sandbox down` first"
        )
    if existing is not None:
        shutil.rmtree(folder)  # what a crashed or rebooted sandbox left: nothing runs
    root = previewer.project.root
    ref = reference(root)
    previewer.load(stack)  # a typo in STACK fails here, before minutes of building
    tools = ensure_tools(say)
    folder.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(tools, folder, ref, detach=True)
    say("starting etcd, kube-apiserver, Volcano and kwok on 127.0.0.1")
    try:
        plane.start()
        say(f"deploying platform stack {stack} and simulating its nodes")
        platform = deploy_platform(plane, previewer, stack)
        created: list[str] = []
        for team_stack in team_stacks(previewer, stack) if jobs else []:
            say(f"deploying team stack {team_stack}")
            created += deploy_team_stack(platform, previewer, team_stack)
    except BaseException:
        plane.stop()
        raise
    state = State(
        stack=stack,
        kubeconfig=str(plane.kubeconfig()),
        server=plane.server,
        pids=plane.pids(),
        binaries={name: process.argv[0] for name, process in plane.processes.items()},
        jobs=created,
    )
    state.write(folder)
    return state


def down(say: Callable[[str], None], *, timeout: float = 10) -> bool:
    """Stop the sandbox's processes and remove its folder; False when there was none."""
    folder = home()
    state = State.read(folder)
    if state is None:
        return False
    # One at a time, the reverse of the start order, as ControlPlane.stop does: clients
    # before the API server, the API server before etcd (stopped together, the API server
    # spends its grace period retrying a gone etcd).
    for name, pid in reversed(list(running(state).items())):
        binary = state.binaries[name]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _ours(pid, binary) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _ours(pid, binary):
            say(f"{name} (pid {pid}) still running {timeout:.0f} s after SIGTERM; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)
    return True


def summary(state: State) -> dict[str, Any]:
    return {"stack": state.stack, "server": state.server, "kubeconfig": state.kubeconfig}
