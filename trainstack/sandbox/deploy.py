"""Apply a stack's plan to the e2e control plane the way the Pulumi engine would, and reset it.

The plan (`trainstack preview`, in-process) lists every Kubernetes object with the resources it
depends on. The engine creates a resource once its dependencies exist and runs independent
resources concurrently, in no promised order. `waves` groups objects by dependency depth and
`apply_in_order` applies each wave in reverse plan order: one order the engine may choose, fixed
so that a missing dependency fails every run rather than one run in N.

Helm releases are not applied (the fixture runs Volcano itself; other charts' workloads need
kubelets and images). Objects whose API the control plane does not serve are skipped with the
reason in `UNSERVED`, so a new kind cannot be skipped silently.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainstack.builders import labels, topology
from trainstack.config.model import PlatformConfig
from trainstack.kube import ApiError, Kube, holds_everything, wait_for
from trainstack.preview.plan import Plan, Resource
from trainstack.sandbox import nodes

# API groups the control plane does not serve, with the reason (checked by a test).
UNSERVED = {
    "mellanox.com": "the NVIDIA Network Operator's CRDs are not in the reference set "
    "(their chart installs them; nothing here reads a NicClusterPolicy)",
}
MANAGED = f"{labels.MANAGED_BY}={labels.MANAGER}"
SIMULATED = "e2e.trainstack.io/simulated=true"  # what the fixture stands in for (nodes.py)
DISCOVERED = topology.SOURCE_LABEL  # HyperNodes a Volcano discovery source made
KEEP_QUEUES = frozenset({"root", "default"})


def group_of(obj: Mapping[str, Any]) -> str:
    api_version = str(obj["apiVersion"])
    return api_version.split("/", 1)[0] if "/" in api_version else ""


@dataclass(frozen=True)
class Item:
    resource: Resource
    obj: dict[str, Any]

    @property
    def label(self) -> str:
        meta = self.obj["metadata"]
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        return f"{self.obj['kind']} {where}{meta['name']}"


@dataclass
class Outcome:
    """What the server did with each object: its live form, or the error it answered."""

    live: dict[str, Any] = field(default_factory=dict)  # item label -> live object
    errors: dict[str, str] = field(default_factory=dict)  # item label -> message
    pruned: dict[str, list[str]] = field(default_factory=dict)  # item label -> lost fields
    skipped: dict[str, str] = field(default_factory=dict)


def items(plan: Plan) -> tuple[list[Item], dict[str, str]]:
    """Kubernetes objects to apply, and those skipped with their reason."""
    applied: list[Item] = []
    skipped: dict[str, str] = {}
    for resource, obj in plan.kubernetes_objects():
        item = Item(resource, obj)
        reason = UNSERVED.get(group_of(obj))
        if reason:
            skipped[item.label] = reason
        else:
            applied.append(item)
    return applied, skipped


def waves(plan: Plan, todo: list[Item]) -> list[list[Item]]:
    """Dependency layers: an object comes after every object it depends on.

    A dependency on a component means one on all of its custom descendants (the engine waits
    for a component's children); dependencies on anything else (Helm releases, AWS resources,
    providers) are taken as already satisfied here.
    """
    by_ref = {item.resource.ref: item for item in todo}
    children: dict[str, list[str]] = {}
    for resource in plan.resources:
        if resource.parent:
            children.setdefault(resource.parent, []).append(resource.ref)
    kinds = {r.ref: r.custom for r in plan.resources}

    def expand(ref: str) -> set[str]:
        if kinds.get(ref, True):
            return {ref} if ref in by_ref else set()
        found: set[str] = set()
        for child in children.get(ref, []):
            found |= expand(child) if not kinds.get(child, True) else ({child} & by_ref.keys())
        return found

    needs = {
        ref: set().union(*(expand(d) for d in item.resource.dependencies)) - {ref}
        for ref, item in by_ref.items()
    }
    done: set[str] = set()
    layers: list[list[Item]] = []
    while len(done) < len(by_ref):
        ready = [by_ref[r] for r in by_ref if r not in done and needs[r] <= done]
        if not ready:
            cycle = sorted(r for r in by_ref if r not in done)
            raise AssertionError(f"dependency cycle among {cycle}")
        layers.append(ready)
        done |= {i.resource.ref for i in ready}
    return layers


def _apply_one(
    kube: Kube, item: Item, outcome: Outcome, *, dry_run_first: bool, custom: set[str]
) -> bool:
    try:
        if dry_run_first:
            kube.apply(item.obj, dry_run=True)
        live = kube.apply(item.obj)
    except (ApiError, LookupError) as error:
        outcome.errors[item.label] = str(error)
        return False
    outcome.errors.pop(item.label, None)
    outcome.live[item.label] = live
    lost = holds_everything(item.obj, live, builtin=group_of(item.obj) not in custom)
    if lost:
        outcome.pruned[item.label] = lost
    return True


def _crd_groups(kube: Kube) -> set[str]:
    return {
        c["spec"]["group"] for c in kube.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    }


def apply_in_order(kube: Kube, plan: Plan, *, dry_run_first: bool = True) -> Outcome:
    """Each wave in reverse plan order; every object is tried once (no retries)."""
    todo, skipped = items(plan)
    outcome = Outcome(skipped=skipped)
    custom = _crd_groups(kube)
    for layer in waves(plan, todo):
        for item in reversed(layer):
            _apply_one(kube, item, outcome, dry_run_first=dry_run_first, custom=custom)
        kube.forget_discovery()
    return outcome


def converge(kube: Kube, plan: Plan, *, rounds: int = 6, dry_run_first: bool = False) -> Outcome:
    """Apply in plan order, retrying refusals while each round makes progress.

    What an operator gets by running `pulumi up` again: objects that are valid on their own
    but arrived before something they need end up accepted. Scenario tests start from here so
    that an ordering defect (tested on its own) does not hide every other behaviour.
    """
    todo, skipped = items(plan)
    outcome = Outcome(skipped=skipped)
    pending = [item for layer in waves(plan, todo) for item in layer]
    custom = _crd_groups(kube)
    for _ in range(rounds):
        pending = [
            i
            for i in pending
            if not _apply_one(kube, i, outcome, dry_run_first=dry_run_first, custom=custom)
        ]
        if not pending:
            break
        time.sleep(1)  # informer caches (Volcano's webhook lists queues from one)
    return outcome


# -- reset ------------------------------------------------------------------------------------


HYPERNODE = ("topology.volcano.sh/v1alpha1", "HyperNode")


def _delete_all(kube: Kube, kind: tuple[str, str], objects: list[dict[str, Any]]) -> None:
    """Delete cluster-scoped `objects` of `kind` by name."""
    for obj in objects:
        kube.delete(*kind, obj["metadata"]["name"])


def duplicate_members(hypernodes: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Members (nodes or HyperNodes, by exact name) that more than one HyperNode lists."""
    owners: dict[str, list[str]] = {}
    for hypernode in hypernodes:
        for member in hypernode.get("spec", {}).get("members", []):
            name = member.get("selector", {}).get("exactMatch", {}).get("name")
            if name:
                key = f"{member.get('type', '')}/{name}"
                owners.setdefault(key, []).append(hypernode["metadata"]["name"])
    return {key: names for key, names in owners.items() if len(names) > 1}


