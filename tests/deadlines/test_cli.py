"""`trainstack-deadlines` on bad input: usage errors exit 2, setup errors exit 1 with a line
that says what to fix; nothing is raised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainstack_deadlines.cli import main
from trainstack_deadlines.errors import ExitCode


@pytest.mark.parametrize(
    "argv",
    [
        ["--interval", "0"],
        ["--interval", "soon"],
        ["--margin", "-1"],
        ["--state", "no-namespace"],
        ["--state", "a/b/c"],
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == ExitCode.USAGE
    assert "error: argument" in capsys.readouterr().err


def _last_event(err: str) -> dict[str, object]:
    event: dict[str, object] = json.loads(err.strip().splitlines()[-1])
    return event


def test_outside_a_pod_it_says_how_to_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["--once"]) == ExitCode.SETUP
    event = _last_event(capsys.readouterr().err)
    assert event["event"] == "setup_error"
    assert "pass --server, --token-file and --ca-file" in str(event["message"])


def test_server_needs_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--once", "--server", "https://127.0.0.1:1"]) == ExitCode.SETUP
    assert "--server needs --token-file and --ca-file" in capsys.readouterr().err


def test_missing_credential_files_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--once", "--server", "https://127.0.0.1:1", "--token-file", str(tmp_path / "t"),
            "--ca-file", str(tmp_path / "ca.crt")]  # fmt: skip
    assert main(argv) == ExitCode.SETUP
    assert f"CA bundle {tmp_path / 'ca.crt'} does not exist" in capsys.readouterr().err
