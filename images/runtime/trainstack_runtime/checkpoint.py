"""Whole-state checkpoints that survive kills: staged async save, atomic commit, verified resume.

Layout under the durable root (``TRAINSTACK_CHECKPOINT_DIR``, default ``/checkpoints``)::

    step-000000120/            committed: renamed from .tmp only after manifest.json exists
      manifest.json            written last: format, step, world size, size+sha256 of each file
      shared.pkl               skeleton of the replicated state (model, optimizer, scheduler)
      rank-00000.bin           raw tensor bytes: this rank's share of shared + its own tensors
      rank-00000.pkl           skeleton of rank 0's private state (RNG, data-loader position)
      rank-00000.done.json     rank 0's commit vote (its files and checksums)
    step-000000130.tmp/        in flight (or left by a crash: deleted on the next start)
    step-000000110.corrupt/    failed verification on start: kept for inspection, never loaded
    LATEST                     hint only; the highest valid step-* directory is authoritative

Save path (per rank): ``save()`` snapshots Python-side state and copies tensors that forward
may change (buffers, RNG) synchronously; parameters and optimizer state are copied to reusable
host buffers by a background thread while the next forward/backward runs, and
``wait_for_staging()`` (call it right before ``optimizer.step()``) is the only other place the
loop can block. The same thread then writes the files (fsync), uploads them from the optional
local tier to the durable root, records its checksums and votes (an all-reduce on a dedicated
gloo group); rank 0 then writes the manifest (tmp, fsync, rename), renames the directory,
applies retention and broadcasts the outcome. At most one
save is in flight: the next ``save()`` waits for the previous commit (back-pressure).

Replicated state (DDP: every rank holds the same model and optimizer) is written once, split
across ranks by size so ranks write in parallel. Tensor bytes are written from host memory
without pickling, so the writer thread holds the GIL only briefly.

This deliberately avoids ``torch.distributed`` object collectives (they need numpy, which the
runtime does not depend on); coordination uses the shared filesystem and tensor collectives.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import io
import json
import logging
import os
import pickle
import random
import re
import shutil
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from .contract import (
    CHECKPOINT_DIR_DEFAULT,
    ENV_CHECKPOINT_CHECK_EVERY,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY,
    ENV_CHECKPOINT_INTERVAL_S,
    ENV_CHECKPOINT_KEEP,
    ENV_CHECKPOINT_LOCAL_DIR,
    ENV_COMMIT_TIMEOUT_S,
    KEEP_LAST_DEFAULT,
)
from .exitcodes import ConfigError, StorageError
from .faults import Injector

log = logging.getLogger("trainstack.checkpoint")

FORMAT = "trainstack-checkpoint/1"
MANIFEST = "manifest.json"
LATEST = "LATEST"
_STEP_DIR = re.compile(r"^step-(\d{9})$")
_CHUNK = 16 << 20


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


@dataclass
class TrainState:
    """Everything needed to continue bit-for-bit. ``replicated``: model and optimizer are
    identical on every rank (DDP); set False for per-rank models."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Stateful | None = None
    loader: Stateful | None = None
    extra: dict[str, Stateful] = field(default_factory=dict)
    replicated: bool = True


