"""A fake of the agent's Kubernetes calls (agent.AgentApi) that applies the JSON patches the
way the API server does: in order, all or nothing, a failed `test` refusing the whole patch with
422 (k8s.io/apiserver v0.37.2 pkg/endpoints/handlers/patch.go `applyJSPatch`), and a new
resourceVersion on every write."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainstack_health.kube import ApiError


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(  # noqa: PLR0912 - one branch per operation and container kind
    doc: dict[str, Any], ops: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """RFC 6902 test/add/replace/remove on objects and arrays (what the agent sends)."""
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [_unescape(t) for t in op["path"].split("/")[1:]]
        target: Any = out
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        kind = op["op"]
        if kind == "test":
            current = target[int(last)] if isinstance(target, list) else target.get(last)
            if current != op["value"]:
                raise ValueError(f"test failed at {op['path']}: {current!r} != {op['value']!r}")
        elif kind == "add":
            if isinstance(target, list):
                target.insert(len(target) if last == "-" else int(last), op["value"])
            else:
                target[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            if isinstance(target, list):
                target[int(last)] = op["value"]
            elif last not in target:
                raise ValueError(f"replace of a missing member {op['path']}")
            else:
                target[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            if isinstance(target, list):
                del target[int(last)]
            elif last not in target:
                raise ValueError(f"remove of a missing member {op['path']}")
            else:
                del target[last]
        else:
            raise ValueError(f"unexpected op {kind}")
    return out


class FakeKube:
    def __init__(self, node: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> None:
        self.node = copy.deepcopy(node)
        self.node.setdefault("metadata", {}).setdefault("resourceVersion", "100")
        self.pods = list(pods or [])
        self.patches: list[list[dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self.calls: list[str] = []
        # Runs before a patch is applied (a concurrent writer, a pod binding meanwhile).
        self.before_patch: Callable[[FakeKube, list[dict[str, Any]]], None] | None = None

    def bump(self) -> None:
        meta = self.node["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def get_node(self, name: str) -> dict[str, Any]:
        self.calls.append("get_node")
        assert name == self.node["metadata"]["name"]
        return copy.deepcopy(self.node)

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        self.calls.append("list_pods")
        return [copy.deepcopy(p) for p in self.pods if p["spec"]["nodeName"] == node]

    def patch_node_json(self, name: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        self.calls.append("patch")
        assert name == self.node["metadata"]["name"]
        ops = [dict(op) for op in ops]
        if self.before_patch is not None:
            hook, self.before_patch = self.before_patch, None
            hook(self, ops)
        self.patches.append(ops)
        try:
            self.node = apply_patch(self.node, ops)
        except (ValueError, KeyError, IndexError) as err:
            raise ApiError("PATCH", f"/api/v1/nodes/{name}", 422, "Invalid", str(err)) from None
        self.bump()
        return copy.deepcopy(self.node)

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.calls.append("event")
        assert namespace == "default"
        self.events.append(dict(event))


def node(
    name: str = "ip-10-1-23-45.ec2.internal",
    *,
    pool: str = "gpu-p5",
    taints: list[dict[str, Any]] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "7d1b7a0e-3c55-4f1e-9a53-0c8b3f1e2a10",
            "resourceVersion": "100",
            "labels": {
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "trainstack.io/pool": pool,
                **(labels or {}),
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"providerID": "aws:///us-east-1a/i-0abc", "taints": list(taints or [])},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


def pod(name: str, node_name: str, *, team: str | None = "vision", phase: str = "Running"):
    labels = {"trainstack.io/team": team} if team else {"app": "trainstack-health-agent"}
    return {
        "metadata": {"name": name, "namespace": team or "trainstack-system", "labels": labels},
        "spec": {"nodeName": node_name},
        "status": {"phase": phase},
    }