def settle_discovered_topology(kube: Kube, nearest: str, timeout: float = 90) -> None:
    """Wait until the HyperNodes Volcano's label discovery made form a tree.

    Volcano v1.15.1's controller can leave two HyperNodes for one label value: each node
    event re-runs the whole discovery, which names a HyperNode afresh unless its informer
    already holds the one made for that value (discovery/label/label.go buildHyperNodeName)
    and deletes only those its informer lists (hypernode_controller.go reconcileTopology), so
    two runs within the informer's lag can each create one. The scheduler then refuses the
    tree ("already has a parent ... cannot set another parent", cache.go) and skips every job
    with a topology (HyperNodesReadyToSchedule: false) until a later event re-runs discovery.
    Seen in `make e2e` after many nodes were created at once. Here: delete the discovered
    HyperNodes (a deletion re-runs discovery, label.go DeleteHyperNode) until none is
    duplicated. Nothing to wait for when no node carries `nearest`, the label nearest the
    nodes (Volcano then makes no HyperNode)."""
    if not kube.list("v1", "Node", labels=nearest):
        return
    deadline = time.monotonic() + timeout
    before: set[str] | None = None
    while True:
        found = kube.list(*HYPERNODE, labels=DISCOVERED)
        duplicates = duplicate_members(found)
        names = {obj["metadata"]["name"] for obj in found}
        if found and not duplicates and names == before:  # the same tree twice in a row
            return
        before = None if duplicates else names
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Volcano's discovered HyperNodes never settled: {len(found)} found, "
                f"members in several: {duplicates}"
            )
        if duplicates:
            _delete_all(kube, HYPERNODE, found)
        time.sleep(3)


def delete_jobs(kube: Kube) -> None:
    """Every Volcano Job and Command, in every namespace (Volcano then deletes their pods)."""
    for job in kube.list("batch.volcano.sh/v1alpha1", "Job"):
        meta = job["metadata"]
        kube.delete("batch.volcano.sh/v1alpha1", "Job", meta["name"], meta["namespace"])
    for command in kube.list("bus.volcano.sh/v1alpha1", "Command"):
        meta = command["metadata"]
        kube.delete("bus.volcano.sh/v1alpha1", "Command", meta["name"], meta["namespace"])


def delete_nodes(kube: Kube) -> None:
    """Every Node, and the CSINodes the fixture made for the simulated ones."""
    for obj in kube.list("storage.k8s.io/v1", "CSINode", labels=SIMULATED):
        kube.delete("storage.k8s.io/v1", "CSINode", obj["metadata"]["name"])
    for node in kube.list("v1", "Node"):
        kube.delete("v1", "Node", node["metadata"]["name"])