@dataclass(frozen=True)
class CheckpointConfig:
    root: Path = Path(CHECKPOINT_DIR_DEFAULT)
    local_root: Path | None = None
    every: int = 0  # 0: only on demand (preemption, end of training)
    interval_s: float = 0.0  # also checkpoint when this much time has passed (0: off)
    check_every: int = 10  # steps between the ranks' agreement on a time-based save
    keep: int = KEEP_LAST_DEFAULT
    commit_timeout_s: float = 600.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> CheckpointConfig:
        env = dict(os.environ) if env is None else env
        local = env.get(ENV_CHECKPOINT_LOCAL_DIR)

        def num(name: str, default: float) -> float:
            raw = env.get(name)
            if not raw:
                return default
            try:
                return float(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a number") from None

        cfg = cls(
            root=Path(env.get(ENV_CHECKPOINT_DIR) or CHECKPOINT_DIR_DEFAULT),
            local_root=Path(local) if local else None,
            every=int(num(ENV_CHECKPOINT_EVERY, 0)),
            interval_s=num(ENV_CHECKPOINT_INTERVAL_S, 0.0),
            check_every=int(num(ENV_CHECKPOINT_CHECK_EVERY, 10)),
            keep=int(num(ENV_CHECKPOINT_KEEP, KEEP_LAST_DEFAULT)),
            commit_timeout_s=num(ENV_COMMIT_TIMEOUT_S, 600.0),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.every < 0:
            raise ConfigError(f"{ENV_CHECKPOINT_EVERY} must be >= 0")
        if self.interval_s < 0:
            raise ConfigError(f"{ENV_CHECKPOINT_INTERVAL_S} must be >= 0")
        if self.check_every < 1:
            raise ConfigError(f"{ENV_CHECKPOINT_CHECK_EVERY} must be >= 1")
        if self.keep < 1:
            raise ConfigError(f"{ENV_CHECKPOINT_KEEP} must be >= 1 (2+ recommended)")
        if self.commit_timeout_s <= 0:
            raise ConfigError(f"{ENV_COMMIT_TIMEOUT_S} must be > 0")


# --- skeletons: nested Python state with tensors replaced by references --------------------
@dataclass(frozen=True)
class TensorRef:
    index: int


def _flatten(obj: Any, out: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse or obj.is_quantized or obj.is_nested:
            raise ConfigError("sparse, quantized and nested tensors are not supported")
        out.append(obj)
        return TensorRef(len(out) - 1)
    if isinstance(obj, OrderedDict):
        new: OrderedDict[Any, Any] = OrderedDict((k, _flatten(v, out)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            new._metadata = meta  # type: ignore[attr-defined]  # module versions for load
        return new
    if isinstance(obj, dict):
        return {k: _flatten(v, out) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_flatten(v, out) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_flatten(v, out) for v in obj)
    return obj


def _unflatten(obj: Any, tensors: dict[int, torch.Tensor]) -> Any:
    if isinstance(obj, TensorRef):
        return tensors[obj.index]
    if isinstance(obj, OrderedDict):
        new: OrderedDict[Any, Any] = OrderedDict(
            (k, _unflatten(v, tensors)) for k, v in obj.items()
        )
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            new._metadata = meta  # type: ignore[attr-defined]
        return new
    if isinstance(obj, dict):
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_unflatten(v, tensors) for v in obj)
    return obj


class _SafeUnpickler(pickle.Unpickler):
    """Checkpoints hold plain data: refuse every global except these few."""

    _ALLOWED = frozenset(
        {
            (__name__, "TensorRef"),
            ("collections", "OrderedDict"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "complex"),
            ("builtins", "slice"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"checkpoint refers to disallowed global {module}.{name}")


def _safe_loads(data: bytes) -> Any:
    return _SafeUnpickler(io.BytesIO(data)).load()


def _dumps_checked(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=5)
    try:
        _safe_loads(data)
    except pickle.UnpicklingError as err:
        raise ConfigError(
            f"training state holds an object checkpoints cannot restore: {err}"
        ) from err
    return data


# --- RNG ------------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    # torch leaves these two unannotated
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:
        name, keys, pos, has_gauss, gauss = sys.modules["numpy"].random.get_state()
        state["numpy"] = (name, [int(k) for k in keys], int(pos), int(has_gauss), float(gauss))
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        np = importlib.import_module("numpy")
        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))


# --- file helpers ---------------------------------------------------------------------------
def _view(t: torch.Tensor) -> memoryview:
    """Zero-copy bytes of a contiguous host tensor (no numpy needed)."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {name}")
    return value


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


# --- verification ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    manifest: dict[str, Any] | None = None


def verify(directory: Path, *, checksums: bool = True) -> Verdict:  # noqa: PLR0911 - one exit per defect
    """Check a committed checkpoint: manifest readable, every file present, sizes and hashes."""
    mpath = directory / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        return Verdict(False, "no manifest.json (incomplete write)")
    except (OSError, ValueError) as err:
        return Verdict(False, f"unreadable manifest: {err}")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return Verdict(False, f"not a {FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return Verdict(False, "manifest lists no files")
    for name, meta in sorted(files.items()):
        path = directory / name
        if "/" in name or name.startswith("."):
            return Verdict(False, f"manifest names a path outside the checkpoint: {name}")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return Verdict(False, f"missing file {name}")
        if size != meta.get("size"):
            return Verdict(False, f"{name}: size {size} != manifest {meta.get('size')}")
        if checksums and sha256_file(path) != meta.get("sha256"):
            return Verdict(False, f"{name}: sha256 mismatch")
    return Verdict(True, manifest=manifest)


def committed_steps(root: Path) -> list[int]:
    """Steps whose directory was renamed into place (not yet verified), ascending."""
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            steps.append(int(match.group(1)))
    return sorted(steps)


def select_checkpoint(root: Path, world_size: int, *, quarantine: bool = True) -> int | None:
    """Newest verified step under ``root``; corrupt ones are moved aside. None: start fresh."""
    for step in reversed(committed_steps(root)):
        directory = root / step_dir_name(step)
        result = verify(directory)
        if result.ok:
            assert result.manifest is not None
            saved_world = result.manifest.get("world_size")
            if saved_world != world_size:
                raise ConfigError(
                    f"checkpoint {directory} was written by {saved_world} ranks but this job "
                    f"has {world_size}; resharding per-rank state is not supported"
                )
            return step
        log.error("checkpoint %s is invalid (%s); falling back", directory, result.reason)
        if quarantine:
            _quarantine(directory)
    return None


def _quarantine(directory: Path) -> None:
    target = directory.with_name(directory.name + ".corrupt")
    n = 1
    while target.exists():
        target = directory.with_name(f"{directory.name}.corrupt{n}")
        n += 1
    os.replace(directory, target)


# --- the manager ----------------------------------------------------------------------------
@dataclass
class _Layout:
    signature: tuple[tuple[tuple[int, ...], str], ...]
    owners: list[int]  # shared tensor index -> writing rank
    offsets: list[int]  # shared tensor index -> offset in owner's data file


@dataclass
class _Job:
    step: int
    shared_blob: bytes
    private_blob: bytes
    shared: list[torch.Tensor]  # sources (only read by the staging copy)
    private: list[torch.Tensor]
    staged: threading.Event = field(default_factory=threading.Event)
    cuda_stream: Any = None
    started: float = field(default_factory=time.perf_counter)
    future: Future[None] | None = None


class CheckpointManager:
    def __init__(
        self,
        config: CheckpointConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        attempt: int = 0,
        on_commit: Callable[[int, float], None] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.rank, self.world_size = rank, world_size
        self._on_commit = on_commit
        self._faults = Injector(rank, attempt)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt")
        self._job: _Job | None = None
        self._layout: _Layout | None = None
        self._buffers: list[torch.Tensor] = []
        self._buffer_sig: tuple[tuple[tuple[int, ...], str], ...] = ()
        self._private_buffers: list[torch.Tensor] = []
        self._restored_rng: dict[str, Any] | None = None
        self._group: Any = None
        if self._dist():
            # Long enough for the slowest rank's write; collective on all ranks, so here.
            self._group = dist.new_group(
                backend="gloo", timeout=timedelta(seconds=config.commit_timeout_s)
            )
        self._clock_group: Any = None
        if self._dist() and config.interval_s > 0:
            # Separate from the writer thread's group: collectives on one group must not
            # interleave between threads.
            self._clock_group = dist.new_group(backend="gloo")
        self._last_save_clock = time.monotonic()
        self.last_saved_step = -1
        self.last_commit_step = -1
        self.last_commit_time = 0.0
        self.last_stall_s = 0.0
        self.last_persist_s = 0.0
        self.commits = 0
        config.root.mkdir(parents=True, exist_ok=True)
        if config.local_root is not None:
            config.local_root.mkdir(parents=True, exist_ok=True)

    # ---- collectives (tensor only) ----
    def _dist(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _broadcast_int(self, value: int) -> int:
        if not self._dist():
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(t, src=0)
        return int(t.item())

    def _check_same_layout(self, sig: tuple[tuple[tuple[int, ...], str], ...]) -> None:
        if not self._dist():
            return
        digest = hashlib.sha256(repr(sig).encode()).digest()
        h = int.from_bytes(digest[:7], "big")
        t = torch.tensor([h, -h], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if int(t[0]) != h or int(t[1]) != -h:
            raise ConfigError(
                "TrainState(replicated=True) but ranks hold differently shaped model/optimizer "
                "state; pass replicated=False for per-rank models"
            )

    # ---- restore ----
    def restore(self, state: TrainState) -> int:
        """Load the newest valid checkpoint into ``state``; returns its step (0: fresh start).

        Rank 0 verifies checksums and quarantines corrupt checkpoints; the choice is broadcast
        so every rank loads the same step. RNG is applied last; if you create data iterators
        after this call, call :meth:`reapply_rng` afterwards (iterators draw from the RNG).
        """
        chosen = -1
        if self.rank == 0:
            try:
                self._clean_incomplete()
                step = select_checkpoint(self.config.root, self.world_size)
                chosen = -1 if step is None else step
            except ConfigError:
                self._broadcast_int(-2)
                raise
        chosen = self._broadcast_int(chosen)
        if chosen == -2:
            raise ConfigError("rank 0 rejected the checkpoint (see its log)")
        if chosen < 0:
            log.info("no valid checkpoint under %s: starting fresh", self.config.root)
            return 0
        directory = self.config.root / step_dir_name(chosen)
        self._load(directory, state)
        self.last_commit_step = self.last_saved_step = chosen
        self.last_commit_time = (directory / MANIFEST).stat().st_mtime
        log.info("rank %d resumed from %s", self.rank, directory)
        return chosen

    def reapply_rng(self) -> None:
        if self._restored_rng is not None:
            restore_rng(self._restored_rng)

    def _clean_incomplete(self) -> None:
        for root in filter(None, (self.config.root, self.config.local_root)):
            for entry in root.glob("step-*.tmp"):
                shutil.rmtree(entry, ignore_errors=True)

    def _read_tensors(
        self, directory: Path, table: list[dict[str, Any]]
    ) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        handles: dict[str, Any] = {}
        try:
            for entry in table:
                t = torch.empty(entry["shape"], dtype=_dtype(entry["dtype"]))
                fh = handles.get(entry["file"])
                if fh is None:
                    fh = handles[entry["file"]] = open(directory / entry["file"], "rb")  # noqa: SIM115
                fh.seek(entry["offset"])
                view, got = _view(t), 0
                while got < len(view):
                    n = fh.readinto(view[got:])
                    if not n:
                        raise StorageError(f"{entry['file']}: truncated at tensor {entry['index']}")
                    got += n
                out[entry["index"]] = t
        finally:
            for fh in handles.values():
                fh.close()
        return out

    def _load(self, directory: Path, state: TrainState) -> None:
        shared_skel, shared_table = _safe_loads((directory / "shared.pkl").read_bytes())
        private_skel, private_table = _safe_loads(
            (directory / f"rank-{self.rank:05d}.pkl").read_bytes()
        )
        shared = _unflatten(shared_skel, self._read_tensors(directory, shared_table))
        private = _unflatten(private_skel, self._read_tensors(directory, private_table))
        merged = {**shared, **private}
        _unwrap(state.model).load_state_dict(merged["model"])
        if state.optimizer is not None:
            state.optimizer.load_state_dict(merged["optimizer"])
        if state.scheduler is not None:
            state.scheduler.load_state_dict(merged["scheduler"])
        if state.loader is not None:
            state.loader.load_state_dict(merged["loader"])
        for name, obj in state.extra.items():
            obj.load_state_dict(merged["extra"][name])
        self._restored_rng = merged["rng"]
        restore_rng(merged["rng"])

    # ---- save ----
    def should_save(self, step: int) -> bool:
        """Every `every` steps, and when `interval_s` has passed (checked every
        `check_every` steps, by all ranks together so that they save the same step)."""
        if self.config.every > 0 and step % self.config.every == 0:
            return True
        if self.config.interval_s <= 0 or step % self.config.check_every:
            return False
        due = time.monotonic() - self._last_save_clock >= self.config.interval_s
        if self._clock_group is None:
            return due
        flag = torch.tensor([1 if due else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._clock_group)
        return int(flag.item()) == 1

    def in_flight(self) -> bool:
        return self._job is not None and not (self._job.future and self._job.future.done())

    def save(self, step: int, state: TrainState, *, blocking: bool = False) -> None:
        """Start a checkpoint of ``state`` at ``step``. Blocks only for back-pressure, the
        snapshot of Python state and buffers, and (if ``blocking``) the commit."""
        t0 = time.perf_counter()
        self._last_save_clock = time.monotonic()
        self.wait()  # back-pressure: one save in flight; surfaces background errors
        if step == self.last_saved_step:
            self.last_stall_s = time.perf_counter() - t0
            return
        shared_obj, private_obj, safe = _snapshot(step, state)
        shared: list[torch.Tensor] = []
        private: list[torch.Tensor] = []
        shared_skel = _flatten(shared_obj, shared)
        private_skel = _flatten(private_obj, private)
        sig = tuple((tuple(t.shape), str(t.dtype)) for t in shared)
        if self._layout is None or self._layout.signature != sig:
            if state.replicated:
                self._check_same_layout(sig)
            self._layout = self._plan(sig, shared, replicated=state.replicated)
        shared_table, private_table, mine = self._tables(shared, private)
        job = _Job(
            step=step,
            shared_blob=_dumps_checked((shared_skel, shared_table)),
            private_blob=_dumps_checked((private_skel, private_table)),
            shared=[shared[i] for i in mine],
            private=private,
        )
        # Tensors that forward may mutate (buffers, RNG, user extras) are copied now; params
        # and optimizer state only change in optimizer.step(), which waits for staging.
        self._ensure_buffers(job.shared + job.private)
        stage_now = [
            i
            for i, t in enumerate(job.shared + job.private)
            if t.untyped_storage().data_ptr() not in safe
        ]
        srcs = job.shared + job.private
        for i in stage_now:
            self._buffers[i].copy_(srcs[i])
        if any(t.is_cuda for t in srcs):
            stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream())
            job.cuda_stream = stream
        later = sorted(set(range(len(srcs))) - set(stage_now))
        self._job = job
        self.last_saved_step = step
        job.future = self._pool.submit(self._persist, job, later)
        if blocking:
            self.wait()
        self.last_stall_s = time.perf_counter() - t0

    def wait_for_staging(self) -> float:
        """Block until the host copy of the in-flight save is done; returns seconds blocked."""
        job = self._job
        if job is None or job.staged.is_set():
            return 0.0
        t0 = time.perf_counter()
        while not job.staged.wait(0.05):
            if job.future is not None and job.future.done():
                job.future.result()  # re-raise the writer's error
                break
        blocked = time.perf_counter() - t0
        self.last_stall_s += blocked
        return blocked

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the in-flight save (if any) committed; re-raises its error.
        Returns False if ``timeout`` expired first."""
        job = self._job
        if job is not None and job.future is not None:
            try:
                job.future.result(timeout)
            except TimeoutError:
                return False
        return True

    def poll(self) -> None:
        """Raise a background failure promptly without blocking."""
        job = self._job
        if job is not None and job.future is not None and job.future.done():
            job.future.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    # ---- internals ----
    def _tables(
        self, shared: list[torch.Tensor], private: list[torch.Tensor]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
        """Where each tensor's bytes go: shared ones in their owner's file, then private."""
        assert self._layout is not None
        shared_table = [
            {
                "index": i,
                "file": f"rank-{self._layout.owners[i]:05d}.bin",
                "offset": self._layout.offsets[i],
                "shape": list(t.shape),
                "dtype": str(t.dtype),
            }
            for i, t in enumerate(shared)
        ]
        mine = [i for i, o in enumerate(self._layout.owners) if o == self.rank]
        base = sum(_nbytes(shared[i]) for i in mine)
        private_table, offset = [], base
        for i, t in enumerate(private):
            private_table.append(
                {
                    "index": i,
                    "file": f"rank-{self.rank:05d}.bin",
                    "offset": offset,
                    "shape": list(t.shape),
                    "dtype": str(t.dtype),
                }
            )
            offset += _nbytes(t)
        return shared_table, private_table, mine

    def _plan(
        self,
        sig: tuple[tuple[tuple[int, ...], str], ...],
        shared: list[torch.Tensor],
        *,
        replicated: bool,
    ) -> _Layout:
        owners = [0] * len(shared)
        if replicated and self.world_size > 1:
            load = [0] * self.world_size
            # Largest first onto the least-loaded rank; identical on every rank by construction.
            for i in sorted(range(len(shared)), key=lambda j: (-_nbytes(shared[j]), j)):
                r = min(range(self.world_size), key=lambda k: (load[k], k))
                owners[i] = r
                load[r] += _nbytes(shared[i])
        elif not replicated:
            owners = [self.rank] * len(shared)
        offsets, pos = [0] * len(shared), dict.fromkeys(range(self.world_size), 0)
        for i, t in enumerate(shared):
            offsets[i] = pos[owners[i]]
            pos[owners[i]] += _nbytes(t)
        return _Layout(sig, owners, offsets)

    def _ensure_buffers(self, srcs: list[torch.Tensor]) -> None:
        sig = tuple((tuple(t.shape), str(t.dtype)) for t in srcs)
        if sig == self._buffer_sig:
            return  # reuse: allocating GBs of host memory per save would dominate the stall
        pin = torch.cuda.is_available()
        self._buffers = [
            torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin) for t in srcs
        ]
        self._buffer_sig = sig

    def _stage(self, job: _Job, indices: list[int]) -> None:
        srcs = job.shared + job.private
        if job.cuda_stream is not None:
            with torch.cuda.stream(job.cuda_stream):
                for i in indices:
                    self._buffers[i].copy_(srcs[i], non_blocking=True)
            job.cuda_stream.synchronize()
        else:
            for i in indices:
                self._buffers[i].copy_(srcs[i])

    def _persist(self, job: _Job, stage_later: list[int]) -> None:
        try:
            self._stage(job, stage_later)
        finally:
            job.staged.set()
        t0 = time.perf_counter()
        durable = self.config.root / (step_dir_name(job.step) + ".tmp")
        failure: BaseException | None = None
        try:
            self._write_rank_files(job, durable)
        except Exception as err:  # still vote, so peers do not wait for the timeout
            failure = err
        if not self._vote(failure is None):
            if failure is not None:
                raise failure
            raise StorageError(f"checkpoint {job.step}: another rank failed to write its part")
        if self.rank == 0:
            try:
                self._commit(job.step, durable)
            except Exception as err:
                failure = err
        committed = self._broadcast_commit(failure is None)
        if failure is not None:
            raise failure
        if not committed:
            raise StorageError(f"checkpoint {job.step}: rank 0 failed to commit")
        self.last_persist_s = time.perf_counter() - t0
        self.last_commit_step, self.last_commit_time = job.step, time.time()
        self.commits += 1
        if self._on_commit is not None:
            self._on_commit(job.step, self.last_commit_time)

    def _write_rank_files(self, job: _Job, durable: Path) -> None:
        stage_root = self.config.local_root or self.config.root
        workdir = stage_root / durable.name
        workdir.mkdir(parents=True, exist_ok=True)
        files: dict[str, dict[str, Any]] = {}
        data_name = f"rank-{self.rank:05d}.bin"
        files[data_name] = self._write_data(workdir / data_name, job)
        files[f"rank-{self.rank:05d}.pkl"] = _write_bytes(
            workdir / f"rank-{self.rank:05d}.pkl", job.private_blob
        )
        if self.rank == 0:
            files["shared.pkl"] = _write_bytes(workdir / "shared.pkl", job.shared_blob)
        if self.config.local_root is not None:
            durable.mkdir(parents=True, exist_ok=True)
            for fname, meta in files.items():
                _upload(workdir / fname, durable / fname, meta)
            fsync_dir(durable)
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            fsync_dir(workdir)
        write_atomic(
            durable / f"rank-{self.rank:05d}.done.json",
            json.dumps({"rank": self.rank, "files": files}).encode(),
        )

    # Coordination runs on a dedicated gloo group from the writer thread: a dead peer shows up
    # as a connection error within seconds instead of an endless wait for its files.
    def _vote(self, ok: bool) -> bool:
        if self._group is None:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        return int(flag.item()) == 1

    def _broadcast_commit(self, ok: bool) -> bool:
        if self._group is None:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.broadcast(flag, src=0, group=self._group)
        return int(flag.item()) == 1

    def _write_data(self, path: Path, job: _Job) -> dict[str, Any]:
        h = hashlib.sha256()
        size = 0
        kill_midway = self._faults.in_checkpoint_write(job.step)
        with open(path, "wb") as fh:
            for k, buf in enumerate(self._buffers):
                view = _view(buf)
                for start in range(0, len(view), _CHUNK):
                    chunk = view[start : start + _CHUNK]
                    fh.write(chunk)
                    h.update(chunk)
                    size += len(chunk)
                if kill_midway and k >= len(self._buffers) // 2:
                    fh.flush()
                    os.fsync(fh.fileno())
                    os.kill(os.getpid(), signal.SIGKILL)
            fh.flush()
            os.fsync(fh.fileno())
        return {"size": size, "sha256": h.hexdigest()}

    def _commit(self, step: int, durable: Path) -> None:
        votes = [durable / f"rank-{r:05d}.done.json" for r in range(self.world_size)]
        files: dict[str, Any] = {}
        for vote in votes:
            files.update(json.loads(vote.read_text())["files"])
            files[vote.name] = {"size": vote.stat().st_size, "sha256": sha256_file(vote)}
        manifest = {
            "format": FORMAT,
            "step": step,
            "world_size": self.world_size,
            "created_unix": time.time(),
            "torch": torch.__version__,
            "files": files,
        }
        write_atomic(durable / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        final = self.config.root / step_dir_name(step)
        if final.exists():  # never write into a committed directory; keep the old one aside
            _quarantine(final)
        os.replace(durable, final)
        fsync_dir(self.config.root)
        write_atomic(self.config.root / LATEST, f"{step}\n".encode())
        self._retain()

    def _retain(self) -> None:
        steps = committed_steps(self.config.root)
        for old in steps[: max(0, len(steps) - self.config.keep)]:
            try:
                shutil.rmtree(self.config.root / step_dir_name(old))
            except OSError as err:  # a failed delete costs space, not correctness
                log.warning("could not delete old checkpoint %s: %s", old, err)


def _snapshot(step: int, state: TrainState) -> tuple[dict[str, Any], dict[str, Any], set[int]]:
    """Python-side state now (it is pickled at once); tensors are still live references.
    Also returns the storages that only ``optimizer.step()`` mutates (safe to copy later)."""
    model_sd = _unwrap(state.model).state_dict()
    safe = {p.untyped_storage().data_ptr() for p in state.model.parameters()}
    shared_obj: dict[str, Any] = {"step": step}
    private_obj: dict[str, Any] = {"rng": capture_rng(), "extra": {}}
    target = shared_obj if state.replicated else private_obj
    target["model"] = model_sd
    if state.optimizer is not None:
        opt_sd = state.optimizer.state_dict()
        for per_param in opt_sd["state"].values():
            for value in per_param.values():
                if isinstance(value, torch.Tensor):
                    safe.add(value.untyped_storage().data_ptr())
        target["optimizer"] = opt_sd
    if state.scheduler is not None:
        target["scheduler"] = state.scheduler.state_dict()
    if state.loader is not None:
        private_obj["loader"] = state.loader.state_dict()
    for name, obj in state.extra.items():
        private_obj["extra"][name] = obj.state_dict()

    return shared_obj, private_obj, safe


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "module", None)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and isinstance(
        inner, torch.nn.Module
    ):
        return inner
    return model


def _write_bytes(path: Path, data: bytes) -> dict[str, Any]:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _upload(src: Path, dst: Path, meta: dict[str, Any]) -> None:
    """Copy to the durable tier, re-hashing what was read back from the local disk."""
    h = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            fout.write(chunk)
            h.update(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    if h.hexdigest() != meta["sha256"]:
        raise StorageError(f"{src}: local copy does not match what was written")
