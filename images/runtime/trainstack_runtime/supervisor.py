"""Container entrypoint: launch the workers in-process and exit with a classified code.

    python -m trainstack_runtime.supervisor [--nproc-per-node N] [--max-restarts R] \\
        -- train/main.py --steps 1000        (or: -- -m train.main --steps 1000)

Plain ``torchrun`` exits 1 for every worker failure, so retryable and fatal failures look the
same to the scheduler. This wraps ``elastic_launch`` instead, maps each failed rank's exit
status (and the record the worker left through ``session.run``) to the contract, drops ranks
that were only collateral damage, and writes a one-line JSON verdict to the termination log.
It also serves ``/healthz`` and ``/metrics`` for the pod (it outlives worker restarts).
Run it as PID 1 (exec form), or SIGTERM from the kubelet never reaches it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from . import elastic, evidence
from .attempts import record_end, record_start
from .contract import (
    CHECKPOINT_DIR_DEFAULT,
    ENV_CHECKPOINT_DIR,
    ENV_JOB_INSTANCE,
    ENV_JOB_RETRY,
    ENV_MAX_CRASHES,
    ENV_MAX_DURATION_S,
    ENV_MAX_FAILURES,
    ENV_MAX_RESTARTS,
    ENV_RDZV_STORE_HOST,
    ENV_RUN_DIR,
    ENV_SHUTDOWN_TIMEOUT_S,
    ENV_TERMINATION_LOG,
    MAX_CRASHES_DEFAULT,
    RUN_DIR_DEFAULT,
    SHUTDOWN_TIMEOUT_S_DEFAULT,
    TERMINATION_LOG_DEFAULT,
    ExitCode,
    is_retryable,
)
from .crashes import record_crash, record_failure
from .deadline import DeadlineWatch, job_start
from .exitcodes import ConfigError, Outcome, classify_failures, classify_text
from .health import (
    HealthPolicy,
    HealthServer,
    configured_port,
    progress_dir,
    read_records,
    serve,
)
from .preflight import memlock_issue
from .topology import NodePlan, TopologyError, node_plan, restartable

log = logging.getLogger("trainstack.supervisor")
FLIGHT_RECORDER_DIR = "flight-recorder"
# torch's default join timeout (dynamic_rendezvous.py RendezvousTimeout._DEFAULT_TIMEOUTS).
RDZV_JOIN_TIMEOUT_S_TORCH = 600
CGROUP = Path("/sys/fs/cgroup")
# torch reads the first, then the older name (c10d FlightRecorder.cpp, DebugInfoWriter::getWriter).
FLIGHT_RECORDER_PREFIX_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# The pod's health server, once started: supervise() asks it how the last probe went.
HEALTH_SERVER: list[HealthServer] = []


def supervise(config: LaunchConfig, argv: list[str], run_dir: Path) -> Outcome:
    try:
        elastic_launch(config, sys.executable)("-u", *argv)
        return Outcome(ExitCode.OK)
    except SignalException as exc:
        # The launcher already forwarded the signal; workers checkpointed and exited.
        stuck = HEALTH_SERVER[0].failing() if HEALTH_SERVER else None
        if stuck is not None:  # the liveness probe's kill: a hang, not a clean preemption
            return Outcome(
                ExitCode.COMM_ERROR,
                cause=f"{exc.sigval.name} after failing the liveness probe ({stuck})",
            )
        return Outcome(ExitCode.PREEMPTED, cause=f"received {exc.sigval.name}")
    except ChildFailedError as exc:
        return classify_failures(exc.failures, run_dir)
    except RendezvousTimeoutError as exc:
        # The agent's join waited `join_timeout` for the round's minimum of nodes
        # (dynamic_rendezvous.py _RendezvousJoinOp, ERROR_TIMEOUT): the job is below its
        # minimum, and holding the nodes it has left only keeps them idle.
        lo = config.min_nodes
        return Outcome(
            ExitCode.BELOW_MINIMUM,
            cause=f"the rendezvous did not gather its minimum of {lo} nodes in time: {exc}",
        )
    except Exception as exc:  # rendezvous or launcher failure before/between workers
        return Outcome(classify_text(repr(exc), default=ExitCode.COMM_ERROR), cause=repr(exc))


def supervise_until(
    watch: DeadlineWatch | None, config: LaunchConfig, argv: list[str], run_dir: Path
) -> Outcome:
    """`supervise`, stopped at the job's maximum duration if it has one."""
    if watch is None:
        return supervise(config, argv, run_dir)
    if watch.remaining <= 0:
        return Outcome(ExitCode.DEADLINE_EXCEEDED, cause="maximum duration already passed")
    watch.start()
    outcome = supervise(config, argv, run_dir)
    watch.stop()
    if watch.fired.is_set() and outcome.code in (ExitCode.PREEMPTED, ExitCode.OK):
        # The SIGTERM was ours: the workers checkpointed; the job must not retry.
        return Outcome(ExitCode.DEADLINE_EXCEEDED, cause="maximum duration reached")
    return outcome


