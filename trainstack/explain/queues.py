"""The team's queue and its parents: is there room for the gang, and if the team is entitled to
GPUs that others hold, why reclaim has not taken them back (Volcano v1.15.1's capacity plugin,
plugins/capacity/capacity.go; the platform's queues: builders/scheduling.py).

Counted in the job's own GPU resource: whole GPUs, or for a job on GPU slices the slice it asks
for (nvidia.com/mig-<profile>, nvidia.com/gpu.shared; docs/gpu-sharing.md), which Volcano
caps per resource like any other (capacity.go realCapability). Guarantees and deserved shares
are in whole GPUs only, so a slice's limit is its capability down the chain."""

from __future__ import annotations

from collections.abc import Mapping

from trainstack.explain import volcano
from trainstack.explain.jobinfo import key
from trainstack.explain.model import Diagnosis, Live, Obj, Platform, Reason
from trainstack.explain.resources import GPU, bound_requests, fmt, quantity, task_requests
from trainstack.slices import is_gpu_resource


def unit_of(job: Obj) -> str:
    """The GPU resource the job asks for: whole GPUs if any task does, else its slice."""
    asked: set[str] = set()
    for task in job.get("spec", {}).get("tasks") or []:
        asked |= {k for k, v in task_requests(task).items() if v and is_gpu_resource(k)}
    if GPU in asked or not asked:
        return GPU
    return sorted(asked)[0]


def _units(unit: str) -> str:
    """How messages name the counted resource."""
    return "GPUs" if unit == GPU else unit


def _gpus(resources: Mapping[str, object] | None, unit: str) -> float:
    return quantity((resources or {}).get(unit, 0))


def _need(live: Live, unit: str) -> float:
    """GPUs the gang needs at once: the PodGroup's minResources (Volcano's controller sets it
    from the tasks' minAvailable), else every replica."""
    if live.podgroup is not None:
        minimum = live.podgroup.get("spec", {}).get("minResources")
        if minimum:
            return _gpus(minimum, unit)
    total = 0.0
    for task in live.job.get("spec", {}).get("tasks") or []:
        total += task_requests(task).get(unit, 0.0) * int(
            task.get("minAvailable", task.get("replicas", 1))
        )
    return total


def _queue_name(live: Live, platform: Platform) -> str:
    return str(live.job.get("spec", {}).get("queue") or platform.queue or "default")


def _own_gpus(live: Live, unit: str) -> float:
    """GPUs the job's own pods hold now (a restarting job's bound pods count in its queue)."""
    return sum(held.get(unit, 0.0) for held in bound_requests(live.pods).values())


def queue_room(live: Live, platform: Platform) -> Diagnosis | None:
    if live.queues is None:
        return None
    by_name = {str(q["metadata"]["name"]): q for q in live.queues}
    name = _queue_name(live, platform)
    queue = by_name.get(name)
    if queue is None:
        return None
    unit = unit_of(live.job)
    need = _need(live, unit) - _own_gpus(live, unit)
    if need <= 0:
        return None
    chain = [queue]
    while (parent := chain[-1].get("spec", {}).get("parent")) and str(parent) in by_name:
        chain.append(by_name[str(parent)])
    limits = real_capabilities(by_name, chain, unit)
    for index, q in enumerate(chain):
        capability = limits.get(str(q["metadata"]["name"]))
        allocated = _gpus(q.get("status", {}).get("allocated"), unit)
        if capability is not None and allocated + need > capability:
            return _at_capability(
                live,
                by_name=by_name,
                chain=chain,
                index=index,
                need=need,
                allocated=allocated,
                capability=capability,
                unit=unit,
            )
    return _reclaim(live, by_name, queue, need, unit)


def _guarantee(q: Obj, unit: str) -> float:
    return _gpus(q.get("spec", {}).get("guarantee", {}).get("resource"), unit)


def real_capabilities(
    by_name: Mapping[str, Obj], chain: list[Obj], unit: str = GPU
) -> dict[str, float]:
    """GPUs each queue of `chain` (leaf first) may hold, as Volcano v1.15.1's capacity plugin
    computes it (plugins/capacity/capacity.go checkHierarchicalQueue): a child's real
    capability is its parent's minus every sibling's guarantee (its own kept), at most its own
    capability; the root's is its capability, unbounded when unset. So no team can use another's
    idle guarantee. A queue without a parent (flat mode) keeps its capability. Queues without
    a GPU capability are absent (no limit known)."""
    real: dict[str, float] = {}
    parent_real: float | None = None
    top = chain[-1]
    for q in reversed(chain):
        name = str(q["metadata"]["name"])
        capability = _gpus(q.get("spec", {}).get("capability"), unit) or None
        if q is top or parent_real is None:
            limit = capability
        else:
            parent = str(q["spec"]["parent"])
            guarantees = sum(_guarantee(c, unit) for c in _children(by_name, parent))
            limit = max(0.0, parent_real - guarantees) + _guarantee(q, unit)
            if capability is not None:
                limit = min(limit, capability)
        if limit is not None:
            real[name] = limit
        parent_real = limit
    return real


def _children(by_name: Mapping[str, Obj], parent: str) -> list[Obj]:
    return [q for q in by_name.values() if q.get("spec", {}).get("parent") == parent]


