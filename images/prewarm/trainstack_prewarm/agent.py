"""The node agent: one dataset cache per node, versions published read-only into pods.

The agent owns the node's cache directory (a hostPath in its own, privileged namespace). A
workload pod asks for a version through a CSI ephemeral inline volume (allowed by Pod
Security baseline and restricted); the CSI node service (:mod:`trainstack_prewarm.csi`) calls
:meth:`CacheAgent.publish`, which

1. fills the version once per node: concurrent publishes of one version wait on one fill
   (and the fetcher's own ``.prewarm/lock`` keeps it to one even across agent restarts);
2. takes a shared **hold** on it (the same flock ``verify -- CMD`` takes), so eviction and
   repairs leave it alone while any pod has it mounted;
3. checks it (marker, sizes) under that hold, and bind-mounts the version directory
   read-only at the pod's target path (:class:`SystemMounter`: read-only before the mount
   reaches the kubelet's directory, so the host's and the pod's copies are read-only too).

:meth:`CacheAgent.unpublish` unmounts and releases the hold. Each publish is recorded in
``<cache>/.agent/volumes/<volume id>.json``, so an agent that restarts re-takes the holds of
the volumes still mounted before it serves again. Mounting goes through :class:`Mounter`: the
real one runs ``mount``; tests record calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainstack_prewarm import cache
from trainstack_prewarm.errors import PrewarmError, SourceError, UsageError
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.sources import dir_parts, source_under

AGENT_DIR = ".agent"
VOLUMES_DIR = "volumes"
# Volume attributes a pod's `csi.volumeAttributes` carries (rendered by trainstack/jobs).
ATTR_SOURCE, ATTR_DATASET, ATTR_VERSION = "source", "dataset", "version"
_VOLUME_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class Mounter(Protocol):
    """How a version reaches a pod: a read-only bind mount, and its removal."""

    def bind_read_only(self, source: Path, target: Path) -> None: ...

    def unmount(self, target: Path) -> None: ...

    def is_mounted(self, target: Path) -> bool: ...


STAGING_DIR = "staging"


def _run_mount(argv: list[str]) -> None:
    """Run mount(8)/umount(8); a failure is an OSError with what the command said (the CSI
    service answers it as INTERNAL, and the kubelet retries)."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise OSError(f"{' '.join(argv)}: exit {done.returncode}: {said}")


