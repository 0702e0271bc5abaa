"""Live objects as the API server returns them, small enough to read in a table test.

Shapes follow the real ones (Volcano v1.15.1 CRDs, core v1); the messages are Volcano's own
wording (trainstack/explain/volcano.py names each source).
"""

from __future__ import annotations

from typing import Any

from trainstack.explain.model import Platform, Pool

GPU = "nvidia.com/gpu"
NS = "vision"
UID = "uid-1"

PLATFORM = Platform(
    team="vision",
    queue="vision",
    max_job_hours=72.0,
    pools=(
        Pool("h100-block", {"trainstack.io/pool": "h100-block"}, max_nodes=8, gpus_per_node=8),
        Pool("h200-burst", {"trainstack.io/pool": "h200-burst"}, max_nodes=4, gpus_per_node=8),
    ),
)


def job(
    name: str = "train",
    *,
    phase: str = "Pending",
    replicas: int = 2,
    gpus: int = 8,
    pool: str = "h100-block",
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    state_time: str | None = None,
    retries: int = 0,
) -> dict[str, Any]:
    template = {
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "resources": {
                        "requests": {GPU: str(gpus), "cpu": "90", "memory": "900Gi"},
                        "limits": {GPU: str(gpus)},
                    },
                }
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "trainstack.io/pool",
                                        "operator": "In",
                                        "values": [pool],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        }
    }
    state: dict[str, Any] = {"phase": phase}
    if state_time:
        state["lastTransitionTime"] = state_time
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": UID,
            "creationTimestamp": "2026-12-06T00:00:00Z",
            "annotations": (
                {"trainstack.io/max-duration-seconds": "86400"}
                if annotations is None
                else annotations
            ),
        },
        "spec": {
            "queue": "vision",
            "minAvailable": replicas,
            "maxRetry": 104,
            "tasks": [
                {
                    "name": "worker",
                    "replicas": replicas,
                    "minAvailable": replicas,
                    "template": template,
                }
            ],
        },
        "status": {"state": state, "conditions": conditions or [], "retryCount": retries},
    }


def podgroup(message: str | None = None, gpus: int = 16) -> dict[str, Any]:
    conditions = []
    if message is not None:
        conditions.append(
            {
                "type": "Unschedulable",
                "status": "True",
                "reason": "NotEnoughResources",
                "message": message,
            }
        )
    return {
        "metadata": {
            "name": f"train-{UID}",
            "namespace": NS,
            "ownerReferences": [{"kind": "Job", "uid": UID}],
        },
        "spec": {"minMember": 2, "queue": "vision", "minResources": {GPU: str(gpus)}},
        "status": {"phase": "Pending", "conditions": conditions},
    }


def queue(
    name: str,
    *,
    capability: int,
    allocated: int,
    deserved: int,
    parent: str | None = None,
    reclaimable: bool = True,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capability": {GPU: str(capability)},
        "deserved": {GPU: str(deserved)},
        "guarantee": {"resource": {GPU: str(min(deserved, 16))}},
        "reclaimable": reclaimable,
    }
    if parent:
        spec["parent"] = parent
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {"state": "Open", "allocated": {GPU: str(allocated)}},
    }


def queues(**allocated: int) -> tuple[dict[str, Any], ...]:
    """prod's hierarchy, each team queue at the given allocation (GPUs)."""
    a = {"vision": 0, "nlp": 0, "recsys": 0, **allocated}
    return (
        queue("trainstack", capability=128, allocated=sum(a.values()), deserved=128, parent="root"),
        queue(
            "group-research",
            capability=128,
            allocated=a["vision"] + a["nlp"],
            deserved=104,
            parent="trainstack",
        ),
        queue(
            "group-product", capability=128, allocated=a["recsys"], deserved=24, parent="trainstack"
        ),
        queue("vision", capability=64, allocated=a["vision"], deserved=40, parent="group-research"),
        queue("nlp", capability=72, allocated=a["nlp"], deserved=56, parent="group-research"),
        queue("recsys", capability=32, allocated=a["recsys"], deserved=24, parent="group-product"),
    )


def node(
    name: str,
    pool: str = "h100-block",
    *,
    gpus: int = 8,
    ready: bool = True,
    health: str | None = None,
) -> dict[str, Any]:
    taints = [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    if health:
        taints.append({"key": "trainstack.io/health", "value": health, "effect": "NoSchedule"})
    return {
        "metadata": {"name": name, "labels": {"trainstack.io/pool": pool}},
        "spec": {"taints": taints},
        "status": {
            "allocatable": {GPU: str(gpus), "cpu": "192", "memory": "2000Gi"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(name: str, node_name: str | None, gpus: int = 8, phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {GPU: str(gpus)}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": NS}, "spec": spec, "status": {"phase": phase}}


def event(reason: str, message: str, kind: str = "Job", name: str = "train") -> dict[str, Any]:
    return {
        "reason": reason,
        "message": message,
        "involvedObject": {"kind": kind, "name": name, "namespace": NS},
        "lastTimestamp": "2026-12-06T01:00:00Z",
    }


GANG_INSUFFICIENT = (
    "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable; "
    "Pending: 2 Unschedulable. Origin reason is train-worker-0: 0/16 nodes are unavailable: "
    "8 node(s) didn't match Pod's node affinity/selector, 8 Insufficient nvidia.com/gpu."
)
GANG_TAINT = (
    "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable; "
    "Pending: 2 Unschedulable. Origin reason is train-worker-0: 0/16 nodes are unavailable: "
    "8 node(s) didn't match Pod's node affinity/selector, 8 node(s) had untolerated taint(s)."
)
GANG_NO_ORIGIN = (
    "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable; "
    "Pending: 2 Unschedulable"
)
DENIED_POD = (
    "Error creating pods: [failed to create pod train-worker-0, err: &errors.StatusError{"
    'ErrStatus:v1.Status{TypeMeta:v1.TypeMeta{Kind:"", APIVersion:""}, ListMeta:v1.ListMeta{}, '
    'Status:"Failure", Message:"pods \\"train-worker-0\\" is forbidden: ValidatingAdmissionPolicy '
    "'trainstack-rule-pod-example' with binding 'trainstack-rule-pod-example' denied request: "
    'pods may not do that. Fix: do the other thing", Reason:"Forbidden", '
    "Details:(*v1.StatusDetails)(nil), Code:403}}]"
)
