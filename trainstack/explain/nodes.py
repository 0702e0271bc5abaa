"""The nodes of the job's pool: the health gate, and which resource is short on how many nodes
(the pool at its maximum size, growing, or too small for one gang member)."""

from __future__ import annotations

from collections.abc import Mapping

from trainstack.builders import labels
from trainstack.contracts import health as health_contract
from trainstack.explain import volcano
from trainstack.explain.jobinfo import key, replicas
from trainstack.explain.model import Diagnosis, Live, Obj, Platform, Reason
from trainstack.explain.resources import GPU, bound_requests, fmt, quantity, task_requests

POOL_LABEL = labels.POOL


def nodes_text(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def _pool_name(live: Live) -> str | None:
    for task in live.job.get("spec", {}).get("tasks") or []:
        spec = task.get("template", {}).get("spec", {})
        selected = (spec.get("nodeSelector") or {}).get(POOL_LABEL)
        if selected:
            return str(selected)
        affinity = spec.get("affinity", {}).get("nodeAffinity", {})
        terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {})
        for term in terms.get("nodeSelectorTerms") or []:
            for expr in term.get("matchExpressions") or []:
                if expr.get("key") == POOL_LABEL and expr.get("values"):
                    return str(expr["values"][0])
    return None


def _pool_nodes(live: Live, platform: Platform) -> tuple[str, list[Obj]] | None:
    if live.nodes is None:
        return None
    name = _pool_name(live)
    pool = platform.pool(name) if name else None
    selector: Mapping[str, str] = (
        pool.node_selector if pool else ({POOL_LABEL: name} if name else {})
    )
    if not selector:
        return None
    nodes = [
        n
        for n in live.nodes
        if all(n.get("metadata", {}).get("labels", {}).get(k) == v for k, v in selector.items())
    ]
    return str(name), nodes


def _health(node: Obj) -> str | None:
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("key") == health_contract.TAINT_KEY:
            return str(taint.get("value", ""))
    return None


def health_gate(live: Live, platform: Platform) -> Diagnosis | None:
    job = key(live.job)
    fix = ("wait: the health agent checks new nodes and removes the taint when they pass "
           "(docs/health.md); a failed node is repaired or replaced by the platform")  # fmt: skip
    found = _pool_nodes(live, platform)
    if found is not None:
        pool, nodes = found
        gated = {n["metadata"]["name"]: _health(n) for n in nodes if _health(n) is not None}
        if not gated or not _short_elsewhere(
            live, [n for n in nodes if n["metadata"]["name"] not in gated]
        ):
            return None
        counts: dict[str, int] = {}
        for value in gated.values():
            counts[str(value)] = counts.get(str(value), 0) + 1
        states = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        return Diagnosis(
            Reason.HEALTH_GATE,
            f"{job} waits on the health gate: {len(gated)} of {len(nodes)} nodes of pool "
            f"{pool} are not yet cleared ({health_contract.TAINT_KEY}: {states})",
            tuple(f"node {k}: {v}" for k, v in sorted(gated.items())),
            fix,
        )
    fits = volcano.fit_errors(volcano.unschedulable_message(live.podgroup, live.events))
    if fits is None or not fits.count(volcano.TAINT):
        return None
    # A team member cannot read nodes; on this platform a job tolerates its pools' GPU
    # taint (jobs/render.py), so an untolerated taint on a GPU node is the health gate's.
    tainted = nodes_text(fits.count(volcano.TAINT))
    return Diagnosis(
        Reason.HEALTH_GATE,
        f"{job} waits on the health gate: {tainted} carry a taint the "
        f"job does not tolerate, on this platform the health gate's ({health_contract.TAINT_KEY})",
        (f"scheduler: {fits.text}",),
        fix,
    )


def _member(live: Live) -> dict[str, float]:
    """The largest gang member's request (the scheduler must place each)."""
    best: dict[str, float] = {}
    for task in live.job.get("spec", {}).get("tasks") or []:
        request = task_requests(task)
        if request.get(GPU, 0.0) >= best.get(GPU, 0.0):
            best = request
    return best


def _short(node: Obj, used: Mapping[str, float], member: Mapping[str, float]) -> list[str]:
    allocatable = node.get("status", {}).get("allocatable") or {}
    return [
        name
        for name, want in member.items()
        if want > 0 and quantity(allocatable.get(name, 0)) - used.get(name, 0.0) + 1e-9 < want
    ]


