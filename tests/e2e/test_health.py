"""The node health gate on the real control plane (issue 42; docs/health.md).

What runs for real: the API server (its TokenRequest, which binds the agent's token to a pod
and puts that pod's node in the token's `userInfo.extra`; its RBAC; the platform's
ValidatingAdmissionPolicies), the DaemonSet controller (it makes the agent's pod for the new
node), Volcano (it binds, or does not bind, the training job) and the platform's own objects
as the prod stack deploys them. The agent and the repair controller run their own code, in
process (`trainstack_health.cli.main`), authenticated as their ServiceAccounts; only the
agent's hardware probes are replaced, at their boundary, by recorded outputs of the real
tools (tests/health/fixtures, `--probes-from`).

What cannot run here: the tools themselves (no GPU), and the Auto Scaling call of the repair
(no AWS): the repair runs with mode "none" (drain only), its "replace" path is tested against
moto (tests/health/test_repair_aws.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from trainstack_health import contract
from trainstack_health.cli import main as health_main
from trainstack_health.kube import Access, ApiError
from trainstack_health.kube import Kube as HealthKube
from trainstack_health.repair.cli import main as repair_main

from tests.e2e import jobs
from tests.e2e.conftest import Deployed
from trainstack.builders.health_access import AGENT_POLICY, REPAIR_POLICY
from trainstack.kube import wait_for
from trainstack.sandbox import deploy, nodes

FIXTURES = Path(__file__).resolve().parent.parent / "health" / "fixtures"
POOL = "h100-reserved"
NODE = "health-gate-0"
# Keeps the pool's other nodes out of reach until the test lets the job restart there.
FULL = {"key": "e2e.trainstack.io/full", "value": "true", "effect": "NoSchedule"}
EKS_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute"}
AGENT_APP = "trainstack-health-agent"


@dataclass
class Gate:
    platform: Deployed
    node: str
    others: list[str]
    agent_token: Path
    unbound_token: Path
    repair_token: Path
    expectations: Path
    repair_expectations: Path

    def access(self, token: Path) -> Access:
        return Access(self.platform.plane.server, Path(self.platform.plane.ca.cert), token)

    def client(self, token: Path) -> HealthKube:
        return HealthKube(self.access(token))

    def agent(self, fixtures: str) -> int:
        return health_main(
            [
                "agent",
                "--once",
                "--node",
                self.node,
                *self._server(self.agent_token),
                "--expectations",
                str(self.expectations),
                "--probes-from",
                str(FIXTURES / fixtures),
            ]
        )

    def repair(self) -> int:
        return repair_main(
            [
                "--once",
                *self._server(self.repair_token),
                "--expectations",
                str(self.repair_expectations),
            ]
        )

    def _server(self, token: Path) -> list[str]:
        a = self.access(token)
        return [
            "--server",
            a.server,
            "--token-file",
            str(a.token_file),
            "--ca-file",
            str(a.ca_file),
        ]

    def get_node(self, name: str | None = None) -> dict[str, Any]:
        node: dict[str, Any] = self.platform.kube.get("v1", "Node", name or self.node)
        return node


def node_group_taints(platform: Deployed) -> list[dict[str, str]]:
    """The taints the pool's managed node group registers its nodes with, as the plan has
    them (EKS passes them to the kubelet's --register-with-taints; builders/pools.py)."""
    groups = [
        r
        for r in platform.plan.aws_resources()
        if r.type == "aws:eks/nodeGroup:NodeGroup" and POOL in r.name
    ]
    assert len(groups) == 1, [r.name for r in groups]
    return [
        {"key": t["key"], "value": t["value"], "effect": EKS_EFFECTS[t["effect"]]}
        for t in groups[0].inputs["taints"]
    ]


def token(platform: Deployed, account: str, path: Path, bound_to: dict[str, Any] | None) -> Path:
    """A token of `account` from the TokenRequest API, bound to a pod if given (what the
    kubelet projects into that pod)."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if bound_to is not None:
        meta = bound_to["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    answer = platform.kube.request(
        "POST",
        f"/api/v1/namespaces/{contract.SYSTEM_NAMESPACE}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    path.write_text(answer["status"]["token"])
    return path


def agent_pod(platform: Deployed, node: str, app: str = AGENT_APP) -> dict[str, Any]:
    """The DaemonSet controller's pod of `app` for `node`, bound there as a scheduler would (no
    kube-scheduler runs here; the DaemonSet pins each pod to its node by a matchFields term)."""

    def made() -> dict[str, Any] | None:
        for pod in platform.kube.list(
            "v1", "Pod", contract.SYSTEM_NAMESPACE, labels=f"app.kubernetes.io/name={app}"
        ):
            terms = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            if any(f.get("values") == [node] for t in terms for f in t.get("matchFields", [])):
                return pod
        return None

    pod = wait_for(f"the DaemonSet's {app} pod for {node}", made, timeout=60)
    if not pod["spec"].get("nodeName"):
        meta = pod["metadata"]
        platform.kube.request(
            "POST",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": meta["name"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )
    bound: dict[str, Any] = platform.kube.get(
        "v1", "Pod", pod["metadata"]["name"], contract.SYSTEM_NAMESPACE
    )
    return bound


def set_taints(platform: Deployed, name: str, taints: list[dict[str, str]]) -> None:
    platform.kube.patch({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
                        {"spec": {"taints": taints}})  # fmt: skip


@pytest.fixture(scope="module")
def gate(prod: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    pool = prod.cfg.pool(POOL)
    assert pool is not None
    node = copy.deepcopy(nodes.pool_nodes(prod.cfg, pool, 1)[0])
    node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = NODE
    node["spec"]["taints"] = node_group_taints(prod)
    deploy.create_nodes(prod.kube, [node])
    drivers = nodes.csi_drivers([obj for _, obj in prod.plan.kubernetes_objects()])
    for csi in nodes.csi_nodes([node], drivers):
        prod.kube.create(csi)
    others = [
        n["metadata"]["name"]
        for n in prod.kube.list("v1", "Node", labels=f"trainstack.io/pool={POOL}")
        if n["metadata"]["name"] != NODE
    ]
    for other in others:
        set_taints(prod, other, [*prod.kube.get("v1", "Node", other)["spec"]["taints"], FULL])

    workdir = tmp_path_factory.mktemp("health")
    pod = agent_pod(prod, NODE)
    cm = prod.kube.get("v1", "ConfigMap", contract.CONFIGMAP, contract.SYSTEM_NAMESPACE)
    expectations = workdir / "expectations.json"
    expectations.write_text(cm["data"]["expectations.json"])
    drain_only = json.loads(cm["data"]["expectations.json"])
    drain_only["repair"] = {**drain_only["repair"], "mode": "none", "delaySeconds": 0,
                            "prometheusUrl": None}  # fmt: skip
    repair_expectations = workdir / "repair.json"
    repair_expectations.write_text(json.dumps(drain_only))
    yield Gate(
        prod,
        NODE,
        others,
        token(prod, contract.AGENT_SERVICE_ACCOUNT, workdir / "agent", pod),
        token(prod, contract.AGENT_SERVICE_ACCOUNT, workdir / "unbound", None),
        token(prod, contract.REPAIR_SERVICE_ACCOUNT, workdir / "repair", None),
        expectations,
        repair_expectations,
    )
    for job in prod.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(prod, job)
    prod.kube.delete("v1", "Node", NODE)
    for other in others:
        live = prod.kube.get("v1", "Node", other)["spec"].get("taints", [])
        set_taints(prod, other, [t for t in live if t["key"] != FULL["key"]])


def health_taint(node: dict[str, Any]) -> str | None:
    return next(
        (t.get("value") for t in node["spec"].get("taints", []) if t["key"] == contract.TAINT_KEY),
        None,
    )


def events(gate: Gate, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in gate.platform.kube.list("v1", "Event", contract.EVENT_NAMESPACE)
        if e["reason"] == reason and e["involvedObject"].get("name") == gate.node
    ]


def _job(gate: Gate) -> dict[str, Any]:
    return jobs.rendered(gate.platform, jobs.spec("vision", "gated", pool=POOL, gpus=8))


def test_a_node_takes_work_only_after_passing_and_is_drained_when_it_fails(gate: Gate) -> None:
    kube = gate.platform.kube
    # Registered behind the gate: the node group's startup taint.
    assert health_taint(gate.get_node()) == contract.TAINT_PENDING
    job = _job(gate)
    jobs.submit(gate.platform, job)
    assert jobs.stays_unscheduled(gate.platform, job) == []

    # prod pre-pulls images (docs/prepull.md): the agent's first check waits while the pool's
    # pre-pull pod on the node is not Ready (no kube-scheduler binds it here).
    assert gate.agent("healthy") == 0
    assert health_taint(gate.get_node()) == contract.TAINT_PENDING
    assert not events(gate, contract.EVENT_PASSED)
    # Bound, kwok makes it Ready, as a kubelet would once its images are pulled.
    agent_pod(gate.platform, gate.node, contract.PREPULL_APP)
    wait_for(
        "the pre-pull pod Ready",
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for p in kube.list("v1", "Pod", contract.SYSTEM_NAMESPACE,
                               labels=f"app.kubernetes.io/name={contract.PREPULL_APP}")
            if p["spec"].get("nodeName") == gate.node
            for c in p.get("status", {}).get("conditions", [])
        ),
        timeout=30,
    )  # fmt: skip

    # The agent's own code, with the recorded outputs of a healthy p5.48xlarge.
    assert gate.agent("healthy") == 0
    node = gate.get_node()
    assert health_taint(node) is None
    assert node["metadata"]["labels"][contract.STATE_LABEL] == contract.STATE_PASSED
    # Only the gate moved: the GPU taint stays.
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu"]
    assert events(gate, contract.EVENT_PASSED)
    [pod] = jobs.wait_running(gate.platform, job)
    assert pod["spec"]["nodeName"] == gate.node

    # A fatal XID in the kernel log while the job runs: passive checks catch it.
    assert gate.agent("xid-fatal") == 0
    node = gate.get_node()
    assert health_taint(node) == contract.TAINT_FAILED
    assert node["metadata"]["labels"][contract.STATE_LABEL] == contract.STATE_FAILED
    assert node["metadata"]["labels"][contract.REASON_LABEL] == contract.CHECK_XID
    [failed] = events(gate, contract.EVENT_FAILED)
    assert failed["type"] == "Warning"

    # Room elsewhere in the pool; the repair controller drains the failed node.
    set_taints(gate.platform, gate.others[0], [
        t for t in kube.get("v1", "Node", gate.others[0])["spec"]["taints"]
        if t["key"] != FULL["key"]
    ])  # fmt: skip
    assert gate.repair() == 0
    node = gate.get_node()
    assert node["metadata"]["labels"][contract.REPAIR_LABEL] in {"drained", "requested"}
    assert events(gate, contract.EVENT_DRAINED)
    # The evicted pod's job restarts (its lifecycle policy) and binds on the healthy node.
    wait_for(
        "the job running again, on another node",
        lambda: [
            p
            for p in jobs.running_pods(gate.platform, job)
            if p["spec"]["nodeName"] == gate.others[0]
        ],
        timeout=90,
    )
    assert not [
        p for p in kube.list("v1", "Pod", "vision") if p["spec"].get("nodeName") == gate.node
    ]

    # Repaired in place (or a transient fault): a passing re-check un-taints it, and the
    # repair controller forgets it.
    assert gate.agent("healthy") == 0
    node = gate.get_node()
    assert health_taint(node) is None
    assert node["metadata"]["labels"][contract.STATE_LABEL] == contract.STATE_PASSED
    assert contract.REASON_LABEL not in node["metadata"]["labels"]
    assert gate.repair() == 0
    assert contract.REPAIR_LABEL not in gate.get_node()["metadata"]["labels"]


def _refused(call: Any, policy: str | None = None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    err = caught.value
    if policy is None:
        assert err.status == 403, err  # RBAC
    else:
        assert err.status in {403, 422}, err
        assert policy in err.message, err
    return err


def _merge(client: HealthKube, node: str, patch: dict[str, Any]) -> Any:
    return client.request(
        "PATCH", f"/api/v1/nodes/{node}", patch, content_type="application/merge-patch+json"
    )


def _taints_patch(node: dict[str, Any], taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A JSON patch of the whole taint list, as the agent sends (without its resourceVersion
    test: kwok's heartbeats move the version, and a failed test would hide the verdict)."""
    del node
    return [{"op": "replace", "path": "/spec/taints", "value": taints}]