class SystemMounter:
    """Read-only bind mounts with mount(8), made read-only **before** they reach the pod.

    The target lies in the kubelet's pods directory, which the agent mounts with
    ``mountPropagation: Bidirectional``: a mount made there is copied to the host's peer
    mount (and from it into the pod's container). A copy takes the flags of the mount it
    copies (Linux fs/namespace.c, ``clone_mnt``: ``mnt_flags`` from the old mount; fs/pnode.c
    ``propagate_mnt`` copies through it), but a later read-only remount changes one mount
    only and propagates nothing (fs/namespace.c ``do_reconfigure_mnt``: the flags of the
    mount at that path). So ``mount --bind`` then ``mount -o remount,bind,ro`` at the target
    left the host's and the pod's copies writable. Instead:

    1. bind the version directory to a fresh directory under ``staging``, a private mount
       point of the agent's (nothing mounted under it reaches the host, whatever the
       propagation of the directory above it);
    2. remount that staging mount read-only (a bind mount ignores ``ro`` on its first call:
       mount(8), "the read-only flag ... needs a remount");
    3. bind the staging mount to the target: the new mount, and every copy propagated from
       it, starts read-only;
    4. unmount the staging mount (the target's mount does not depend on it).

    A failure at any step undoes the steps before it, so the publish fails whole and the
    kubelet retries it. Needs CAP_SYS_ADMIN in the agent's mount namespace
    (the DaemonSet runs it privileged). tests/prewarm/test_agent.py checks it in a user and
    mount namespace: a write from the "host" namespace fails with EROFS.
    """

    def __init__(self, *, staging: Path, run: Callable[[list[str]], object] | None = None) -> None:
        self.staging = staging
        self._run = run or _run_mount
        self._prepared = False
        self._prepare_lock = threading.Lock()

    def _prepare(self) -> None:
        """Once: make ``staging`` a private mount point of its own, and drop the staging
        directories a killed agent left (their mounts died with its mount namespace)."""
        with self._prepare_lock:
            if self._prepared:
                return
            self.staging.mkdir(parents=True, exist_ok=True)
            where = self.staging.resolve()  # as mountinfo names it
            if str(where) not in mount_points():
                self._run(["mount", "--bind", str(where), str(where)])
            self._run(["mount", "--make-private", str(where)])
            for left in where.iterdir():
                if self.is_mounted(left):
                    self._run(["umount", str(left)])
                with contextlib.suppress(OSError):
                    left.rmdir()
            self._prepared = True

    def bind_read_only(self, source: Path, target: Path) -> None:
        self._prepare()
        stage = Path(tempfile.mkdtemp(prefix="bind-", dir=self.staging))
        staged = bound = False
        try:
            self._run(["mount", "--bind", str(source), str(stage)])
            staged = True
            self._run(["mount", "-o", "remount,bind,ro", str(stage)])
            self._run(["mount", "--bind", str(stage), str(target)])
            bound = True
            # The kernel's per-mount flag is what keeps the copy read-only: check it before
            # the pod may start, rather than trust the commands.
            if not os.statvfs(target).f_flag & os.ST_RDONLY:
                raise OSError(f"{target}: the bind mount is not read-only")
            self._run(["umount", str(stage)])
            staged = False
        except BaseException:
            # Lazily (MNT_DETACH): the undo must not fail where the step it undoes did, and
            # a detach propagates to the host like any unmount (fs/namespace.c do_umount).
            if bound:
                with contextlib.suppress(Exception):
                    self._run(["umount", "-l", str(target)])
            if staged:
                with contextlib.suppress(Exception):
                    self._run(["umount", "-l", str(stage)])
            raise
        finally:
            with contextlib.suppress(OSError):
                stage.rmdir()

    def unmount(self, target: Path) -> None:
        self._run(["umount", str(target)])

    def is_mounted(self, target: Path) -> bool:
        return str(target) in mount_points()


def mount_points(mountinfo: str = "/proc/self/mountinfo") -> set[str]:
    """Mount points of this mount namespace (field 5 of mountinfo, octal escapes decoded)."""
    points: set[str] = set()
    with contextlib.suppress(OSError), open(mountinfo, encoding="utf-8") as fh:
        for line in fh:
            fields = line.split(" ")
            if len(fields) > 4:
                points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))
    return points


class PublishPending(PrewarmError):
    """The version is still being filled: the CO retries the publish (CSI ABORTED)."""


@dataclass(frozen=True)
class VersionRequest:
    source: str
    dataset: str
    version: str

    @classmethod
    def from_attributes(cls, attrs: dict[str, str]) -> VersionRequest:
        missing = [k for k in (ATTR_SOURCE, ATTR_DATASET, ATTR_VERSION) if not attrs.get(k)]
        if missing:
            raise UsageError(f"volumeAttributes lack {', '.join(missing)}")
        return cls(
            attrs[ATTR_SOURCE],
            cache.check_name("dataset", attrs[ATTR_DATASET]),
            cache.check_name("version", attrs[ATTR_VERSION]),
        )


# Fills one version into the cache root (blocking); raises PrewarmError on failure.
FillFn = Callable[[VersionRequest], object]


@dataclass
class _Published:
    volume_id: str
    target: Path
    vdir: Path
    holding: contextlib.ExitStack


