"""Who am I in the job: topology from the environment the scheduler/launcher provided.

Two levels:

* :func:`node_plan` (supervisor, one per pod): how many nodes, which node this pod is, how
  many processes to start, where to rendezvous. Sources: explicit ``PET_*`` (Kubeflow Trainer
  v2 / elastic PyTorchJob), pod-level ``MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK`` (PyTorchJob
  v1 and Volcano's pytorch plugin: these count *pods*), Volcano ``env``/``svc`` plugins, or a
  single node.
* :func:`process_topology` (worker): this process's rank/world from torchrun/elastic, or a
  pod-per-process job started without a launcher, or a lone process.

Both raise :class:`TopologyError` naming the missing variables when the environment is partial.
Pure functions of a mapping: no torch import (``init_process_group`` imports it lazily).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Literal

from .contract import (
    COMM_TIMEOUT_S_DEFAULT,
    ENV_COMM_TIMEOUT_S,
    ENV_NPROC_PER_NODE,
    ENV_RDZV_JOIN_TIMEOUT_S,
    ENV_RDZV_LAST_CALL_TIMEOUT_S,
    ENV_RDZV_STORE_HOST,
    ENV_VOLCANO_MASTER_TASK,
    ENV_VOLCANO_WORKER_TASK,
)
from .exitcodes import ConfigError

Source = Literal["elastic", "pod-env", "pet", "volcano-svc", "single"]
VOLCANO_DEFAULT_PORT = 23456
_POD_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_ELASTIC_VARS = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TopologyError(ConfigError):
    """The environment does not describe a consistent distributed job."""


@dataclass(frozen=True)
class ProcessTopology:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: Source
    restart_count: int = 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class NodePlan:
    """What the supervisor passes to ``elastic_launch``."""

    num_nodes: int | tuple[int, int]  # exact, or (min, max) for elastic jobs
    node_rank: int | None  # None: let a dynamic rendezvous assign it
    nproc_per_node: int
    rdzv_backend: Literal["static", "c10d"]
    rdzv_endpoint: str
    run_id: str
    source: Source
    # c10d only: whether this pod hosts the rendezvous store; None lets torch guess from the
    # endpoint's host name (c10d_rendezvous_backend.py, _create_tcp_store).
    store_host: bool | None = None
    # c10d only: the rendezvous' join_timeout and last_call_timeout in seconds; None: torch's
    # defaults, 600 and 30 (dynamic_rendezvous.py, RendezvousTimeout._DEFAULT_TIMEOUTS).
    join_timeout_s: int | None = None
    last_call_timeout_s: int | None = None

    @property
    def elastic(self) -> bool:
        """The node count is a range (``PET_NNODES=MIN:MAX``)."""
        return isinstance(self.num_nodes, tuple)

    def world_sizes(self) -> list[int]:
        """Every world size this plan may run at: nodes x processes per node."""
        lo, hi = self.num_nodes if isinstance(self.num_nodes, tuple) else (self.num_nodes,) * 2
        return [n * self.nproc_per_node for n in range(lo, hi + 1)]


def _int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    raw = env[name]
    try:
        value = int(raw)
    except ValueError:
        raise TopologyError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise TopologyError(f"{name}={value} must be >= {minimum}")
    return value


def _require(env: Mapping[str, str], names: tuple[str, ...], context: str) -> None:
    missing = [n for n in names if not env.get(n)]
    if missing:
        present = [n for n in names if env.get(n)]
        raise TopologyError(
            f"{context}: missing environment variable(s) {', '.join(missing)}"
            + (f" (found {', '.join(present)})" if present else "")
        )


def _check_rank(rank: int, world: int, rank_name: str, world_name: str) -> None:
    if world < 1:
        raise TopologyError(f"{world_name}={world} must be >= 1")
    if not 0 <= rank < world:
        raise TopologyError(f"{rank_name}={rank} is outside 0..{world - 1} ({world_name})")


def process_topology(env: Mapping[str, str] | None = None) -> ProcessTopology:
    """Topology of the current worker process."""
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_RUN_ID") and env.get("LOCAL_RANK") is not None:
        _require(env, _ELASTIC_VARS, "torchrun/elastic worker")
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", minimum=1)
        local_rank = _int(env, "LOCAL_RANK")
        local_world = _int(env, "LOCAL_WORLD_SIZE", minimum=1)
        _check_rank(rank, world, "RANK", "WORLD_SIZE")
        _check_rank(local_rank, local_world, "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        node_rank = _int(env, "GROUP_RANK") if env.get("GROUP_RANK") else rank // local_world
        num_nodes = (
            _int(env, "GROUP_WORLD_SIZE", minimum=1)
            if env.get("GROUP_WORLD_SIZE")
            else max(1, world // local_world)
        )
        restarts = (
            _int(env, "TORCHELASTIC_RESTART_COUNT") if env.get("TORCHELASTIC_RESTART_COUNT") else 0
        )
        return ProcessTopology(
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            local_world_size=local_world,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=env["MASTER_ADDR"],
            master_port=_int(env, "MASTER_PORT", minimum=1),
            source="elastic",
            restart_count=restarts,
        )
    if any(env.get(n) for n in _POD_VARS):
        _require(env, _POD_VARS, "pod-level distributed environment (PyTorchJob/Volcano)")
        nproc = _nproc_hint(env)
        if nproc is not None and nproc > 1:
            raise TopologyError(
                f"WORLD_SIZE/RANK count pods here but {nproc} processes per pod were requested; "
                "start the job with `python -m trainstack_runtime.supervisor` so each process "
                "gets its own rank"
            )
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", minimum=1)
        _check_rank(rank, world, "RANK", "WORLD_SIZE")
        return ProcessTopology(
            rank=rank,
            world_size=world,
            local_rank=0,
            local_world_size=1,
            node_rank=rank,
            num_nodes=world,
            master_addr=env["MASTER_ADDR"],
            master_port=_int(env, "MASTER_PORT", minimum=1),
            source="pod-env",
        )
    pet = sorted(k for k in env if k.startswith("PET_"))
    if pet:
        raise TopologyError(
            f"node-level launcher arguments ({', '.join(pet)}) are set but this process was not "
            "started by a launcher; run it under `python -m trainstack_runtime.supervisor`"
        )
    if env.get("VC_TASK_INDEX") or env.get("VK_TASK_INDEX"):
        hosts = sorted(k for k in env if k.startswith("VC_") and k.endswith("_HOSTS"))
        if hosts:
            raise TopologyError(
                "Volcano env/svc variables are set but no ranks were assigned; run under "
                "`python -m trainstack_runtime.supervisor`"
            )
    return ProcessTopology(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=_free_port(),
        source="single",
    )


def _nproc_hint(env: Mapping[str, str]) -> int | None:
    for name in (ENV_NPROC_PER_NODE, "PET_NPROC_PER_NODE"):
        raw = env.get(name)
        if raw and raw.isdigit():
            return int(raw)
    return None


def _nproc(env: Mapping[str, str], gpus: int) -> int:
    for name in (ENV_NPROC_PER_NODE, "PET_NPROC_PER_NODE"):
        raw = env.get(name)
        if not raw:
            continue
        if raw in ("auto", "gpu"):
            return max(gpus, 1)
        if raw == "cpu":
            return os.cpu_count() or 1
        if raw.isdigit() and int(raw) >= 1:
            return int(raw)
        raise TopologyError(f"{name}={raw!r} must be a positive integer, auto, gpu or cpu")
    return max(gpus, 1)


def _nnodes(raw: str) -> int | tuple[int, int]:
    lo, sep, hi = raw.partition(":")
    try:
        if not sep:
            n = int(lo)
            if n < 1:
                raise ValueError
            return n
        a, b = int(lo), int(hi)
        if not 1 <= a <= b:
            raise ValueError
        return (a, b)
    except ValueError:
        raise TopologyError(
            f"PET_NNODES={raw!r} must be N or MIN:MAX with 1 <= MIN <= MAX"
        ) from None


def _task_env(task: str) -> str:
    return task.upper().replace("-", "_")


def _store_host(env: Mapping[str, str]) -> bool | None:
    """``TRAINSTACK_RDZV_STORE_HOST``: whether this pod hosts the c10d store.

    torch decides it from the endpoint's host name when not told
    (c10d_rendezvous_backend.py ``_create_tcp_store`` -> utils.py
    ``_matches_machine_hostname``): true only for ``localhost``, a loopback address, this
    machine's own host name, its canonical name, or an address the endpoint resolves to. A
    Volcano endpoint ``job-master-0.job`` is none of the first three on the master pod (its
    host name is ``job-master-0``, its canonical name the full
    ``job-master-0.job.<namespace>.svc.cluster.local`` of the kubelet's /etc/hosts), so the
    answer rests on the headless Service's DNS record, which may not resolve yet when the pod
    starts: then no pod hosts the store and every node times out joining. The platform says
    which pod hosts it instead."""
    raw = env.get(ENV_RDZV_STORE_HOST)
    if not raw:
        return None
    if raw not in ("0", "1"):
        raise TopologyError(f"{ENV_RDZV_STORE_HOST}={raw!r} must be 1 (this pod) or 0")
    return raw == "1"


def _seconds(env: Mapping[str, str], name: str) -> int | None:
    if not env.get(name):
        return None
    # torch reads these as whole seconds (RendezvousParameters.get_as_int) and refuses 0.
    return _int(env, name, minimum=1)


def node_plan(
    env: Mapping[str, str] | None = None,
    *,
    gpus: int = 0,
    hostname: str | None = None,
) -> NodePlan:
    """Launcher plan for this pod. ``gpus`` is the visible accelerator count.

    ``TRAINSTACK_RDZV_STORE_HOST`` and the rendezvous timeouts apply to every plan but a
    single node's (whose endpoint is ``localhost``)."""
    env = os.environ if env is None else env
    plan = _plan(env, gpus, hostname)
    if plan.source == "single":
        return plan
    return replace(
        plan,
        store_host=_store_host(env),
        join_timeout_s=_seconds(env, ENV_RDZV_JOIN_TIMEOUT_S),
        last_call_timeout_s=_seconds(env, ENV_RDZV_LAST_CALL_TIMEOUT_S),
    )


def _plan(env: Mapping[str, str], gpus: int, hostname: str | None) -> NodePlan:
    nproc = _nproc(env, gpus)
    run_id = env.get("PET_RDZV_ID") or env.get("TORCHELASTIC_RUN_ID") or "trainstack"
    if env.get("PET_NNODES"):
        nodes = _nnodes(env["PET_NNODES"])
        endpoint = env.get("PET_RDZV_ENDPOINT")
        if not endpoint:
            addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
            port = env.get("PET_MASTER_PORT") or env.get("MASTER_PORT")
            if not (addr and port):
                raise TopologyError(
                    "PET_NNODES is set: missing PET_RDZV_ENDPOINT, or PET_MASTER_ADDR and "
                    "PET_MASTER_PORT (MASTER_ADDR/MASTER_PORT also accepted)"
                )
            endpoint = f"{addr}:{port}"
        node_rank: int | None = None
        for name in ("PET_NODE_RANK", "RANK"):
            if env.get(name) and isinstance(nodes, int):
                node_rank = _int(env, name)
                _check_rank(node_rank, nodes, name, "PET_NNODES")
                break
        backend = env.get("PET_RDZV_BACKEND") or ("static" if node_rank is not None else "c10d")
        if backend not in ("static", "c10d"):
            raise TopologyError(f"PET_RDZV_BACKEND={backend!r}: only static and c10d are supported")
        if backend == "static" and node_rank is None:
            raise TopologyError("static rendezvous needs PET_NODE_RANK")
        return NodePlan(nodes, node_rank, nproc, backend, endpoint, run_id, "pet")  # type: ignore[arg-type]
    if any(env.get(n) for n in _POD_VARS):
        _require(env, _POD_VARS, "pod-level distributed environment (PyTorchJob/Volcano)")
        pods, pod_rank = _int(env, "WORLD_SIZE", minimum=1), _int(env, "RANK")
        _check_rank(pod_rank, pods, "RANK", "WORLD_SIZE")
        return NodePlan(
            pods,
            pod_rank,
            nproc,
            "static",
            f"{env['MASTER_ADDR']}:{_int(env, 'MASTER_PORT', minimum=1)}",
            run_id,
            "pod-env",
        )
    index = env.get("VC_TASK_INDEX") or env.get("VK_TASK_INDEX")
    if index is not None:
        master = env.get(ENV_VOLCANO_MASTER_TASK, "master")
        worker = env.get(ENV_VOLCANO_WORKER_TASK, "worker")
        mkey, wkey = f"VC_{_task_env(master)}_HOSTS", f"VC_{_task_env(worker)}_HOSTS"
        if not env.get(mkey):
            raise TopologyError(
                f"Volcano VC_TASK_INDEX is set: missing {mkey} (svc plugin); set "
                f"{ENV_VOLCANO_MASTER_TASK} if the master task has another name"
            )
        masters = env[mkey].split(",")
        workers = env[wkey].split(",") if env.get(wkey) else []
        host = (hostname or socket.gethostname()).split(".")[0]
        ordered = masters + workers
        short = [h.split(".")[0] for h in ordered]
        if host not in short:
            raise TopologyError(f"hostname {host!r} is not listed in {mkey} or {wkey}")
        port = env.get("MASTER_PORT") or str(VOLCANO_DEFAULT_PORT)
        return NodePlan(
            len(ordered),
            short.index(host),
            nproc,
            "static",
            f"{masters[0]}:{port}",
            run_id,
            "volcano-svc",
        )
    return NodePlan(1, 0, nproc, "c10d", "localhost:0", run_id, "single")


def restartable(
    plan: NodePlan, max_restarts: int, env: Mapping[str, str] | None = None
) -> NodePlan:
    """The plan to launch with when the worker group may restart in the pod.

    The static rendezvous cannot restart: ``StaticTCPRendezvous.next_rendezvous`` keeps one
    TCPStore for every round, its ``use_agent_store`` is always True, and the workers'
    ``env://`` store is that same store without a per-round prefix
    (torch/distributed/rendezvous.py ``_create_c10d_store``: "We create a new TCPStore for
    every retry so no need to add prefix"). A restarted worker reads the keys its dead peers
    left there (gloo's addresses) and fails to connect, or waits for ever (issue 22 #4).
    The c10d dynamic rendezvous prefixes its store by round (dynamic_rendezvous.py
    ``_wrap_store``) and, with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the supervisor sets
    it), gives each round's workers a new store on a fresh port; its rounds also restart the
    other pods' workers when one pod's fail (``num_nodes_waiting``), which static does not.

    So a static plan the environment only implied (pod-level variables, Volcano) becomes c10d
    on the same endpoint, hosted by node rank 0 (the pod the endpoint names) unless
    ``TRAINSTACK_RDZV_STORE_HOST`` says which, with a fixed node count; node ranks then
    follow the rendezvous (sorted host names), not ``RANK``. An explicit
    ``PET_RDZV_BACKEND=static`` with restarts is refused.
    """
    env = os.environ if env is None else env
    if max_restarts <= 0 or plan.rdzv_backend != "static":
        return plan
    if plan.source == "pet" and env.get("PET_RDZV_BACKEND") == "static":
        raise TopologyError(
            f"PET_RDZV_BACKEND=static cannot restart workers in the pod (max restarts "
            f"{max_restarts}): its store keeps the dead workers' addresses; use "
            "PET_RDZV_BACKEND=c10d, or TRAINSTACK_MAX_RESTARTS=0 and let the job restart"
        )
    host = plan.store_host if plan.store_host is not None else plan.node_rank == 0
    return replace(plan, rdzv_backend="c10d", store_host=host)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def comm_timeout(env: Mapping[str, str] | None = None) -> timedelta:
    env = os.environ if env is None else env
    raw = env.get(ENV_COMM_TIMEOUT_S)
    if not raw:
        return timedelta(seconds=COMM_TIMEOUT_S_DEFAULT)
    try:
        seconds = float(raw)
    except ValueError:
        raise TopologyError(f"{ENV_COMM_TIMEOUT_S}={raw!r} is not a number") from None
    if seconds <= 0:
        raise TopologyError(f"{ENV_COMM_TIMEOUT_S} must be > 0")
    return timedelta(seconds=seconds)


def init_process_group(topo: ProcessTopology, timeout: timedelta | None = None) -> str:
    """Initialise torch.distributed for ``topo``; returns the backend string used.

    GPU jobs get ``cuda:nccl,cpu:gloo`` so CPU-side collectives (preemption flag, checkpoint
    coordination) have a backend too; CPU jobs get gloo.
    """
    # Imported here so the env parsing above stays importable without torch.
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    backend = "cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(topo.local_rank)
    # Under a launcher, env:// lets workers reuse (or not) the agent's TCPStore as it decided.
    init_method = (
        "env://"
        if topo.source == "elastic"
        else f"tcp://{_bracket(topo.master_addr)}:{topo.master_port}"
    )
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=topo.rank,
        world_size=topo.world_size,
        timeout=timeout or comm_timeout(),
    )
    return backend


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
