"""`trainstack healthcheck`: an all-reduce across N nodes of a pool, as a Volcano Job.

The check is a training job like any other, rendered by the job layer (jobs/render.py) from a
job spec this module writes: the team's namespace and queue, the gang, the svc/env/pytorch
plugins, the pool's node affinity, GPU toleration and fabric devices (EFA, RDMA) and NCCL
environment, the restricted pod, the checkpoint volume and maximum duration the admission
rules require. So it is admitted and scheduled as a team's job is, and it lands only on nodes
the health gate has passed (it does not tolerate the gate's taint).

Each replica takes every GPU of its node, so N replicas land on N distinct nodes, and the
runtime's supervisor starts one process per GPU: `torchrun --nnodes N --nproc-per-node G -m
trainstack_runtime.busbw` (the supervisor is the runtime's torchrun: torch's elastic launch,
nodes and ranks from Volcano's pytorch plugin). busbw prints the algorithm and bus bandwidth
per size as JSON and exits non-zero below `--floor` (images/runtime/trainstack_runtime/busbw.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainstack import outputs as out
from trainstack.catalog import catalog
from trainstack.config.errors import ConfigError, ConfigIssue, did_you_mean
from trainstack.config.schema import schema_issues
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import SCHEMA, build, intrinsic_issues

NAME_PREFIX = "healthcheck-"
MODULE = "trainstack_runtime.busbw"
# What one replica asks besides its node's GPUs and devices: the check's processes need little
# CPU and memory; NCCL's shared-memory transport needs /dev/shm (the runtime's default 64Mi
# container shm is too small for 8 GPUs' buffers).
CPU = "8"
MEMORY = "64Gi"
SHARED_MEMORY = "16Gi"
MAX_DURATION_HOURS = 1  # the check takes minutes; the platform stops it after an hour
DEFAULT_NODES = 2


class UsageError(ConfigError):
    """An argument that names nothing the platform has (exit 2, like a bad stack name)."""


@dataclass(frozen=True)
class Healthcheck:
    """The rendered job and what the CLI reports beside it."""

    manifest: dict[str, Any]
    pool: str
    team: str
    nodes: int
    gpus_per_node: int
    floor_gbps: float | None  # held against the measurement (busbw --floor)
    catalog_floor_gbps: float | None  # the instance type's intra-node floor (the agent's)


def catalog_floor(pool: Mapping[str, Any]) -> float | None:
    """The intra-node all-reduce floor of the pool's instance type, from the catalog (the
    one the node agent holds each node to); None for existing clusters and types without one."""
    instance = pool.get("instanceType")
    if instance is None or instance not in catalog():
        return None
    floor = getattr(catalog()[instance], "busbw_floor_gbps", None)
    return None if floor is None else float(floor)


def _team(view: PlatformView, pool: str, team: str | None) -> str:
    """The team whose namespace and queue run the check: the team stack's, else the first
    team (by name) that may use the pool."""
    if team is not None:
        return team
    slices = out.team_slices(view.outputs)
    allowed = [
        name
        for name, slice_ in sorted(slices.items())
        if pool in (slice_.get("scheduling") or {}).get("pools", [])
    ]
    if not allowed:
        raise ConfigError("healthcheck", [ConfigIssue(pool, "no team may use this pool")])
    return allowed[0]


def job_document(
    *, name: str, team: str, pool: str, image: str, nodes: int, gpus: int, floor: float | None
) -> dict[str, Any]:
    """The check as a job spec (job_specs/schema/job.schema.json)."""
    return {
        "apiVersion": "trainstack.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "team": team, "labels": {"purpose": "healthcheck"}},
        "spec": {
            "image": image,
            "command": ["python", "-m", MODULE],
            "args": [] if floor is None else ["--floor", f"{floor:g}"],
            "pool": pool,
            "workers": {"replicas": nodes, "gpus": gpus, "cpu": CPU, "memory": MEMORY},
            "sharedMemory": SHARED_MEMORY,
            # Required of every job (policy checkpoint-volume); the check writes none.
            "checkpoint": {"intervalSeconds": 1800, "keep": 1, "graceSeconds": 60},
            "maxDurationHours": MAX_DURATION_HOURS,
            # A failed check is an answer, not something to retry.
            "retry": {"maxRetries": 1, "maxPreemptions": 0},
        },
    }


def healthcheck(
    view: PlatformView,
    pool_name: str,
    *,
    image: str,
    nodes: int | None = None,
    team: str | None = None,
    floor: float | None = None,
) -> Healthcheck:
    """The check's Volcano Job for `nodes` nodes of `pool_name`. UsageError for a pool the
    platform lacks or more nodes than it may have; ConfigError for what the job layer refuses
    (an unpinned image, a team without the pool)."""
    pool = view.pool(pool_name)
    if pool is None:
        names = view.pool_names()
        raise UsageError(
            "POOL",
            [
                ConfigIssue(
                    pool_name,
                    f"unknown pool{did_you_mean(pool_name, names)}; the platform has: "
                    f"{', '.join(names) or 'no GPU pools'}",
                )
            ],
        )
    most = int(pool["maxNodes"])
    count = min(DEFAULT_NODES, most) if nodes is None else nodes
    if count < 1 or count > most:
        raise UsageError(
            "--nodes",
            [
                ConfigIssue(
                    str(count), f"pool {pool_name} has at most {most} nodes; pass 1 to {most}"
                )
            ],
        )
    gpus = int(pool["gpusPerNode"])
    intra = catalog_floor(pool)
    # The catalog's floor is an intra-node figure (NVLink): it judges a one-node check only.
    # Across nodes the network bounds the bus bandwidth; pass --floor for that.
    applied = floor if floor is not None else (intra if count == 1 else None)
    who = _team(view, pool_name, team)
    name = f"{NAME_PREFIX}{pool_name}"
    doc = job_document(
        name=name, team=who, pool=pool_name, image=image, nodes=count, gpus=gpus, floor=applied
    )
    issues = schema_issues(SCHEMA, doc, "job") + intrinsic_issues(doc)
    if issues:
        raise ConfigError("healthcheck", issues)
    manifest = render(build(doc, "healthcheck"), view, who)
    return Healthcheck(manifest, pool_name, who, count, gpus, applied, intra)
