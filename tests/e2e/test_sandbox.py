"""The README's "Try it on a local cluster" steps, run as they are written (issue 45 #3).

The block after the `try-it` marker in README.md runs in one bash with `set -euo pipefail`,
from the repository root, so a step the README shows that no longer works fails here. The
sandbox is the e2e suite's own control plane code (trainstack/sandbox/: `ControlPlane`,
`deploy_platform`), started detached by `trainstack sandbox up` as a user starts it; this test
gives it a folder of its own (TRAINSTACK_SANDBOX_DIR), so it never meets a sandbox the person
running the tests has up. It costs one more control plane start (about half a minute) because
starting one is exactly what it proves.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainstack.sandbox import local

MARKER = "<!-- try-it:"


def try_it_block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index(MARKER) :]
    block = re.search(r"```sh\n(.*?)```", after, re.S)
    assert block, "README.md: no ```sh block after the try-it marker"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_try_it_steps_run(
    tools: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    del tools  # built: the sandbox must not start a 30-minute build inside the suite
    folder = tmp_path / "sandbox"
    env = dict(os.environ, TRAINSTACK_SANDBOX_DIR=str(folder))
    env.pop("KUBECONFIG", None)
    lines = [line for line in try_it_block() if not line.lstrip().startswith("#")]
    script = "set -euo pipefail\n" + "\n".join(
        # Each step's output framed, so a failure says which step printed what.
        f"echo '>>> {line.split('#')[0].strip()}'\n{line}"
        for line in lines
    )
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        monkeypatch.setenv("TRAINSTACK_SANDBOX_DIR", str(folder))
        left = local.State.read(folder)
        if left is not None:  # a failed step: stop what it left running
            local.down(print)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    steps: dict[str, str] = {}  # each step's command -> what it printed
    for chunk in done.stdout.split(">>> ")[1:]:
        step, _, printed = chunk.partition("\n")
        steps[step] = printed
    assert any("sandbox down" in step for step in steps), output
    status = next(out for step, out in steps.items() if "trainstack status" in step)
    for job in ("demo-train", "elastic-pretrain", "embeddings-ps", "fsdp-multinode"):
        assert job in status, status
    explain = next(out for step, out in steps.items() if "trainstack explain" in step)
    assert EXPECTED_REASON in explain, explain
    assert not folder.exists(), "sandbox down leaves nothing behind"


# The four jobs of the vision stack hold 58 of the queue's 64 GPUs (status shows them): a
# second 32-GPU gang waits on the queue's capability, which explain says with the numbers.
EXPECTED_REASON = "queue vision is at its capability"