class CacheAgent:
    def __init__(
        self,
        cache_root: Path,
        *,
        fill: FillFn,
        mounter: Mounter,
        allowed_sources: Iterable[str] = (),
        log: JsonLog | None = None,
        fill_workers: int = 4,
        hold_timeout_s: float = 60.0,
        reserve_percent: float | None = None,
    ) -> None:
        self.cache_root = cache_root
        self._fill_fn = fill
        self.mounter = mounter
        self.allowed_sources = tuple(allowed_sources)
        self.log = log or JsonLog()
        self.hold_timeout_s = hold_timeout_s
        self._pool = ThreadPoolExecutor(fill_workers, thread_name_prefix="fill")
        self._lock = threading.Lock()
        self._fills: dict[tuple[str, str], Future[object]] = {}
        self._published: dict[str, _Published] = {}
        self._busy: set[str] = set()  # volume ids with a publish/unpublish under way
        self._state = cache_root / AGENT_DIR / VOLUMES_DIR
        self.fills_started = 0
        # None: never evict on the agent's own account (`--no-evict`).
        self.reserve_percent = reserve_percent
        self._stopping = threading.Event()
        self._wake = threading.Event()

    # ---- fills: one per version, shared by every publisher --------------------------------

    def check_source(self, source: str) -> None:
        """Only the platform's dataset sources: the agent fetches with its own credentials.
        A directory source must be a normalised absolute path inside an allowed directory,
        component by component (``/data/sets/../x/`` and ``/data/setsX/`` are not inside
        ``/data/sets/``); the fill then reads it following no link (dirsource.DirSource)."""
        if not source.startswith("s3://") and dir_parts(source) is None:
            raise SourceError(
                f"source {source!r}: not a normalised absolute path ('.', '..' and empty "
                "segments are refused); name the dataset version's directory itself"
            )
        if not any(source_under(source, prefix) for prefix in self.allowed_sources):
            allowed = ", ".join(self.allowed_sources) or "none configured"
            raise SourceError(f"source {source!r} is not under an allowed prefix ({allowed})")

    def ensure(self, req: VersionRequest) -> Future[object]:
        """The fill of ``req``'s version: the one under way, else a new one (a fill of a
        complete version checks its marker and returns without contacting the source)."""
        self.check_source(req.source)
        key = (req.dataset, req.version)
        with self._lock:
            fut = self._fills.get(key)
            if fut is None or fut.done():
                fut = self._pool.submit(self._fill_fn, req)
                self.fills_started += 1
                self._fills[key] = fut
                self.log("fill_started", dataset=req.dataset, version=req.version)
            else:
                self.log("fill_joined", dataset=req.dataset, version=req.version)
            return fut

    # ---- publish / unpublish ----------------------------------------------------------------

    @contextlib.contextmanager
    def _exclusive(self, volume_id: str) -> Iterator[None]:
        with self._lock:
            if volume_id in self._busy:
                raise PublishPending(f"volume {volume_id}: an operation is under way")
            self._busy.add(volume_id)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(volume_id)

    def publish(self, volume_id: str, target: Path, req: VersionRequest, *, wait_s: float) -> Path:
        """Fill (or join the fill of), hold, check and bind-mount the version at ``target``.

        Raises :class:`PublishPending` when the fill outlasts ``wait_s``: the kubelet retries
        and the next call joins the same fill.
        """
        if not _VOLUME_ID.match(volume_id):
            raise UsageError(f"volume id {volume_id!r}: not a safe file name")
        with self._exclusive(volume_id):
            known = self._published.get(volume_id)
            if known is not None:
                if known.target != target or known.vdir != self._vdir(req):
                    raise UsageError(f"volume {volume_id} is published elsewhere or differently")
                return known.vdir  # idempotent
            began = time.monotonic()
            fut = self.ensure(req)
            try:
                fut.result(timeout=max(wait_s, 0.0))
            except FutureTimeout:
                raise PublishPending(
                    f"{req.dataset}/{req.version}: still being fetched onto this node"
                ) from None
            vdir = self._vdir(req)
            # The hold waits only for what is left of this call's budget: a repair or an
            # eviction can hold the version for minutes, and a mount made after the kubelet
            # gave up on the call is one it does not know of (the call's answer, LOCK_TIMEOUT,
            # is ABORTED: the kubelet retries). Also check of issue 39.
            hold_s = min(self.hold_timeout_s, max(wait_s - (time.monotonic() - began), 0.0))
            stack = contextlib.ExitStack()
            try:
                stack.enter_context(
                    cache.hold(
                        vdir,
                        timeout_s=hold_s,
                        on_wait=lambda: self.log("hold_wait", cache=str(vdir)),
                    )
                )
                # Marker and sizes: the fill hashed every byte before it wrote the marker, and
                # a publish per pod start must not read the version (issue 39 #2).
                cache.verify(vdir, deep=False, dataset=req.dataset, version=req.version)
                target.mkdir(parents=True, exist_ok=True)
                self._record(volume_id, target, vdir)
                self.mounter.bind_read_only(vdir, target)
            except BaseException:
                stack.close()
                self._forget(volume_id)
                raise
            self._published[volume_id] = _Published(volume_id, target, vdir, stack)
            self.log("published", volume=volume_id, cache=str(vdir), target=str(target))
            return vdir

    def unpublish(self, volume_id: str, target: Path) -> None:
        """Unmount, release the hold, forget the volume. Idempotent."""
        with self._exclusive(volume_id):
            known = self._published.pop(volume_id, None)
            if self.mounter.is_mounted(target):
                self.mounter.unmount(target)
            with contextlib.suppress(OSError):
                target.rmdir()  # CSI: the plugin removes the target path it published
            if known is not None:
                known.holding.close()
            self._forget(volume_id)
            self.log("unpublished", volume=volume_id, target=str(target))
        if known is not None:
            self._wake.set()  # the version it held may now make room (not in this call: an
            # eviction can take minutes of unlinks, and the kubelet waits on the unpublish)

    # ---- the volume's reserve ---------------------------------------------------------------

    def keep_reserve(self) -> list[Path]:
        """Evict versions no pod holds until the volume has its reserve free again. A fill is
        admitted only with the reserve left over, but the volume's other tenants (images,
        pod logs, emptyDirs) keep growing; without this the cache would sit on the space
        the kubelet needs until the next fill (issue 39 #1). Never raises: a failed round
        is logged and the next one retries."""
        if self.reserve_percent is None:
            return []
        try:
            return cache.keep_reserve(
                self.cache_root,
                self.reserve_percent,
                on_evict=lambda vdir, size: self.log(
                    "evicted", cache=str(vdir), bytes=size, reason="reserve"
                ),
            )
        except (OSError, PrewarmError) as exc:
            self.log("reserve_failed", error=str(exc))
            return []

    def start_reserve_keeper(self, interval_s: float) -> threading.Thread | None:
        """Run :meth:`keep_reserve` every ``interval_s`` seconds (0: never on a timer) and
        after each unpublish that released a hold, until :meth:`close`."""
        if self.reserve_percent is None:
            return None

        def loop() -> None:
            while True:
                self._wake.wait(interval_s if interval_s > 0 else None)
                if self._stopping.is_set():
                    return
                self._wake.clear()
                self.keep_reserve()

        thread = threading.Thread(target=loop, name="reserve", daemon=True)
        thread.start()
        return thread

    def recover(self) -> int:
        """Re-take the holds of volumes an earlier agent published and left mounted."""
        recovered = 0
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(self._state.iterdir()):
                try:
                    doc = json.loads(path.read_text())
                    volume_id, target, vdir = doc["volume"], Path(doc["target"]), Path(doc["vdir"])
                except (OSError, ValueError, KeyError, TypeError):
                    path.unlink(missing_ok=True)
                    continue
                if not self.mounter.is_mounted(target):
                    path.unlink(missing_ok=True)
                    continue
                stack = contextlib.ExitStack()
                try:
                    stack.enter_context(cache.hold(vdir, timeout_s=self.hold_timeout_s))
                except PrewarmError as exc:
                    self.log("recover_failed", volume=volume_id, error=exc.message)
                    stack.close()
                    continue
                self._published[volume_id] = _Published(volume_id, target, vdir, stack)
                recovered += 1
        self.log("recovered", volumes=recovered)
        return recovered

    def published(self) -> dict[str, Path]:
        with self._lock:
            return {v: p.vdir for v, p in self._published.items()}

    def close(self) -> None:
        """Stop the fill pool and the reserve keeper; holds stay with the process (they end
        when it exits)."""
        self._stopping.set()
        self._wake.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- state ------------------------------------------------------------------------------

    def _vdir(self, req: VersionRequest) -> Path:
        return cache.version_dir(self.cache_root, req.dataset, req.version)

    def _record(self, volume_id: str, target: Path, vdir: Path) -> None:
        self._state.mkdir(parents=True, exist_ok=True)
        path = self._state / f"{volume_id}.json"
        tmp = path.with_suffix(".tmp")
        doc = {"volume": volume_id, "target": str(target), "vdir": str(vdir), "at": time.time()}
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    def _forget(self, volume_id: str) -> None:
        (self._state / f"{volume_id}.json").unlink(missing_ok=True)
