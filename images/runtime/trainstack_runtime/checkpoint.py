"""Whole-state checkpoints on torch.distributed.checkpoint (DCP), with a commit protocol on top.

What DCP does (torch 2.13.0): sharded state dicts for DDP, FSDP2 and DTensor models through
``get_state_dict``/``set_state_dict``; replicated tensors written once, spread over the ranks;
resharding on load (a job resumed on another number of ranks reads the pieces it needs,
straight into its own tensors); staging into reused (pinned where CUDA exists) host copies
through ``DefaultStager``. What this module adds, with the manager here and the rest apart
(layout and verification in ckptfiles.py, how the files are written in ckptwrite.py, the
restricted readers in ckptpickle.py, the ranks' shares of replicated state in ckptshare.py, the
pod's memory for staging in ckptmemory.py):

* **Consistency without a rule to remember.** ``save()`` returns once Python-side state is
  pickled and the tensors that forward can change (module buffers) are copied; parameters and
  optimizer state are staged by DCP's stager in the background while the next forward/backward
  runs. A global optimizer step pre-hook waits for that staging, so no loop (a Hugging Face
  or Lightning loop, a GradScaler, gradient accumulation) can commit step N+1's tensors
  labelled step N.
* **Commit protocol.** Every rank hashes the files it wrote and votes (all-reduce on a
  dedicated gloo group); rank 0 writes manifest.json last, renames ``step-N.tmp`` to
  ``step-N``, applies retention and broadcasts the outcome. Nothing half-written is visible.
* **Verified resume, in parallel.** Each rank hashes its share of the newest checkpoint's
  files; if any rank finds damage the checkpoint is quarantined and the next one tried.
* **Private per-rank state** (RNG streams, data-loader position, scheduler, extras) in one
  small pickle per rank, read with an unpickler that accepts plain data only; DCP's own index
  and non-tensor values are read through restricted unpicklers too.
* **Replicated means replicated.** Plain (non-DTensor) model and optimizer tensors are saved
  once for all ranks; on the first save their contents are compared across ranks, so
  per-rank states (a hand-sharded optimizer, per-rank models) fail loudly instead of being
  restored from another rank. Use ``TrainState(replicated=False)`` for those.
* **A local tier** (``TRAINSTACK_CHECKPOINT_LOCAL_DIR``): each rank writes to its own
  directory on the node's disk and uploads to the durable root, re-hashing what it reads.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (  # _get_fqns: DCP's own key mapping
    _get_fqns,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .ckptfiles import (
    DCP_METADATA,
    FORMAT,
    LATEST,
    MANIFEST,
    Verdict,
    check_candidate,
    committed_steps,
    copy_verified,
    data_files,
    describe,
    fsync_dir,
    quarantine_dir,
    rank_name,
    retain,
    select_checkpoint,
    step_dir_name,
    verify,
    write_atomic,
    write_bytes,
)
from .ckptmemory import staging_memory_issue
from .ckptpickle import (
    SafeLoadPlanner,
    SafeReader,
    dumps_private,
    loads_private,
    unrestorable_value,
)
from .ckptshare import _digest, _nbytes, _SavePlanner, own_share, writers
from .ckptwrite import ChecksumWriter
from .contract import (
    CHECKPOINT_DIR_DEFAULT,
    ENV_CHECKPOINT_CHECK_EVERY,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY,
    ENV_CHECKPOINT_INTERVAL_S,
    ENV_CHECKPOINT_KEEP,
    ENV_CHECKPOINT_LOCAL_DIR,
    ENV_CHECKPOINT_S3_KEEP,
    ENV_CHECKPOINT_S3_URI,
    ENV_COMMIT_TIMEOUT_S,
    KEEP_LAST_DEFAULT,
)
from .exitcodes import ConfigError, StorageError
from .faults import Injector
from .tiering import S3_KEEP_DEFAULT, ObjectTier, Uploader, make_client

__all__ = [
    "FORMAT",
    "MANIFEST",
    "CheckpointConfig",
    "CheckpointManager",
    "TrainState",
    "Verdict",
    "capture_rng",
    "committed_steps",
    "restore_rng",
    "select_checkpoint",
    "step_dir_name",
    "verify",
]

log = logging.getLogger("trainstack.checkpoint")
# DCP warns on every single-process save and load (state_dict_saver.py / state_dict_loader.py,
# ``no_dist``); a job of one process is intended here, not a misconfiguration.
warnings.filterwarnings(
    "ignore",
    message=r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent",
    category=UserWarning,
)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


@dataclass
class TrainState:
    """Everything needed to continue bit-for-bit.

    ``replicated``: plain (non-DTensor) model and optimizer tensors are identical on every
    rank, as with DDP; FSDP2/DTensor shards are always saved per shard. Set False when each
    rank's plain tensors are its own (per-rank models, hand-sharded optimizers): they are then
    saved per rank and can only be resumed on the same number of ranks."""

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
    s3_uri: str | None = None  # a job's prefix in the object store: tiering.py
    s3_keep: int = S3_KEEP_DEFAULT

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
            s3_uri=env.get(ENV_CHECKPOINT_S3_URI) or None,
            s3_keep=int(num(ENV_CHECKPOINT_S3_KEEP, S3_KEEP_DEFAULT)),
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
        if self.s3_keep < 1:
            raise ConfigError(f"{ENV_CHECKPOINT_S3_KEEP} must be >= 1")


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


def buffer_keys(model: torch.nn.Module) -> frozenset[str]:
    """The keys DCP's model state dict gives the module's buffers: DCP's own mapping
    (torch.distributed.checkpoint.state_dict ``_get_fqns``, which drops DDP's ``module.``
    and torch.compile's ``_orig_mod.``). Names from ``named_buffers()`` keep those prefixes,
    so for a compiled model none matched: its buffers were neither snapshotted before async
    staging nor written by rank 0 only (issue 40 #3)."""
    return frozenset(fqn for name, _ in model.named_buffers() for fqn in _get_fqns(model, name))


# --- the manager ----------------------------------------------------------------------------
@dataclass
class _Job:
    step: int
    staging: Future[Any] | Any
    private_blob: bytes
    digest: int | None  # the first save's, of all replicated tensors: compared across ranks
    rank0_only: frozenset[str]
    staged: threading.Event = field(default_factory=threading.Event)
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
        s3_client: Any = None,
    ) -> None:
        config.validate()
        self.config = config
        self.rank, self.world_size = rank, world_size
        self._on_commit = on_commit
        self._faults = Injector(rank, attempt)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt")
        # One stager for the run, handed the same share of the state at every save: it keeps
        # its host copies (pinned with CUDA) and reuses them, so a save allocates no new host
        # memory after the first.
        self._stager = _new_stager()
        self._job: _Job | None = None
        self._saves = 0
        self._restored_rng: dict[str, Any] | None = None
        self._group: Any = None
        if self._dist():
            # DCP's collectives and the votes run here, from the writer thread; gloo, so a dead
            # peer shows up as a connection error, and long enough for the slowest write.
            self._group = dist.new_group(
                backend="gloo", timeout=timedelta(seconds=config.commit_timeout_s)
            )
        self._clock_group: Any = None
        if self._dist() and config.interval_s > 0:
            # Separate from the writer thread's group: collectives on one group must not
            # interleave between threads.
            self._clock_group = dist.new_group(backend="gloo")
        # Every optimizer's step() waits for the in-flight save's staging (see module doc).
        self._hook = register_optimizer_step_pre_hook(self._before_step)
        self._last_save_clock = time.monotonic()
        self.last_saved_step = -1
        self.last_commit_step = -1
        self.last_commit_time = 0.0
        self.last_stall_s = 0.0
        self.hook_stall_s = 0.0  # blocked in optimizer.step() since the last take_hook_stall()
        self.last_persist_s = 0.0
        self.commits = 0
        config.root.mkdir(parents=True, exist_ok=True)
        if config.local_root is not None:
            config.local_root.mkdir(parents=True, exist_ok=True)
        # The object-store tier is rank 0's: it fetches before a restore and uploads after
        # each commit, from a thread of its own (tiering.py).
        self.tier: ObjectTier | None = None
        self._uploader: Uploader | None = None
        if config.s3_uri and rank == 0:
            client = s3_client if s3_client is not None else make_client()
            self.tier = ObjectTier(config.s3_uri, client, config.s3_keep)
            self._uploader = Uploader(self.tier)

    # ---- collectives (tensor only, on the checkpoint group) ----
    def _dist(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _all(self, ok: bool) -> bool:
        """True if ``ok`` on every rank."""
        if self._group is None:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        return int(flag.item()) == 1

    def _same(self, value: int) -> bool:
        """True if every rank passed the same ``value``."""
        if self._group is None:
            return True
        t = torch.tensor([value, -value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
        return int(t[0]) == value and int(t[1]) == -value

    def _from_rank0(self, ok: bool) -> bool:
        if self._group is None:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.broadcast(flag, src=0, group=self._group)
        return int(flag.item()) == 1

    # ---- restore ----
    def restore(self, state: TrainState) -> int:
        """Load the newest valid checkpoint into ``state``; returns its step (0: fresh start).

        Every rank verifies its share of the files; a checkpoint any rank finds damaged is
        quarantined and the next older one tried. RNG is applied last; if you create data
        iterators after this call, call :meth:`reapply_rng` afterwards."""
        self._clean_incomplete()
        self._fetch_from_tier()
        chosen = self._select()
        if chosen is None:
            log.info("no valid checkpoint under %s: starting fresh", self.config.root)
            return 0
        step, manifest = chosen
        directory = self.config.root / step_dir_name(step)
        self._load(directory, manifest, state)
        self.last_commit_step = self.last_saved_step = step
        self.last_commit_time = (directory / MANIFEST).stat().st_mtime
        log.info("rank %d resumed from %s", self.rank, directory)
        if self._uploader is not None:  # a copy a preempted run did not finish: catch up
            self._uploader.submit(step, directory)
        return step

    def _fetch_from_tier(self) -> None:
        """Rank 0 brings the object store's newest complete copy onto the file system when
        the file system has nothing as new; every rank waits for it. A failure is logged and
        the file system's own checkpoints are used: the job still runs."""
        if self.tier is not None:
            try:
                self.tier.fetch_if_newer(self.config.root)
            except Exception as err:  # resume from what the file system has
                log.error("could not fetch a checkpoint from %s: %s", self.tier.uri, err)
        self._all(True)  # barrier: nobody lists the root before the fetch is in place

    def drain_uploads(self, timeout: float | None = None) -> None:
        """Rank 0: wait until the newest committed checkpoint is in the object store.
        StorageError if it is not (the copy failed, or ``timeout`` passed): at the end of
        training a job is not done before its checkpoint is safe. Other ranks: no-op."""
        if self._uploader is None:
            return
        if not self._uploader.drain(timeout):
            raise StorageError(
                f"checkpoint {self.last_commit_step} not copied to {self._uploader.tier.uri} "
                f"within {timeout:.0f} s"
            )
        if self._uploader.last_uploaded_step < self.last_commit_step:
            error = self._uploader.last_error
            raise StorageError(
                f"checkpoint {self.last_commit_step} not copied to "
                f"{self._uploader.tier.uri}: {error[1] if error else 'no upload finished'}"
            )

    def reapply_rng(self) -> None:
        if self._restored_rng is not None:
            restore_rng(self._restored_rng)

    def _clean_incomplete(self) -> None:
        if self.rank == 0:
            for entry in self.config.root.glob("step-*.tmp"):
                shutil.rmtree(entry, ignore_errors=True)
        if self.config.local_root is not None:  # only this rank's: node-mates may be writing
            for entry in self.config.local_root.glob(f"step-*.tmp/{rank_name(self.rank)}"):
                shutil.rmtree(entry, ignore_errors=True)
                _rmdir_if_empty(entry.parent)

    def _select(self) -> tuple[int, dict[str, Any]] | None:
        """The newest step every rank verified, with its manifest; None: start fresh."""
        steps = committed_steps(self.config.root)
        if not self._same(steps[-1] if steps else -1):
            raise StorageError(
                f"ranks see different checkpoints under {self.config.root}: is it one shared "
                "file system for every pod?"
            )
        for step in reversed(steps):
            directory = self.config.root / step_dir_name(step)
            result = check_candidate(directory, share=(self.rank, self.world_size))
            if self._all(result.ok):
                assert result.manifest is not None
                return step, result.manifest
            if self.rank == 0:
                log.error("quarantining %s and falling back", directory)
                quarantine_dir(directory)
            self._all(True)  # barrier: nobody looks at the next one before the move
        return None

    def _load(self, directory: Path, manifest: dict[str, Any], state: TrainState) -> None:
        saved_world = int(manifest.get("world_size", 0))
        same_world = saved_world == self.world_size
        if not state.replicated and not same_world:
            raise ConfigError(
                f"checkpoint {directory} holds per-rank state (TrainState(replicated=False)) "
                f"of {saved_world} ranks; this job has {self.world_size}. Per-rank state "
                "cannot be resharded: run with the same number of ranks"
            )
        # DCP reads into the tensors of state dicts shaped like the live ones: each rank reads
        # only the pieces its shards need (resharding when the world size changed).
        tree = self._tree(state)
        dcp_load(
            tree,
            storage_reader=SafeReader(directory),
            planner=SafeLoadPlanner(),
            process_group=self._group,
            no_dist=self._group is None,
        )
        part = tree if state.replicated else tree[rank_name(self.rank)]
        opts = [state.optimizer] if state.optimizer is not None else []
        set_state_dict(
            state.model,
            opts,
            model_state_dict=part["model"],
            optim_state_dict=part.get("optim", {}),
        )
        source = self.rank if same_world else 0
        private = loads_private((directory / f"{rank_name(source)}.pkl").read_bytes())
        if state.scheduler is not None:
            state.scheduler.load_state_dict(private["scheduler"])
        if state.loader is not None:
            state.loader.load_state_dict(private["loader"])
        for name, obj in state.extra.items():
            obj.load_state_dict(private["extra"][name])
        if same_world:
            self._restored_rng = private["rng"]
            restore_rng(private["rng"])
        else:
            log.warning(
                "resumed on %d ranks from a checkpoint of %d: model and optimizer resharded; "
                "per-rank random streams start fresh, so this resume is not bit-exact",
                self.world_size,
                saved_world,
            )

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
        """Start a checkpoint of ``state`` at ``step``. Blocks only for back-pressure (one
        save in flight), the snapshot of Python state and buffers, and (if ``blocking``) the
        commit. Parameters and optimizer state are staged while training goes on; the next
        ``optimizer.step()`` waits for that staging."""
        t0 = time.perf_counter()
        self._last_save_clock = time.monotonic()
        self.wait()  # back-pressure; surfaces background errors
        if step == self.last_saved_step:
            self.last_stall_s = time.perf_counter() - t0
            return
        private = {
            "step": step,
            "world_size": self.world_size,
            "rng": capture_rng(),
            "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
            "loader": state.loader.state_dict() if state.loader is not None else None,
            "extra": {name: obj.state_dict() for name, obj in state.extra.items()},
        }
        tree = self._tree(state)
        prefix = "model." if state.replicated else f"{rank_name(self.rank)}.model."
        buffers = frozenset(prefix + key for key in buffer_keys(state.model))
        check_replicated = state.replicated and self._saves == 0 and self._dist()
        digest: int | None = None
        if check_replicated:
            # The first save compares every replicated tensor across ranks. Hashed here, on
            # the live tensors a chunk at a time: staging all of them for it held local ranks
            # x the whole state in host memory (issue 40 #6), and optimizer.step() cannot
            # change them before this returns. Buffers are not compared (see _SavePlanner).
            digest = _digest(tree, buffers)
        if state.replicated and self._dist():
            # DCP writes each replicated tensor once, from one rank; staging all of them on
            # every rank copied world_size times what is written (DDP: the whole model and
            # optimizer per rank). Each rank stages and writes only its share, from the
            # first save on, so the stager's host copies are sized to it.
            owner = writers(tree, self.world_size, buffers)
            tree = own_share(tree, lambda name: owner.get(name, self.rank) == self.rank)
        part = tree if state.replicated else tree[rank_name(self.rank)]
        # Forward changes buffers (BatchNorm statistics): copy them now. Parameters and
        # optimizer state change only in optimizer.step(), which waits for the staging.
        for key in list(part["model"]):
            if prefix + key in buffers:
                part["model"][key] = part["model"][key].detach().clone()
        if self._saves == 0:  # the stager keeps its copies: the first save sizes them
            issue = staging_memory_issue(_nbytes(tree), _local_ranks())
            if issue is not None:
                raise ConfigError(issue)
            # What a restore would refuse fails here, not at a resume hours later.
            issue = unrestorable_value(tree)
            if issue is not None:
                raise ConfigError(issue)
        job = _Job(
            step=step,
            staging=self._stager.stage(tree),
            private_blob=dumps_private(private),
            digest=digest,
            rank0_only=buffers if state.replicated else frozenset(),
        )
        self._saves += 1
        self._job = job
        self.last_saved_step = step
        job.future = self._pool.submit(self._persist, job)
        if blocking:
            self.wait()
        self.last_stall_s = time.perf_counter() - t0

    def _tree(self, state: TrainState) -> dict[str, Any]:
        """The DCP state dict: model and optimizer (FQN keys, DTensor shards as they are)."""
        opts = [state.optimizer] if state.optimizer is not None else []
        msd, osd = get_state_dict(state.model, opts)
        tree: dict[str, Any] = {"model": msd}
        if state.optimizer is not None:
            tree["optim"] = osd
        return tree if state.replicated else {rank_name(self.rank): tree}

    def _before_step(self, *_: Any) -> None:
        self.hook_stall_s += self.wait_for_staging()

    def take_hook_stall(self) -> float:
        stall, self.hook_stall_s = self.hook_stall_s, 0.0
        return stall

    def wait_for_staging(self) -> float:
        """Block until the in-flight save's host copy is done; returns seconds blocked. The
        optimizer step pre-hook calls this; calling it yourself is harmless."""
        job = self._job
        if job is None or job.staged.is_set():
            return 0.0
        t0 = time.perf_counter()
        while not job.staged.wait(0.05):
            if job.future is not None and job.future.done():
                job.future.result()  # re-raise the writer's error
                break
        return time.perf_counter() - t0

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
            self._hook.remove()
            self._pool.shutdown(wait=True)
            self._stager.close()
            if self._uploader is not None:
                self._uploader.close()

    # ---- the writer thread ----
    def _persist(self, job: _Job) -> None:
        try:
            staged = job.staging.result() if isinstance(job.staging, Future) else job.staging
        finally:
            job.staged.set()
        t0 = time.perf_counter()
        if job.digest is not None and not self._same(job.digest):
            raise ConfigError(
                "TrainState(replicated=True), but the model or optimizer tensors differ "
                "between ranks (per-rank models, a hand-sharded optimizer): shard with FSDP2 "
                "or DTensor, or pass TrainState(replicated=False)"
            )
        durable = self.config.root / (step_dir_name(job.step) + ".tmp")
        workdir = durable
        if self.config.local_root is not None:  # one directory per rank: node-mates write too
            workdir = self.config.local_root / durable.name / rank_name(self.rank)
        workdir.mkdir(parents=True, exist_ok=True)
        # Collective: every rank's planner and writer run, errors come back on every rank.
        writer = ChecksumWriter(workdir)
        dcp_save(
            staged,
            storage_writer=writer,
            planner=_SavePlanner(self.rank, job.rank0_only),
            process_group=self._group,
            no_dist=self._group is None,
        )
        failure: BaseException | None = None
        try:
            if self._faults.in_checkpoint_write(job.step):
                os.kill(os.getpid(), signal.SIGKILL)  # data written, nothing committed
            self._finish_rank(job, workdir, durable, writer.fs.written)
        except Exception as err:  # still vote, so peers do not wait for the timeout
            failure = err
        if not self._all(failure is None):
            if failure is not None:
                raise failure
            raise StorageError(f"checkpoint {job.step}: another rank failed to write its part")
        if self.rank == 0:
            try:
                self._commit(job.step, durable)
            except Exception as err:
                failure = err
        committed = self._from_rank0(failure is None)
        if failure is not None:
            raise failure
        if not committed:
            raise StorageError(f"checkpoint {job.step}: rank 0 failed to commit")
        self.last_persist_s = time.perf_counter() - t0
        self.last_commit_step, self.last_commit_time = job.step, time.time()
        self.commits += 1
        if self._on_commit is not None:
            self._on_commit(job.step, self.last_commit_time)

    def _finish_rank(
        self, job: _Job, workdir: Path, durable: Path, written: dict[str, dict[str, Any]]
    ) -> None:
        """This rank's private state, checksums of what it wrote (taken as DCP wrote the
        files; uploaded from the local tier when there is one) and its vote file."""
        durable.mkdir(parents=True, exist_ok=True)
        mine = data_files(workdir, self.rank)
        if self.rank == 0:
            mine.append(workdir / DCP_METADATA)
        files: dict[str, dict[str, Any]] = {}
        if workdir != durable:
            for path in mine:
                files[path.name] = copy_verified(path, durable / path.name, written.get(path.name))
            shutil.rmtree(workdir, ignore_errors=True)
            _rmdir_if_empty(workdir.parent)
        else:
            # A file DCP wrote some other way (none in torch 2.13.0) is read back instead.
            files = {path.name: written.get(path.name) or describe(path) for path in mine}
        private = f"{rank_name(self.rank)}.pkl"
        files[private] = write_bytes(durable / private, job.private_blob)
        fsync_dir(durable)
        write_atomic(
            durable / f"{rank_name(self.rank)}.done.json",
            json_bytes({"rank": self.rank, "files": files}),
        )

    def _commit(self, step: int, durable: Path) -> None:
        files: dict[str, Any] = {}
        for rank in range(self.world_size):
            vote = durable / f"{rank_name(rank)}.done.json"
            files.update(json.loads(vote.read_bytes())["files"])
            files[vote.name] = describe(vote)
        manifest = {
            "format": FORMAT,
            "step": step,
            "world_size": self.world_size,
            "created_unix": time.time(),
            "torch": torch.__version__,
            "files": files,
        }
        write_atomic(durable / MANIFEST, json_bytes(manifest, indent=1))
        final = self.config.root / step_dir_name(step)
        if final.exists():  # never write into a committed directory; keep the old one aside
            quarantine_dir(final)
        os.replace(durable, final)
        fsync_dir(self.config.root)
        write_atomic(self.config.root / LATEST, f"{step}\n".encode())
        retain(self.config.root, self.config.keep)
        if self._uploader is not None:
            self._uploader.submit(step, final)


class OrderedStager(DefaultStager):
    """DCP's DefaultStager, its copies ordered after the training stream's queued work.

    With an accelerator, DefaultStager copies on a stream of its own from a background
    thread and never waits for the stream that computed the tensors (torch 2.13.0
    distributed/checkpoint/staging.py ``_stage``: no ``wait_stream``/``wait_event``).
    ``save()`` runs right after ``optimizer.step()``, whose kernels (and the buffer clones)
    may still be queued: the copies could read a mix of two steps, and the manifest's
    checksums, taken over the staged bytes, would bless the torn checkpoint (issue 40 #4).
    An event recorded on the current stream when ``stage`` is called, and waited for by the
    staging stream before its first copy, orders them. No accelerator: no stream, no event.
    """

    def stage(self, state_dict: Any, **kwargs: Any) -> Any:
        ready = None
        if self._staging_stream is not None:
            ready = torch.Event()  # the current accelerator's
            ready.record()  # on its current stream: after everything queued so far
        return super().stage(state_dict, ready=ready, **kwargs)

    def _stage(self, state_dict: Any, **kwargs: Any) -> Any:
        ready = kwargs.pop("ready", None)
        if ready is not None and self._staging_stream is not None:
            self._staging_stream.wait_event(ready)  # device-side: the host does not block
        return super()._stage(state_dict, **kwargs)


def _new_stager() -> DefaultStager:
    cuda = torch.cuda.is_available()
    return OrderedStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,
            use_async_staging=True,
            use_non_blocking_copy=cuda,
        )
    )


def json_bytes(obj: Any, indent: int | None = None) -> bytes:
    return json.dumps(obj, indent=indent, sort_keys=True).encode()


def _local_ranks() -> int:
    raw = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def _rmdir_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (a node-mate still writes) or gone
        path.rmdir()