def _leaves(by_name: Mapping[str, Obj], queue: Obj) -> list[Obj]:
    kids = _children(by_name, str(queue["metadata"]["name"]))
    if not kids:
        return [queue]
    return [leaf for kid in kids for leaf in _leaves(by_name, kid)]


def _usage(q: Obj, unit: str) -> str:
    allocated = _gpus(q.get("status", {}).get("allocated"), unit)
    deserved = _gpus(q.get("spec", {}).get("deserved"), unit)
    borrowed = allocated - deserved
    lent = f", {fmt(borrowed)} above its deserved {fmt(deserved)}" if borrowed > 0 else ""
    return f"queue {q['metadata']['name']}: {fmt(allocated)} {_units(unit)}{lent}"


def _at_capability(
    live: Live,
    *,
    by_name: Mapping[str, Obj],
    chain: list[Obj],
    index: int,
    need: float,
    allocated: float,
    capability: float,
    unit: str,
) -> Diagnosis:
    q = chain[index]
    qname = str(q["metadata"]["name"])
    job = key(live.job)
    if index == 0:
        units = _units(unit)
        details = [f"the gang needs {fmt(need)} {units} at once; "
                   f"{fmt(capability - allocated)} are left under the capability"]  # fmt: skip
        details += [f"in use by the team's own jobs: {fmt(allocated)} {units}"]
        own = _gpus(q.get("spec", {}).get("capability"), unit)
        if own > capability:
            details += [f"its capability is {fmt(own)} {units}, of which {fmt(capability)} "
                        "are usable: Volcano keeps the other teams' guarantees free"]  # fmt: skip
        if need > capability:
            fix = (f"the job alone needs more than the capability ({fmt(capability)}): "
                   "make it smaller, or raise the team's capability in the registry")  # fmt: skip
        else:
            fix = ("wait for one of the team's jobs to finish, or stop one; raising the "
                   "capability is the registry's quota (docs/scheduling.md)")  # fmt: skip
        return Diagnosis(
            Reason.QUEUE_AT_CAPABILITY,
            f"{job} waits: queue {qname} is at its capability ({fmt(allocated)} of "
            f"{fmt(capability)} {units} in use, the gang needs {fmt(need)} more)",
            tuple(details),
            fix,
        )
    users = [
        _usage(leaf, unit)
        for leaf in _leaves(by_name, q)
        if _gpus(leaf.get("status", {}).get("allocated"), unit)
    ]
    return Diagnosis(
        Reason.PARENT_AT_CAPABILITY,
        f"{job} waits: queue {qname}, above the team's queue "
        f"{chain[0]['metadata']['name']}, is at its capability ({fmt(allocated)} of "
        f"{fmt(capability)} {_units(unit)} in use, the gang needs {fmt(need)} more)",
        ("who uses it:", *users),
        "wait for GPUs to be released in the group; borrowed GPUs above a team's deserved "
        "share come back by reclaim only for a team below its own share",
    )


def _reclaim(
    live: Live, by_name: Mapping[str, Obj], queue: Obj, need: float, unit: str
) -> Diagnosis | None:
    """The team is entitled (within its deserved share) but the GPUs are lent: why reclaim
    has not taken them back. Volcano v1.15.1 reclaims only from a queue that is `reclaimable`
    and above its deserved share after the eviction (plugins/capacity/capacity.go
    reclaimableFn, checkDeservedExceedance), never below a guarantee (checkGuaranteeConstraint);
    it does not know pools (docs/scheduling.md, "What a guarantee does not cover")."""
    allocated = _gpus(queue.get("status", {}).get("allocated"), unit)
    deserved = _gpus(queue.get("spec", {}).get("deserved"), unit)
    if allocated + need > deserved:
        return None
    fits = volcano.fit_errors(volcano.unschedulable_message(live.podgroup, live.events))
    if fits is not None and not fits.insufficient():
        return None  # not a question of room: the node checks explain it
    name = str(queue["metadata"]["name"])
    borrowers = [
        q
        for q in by_name.values()
        if q["metadata"]["name"] != name
        and not _children(by_name, str(q["metadata"]["name"]))
        and _gpus(q.get("status", {}).get("allocated"), unit)
        > _gpus(q.get("spec", {}).get("deserved"), unit)
    ]
    if not borrowers:
        return None
    locked = [q for q in borrowers if q.get("spec", {}).get("reclaimable") is False]
    details = ["who uses the headroom:", *(_usage(q, unit) for q in borrowers)]
    if locked:
        why = (f"queue {', '.join(str(q['metadata']['name']) for q in locked)} is not "
               "reclaimable (reclaimable: false in its quota)")  # fmt: skip
        fix = "wait for the borrowing jobs to end; ask the platform team if this stays"
    else:
        why = ("reclaim takes back only what a borrower holds above its deserved share, and "
               "only pods on nodes that can hold this job: the borrowed GPUs may be on another "
               "pool, or the evictions are under way")  # fmt: skip
        fix = "wait a few scheduling cycles; reclaim evicts the borrowers' newest pods"
    return Diagnosis(
        Reason.GUARANTEE_NOT_RECLAIMABLE,
        f"{key(live.job)} waits for GPUs that team {name}'s share entitles it to "
        f"({fmt(allocated)} + {fmt(need)} of a deserved {fmt(deserved)}), lent to other "
        f"teams and not yet reclaimable: {why}",
        tuple(details),
        fix,
    )
