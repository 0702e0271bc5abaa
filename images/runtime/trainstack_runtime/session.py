"""Worker-side glue: one object a training loop talks to, and ``run()`` to exit correctly.

Typical loop::

    def main() -> None:
        with Session.start() as s:
            ...build model/optimizer/scheduler/loader...
            state = TrainState(model, optimizer, scheduler, loader)
            start = s.restore(state)
            s.watch_comm(model)
            for step in range(start + 1, total + 1):
                with s.timed_data():
                    batch = next(loader)
                loss = ...
                with s.timed_backward():
                    loss.backward()
                optimizer.step()
                scheduler.step()
                s.end_step(step, state, samples=len(batch))
            s.finish(total, state)

    if __name__ == "__main__":
        run(main)

``run`` maps whatever ended ``main`` to the exit-code contract, records it for the supervisor
and leaves with ``os._exit`` (a normal interpreter exit with live process groups can turn the
code into a SIGABRT).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from .checkpoint import CheckpointConfig, CheckpointManager, TrainState
from .contract import ENV_RUN_DIR, EXIT_CLASS, RUN_DIR_DEFAULT, ExitCode
from .elastic import BatchPlan, batch_plan
from .exitcodes import ConfigError, Preempted, StorageError, classify_exception, classify_exit
from .faults import Injector
from .handoff import HandoffConfig, hand_off
from .health import ProgressReporter
from .preemption import PreemptionWatcher
from .topology import ProcessTopology, init_process_group, process_topology

log = logging.getLogger("trainstack.session")
# How long a rank whose stop another node asked for waits for its own agent's SIGTERM (the
# agent checks every 0.2 s: supervisor.launch_config's monitor_interval).
PEER_STOP_GRACE_S = 5.0


class CommTimer:
    """Exposed communication time per step: CPU clocks on CPU, CUDA events on CUDA (see
    ``Session.watch_comm``). ``event`` makes the CUDA path testable without a GPU."""

    def __init__(self, event: Callable[[], Any] | None = None) -> None:
        self.cuda = False
        self._event = event or (
            lambda: torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        )
        self._ready: Any = None
        self._pending: list[tuple[Any, Any]] = []
        self._done_s = 0.0

    def start_backward(self) -> None:
        self._ready = None

    def grad_ready(self) -> None:
        if self.cuda:
            event = self._event()
            event.record()
            self._ready = event
        else:
            self._ready = time.perf_counter()

    def end_backward(self) -> None:
        if self._ready is None:
            return
        if self.cuda:
            end = self._event()
            end.record()
            self._pending.append((self._ready, end))
        else:
            self._done_s += max(0.0, time.perf_counter() - self._ready)
        self._ready = None

    def take(self) -> float:
        """Seconds measured since the last call. CUDA pairs are counted once their end event
        has completed (``query()``), which can be a step later; none is waited for."""
        still: list[tuple[Any, Any]] = []
        for start, end in self._pending:
            if end.query():
                self._done_s += max(0.0, start.elapsed_time(end) / 1000.0)
            else:
                still.append((start, end))
        self._pending = still
        out, self._done_s = self._done_s, 0.0
        return out


class Session:
    def __init__(
        self,
        topology: ProcessTopology,
        checkpoints: CheckpointManager,
        progress: ProgressReporter,
        preemption: PreemptionWatcher,
    ) -> None:
        self.topology = topology
        self.checkpoints = checkpoints
        self.progress = progress
        self.preemption = preemption
        self._faults = Injector(topology.rank, topology.restart_count)
        self._last_end = time.perf_counter()
        self._data_s = 0.0
        self._comm = CommTimer()
        self._stall_s = 0.0
        self._hook: Any = None

    @classmethod
    def start(cls, checkpoint_config: CheckpointConfig | None = None) -> Session:
        topo = process_topology()
        # Before init: a SIGTERM during a slow rendezvous must not kill us without a verdict.
        watcher = PreemptionWatcher(distributed=topo.is_distributed)
        if topo.is_distributed:
            init_process_group(topo)
        progress = ProgressReporter(topo.rank, restart_count=topo.restart_count)
        manager = CheckpointManager(
            checkpoint_config or CheckpointConfig.from_env(),
            rank=topo.rank,
            world_size=topo.world_size,
            attempt=topo.restart_count,
            on_commit=progress.checkpoint_committed,
        )
        return cls(topo, manager, progress, watcher)

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.checkpoints.close()
            self.preemption.drain()
            self.progress.set_state("done")
        else:
            self.progress.set_state("exiting")
            # Let a nearly finished save commit (it may spare a restart some steps), but
            # briefly: after a comm failure the peers it waits for may be gone.
            try:
                self.checkpoints.wait(timeout=5.0)
            except Exception as err:  # the original failure is the one to report
                log.warning("in-flight checkpoint failed during shutdown: %s", err)

    # ---- resume ----
    def restore(self, state: TrainState) -> int:
        step = self.checkpoints.restore(state)
        self._last_end = time.perf_counter()
        return step

    def batch_plan(self, micro_batch: int) -> BatchPlan:
        """Micro-batches to accumulate per optimizer step at this world size: the number
        that keeps ``TRAINSTACK_GLOBAL_BATCH`` when it is set, else 1 (the per-worker batch
        is kept). Raises ``ConfigError`` (exit 2) when the global batch cannot be split
        (elastic.batch_plan; docs/runtime.md, "Elastic jobs")."""
        return batch_plan(micro_batch, self.topology.world_size)

    # ---- long phases ----
    @contextmanager
    def phase(self, name: str, *, heartbeat_s: float = 30.0) -> Iterator[None]:
        """Declare a long stretch without steps (evaluation, export, a slow first batch):
        ``with s.phase("evaluating"): ...``. Without it, a phase longer than
        ``TRAINSTACK_HEALTH_STALE_S`` fails ``/healthz``, the kubelet's liveness probe kills
        the container with SIGTERM and the job restarts from its last checkpoint, every time.
        A thread heartbeats while the phase lasts; ``TRAINSTACK_HEALTH_PHASE_S`` (default
        4 h) still bounds it, so a hang inside the phase is caught."""
        self.progress.enter_phase(name)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(heartbeat_s):
                self.progress.heartbeat()

        thread = threading.Thread(target=beat, name=f"phase-{name}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.progress.leave_phase()
            self._last_end = time.perf_counter()  # the phase is not part of the next step

    # ---- timing ----
    @contextmanager
    def timed_data(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._data_s += time.perf_counter() - t0

    def watch_comm(self, model: torch.nn.Module) -> None:
        """Exposed comm = end of backward - when the first layer's gradient was ready: with
        DDP the remaining backward time is spent waiting for the last all-reduce buckets.

        On CUDA both ends are CUDA events on the compute stream, not CPU timestamps: NCCL
        calls are asynchronous, so ``backward()`` returns once kernels are queued and CPU
        clocks measure enqueue time. DDP makes the compute stream wait for its all-reduces
        before backward completes (``Reducer::finalize_backward``), so the end event
        completes after them. Events are read at a later step end, once done (no sync)."""
        first = next((p for p in model.parameters() if p.requires_grad), None)
        if first is None:
            return
        self._comm.cuda = first.is_cuda

        def mark(_: torch.Tensor) -> None:
            self._comm.grad_ready()

        self._hook = first.register_post_accumulate_grad_hook(mark)  # type: ignore[no-untyped-call]

    @contextmanager
    def timed_backward(self) -> Iterator[None]:
        self._comm.start_backward()
        try:
            yield
        finally:
            self._comm.end_backward()

    def before_optimizer_step(self) -> None:
        """Optional: ``optimizer.step()`` itself waits for an in-flight save's staging (a
        step pre-hook), so loops that never call this cannot commit a torn checkpoint."""
        self._stall_s += self.checkpoints.wait_for_staging()

    # ---- per step ----
    def end_step(self, step: int, state: TrainState, *, samples: int = 0) -> None:
        """Metrics, fault injection, periodic checkpoint, preemption. Raises ``Preempted``
        after the emergency checkpoint committed."""
        self._faults.at_step_end(step)
        self.checkpoints.poll()
        self._stall_s += self.checkpoints.take_hook_stall()
        if self.checkpoints.should_save(step):
            self.checkpoints.save(step, state)
            self._stall_s += self.checkpoints.last_stall_s
        now = time.perf_counter()
        if self._stall_s > 0:
            self.progress.checkpoint_stall(self._stall_s)
        self.progress.step(
            step,
            step_time_s=now - self._last_end,
            data_time_s=self._data_s,
            comm_time_s=self._comm.take(),
            samples=samples,
        )
        self._last_end, self._data_s, self._stall_s = now, 0.0, 0.0
        if self.preemption.agreed():
            self.progress.set_state("checkpointing")
            self.checkpoints.save(step, state, blocking=True)
            self.progress.checkpoint_stall(self.checkpoints.last_stall_s)
            self.progress.set_state("exiting")
            if self.topology.num_nodes > 1 and not self.preemption.requested:
                # Another node's rank was signalled. When its agent is restarting the worker
                # group for a new round (a node joined: num_nodes_waiting), this node's agent
                # does the same within its monitor interval; a worker that exits first is
                # read as failed by that agent's previous check (agent/server/api.py
                # _invoke_run: _monitor_workers before num_nodes_waiting), which spends a
                # restart, or ends the pod when none is left. So wait briefly for our own.
                self.preemption.until_signalled(PEER_STOP_GRACE_S)
            raise Preempted(step)

    def finish(
        self,
        step: int,
        state: TrainState,
        *,
        save: bool = True,
        metrics: Mapping[str, Any] | None = None,
    ) -> None:
        """End of training: final checkpoint (so a restart is a no-op), drain, and, with an
        object store configured, wait until that checkpoint is there (tiering.py): the job
        is not complete while its last checkpoint could still be lost with the file system.
        With an artifact location (``TRAINSTACK_ARTIFACT_URI``), rank 0 then hands off the
        model and a report carrying ``metrics`` (handoff.py) before the job can complete."""
        if save:
            self.checkpoints.save(step, state, blocking=True)
        self.checkpoints.wait()
        if self.checkpoints.tier is not None:
            with self.phase("uploading"):
                self.checkpoints.drain_uploads()
        handoff = HandoffConfig.from_env()
        if handoff is None or self.topology.rank != 0:
            return
        final = self.checkpoints.last_commit_step
        if final < 0:
            raise ConfigError("hand-off: the job committed no checkpoint to hand off")
        tier = self.checkpoints.tier
        with self.phase("handoff"):
            try:
                hand_off(
                    handoff,
                    self.checkpoints.config.root,
                    final,
                    metrics,
                    client=tier.client if tier is not None else None,
                    world_size=self.topology.world_size,
                )
            except (ConfigError, StorageError):
                raise
            except Exception as err:  # the store, the registry: retried with the job
                raise StorageError(f"hand-off to {handoff.uri} failed: {err}") from err


# ---- process exit --------------------------------------------------------------------------
def _exit_record_path(rank: int) -> Path:
    base = Path(os.environ.get(ENV_RUN_DIR) or RUN_DIR_DEFAULT)
    return base / "exit" / f"rank-{rank:05d}.json"


def _destroy_pg(timeout_s: float = 10.0) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        return
    done = threading.Event()

    def destroy() -> None:
        try:
            dist.destroy_process_group()
        finally:
            done.set()

    threading.Thread(target=destroy, daemon=True).start()
    done.wait(timeout_s)  # a dead peer can make teardown hang; the exit code matters more


def run(main: Callable[[], None]) -> NoReturn:
    """Run ``main`` and exit with the contract code for however it ended."""
    logging.basicConfig(
        level=os.environ.get("TRAINSTACK_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    rank = int(os.environ.get("RANK", "0") or 0)
    code, message = ExitCode.OK, ""
    try:
        main()
    except SystemExit as exc:
        raw = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        code = classify_exit(raw)
        message = f"SystemExit({exc.code!r})"
    except BaseException as exc:
        code = classify_exception(exc)
        message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if code is not ExitCode.PREEMPTED:
            traceback.print_exc()
        log.error("rank %d exiting with %d (%s): %s", rank, code, EXIT_CLASS[code], message)
    try:
        path = _exit_record_path(rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "rank": rank,
            "pid": os.getpid(),
            "code": int(code),
            "class": EXIT_CLASS[code],
            "message": message[:2000],
            "time": time.time(),
        }
        path.write_text(json.dumps(record))
    except OSError:
        pass  # the exit code still carries the verdict
    if code in (ExitCode.OK, ExitCode.PREEMPTED):
        _destroy_pg()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))
