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
   read-only at the pod's target path.

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


class SystemMounter:
    """``mount --bind`` then a read-only remount (a bind mount ignores ``ro`` on its first
    call: mount(8), "the read-only flag ... needs a remount"), and ``umount``.

    Needs CAP_SYS_ADMIN and, for the mount to reach the kubelet's view of the target,
    ``mountPropagation: Bidirectional`` on the kubelet directory (the DaemonSet does both).
    """

    def __init__(self, run: Callable[[list[str]], object] | None = None) -> None:
        self._run = run or (lambda argv: subprocess.run(argv, check=True, capture_output=True))

    def bind_read_only(self, source: Path, target: Path) -> None:
        self._run(["mount", "--bind", str(source), str(target)])
        try:
            self._run(["mount", "-o", "remount,bind,ro", str(target)])
        except BaseException:
            with contextlib.suppress(Exception):
                self._run(["umount", str(target)])
            raise

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

    # ---- fills: one per version, shared by every publisher --------------------------------

    def check_source(self, source: str) -> None:
        """Only the platform's dataset sources: the agent fetches with its own credentials."""
        if not any(source.startswith(prefix) for prefix in self.allowed_sources):
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
            fut = self.ensure(req)
            try:
                fut.result(timeout=max(wait_s, 0.0))
            except FutureTimeout:
                raise PublishPending(
                    f"{req.dataset}/{req.version}: still being fetched onto this node"
                ) from None
            vdir = self._vdir(req)
            stack = contextlib.ExitStack()
            try:
                stack.enter_context(
                    cache.hold(
                        vdir,
                        timeout_s=self.hold_timeout_s,
                        on_wait=lambda: self.log("hold_wait", cache=str(vdir)),
                    )
                )
                cache.verify(vdir, dataset=req.dataset, version=req.version)
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
        """Stop the fill pool; holds stay with the process (they end when it exits)."""
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