# Classes the node's hardware evidence overrides: what a failing GPU can look like from the
# process (a crash, the watchdog's SIGABRT, a lost peer, an unexplained exception).
EVIDENCE_OVERRIDES = frozenset(
    {
        ExitCode.CRASH,
        ExitCode.COMM_ERROR,
        ExitCode.PEER_LOST,
        ExitCode.KILLED,
        ExitCode.USER_ERROR,
    }
)


def judge(outcome: Outcome, before: evidence.GpuHealth | None, run_dir: Path) -> Outcome:
    """The workers' verdict, revised by the node's GPU evidence and the restart budgets."""
    if outcome.code in EVIDENCE_OVERRIDES:
        reason = evidence.hardware_evidence(before, evidence.read())
        if reason:
            cause = f"node evidence: {reason}; workers: {outcome.cause}"
            outcome = Outcome(ExitCode.HARDWARE, outcome.ranks, cause)
    if outcome.code is ExitCode.CRASH:
        outcome = _crash_budget(outcome, run_dir)
    return _failure_budget(outcome)


def _crash_budget(outcome: Outcome, run_dir: Path) -> Outcome:
    limit = _env_int(ENV_MAX_CRASHES, MAX_CRASHES_DEFAULT)
    steps = [r.get("last_ckpt_step") for r in read_records(progress_dir(run_dir))]
    committed = max((s for s in steps if isinstance(s, int) and s > 0), default=None)
    try:
        count = record_crash(checkpoint_root(), os.environ.get(ENV_JOB_INSTANCE), committed)
    except OSError as err:
        log.warning("crash not counted: %s", err)
        return outcome
    if count > limit:
        cause = (
            f"crashed {count} times without a new checkpoint ({ENV_MAX_CRASHES}={limit}): "
            f"{outcome.cause}"
        )
        return Outcome(ExitCode.CRASH_LOOP, outcome.ranks, cause)
    return outcome


# Capacity taken away, not a failure of the job: a preemption, and an elastic job left below
# its minimum by reclaim.
NOT_FAILURES = frozenset({ExitCode.PREEMPTED, ExitCode.BELOW_MINIMUM})


def _failure_budget(outcome: Outcome) -> Outcome:
    """A retryable failure counts against the job's maxRetries, once per incarnation; a
    preemption or a lost minimum never does (crashes.py). Without both variables (a pod not
    rendered by trainstack, a run outside Volcano) Volcano's own maxRetry is the only bound."""
    if outcome.code in NOT_FAILURES or not is_retryable(outcome.code):
        return outcome
    limit = _env_int(ENV_MAX_FAILURES, -1)
    incarnation = _env_int(ENV_JOB_RETRY, -1)
    if limit < 0 or incarnation < 0:
        return outcome
    try:
        failed = record_failure(checkpoint_root(), os.environ.get(ENV_JOB_INSTANCE), incarnation)
    except OSError as err:
        log.warning("failure not counted: %s", err)
        return outcome
    if len(failed) <= limit:
        return outcome
    counts = ", ".join(map(str, failed))
    cause = (
        f"failed in {len(failed)} runs of the job (Volcano retry counts {counts}), "
        f"more than its maxRetries ({ENV_MAX_FAILURES}={limit}); preemptions do not count: "
        f"{outcome.cause}"
    )
    return Outcome(ExitCode.RETRIES_EXHAUSTED, outcome.ranks, cause)


def launch_config(plan: NodePlan, *, max_restarts: int, shutdown_timeout: int) -> LaunchConfig:
    lo, hi = plan.num_nodes if isinstance(plan.num_nodes, tuple) else (plan.num_nodes,) * 2
    rdzv_configs: dict[str, Any] = {}
    if plan.rdzv_backend == "static":
        rdzv_configs["rank"] = plan.node_rank
    else:
        # torch's own keys (c10d_rendezvous_backend.py _create_tcp_store; dynamic_rendezvous.py
        # create_handler, which reads "<name>_timeout" as whole seconds).
        if plan.store_host is not None:
            rdzv_configs["is_host"] = plan.store_host
        if plan.store_host is False:
            # A client connects to the store for up to its read timeout, retrying while the
            # host's name does not resolve or its port refuses (torch's TCPStore client):
            # the rendezvous pod may start minutes after a worker (an image pull), and a
            # worker that gave up after torch's 60 s would be restarted alone, spending a
            # retry. As long as a node waits for the others to join.
            rdzv_configs["read_timeout"] = plan.join_timeout_s or RDZV_JOIN_TIMEOUT_S_TORCH
        if plan.join_timeout_s is not None:
            rdzv_configs["join_timeout"] = plan.join_timeout_s
        if plan.last_call_timeout_s is not None:
            rdzv_configs["last_call_timeout"] = plan.last_call_timeout_s
    return LaunchConfig(
        min_nodes=lo,
        max_nodes=hi,
        nproc_per_node=plan.nproc_per_node,
        run_id=plan.run_id if plan.source != "single" else uuid.uuid4().hex,
        rdzv_endpoint=plan.rdzv_endpoint,
        rdzv_backend=plan.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=max_restarts,
        monitor_interval=0.2,
        start_method="spawn",
        shutdown_timeout=shutdown_timeout,
    )


