"""The shared file system's layout for the platform (issue 37): `trainstack-prewarm layout`.

Each team's `checkpoints` volume is rooted at its own directory, /checkpoints/<team>
(trainstack/builders/storage.py team_volumes): a Lustre fileset mount, which fails for a
directory that does not exist. This makes those directories, once per platform change, from
the platform's claim on the whole file system (a Job in the system namespace,
trainstack/builders/layout.py):

- `/checkpoints` root:root 0755: no team writes beside its own directory;
- each `/checkpoints/<team>` root:<gid> with the given mode (2770): the kubelet creates a
  job's sub-path below it with the same group and mode, which the non-root trainer (uid and
  gid 10001) writes through its group, so no pod of a team runs as root;
- each read-only directory (`/datasets`, the root of every team's read-only volume) if it is
  missing, root:root 0755; an existing one is left as it is (FSx's data repository
  association owns it).

It runs as root over a file system every team could write anywhere on until issue 37, so it
trusts no path it finds: every component is opened relative to its parent's descriptor
with O_NOFOLLOW | O_DIRECTORY, a symlink or anything but a directory stops it with an error
naming the path (for an operator to look at), and ownership and mode are set through the
descriptor it opened (fchown, fchmod), never by name. It deletes nothing and never recurses:
what is inside a team's directory is the team's.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from trainstack_prewarm.errors import LocalCacheError, UsageError
from trainstack_prewarm.log import JsonLog

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PARENT_MODE = 0o755


@dataclass(frozen=True)
class Layout:
    root: str
    gid: int
    mode: int  # of each team directory, e.g. 0o2770
    team_dirs: tuple[str, ...]  # e.g. /checkpoints/vision
    read_only_dirs: tuple[str, ...] = ()  # e.g. /datasets


def relative_parts(path: str, what: str) -> tuple[str, ...]:
    """The components of an absolute path below the root: no `.`, `..` or empty ones."""
    if not path.startswith("/"):
        raise UsageError(f"{what} {path!r}: give a path from the file system's root, e.g. /x/y")
    parts = tuple(path.strip("/").split("/"))
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise UsageError(f"{what} {path!r}: no empty, . or .. components")
    return parts


def _open_dir(parent: int, name: str, where: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LocalCacheError(
                f"{where} is a symlink or not a directory: refusing to follow it (look at it "
                "and remove it; nothing was changed there)"
            ) from None
        raise


def _ensure_dir(parent: int, name: str, where: str, log: JsonLog) -> tuple[int, bool]:
    """(descriptor of `name` in `parent`, whether it was made here), never following a link."""
    made = False
    try:
        os.mkdir(name, PARENT_MODE, dir_fd=parent)
        made = True
        log("layout_created", path=where)
    except FileExistsError:
        pass
    return _open_dir(parent, name, where), made


def _set(fd: int, owner: tuple[int, int], mode: int, where: str, log: JsonLog) -> None:
    uid, gid = owner
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):  # O_DIRECTORY makes this impossible; stated, not assumed
        raise LocalCacheError(f"{where} is not a directory")
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
    # After fchown: chown(2) clears the setgid bit of a directory on some file systems.
    if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
        os.fchmod(fd, mode)
    after = os.fstat(fd)
    if (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) != (uid, gid, mode):
        raise LocalCacheError(
            f"{where}: is {after.st_uid}:{after.st_gid} {stat.S_IMODE(after.st_mode):o} after "
            f"setting {uid}:{gid} {mode:o} (root squash on this node? docs/security.md)"
        )
    if (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (uid, gid, mode):
        log("layout_set", path=where, owner=f"{uid}:{gid}", mode=f"{mode:o}")


def _walk(root_fd: int, parts: tuple[str, ...], log: JsonLog) -> list[tuple[int, str, bool]]:
    """Open (and make) each component below the root; (fd, path, made) for each."""
    opened: list[tuple[int, str, bool]] = []
    parent, where = root_fd, ""
    for name in parts:
        where = f"{where}/{name}"
        fd, made = _ensure_dir(parent, name, where, log)
        opened.append((fd, where, made))
        parent = fd
    return opened


def apply(layout: Layout, log: JsonLog | None = None) -> None:
    """Make the layout; idempotent. Raises LocalCacheError naming the path it refused."""
    log = log or JsonLog()
    team_parts = [relative_parts(d, "--team-dir") for d in layout.team_dirs]
    read_only_parts = [relative_parts(d, "--read-only-dir") for d in layout.read_only_dirs]
    if not 0 <= layout.mode <= 0o7777:
        raise UsageError(f"--mode {layout.mode:o}: not a permission mode")
    root_fd = os.open(layout.root, DIR_FLAGS)
    try:
        for parts in read_only_parts:
            opened = _walk(root_fd, parts, log)
            try:
                for fd, where, made in opened:
                    if made:  # an existing one is someone else's (the data repository's)
                        _set(fd, (0, 0), PARENT_MODE, where, log)
            finally:
                for fd, _, _ in opened:
                    os.close(fd)
        for parts in team_parts:
            opened = _walk(root_fd, parts, log)
            try:
                *parents, (fd, where, _) = opened
                for parent_fd, parent_where, _ in parents:
                    # Only root writes beside a team's directory.
                    _set(parent_fd, (0, 0), PARENT_MODE, parent_where, log)
                _set(fd, (0, layout.gid), layout.mode, where, log)
            finally:
                for fd, _, _ in opened:
                    os.close(fd)
    finally:
        os.close(root_fd)
    log(
        "layout_done",
        root=layout.root,
        teams=[str(PurePosixPath(d).name) for d in layout.team_dirs],
    )


def parse_mode(raw: str) -> int:
    try:
        return int(raw, 8)
    except ValueError:
        raise UsageError(f"--mode {raw!r}: an octal mode such as 2770") from None


def from_args(
    root: str, gid: int, mode: str, team_dirs: Sequence[str], read_only_dirs: Sequence[str]
) -> Layout:
    return Layout(root, gid, parse_mode(mode), tuple(team_dirs), tuple(read_only_dirs))
