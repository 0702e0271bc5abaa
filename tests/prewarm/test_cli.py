"""The CLI contract: exit codes, JSON logs, the verify gate and the two-phase pattern."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from trainstack_prewarm.cli import main
from trainstack_prewarm.errors import ExitCode

from tests.prewarm.conftest import (
    FakeTime,
    LogCapture,
    S3Server,
    make_files,
    read_tree,
    upload,
    write_tree,
)

REPO = Path(__file__).resolve().parents[2]
PREFIX = "datasets/tok/v2"


def _target(cache: Path) -> list[str]:
    return ["--cache", str(cache), "--dataset", "tok", "--version", "v2"]


def _fetch_args(s3_server: S3Server, bucket: str, cache: Path) -> list[str]:
    return [
        "fetch",
        "--source",
        f"s3://{bucket}/{PREFIX}/",
        *_target(cache),
        "--endpoint-url",
        s3_server.endpoint,
        "--region",
        "us-east-1",
        "--concurrency",
        "3",
        "--max-attempts",
        "2",
        "--base-backoff",
        "0",
        "--start-jitter",
        "0",
    ]


@pytest.fixture
def filled(s3_server: S3Server, bucket: str, tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    files = make_files(5)
    upload(s3_server.client(), bucket, PREFIX, files)
    cache = tmp_path / "cache"
    assert main(_fetch_args(s3_server, bucket, cache), log=LogCapture()) == ExitCode.OK
    return cache, files


def test_fetch_then_verify_via_cli_logs_json_lines(
    s3_server: S3Server, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = make_files(4)
    upload(s3_server.client(), bucket, PREFIX, files)
    cache = tmp_path / "cache"

    assert main(_fetch_args(s3_server, bucket, cache)) == 0
    assert main(["verify", *_target(cache)]) == 0

    out, err = capsys.readouterr()
    assert out == ""
    records = [json.loads(line) for line in err.splitlines()]
    events = [r["event"] for r in records]
    assert events[0] == "start"
    assert events[-2:] == ["complete", "verified"]
    assert records[-1]["files"] == 4
    assert read_tree(cache / "tok" / "v2") == files


def test_verify_refuses_a_cache_without_marker(tmp_path: Path, logs: LogCapture) -> None:
    # Every file is there, but the fetch never finished: the marker is what counts.
    vdir = tmp_path / "cache/tok/v2"
    write_tree(vdir, make_files(3))
    assert main(["verify", *_target(tmp_path / "cache")], log=logs) == ExitCode.INCOMPLETE
    (err,) = logs.events("error")
    assert err["exit_code"] == 3
    assert "no .complete marker" in err["error"]


@pytest.mark.parametrize(
    ("damage", "quick_passes", "message"),
    [
        ("delete", False, "missing"),
        ("truncate", False, "size"),
        ("flip", True, "sha256 mismatch"),
        ("extra", False, "unexpected file"),
        ("garble-marker", False, "unreadable marker"),
        ("other-version-marker", False, "marker is for version"),
    ],
)
def test_verify_refuses_a_damaged_cache(
    filled: tuple[Path, dict[str, bytes]],
    logs: LogCapture,
    damage: str,
    quick_passes: bool,
    message: str,
) -> None:
    cache, files = filled
    vdir = cache / "tok" / "v2"
    victim = vdir / sorted(files)[1]
    assert main(["verify", *_target(cache)], log=logs) == ExitCode.OK
    if damage == "delete":
        victim.unlink()
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-1])
    elif damage == "flip":
        data = bytearray(victim.read_bytes())
        data[7] ^= 0x01
        victim.write_bytes(bytes(data))
    elif damage == "extra":
        (vdir / "injected.py").write_text("print('not part of the dataset')")
    elif damage == "garble-marker":
        (vdir / ".complete").write_text('{"format": 1, "files": [')
    else:
        marker = json.loads((vdir / ".complete").read_text())
        marker["version"] = "v1"
        (vdir / ".complete").write_text(json.dumps(marker))

    # --deep re-hashes; the default trusts the marker and checks sizes (issue 24 #7).
    assert main(["verify", "--deep", *_target(cache)], log=logs) == ExitCode.INCOMPLETE
    assert message in logs.events("error")[-1]["error"]
    default = main(["verify", *_target(cache)], log=logs)
    assert default == (ExitCode.OK if quick_passes else ExitCode.INCOMPLETE)
    quick = main(["verify", "--dir", str(vdir), "--quick"], log=logs)
    if damage == "other-version-marker":
        quick_passes = True  # --dir names no version, so there is nothing to compare with
    assert quick == (ExitCode.OK if quick_passes else ExitCode.INCOMPLETE)


def test_usage_errors_exit_2(tmp_path: Path, logs: LogCapture) -> None:
    assert (
        main(
            ["verify", "--cache", str(tmp_path), "--dataset", "../etc", "--version", "v"], log=logs
        )
        == ExitCode.USAGE
    )
    assert main(["verify", "--dir", str(tmp_path), "--dataset", "x"], log=logs) == ExitCode.USAGE
    assert (
        main(
            [
                "fetch",
                "--source",
                "gs://b/p",
                "--dataset",
                "d",
                "--version",
                "v",
                "--cache",
                str(tmp_path),
            ],
            log=logs,
        )
        == ExitCode.USAGE
    )
    with pytest.raises(SystemExit) as info:
        main(["fetch", "--source", "/x", "--dataset", "d", "--version", "v", "--concurrency", "0"])
    assert info.value.code == ExitCode.USAGE


def test_wait_times_out_then_succeeds_once_the_cache_is_complete(
    s3_server: S3Server, bucket: str, tmp_path: Path, fake_time: FakeTime, logs: LogCapture
) -> None:
    upload(s3_server.client(), bucket, PREFIX, make_files(3))
    cache = tmp_path / "cache"
    args = ["wait", *_target(cache), "--timeout", "30", "--interval", "10"]

    rc = main(args, log=logs, sleep=fake_time.sleep, clock=fake_time.clock)
    assert rc == ExitCode.INCOMPLETE
    assert fake_time.sleeps == [10, 10, 10]

    polls: list[float] = []

    def fetch_meanwhile(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 2:  # the init container finishes during the second poll
            assert main(_fetch_args(s3_server, bucket, cache), log=LogCapture()) == 0

    assert main(args, log=logs, sleep=fetch_meanwhile, clock=fake_time.clock) == ExitCode.OK
    assert len(polls) == 2
    assert logs.events("verified")[-1]["files"] == 3


def _docs_exit_codes() -> dict[int, str]:
    text = (REPO / "docs" / "prewarm.md").read_text()
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"(?m)^\| (\d) \| (\w+) \|", text)}


def test_documented_exit_codes_match_the_code() -> None:
    assert _docs_exit_codes() == {int(c): c.name for c in ExitCode}


def test_two_phase_training_starts_only_on_a_complete_cache(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    """Real processes: the init phase, then the main container's `verify && train` gate."""
    cache = tmp_path / "cache"
    started = tmp_path / "training-started"
    prewarm = [sys.executable, "-m", "trainstack_prewarm"]
    train = f"{shlex.join([*prewarm, 'verify', *_target(cache)])} && touch {started}"
    env = s3_server.env()

    def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)

    # Phase 1 fails (the dataset was never published): exit 4, and phase 2 refuses to train.
    init = run([*prewarm, *_fetch_args(s3_server, bucket, cache)])
    assert init.returncode == ExitCode.SOURCE, init.stderr
    assert json.loads(init.stderr.splitlines()[-1])["kind"] == "SourceError"
    gate = run(["sh", "-c", train])
    assert gate.returncode == ExitCode.INCOMPLETE
    assert not started.exists()

    upload(s3_server.client(), bucket, PREFIX, make_files(3))
    init = run([*prewarm, *_fetch_args(s3_server, bucket, cache)])
    assert init.returncode == ExitCode.OK, init.stderr
    assert run(["sh", "-c", train]).returncode == 0
    assert started.exists()