def write_termination_log(message: str) -> None:
    path = Path(os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG_DEFAULT)
    try:
        with open(path, "w") as fh:
            fh.write(message + "\n")
    except OSError as err:  # outside Kubernetes there may be no such file
        log.debug("termination log %s not written: %s", path, err)


def checkpoint_root() -> Path:
    return Path(os.environ.get(ENV_CHECKPOINT_DIR) or CHECKPOINT_DIR_DEFAULT)


def flight_recorder_dumps(root: Path) -> None:
    """Send the NCCL flight recorder's dumps to ``<checkpoint root>/flight-recorder/``.

    torch writes them to ``<prefix><rank>``, by default under ``$HOME/.cache/torch`` in the
    container, lost with it; the checkpoint volume outlives every restart. Each supervisor
    start gets its own prefix (UTC time, host), so a later attempt never overwrites them.
    A job that names its own location (either variable torch reads) keeps it.
    """
    if any(os.environ.get(name) for name in FLIGHT_RECORDER_PREFIX_ENV):
        return
    folder = root / FLIGHT_RECORDER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    prefix = folder / f"{stamp}-{socket.gethostname()}-rank_"
    os.environ[FLIGHT_RECORDER_PREFIX_ENV[0]] = str(prefix)


def cpu_limit(cgroup: Path = CGROUP) -> float | None:
    """This container's CPU limit (the CFS quota over its period), or None if it has none."""
    try:
        try:
            quota, period = (cgroup / "cpu.max").read_text().split()  # cgroup v2
        except FileNotFoundError:  # cgroup v1
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def omp_threads(nproc: int, limit: float | None, cpus: int) -> int:
    """Threads per worker: the pod's CPUs (its limit, else those it may run on) shared out.

    torchrun sets 1 whenever a node runs several workers (torch/distributed/run.py
    config_from_args); sharing the limit gives the same where CPUs are scarce and keeps
    intra-op parallelism where a pod has many CPUs per worker.
    """
    available = cpus if limit is None else min(limit, cpus)
    return max(1, int(available // nproc))


def worker_environment(plan: NodePlan, max_restarts: int) -> None:
    """What the launcher's workers inherit from this process's environment."""
    # torch's own default, 3: the watchdog tears down without aborting the communicators (an
    # abort can hang, pytorch/pytorch#110723); the launcher would pass 1 to the workers
    # where this is unset (torch/distributed/elastic/agent/server/local_elastic_agent.py).
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    flight_recorder_dumps(checkpoint_root())
    if not os.environ.get("OMP_NUM_THREADS"):
        threads = omp_threads(plan.nproc_per_node, cpu_limit(), len(os.sched_getaffinity(0)))
        os.environ["OMP_NUM_THREADS"] = str(threads)
    if max_restarts > 0 or plan.elastic:
        # In-pod restarts with the agent's shared TCPStore hang or fail to reconnect. An
        # elastic job restarts its workers at every change of membership even without a
        # restart budget (agent/server/api.py _invoke_run: "membership changes do not count
        # as retries"), and a shared store outlives the round: dynamic_rendezvous.py
        # next_rendezvous keeps the first round's bootstrap store info on every node but a new
        # rank 0, so the nodes may not even agree on where the workers' store is.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"


def prepare_pod(plan: NodePlan, max_restarts: int) -> Path:
    """The run directory, the workers' environment and the health server; the run dir."""
    run_dir = Path(os.environ.get(ENV_RUN_DIR) or RUN_DIR_DEFAULT)
    for sub in ("progress", "exit"):
        shutil.rmtree(run_dir / sub, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ[ENV_RUN_DIR] = str(run_dir)
    worker_environment(plan, max_restarts)
    port = configured_port()
    if port >= 0:
        try:
            server = serve(port, progress_dir(run_dir), HealthPolicy.from_env())
        except OSError as err:
            raise OSError(err.errno, f"health port {port}: {err.strerror}") from err
        HEALTH_SERVER[:] = [server]
        bound = server.server_address[1]
        (run_dir / "health.port").write_text(f"{bound}\n")
        log.info("health and metrics on :%d", bound)
    return run_dir


def refuse(outcome: Outcome) -> int:
    """Stop before launching any worker, with a verdict."""
    log.error("%s", outcome.cause)
    write_termination_log(outcome.termination_message())
    return int(outcome.code)


def _deadline_watch() -> DeadlineWatch | None:
    """A watch on the job's maximum duration, if the job layer set one."""
    raw = os.environ.get(ENV_MAX_DURATION_S)
    if not raw:
        return None
    try:
        limit = float(raw)
    except ValueError as err:
        raise ConfigError(f"{ENV_MAX_DURATION_S}={raw!r} is not a number of seconds") from err
    return DeadlineWatch(job_start(checkpoint_root(), os.environ.get(ENV_JOB_INSTANCE)) + limit)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("TRAINSTACK_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    parser = argparse.ArgumentParser(prog="python -m trainstack_runtime.supervisor")
    parser.add_argument("--nproc-per-node", type=int, default=None)
    parser.add_argument("--max-restarts", type=int, default=None)
    parser.add_argument("--shutdown-timeout", type=int, default=None)
    parser.add_argument("script", help="training script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    script_args = args.args[1:] if args.args[:1] == ["--"] else args.args

    try:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if args.nproc_per_node is not None:
            os.environ["TRAINSTACK_NPROC_PER_NODE"] = str(args.nproc_per_node)
        plan = node_plan(gpus=gpus)
        max_restarts = (
            args.max_restarts if args.max_restarts is not None else _env_int(ENV_MAX_RESTARTS, 0)
        )
        plan = restartable(plan, max_restarts)
        elastic.check_world_sizes(plan.world_sizes())
        shutdown = (
            args.shutdown_timeout
            if args.shutdown_timeout is not None
            else _env_int(ENV_SHUTDOWN_TIMEOUT_S, SHUTDOWN_TIMEOUT_S_DEFAULT)
        )
        if args.script == "-m":
            # `-- -m package.module args…`: run a module, as `python -m` would.
            if not script_args:
                raise ConfigError("-m needs a module name")
        elif not Path(args.script).is_file():
            raise ConfigError(f"training script {args.script} not found")
        watch = _deadline_watch()
        if issue := memlock_issue(os.environ):
            raise ConfigError(issue)
        run_dir = prepare_pod(plan, max_restarts)
        for name in (ENV_MAX_CRASHES, ENV_MAX_FAILURES, ENV_JOB_RETRY):
            _env_int(name, 0)  # a bad value stops the pod now
        gpu_health = evidence.read()
    except (ConfigError, TopologyError) as err:
        return refuse(Outcome(ExitCode.CONFIG_ERROR, cause=str(err)))
    except OSError as err:
        # The checkpoint volume, the run directory or the health port: the pod's storage or
        # node, which a new pod may not share; retried, not an abort as a traceback (1) was.
        return refuse(Outcome(ExitCode.STORAGE, cause=f"before launch: {err}"))

    if plan.rdzv_backend == "c10d" and plan.source != "single" and plan.store_host is None:
        log.warning(
            "%s is not set: torch guesses whether this pod hosts the rendezvous store from "
            "the host name in %s, which fails for a name DNS does not resolve yet",
            ENV_RDZV_STORE_HOST,
            plan.rdzv_endpoint,
        )
    config = launch_config(plan, max_restarts=max_restarts, shutdown_timeout=shutdown)
    # GPU time and attempts for the hand-off's report (attempts.py).
    ledger = record_start(
        checkpoint_root(),
        os.environ.get(ENV_JOB_INSTANCE),
        _env_int(ENV_JOB_RETRY, 0),
        pod=socket.gethostname(),
        gpus=gpus,
    )
    log.info(
        "launching %s: nodes=%s node_rank=%s nproc=%d rdzv=%s@%s",
        plan.source,
        plan.num_nodes,
        plan.node_rank,
        plan.nproc_per_node,
        plan.rdzv_backend,
        plan.rdzv_endpoint,
    )
    outcome = judge(
        supervise_until(watch, config, [args.script, *script_args], run_dir), gpu_health, run_dir
    )
    record_end(ledger, outcome.code)
    message = outcome.termination_message()
    write_termination_log(message)
    print(f"trainstack verdict: {message}", file=sys.stderr, flush=True)
    return int(outcome.code)


if __name__ == "__main__":
    sys.exit(main())