def _short_elsewhere(live: Live, nodes: list[Obj]) -> bool:
    """No ungated node of the pool can take the gang (so the gate is what holds it)."""
    if live.node_pods is None:
        return True
    used = bound_requests(live.node_pods)
    member = _member(live)
    free = sum(
        1 for n in nodes if _ready(n) and not _short(n, used.get(n["metadata"]["name"], {}), member)
    )
    return free < replicas(live.job)


def _ready(node: Obj) -> bool:
    if node.get("spec", {}).get("unschedulable"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions") or []
    )


def pool_nodes(live: Live, platform: Platform) -> Diagnosis | None:
    job = key(live.job)
    found = _pool_nodes(live, platform)
    message = volcano.unschedulable_message(live.podgroup, live.events)
    fits = volcano.fit_errors(message)
    if found is None or live.node_pods is None:
        return _scheduler_says(job, fits)
    pool_name, nodes = found
    pool = platform.pool(pool_name)
    used = bound_requests(live.node_pods)
    member = _member(live)
    shortage: dict[str, int] = {}
    never: dict[str, int] = {}
    takers = 0
    for node in nodes:
        lacking = _short(node, used.get(node["metadata"]["name"], {}), member)
        for resource in lacking:
            shortage[resource] = shortage.get(resource, 0) + 1
        for resource in _short(node, {}, member):
            never[resource] = never.get(resource, 0) + 1
        takers += not lacking and _ready(node)
    want = replicas(live.job)
    if takers >= want:
        return None
    request = ", ".join(f"{k} {fmt(v)}" for k, v in sorted(member.items()) if v)
    short_text = ", ".join(f"{k} on {nodes_text(v)}" for k, v in sorted(shortage.items())) or "none"
    details = (
        f"a gang member requests {request}",
        f"short: {short_text}",
        f"{takers} of {len(nodes)} nodes of pool {pool_name} can take a member now; the gang "
        f"needs {want}",
    )
    if nodes and never and all(v == len(nodes) for v in never.values()):
        return Diagnosis(
            Reason.NO_NODE_FITS,
            f"{job} can never run on pool {pool_name}: no node of it can take a gang member "
            f"even empty (short: {', '.join(sorted(never))})",
            details,
            "make each member smaller than one node of the pool (docs/jobs.md)",
        )
    starting = [n for n in nodes if not _ready(n)]
    if pool is not None and (starting or len(nodes) < pool.max_nodes):
        return Diagnosis(
            Reason.POOL_SCALING,
            f"{job} waits for pool {pool_name} to grow: {len(nodes)} of at most "
            f"{pool.max_nodes} nodes, {len(starting)} starting",
            details,
            "wait: the cluster autoscaler adds nodes for pending gang pods, and each new node "
            "passes the health gate first (docs/health.md)",
        )
    if pool is not None:
        return Diagnosis(
            Reason.POOL_AT_MAXIMUM,
            f"{job} waits: pool {pool_name} is at its maximum size ({len(nodes)} of "
            f"{pool.max_nodes} nodes) and {len(nodes) - takers} of them cannot take a gang "
            f"member (short: {short_text})",
            details,
            "wait for jobs on the pool to finish, pick another pool of the team, or make the "
            "job smaller",
        )
    return Diagnosis(
        Reason.NO_NODE_FITS,
        f"{job} waits: {len(nodes) - takers} of {len(nodes)} nodes of pool {pool_name} cannot "
        f"take a gang member (short: {short_text})",
        details,
        "wait for GPUs to free up in the pool, or make the job smaller",
    )


def _scheduler_says(job: str, fits: volcano.FitErrors | None) -> Diagnosis | None:
    """Without nodes to read, the scheduler's own node histogram (a team member sees it on the
    PodGroup): which resource is short on how many nodes."""
    if fits is None or not fits.insufficient():
        return None
    short = ", ".join(f"{k} on {nodes_text(v)}" for k, v in sorted(fits.insufficient().items()))
    return Diagnosis(
        Reason.NO_NODE_FITS,
        f"{job} waits: no node can take a gang member (short: {short})",
        (f"scheduler: {fits.text}",),
        "wait for GPUs to free up in the pool, or make the job's members smaller",
    )
