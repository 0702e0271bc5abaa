"""What `trainstack explain` reads and what it answers: plain data in, frozen dataclasses out.

`Live` holds the objects as the API server returns them (dicts), `None` where the reader may not
see them (a team member's Role grants no cluster-scoped reads: nodes and queues, builders/
teams.py `member_role`); `Platform` holds what the platform's stack outputs say about the team
and its pools. `Diagnosis` is the answer: a reason code, one line, details and the fix.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = Mapping[str, Any]


class Reason(enum.StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    STARTING = "starting"  # every gang member has a node; containers are starting
    QUEUE_AT_CAPABILITY = "queue-at-capability"
    PARENT_AT_CAPABILITY = "parent-at-capability"
    GUARANTEE_NOT_RECLAIMABLE = "guarantee-not-reclaimable"
    NO_NODE_FITS = "no-node-fits"
    POOL_AT_MAXIMUM = "pool-at-maximum"
    POOL_SCALING = "pool-scaling"
    HEALTH_GATE = "health-gate"
    ADMISSION_REFUSED = "admission-refused"
    MAX_DURATION = "max-duration"
    WAITING = "waiting"  # pending with nothing more specific known


@dataclass(frozen=True)
class Diagnosis:
    reason: Reason
    summary: str  # one line, in the platform's terms
    details: tuple[str, ...] = ()
    fix: str = ""
    limits: tuple[str, ...] = ()  # what could not be read, and so is not in the answer


@dataclass(frozen=True)
class Pool:
    """A GPU pool as the platform's `gpuPools` output exports it (builders/pools.pool_output)."""

    name: str
    node_selector: Mapping[str, str]
    max_nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class Platform:
    """What the platform's stack outputs say (trainstack/outputs.py); empty when unknown."""

    team: str = ""
    queue: str = ""
    max_job_hours: float | None = None
    pools: tuple[Pool, ...] = ()

    def pool(self, name: str) -> Pool | None:
        return next((p for p in self.pools if p.name == name), None)


@dataclass(frozen=True)
class Live:
    """The live objects around one Volcano Job; `None` = not readable by the caller."""

    job: Obj
    podgroup: Obj | None = None
    pods: tuple[Obj, ...] = ()
    events: tuple[Obj, ...] = ()  # events of the namespace about the job, its PodGroup, pods
    queues: tuple[Obj, ...] | None = None
    nodes: tuple[Obj, ...] | None = None
    node_pods: tuple[Obj, ...] | None = None  # every pod bound to a node (all namespaces)
    now: float = 0.0  # Unix seconds
    unreadable: tuple[str, ...] = field(default=())  # e.g. "nodes (forbidden)"