def delete_pods_now(kube: Kube, namespaces: Iterable[str] | None = None) -> bool:
    """Delete every pod (or those in `namespaces`) with a zero grace period; True when there
    was none left to delete, for wait_for.

    A zero grace period deletes a pod from the API at once: the pod strategy keeps it, and the
    store then deletes without waiting for a kubelet (kubernetes v1.37.2
    pkg/registry/core/pod/strategy.go CheckGracefulDelete; apiserver
    pkg/registry/generic/registry/store.go, errDeleteNow). A graceful deletion waits for the
    pod's node to confirm it, and once reset has deleted the simulated nodes no kwok does:
    the pod garbage collector then removes it only after its 40 s quarantine of orphaned
    pods (pkg/controller/podgc/gc_controller.go), and its namespace waits with it. Only
    control planes the tests own are reset, and their pods belong to stacks and tests."""
    wanted = None if namespaces is None else set(namespaces)
    left = [
        p for p in kube.list("v1", "Pod") if wanted is None or p["metadata"]["namespace"] in wanted
    ]
    for pod in left:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):  # gone already
            kube.delete("v1", "Pod", meta["name"], meta["namespace"], grace=0)
    return not left


def reset(kube: Kube) -> None:
    """Remove everything a stack or a test created, leaving the control plane as started."""
    delete_jobs(kube)
    namespaces = [n["metadata"]["name"] for n in kube.list("v1", "Namespace", labels=MANAGED)] + [
        n["metadata"]["name"]
        for n in kube.list("v1", "Namespace", labels="e2e.trainstack.io/scratch")
    ]
    for name in namespaces:
        kube.delete("v1", "Namespace", name)
    _delete_queues(kube)
    for api_version, kind in (
        ("topology.volcano.sh/v1alpha1", "HyperNode"),
        ("scheduling.k8s.io/v1", "PriorityClass"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
        ("v1", "PersistentVolume"),
        ("storage.k8s.io/v1", "StorageClass"),
        ("storage.k8s.io/v1", "CSINode"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ):
        for selector in (MANAGED, SIMULATED):
            for obj in kube.list(api_version, kind, labels=selector):
                kube.delete(api_version, kind, obj["metadata"]["name"])
    # HyperNodes Volcano's controller made from the nodes' labels (builders/topology.py): its
    # discovery stops with the stack's ConfigMap and would leave them behind.
    _delete_all(kube, HYPERNODE, kube.list(*HYPERNODE, labels=DISCOVERED))
    delete_nodes(kube)
    # Pods go at once (delete_pods_now), each round: a controller may still make one while
    # its namespace is being deleted.
    wait_for(
        "managed namespaces to be gone",
        lambda: (
            delete_pods_now(kube)
            and not any(kube.get_or_none("v1", "Namespace", n) for n in namespaces)
        ),
        timeout=120,
    )
    wait_for("simulated pods to be gone", lambda: delete_pods_now(kube), timeout=60)


def _delete_queues(kube: Kube) -> None:
    """Leaves first: Volcano's webhook refuses deleting a queue with children."""

    def remaining() -> list[dict[str, Any]]:
        return [
            q
            for q in kube.list("scheduling.volcano.sh/v1beta1", "Queue")
            if q["metadata"]["name"] not in KEEP_QUEUES
        ]

    def step() -> bool:
        queues = remaining()
        if not queues:
            return True
        parents = {q["spec"].get("parent") for q in queues}
        for queue in queues:
            if queue["metadata"]["name"] not in parents:
                # The webhook's cache may still list a child: refused now, deleted next round.
                with contextlib.suppress(ApiError):
                    kube.delete("scheduling.volcano.sh/v1beta1", "Queue", queue["metadata"]["name"])
        return False

    wait_for("queues to be deleted", step, timeout=60, interval=0.5)


def simulate_nodes(kube: Kube, cfg: PlatformConfig, plan: Plan) -> list[dict[str, Any]]:
    """Every pool node of the stack, Ready under kwok, with what node agents would publish
    for it (CSINodes; see nodes.py). Returns the Nodes."""
    simulated = nodes.stack_nodes(cfg)
    create_nodes(kube, simulated)
    drivers = nodes.csi_drivers([obj for _, obj in plan.kubernetes_objects()])
    for obj in nodes.csi_nodes(simulated, drivers):
        kube.create(obj)
    return simulated


def create_nodes(kube: Kube, simulated: Iterable[Mapping[str, Any]]) -> None:
    """Create simulated nodes; status (capacity, allocatable) is kept on create for Nodes."""
    names = []
    for node in simulated:
        kube.create(node)
        names.append(node["metadata"]["name"])

    def all_ready() -> bool:
        ready = 0
        for node in kube.list("v1", "Node"):
            conditions = node.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                ready += 1
        return ready >= len(names)

    wait_for(f"{len(names)} simulated nodes Ready (kwok)", all_ready, timeout=120)
