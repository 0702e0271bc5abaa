"""`trainstack-prewarm layout` (issue 37): each team's checkpoint directory, made by the
platform, never through a link a team planted.

Run for real on this machine's file system: ownership and modes need root, which the tests
have here (they skip, and say so, where they do not). The kubelet side, that a job directory
made below a root:10001 2770 team directory is the trainer's, runs the real kubelet code in
tests/e2e/test_escapes.py.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest
from trainstack_prewarm import cli
from trainstack_prewarm.errors import ExitCode, LocalCacheError, UsageError
from trainstack_prewarm.layout import Layout, apply
from trainstack_prewarm.log import JsonLog

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="ownership needs root")
GID = 10001


def layout(root: Path, *teams: str) -> Layout:
    return Layout(
        str(root),
        GID,
        0o2770,
        tuple(f"/checkpoints/{t}" for t in teams),
        ("/datasets",),
    )


def owner_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def quiet() -> JsonLog:
    return JsonLog(stream=io.StringIO())


def test_a_fresh_file_system_gets_each_teams_directory(tmp_path: Path) -> None:
    apply(layout(tmp_path, "vision", "nlp"), quiet())
    assert owner_mode(tmp_path / "checkpoints") == (0, 0, 0o755)
    for team in ("vision", "nlp"):
        assert owner_mode(tmp_path / "checkpoints" / team) == (0, GID, 0o2770)
    assert owner_mode(tmp_path / "datasets") == (0, 0, 0o755)
    apply(layout(tmp_path, "vision", "nlp"), quiet())  # idempotent
    assert owner_mode(tmp_path / "checkpoints" / "vision") == (0, GID, 0o2770)


def test_a_directory_an_earlier_version_left_is_repaired_not_emptied(tmp_path: Path) -> None:
    """Before issue 37 the kubelet and the checkpoint-dir init container made these; what a
    team wrote inside stays as it is."""
    team = tmp_path / "checkpoints" / "vision"
    (team / "job").mkdir(parents=True)
    os.chown(team, 10001, 10001)
    team.chmod(0o750)
    (team / "job" / "ckpt").write_text("weights")
    os.chown(team / "job", 10001, 10001)
    apply(layout(tmp_path, "vision"), quiet())
    assert owner_mode(team) == (0, GID, 0o2770)
    assert owner_mode(team / "job")[:2] == (10001, 10001)
    assert (team / "job" / "ckpt").read_text() == "weights"


def test_existing_datasets_are_left_to_their_owner(tmp_path: Path) -> None:
    (tmp_path / "datasets").mkdir()
    os.chown(tmp_path / "datasets", 123, 456)
    apply(layout(tmp_path, "vision"), quiet())
    assert owner_mode(tmp_path / "datasets")[:2] == (123, 456)


@pytest.mark.parametrize(
    "plant",
    [
        "team dir -> another team's",
        "team dir -> outside the file system",
        "checkpoints -> elsewhere",
        "team dir is a file",
        "datasets -> a team's directory",
    ],
)
def test_a_planted_link_is_refused_and_nothing_beyond_it_changes(
    tmp_path: Path, plant: str
) -> None:
    """Until issue 37 every team could write anywhere on the file system (a whole-file-system
    volume, and root init containers): a link where a team's directory belongs would make the
    platform's root job chown and chmod its target."""
    fs, outside = tmp_path / "fs", tmp_path / "outside"
    fs.mkdir()
    outside.mkdir()
    outside.chmod(0o700)
    other = fs / "checkpoints" / "nlp"
    other.mkdir(parents=True)
    other.chmod(0o700)
    before = {p: owner_mode(p) for p in (outside, other)}
    checkpoints = fs / "checkpoints"
    if plant == "team dir -> another team's":
        (checkpoints / "vision").symlink_to("nlp")
    elif plant == "team dir -> outside the file system":
        (checkpoints / "vision").symlink_to(outside)
    elif plant == "checkpoints -> elsewhere":
        other.rmdir()
        checkpoints.rmdir()
        checkpoints.symlink_to(outside)
    elif plant == "team dir is a file":
        (checkpoints / "vision").write_text("")
    else:
        (fs / "datasets").symlink_to("checkpoints/nlp")
    with pytest.raises(LocalCacheError, match="symlink or not a directory"):
        apply(layout(fs, "vision"), quiet())
    for path, was in before.items():
        if path.exists() and not path.is_symlink():
            assert owner_mode(path) == was, path


@pytest.mark.parametrize("bad", ["checkpoints/vision", "/checkpoints/../nlp", "/", "/a//b"])
def test_paths_are_absolute_and_plain(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UsageError):
        apply(Layout(str(tmp_path), GID, 0o2770, (bad,)), quiet())


def test_the_command_line_the_platform_renders(tmp_path: Path) -> None:
    """The arguments trainstack/builders/layout.py gives the Job, through the CLI's exit
    codes: 0, then 7 (LOCAL) for a planted link."""
    from trainstack.builders.layout import layout_args  # noqa: PLC0415
    from trainstack.config.loader import load_stack_file  # noqa: PLC0415
    from trainstack.config.model import PlatformConfig  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2]
    cfg = load_stack_file(root / "stacks" / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    args = layout_args(cfg)
    args[args.index("--root") + 1] = str(tmp_path)
    assert cli.main(args, log=quiet()) == ExitCode.OK
    for team in cfg.registry.teams:
        assert owner_mode(tmp_path / "checkpoints" / team.name) == (0, GID, 0o2770)
    (tmp_path / "checkpoints" / "vision").rmdir()
    (tmp_path / "checkpoints" / "vision").symlink_to("nlp")
    assert cli.main(args, log=quiet()) == ExitCode.LOCAL