def test_the_agent_may_move_only_its_own_nodes_gate(gate: Gate) -> None:
    """The agent's identity as an attacker holding its token would use it."""
    agent = gate.client(gate.agent_token)
    own, other = gate.get_node(), gate.get_node(gate.others[-1])
    gated = [*own["spec"].get("taints", []), {"key": contract.TAINT_KEY,
             "value": contract.TAINT_FAILED, "effect": "NoSchedule"}]  # fmt: skip

    # Another node: its gate, its labels.
    _refused(lambda: agent.patch_node_json(other["metadata"]["name"], _taints_patch(other, [])),
             AGENT_POLICY)  # fmt: skip
    _refused(
        lambda: _merge(agent, other["metadata"]["name"],
                       {"metadata": {"labels": {contract.STATE_LABEL: "failed"}}}),
        AGENT_POLICY,
    )  # fmt: skip
    # Its own node, anything but the gate and its labels.
    no_gpu_taint = [t for t in own["spec"].get("taints", []) if t["key"] != "nvidia.com/gpu"]
    _refused(
        lambda: agent.patch_node_json(gate.node, _taints_patch(own, no_gpu_taint)), AGENT_POLICY
    )
    for patch in (
        {"spec": {"unschedulable": True}},
        {"metadata": {"labels": {"trainstack.io/pool": "h200-burst"}}},
        {"metadata": {"labels": {contract.REPAIR_LABEL: "requested"}}},
        {"metadata": {"annotations": {"e2e.trainstack.io/x": "y"}}},
        {"spec": {"taints": [*own["spec"].get("taints", []), {"key": contract.TAINT_KEY,
                             "effect": "NoExecute", "value": "failed"}]}},
    ):  # fmt: skip
        _refused(lambda p=patch: _merge(agent, gate.node, p), AGENT_POLICY)
    # A token of the same account not bound to a pod names no node: nothing.
    unbound = gate.client(gate.unbound_token)
    _refused(lambda: unbound.patch_node_json(gate.node, _taints_patch(own, gated)), AGENT_POLICY)
    # What RBAC never granted.
    _refused(lambda: agent.request("DELETE", f"/api/v1/nodes/{gate.node}"))
    status = {"status": {"capacity": {"nvidia.com/gpu": "16"}}}
    _refused(lambda: agent.request("PATCH", f"/api/v1/nodes/{gate.node}/status", status,
                                   content_type="application/merge-patch+json"))  # fmt: skip
    _refused(
        lambda: agent.request("GET", f"/api/v1/namespaces/{contract.SYSTEM_NAMESPACE}/secrets")
    )
    # And what it may do, through the same policy: its own gate, its own labels.
    agent.patch_node_json(gate.node, _taints_patch(own, gated))
    _merge(agent, gate.node, {"metadata": {"labels": {contract.RECHECK_LABEL: None}}})
    assert health_taint(gate.get_node()) == contract.TAINT_FAILED
    agent.patch_node_json(gate.node, _taints_patch(gate.get_node(), own["spec"].get("taints", [])))


def test_the_repair_controller_may_not_move_a_gate_nor_evict_outside_teams(gate: Gate) -> None:
    repair = gate.client(gate.repair_token)
    node = gate.get_node()
    assert node["metadata"]["labels"][contract.STATE_LABEL] == contract.STATE_PASSED
    _refused(lambda: repair.patch_node_json(gate.node, _taints_patch(node, [])), REPAIR_POLICY)
    _refused(
        lambda: _merge(
            repair, gate.node, {"metadata": {"labels": {contract.STATE_LABEL: "failed"}}}
        ),
        REPAIR_POLICY,
    )
    agent = agent_pod(gate.platform, gate.node)["metadata"]["name"]
    _refused(lambda: repair.evict(contract.SYSTEM_NAMESPACE, agent))
