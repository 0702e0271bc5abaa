"""The directory source: a dataset version in a mounted directory (Lustre, NFS, any POSIX
file system).

Apart from the other sources because its reading is its own: Lustre's transient errnos, the
check that a file did not change while it was copied (size and mtime), and, for the node
agent, opening every path component by component beneath an allowed root without following a
link or leaving its file system (:class:`DirSource`). What every source shares is in
``sources.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from trainstack_prewarm.errors import IntegrityError, PrewarmError, SourceError, TransientError
from trainstack_prewarm.sources import (
    CHUNK,
    ListPage,
    LocalCheck,
    RemoteFile,
    Sink,
    check_relpath,
)

# Errors a Lustre client returns while an OST fails over or the network blips.
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.EAGAIN,
        errno.ETIMEDOUT,
        errno.EINTR,
        errno.ESTALE,
        errno.ECONNRESET,
        errno.ENOTCONN,
        errno.EBUSY,
    }
)


def classify_os_error(exc: OSError, what: str) -> PrewarmError:
    msg = f"{what}: {exc.strerror or exc}"
    if exc.errno in _TRANSIENT_ERRNOS:
        return TransientError(msg)
    return SourceError(msg)


Opener = Callable[[Path], BinaryIO]


def _open_binary(path: Path) -> BinaryIO:
    return open(path, "rb")


# Walking a source beneath its allowed root: every component is opened relative to its parent
# directory's descriptor, and O_NOFOLLOW makes the open fail on a symbolic link instead of
# following it (open(2): "If the trailing component ... is a symbolic link, then the open
# fails"; ELOOP, or ENOTDIR together with O_DIRECTORY).
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the listing would block a plain open until a writer
# came; with it the open returns and the descriptor is refused as not a regular file. It
# changes nothing for reading regular files.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class DirSource:
    """A mounted directory (Lustre, NFS, any POSIX file system).

    By default (the one-shot ``trainstack-prewarm fetch``, which reads with its caller's own
    rights) paths are opened as given and symbolic links to files are followed. With
    ``beneath`` (the node agent, which reads as root from a file system other people may
    write, and whose copy every team can read) nothing is followed: the source must lie
    under ``beneath`` and every path is opened component by component from it without
    following a link; a link anywhere in the version, the version directory included, is
    refused, as is a file or directory on another file system than ``beneath`` or anything
    but a regular file where a file is read. A path swapped for a link between the listing
    and the read fails the same way.
    """

    def __init__(
        self, root: Path, *, opener: Opener | None = None, beneath: Path | None = None
    ) -> None:
        self.root = root.absolute()
        self.uri = str(self.root)
        self._beneath = beneath.absolute() if beneath is not None else None
        if self._beneath is None:
            # Injectable so tests can make the mount fail the way Lustre does (EIO, ESTALE).
            self._open: Opener = opener or _open_binary
            self._stat: Callable[[Path], os.stat_result] = os.stat
            try:
                st = os.stat(self.root)
            except OSError as exc:
                raise classify_os_error(exc, f"source {self.root}") from exc
            if not stat.S_ISDIR(st.st_mode):
                raise SourceError(f"source {self.root}: not a directory")
            dev = st.st_dev
        else:
            if opener is not None:
                raise ValueError("an opener would bypass the walk beneath the source's root")
            if not self.root.is_relative_to(self._beneath):
                raise SourceError(f"source {self.root}: not under {self._beneath}")
            self._open, self._stat = self._open_beneath, self._stat_beneath
            self._rel = self.root.relative_to(self._beneath).parts
            try:
                top = os.open(self._beneath, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                raise classify_os_error(exc, f"source root {self._beneath}") from exc
            try:
                self._dev = os.fstat(top).st_dev
            finally:
                os.close(top)
            try:
                os.close(self._walk(self._rel))  # the version directory: no link on the way
            except OSError as exc:
                raise classify_os_error(exc, f"source {self.root}") from exc
            dev = self._dev
        # Everything on one filesystem shares its servers: limit per device, not per path.
        self.limit_key = f"dev:{dev}"

    # ---- beneath a root: no link followed, no other file system ----------------------------

    def _where(self, parts: tuple[str, ...]) -> Path:
        assert self._beneath is not None
        return self._beneath.joinpath(*parts)

    def _refuse_link(self, parts: tuple[str, ...]) -> SourceError:
        return SourceError(
            f"{self._where(parts)}: a symbolic link in a directory source; the cache agent "
            f"follows none, so that no file outside {self._beneath} is ever read into the "
            "cache (replace the link with the file or directory it points to)"
        )

    def _open_at(self, dir_fd: int, parts: tuple[str, ...], flags: int) -> int:
        """Open ``parts[-1]`` in ``dir_fd``: never through a link, only on the root's file
        system, and (``_FILE_FLAGS``) only a regular file. OSError as the call raised it."""
        name = parts[-1]
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
                with contextlib.suppress(OSError):
                    if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                        raise self._refuse_link(parts) from exc
            raise
        try:
            st = os.fstat(fd)
            if st.st_dev != self._dev:
                raise SourceError(
                    f"{self._where(parts)}: on another file system than {self._beneath} "
                    "(a mount inside a directory source); list that mount as its own source"
                )
            if flags == _FILE_FLAGS and not stat.S_ISREG(st.st_mode):
                raise SourceError(f"{self._where(parts)}: not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _walk(self, parts: tuple[str, ...]) -> int:
        """A descriptor of the directory ``parts`` under the root, reached from the root one
        component at a time. The root's own path is the operator's, so links in it are his."""
        assert self._beneath is not None
        fd = os.open(self._beneath, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i in range(len(parts)):
                child = self._open_at(fd, parts[: i + 1], _DIR_FLAGS)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_beneath(self, full: Path) -> BinaryIO:
        assert self._beneath is not None
        parts = full.relative_to(self._beneath).parts
        parent = self._walk(parts[:-1])
        try:
            fd = self._open_at(parent, parts, _FILE_FLAGS)
        finally:
            os.close(parent)
        return os.fdopen(fd, "rb")

    def _stat_beneath(self, full: Path) -> os.stat_result:
        with self._open_beneath(full) as fh:
            return os.fstat(fh.fileno())

    def _list_beneath(self) -> list[RemoteFile]:
        files: list[RemoteFile] = []
        pending: list[tuple[str, ...]] = [()]
        while pending:
            rel = pending.pop()
            here = (*self._rel, *rel)
            try:
                fd = self._walk(here)  # again from the root: a directory swapped meanwhile fails
                try:
                    for name in sorted(os.listdir(fd)):
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if stat.S_ISLNK(st.st_mode):
                            raise self._refuse_link((*here, name))
                        if stat.S_ISDIR(st.st_mode):
                            pending.append((*rel, name))  # its device is checked as it opens
                        elif stat.S_ISREG(st.st_mode):
                            if st.st_dev != self._dev:
                                raise SourceError(
                                    f"{self._where((*here, name))}: on another file system "
                                    f"than {self._beneath}"
                                )
                            files.append(
                                RemoteFile(
                                    path=check_relpath("/".join((*rel, name)), self.uri),
                                    size=st.st_size,
                                    identity=f"stat:{st.st_size}:{st.st_mtime_ns}",
                                )
                            )
                finally:
                    os.close(fd)
            except OSError as exc:
                raise classify_os_error(exc, f"list {self._where(here)}") from exc
        return files

    # ---- the Source protocol ------------------------------------------------------------------

    def list_page(self, token: str | None) -> ListPage:
        """A directory is listed in one page (os.walk has no continuation)."""
        del token
        if self._beneath is not None:
            return ListPage(self._list_beneath(), None)
        files: list[RemoteFile] = []

        def onerror(exc: OSError) -> None:
            raise classify_os_error(exc, f"list {exc.filename}")

        for dirpath, _dirs, names in os.walk(self.root, onerror=onerror):
            for name in names:
                full = Path(dirpath, name)
                rel = full.relative_to(self.root).as_posix()
                try:
                    # Follows file symlinks: the one-shot fetch reads with its caller's rights.
                    st = os.stat(full)
                except OSError as exc:
                    raise classify_os_error(exc, f"stat {full}") from exc
                if not stat.S_ISREG(st.st_mode):
                    continue
                files.append(
                    RemoteFile(
                        path=check_relpath(rel, self.uri),
                        size=st.st_size,
                        identity=f"stat:{st.st_size}:{st.st_mtime_ns}",
                    )
                )
        return ListPage(files, None)

    def read_index(self) -> list[RemoteFile] | None:
        # A directory is listed by walking the mount, no request per page: no index needed.
        return None

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        full = self.root / path
        try:
            with self._open(full) as fh:
                data = fh.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise classify_os_error(exc, f"read {full}") from exc
        if len(data) > max_bytes:
            raise SourceError(f"{full}: larger than {max_bytes} bytes")
        return data

    def transfer(self, f: RemoteFile, sink: Sink) -> str:
        full = self.root / f.path
        try:
            fh = self._open(full)
        except OSError as exc:
            raise classify_os_error(exc, f"open {full}") from exc
        with fh:
            while True:
                try:
                    chunk = fh.read(CHUNK)
                except OSError as exc:
                    raise classify_os_error(exc, f"read {full}") from exc
                if not chunk:
                    break
                sink(chunk)  # local write errors are the sink's to report
            try:
                after = os.fstat(fh.fileno())
            except OSError as exc:
                raise classify_os_error(exc, f"stat {full}") from exc
        # The listing's identity pins what we meant to copy; a file rewritten in place while we
        # read it would give a torn copy that no later check could notice.
        if f"stat:{after.st_size}:{after.st_mtime_ns}" != f.identity:
            raise IntegrityError(f"{full}: changed while it was copied (size/mtime differ)")
        return "stat"

    def transfer_range(self, f: RemoteFile, start: int, end: int, sink: Sink) -> None:
        full = self.root / f.path
        try:
            fh = self._open(full)
        except OSError as exc:
            raise classify_os_error(exc, f"open {full}") from exc
        with fh:
            try:
                fh.seek(start)
                left = end - start + 1
                while left > 0:
                    chunk = fh.read(min(CHUNK, left))
                    if not chunk:
                        break
                    left -= len(chunk)
                    sink(chunk)
            except OSError as exc:
                raise classify_os_error(exc, f"read {full}") from exc

    def local_check(self, f: RemoteFile) -> LocalCheck:
        return _StatCheck(self.root / f.path, f.identity, self._stat)


class _StatCheck:
    """After ranged reads: the source file must still have the size and mtime it was listed with."""

    def __init__(
        self, full: Path, identity: str, stat_fn: Callable[[Path], os.stat_result]
    ) -> None:
        self._full, self._identity, self._stat = full, identity, stat_fn

    def update(self, data: bytes) -> None:
        pass

    def result(self) -> str:
        try:
            st = self._stat(self._full)
        except OSError as exc:
            raise classify_os_error(exc, f"stat {self._full}") from exc
        if f"stat:{st.st_size}:{st.st_mtime_ns}" != self._identity:
            raise IntegrityError(f"{self._full}: changed while it was copied (size/mtime differ)")
        return "stat"
