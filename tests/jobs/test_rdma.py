"""RDMA pools on existing clusters (issue 15): what a job's pods get, and what admits them.

The NVIDIA Network Operator's pods on the RDMA shared device plugin request
`rdma/<resourceName>`, add IPC_LOCK and name their secondary network in
`k8s.v1.cni.cncf.io/networks` (Mellanox/network-operator v25.7.0 example/rdma-gpu-test-pod1.yml;
Mellanox/network-operator-docs v25.7.0 docs/deployment-guide-kubernetes.rst). Those example pods
run as root. trainstack's run as the images' non-root user, for whom an added capability never
takes effect (containerd's CRI sets no ambient capabilities: containerd v1.7.29
pkg/cri/server/container_create_linux.go WithoutAmbientCaps; kubernetes/kubernetes#56374), so
issue 19 #10 dropped IPC_LOCK: the pods meet Pod Security restricted, every team namespace
enforces baseline, and memory registration rests on the node runtime's RLIMIT_MEMLOCK, which
the runtime checks before training (docs/fabrics.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import kubernetes_validate
import pytest

from tests.conftest import ROOT
from tests.policy.cel import evaluate
from tests.policy.test_equivalence import CONFIG
from trainstack import outputs as out
from trainstack.builders.fabric import NETWORKS_ANNOTATION
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import RESTRICTED_CONTAINER, RESTRICTED_POD, render
from trainstack.jobs.spec import load_job
from trainstack.policy.admission import POLICY_PREFIX, admission_policies
from trainstack.policy.rules import K8S_RULES
from trainstack.preview.plan import Plan, normalise

DEMO = ROOT / "job_specs" / "vision" / "demo-train.yaml"
PS = ROOT / "job_specs" / "vision" / "embeddings-ps.yaml"
PSS_ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.fixture(scope="module")
def roce_job(example_plans: dict[str, Plan]) -> dict[str, Any]:
    spec = dataclasses.replace(load_job(DEMO), team="speech", pool="a100-roce")
    return render(spec, PlatformView(example_plans["onprem"].outputs), "speech")


def templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t["template"] for t in job["spec"]["tasks"]}


def test_roce_replicas_attach_to_the_fabric_as_non_root(roce_job: dict[str, Any]) -> None:
    """Before issue 15 the pods had no secondary network and NCCL's bootstrap pointed at the
    host's bond0; before issue 19 they added IPC_LOCK, which a non-root trainer never holds."""
    for name, template in templates(roce_job).items():
        assert template["metadata"]["annotations"][NETWORKS_ANNOTATION] == "default/roce-net"
        trainer = template["spec"]["containers"][0]
        assert trainer["securityContext"] == RESTRICTED_CONTAINER, name
        assert template["spec"]["securityContext"] == RESTRICTED_POD, name
        env = {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"  # bootstrap on the pod network
        assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"  # RDMA on the HCAs
        assert trainer["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, **template["metadata"]},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(normalise(pod), "1.31", strict=True)


def test_parameter_servers_get_no_secondary_network(example_plans: dict[str, Plan]) -> None:
    """Parameter servers hold no RDMA device and stay off the fabric network."""
    spec = dataclasses.replace(load_job(PS), team="speech", pool="a100-roce", priority="normal")
    job = render(spec, PlatformView(example_plans["onprem"].outputs), "speech")
    ps = templates(job)["ps"]
    assert NETWORKS_ANNOTATION not in ps["metadata"]["annotations"]
    assert NETWORKS_ANNOTATION in templates(job)["worker"]["metadata"]["annotations"]


def test_every_rule_and_its_admission_policy_admit_the_roce_job(
    roce_job: dict[str, Any], example_plans: dict[str, Plan]
) -> None:
    pools = example_plans["onprem"].outputs[out.GPU_POOLS]
    config = dataclasses.replace(CONFIG, pool_selectors=[p["nodeSelector"] for p in pools])
    policies = {
        m["metadata"]["name"].removeprefix(POLICY_PREFIX): m
        for m in admission_policies(config, "test")
        if m["kind"] == "ValidatingAdmissionPolicy"
    }
    namespace = {"metadata": {"name": "speech", "annotations": {}}}
    job = normalise(roce_job)
    for rule in K8S_RULES:
        if rule.name in ("pinned-images", "max-duration"):
            continue  # the equivalence table's registry and team settings, not onprem's
        assert rule.check(job, config) == [], rule.name
        assert evaluate(policies[rule.name], job, namespace), rule.name


def namespaces(plan: Plan) -> dict[str, dict[str, str]]:
    return {
        obj["metadata"]["name"]: obj["metadata"]["labels"]
        for _, obj in plan.kubernetes_objects()
        if obj["kind"] == "Namespace"
    }


def test_every_team_namespace_enforces_restricted(example_plans: dict[str, Plan]) -> None:
    """No pool's pods add a capability now, so no team namespace needs `privileged` (before
    issue 19 RDMA teams' did, and only the admission rule held their pods to baseline); and
    since issue 37 no pod of a team runs as root, so every team namespace enforces
    `restricted` on every pod created in it, Volcano's included."""
    seen = set()
    for stack, plan in example_plans.items():
        pools = {p["name"]: p for p in plan.outputs.get(out.GPU_POOLS, [])}
        labels = namespaces(plan)
        for name, team in out.team_slices(plan.outputs).items():
            for pool in team["scheduling"]["pools"]:
                assert "capabilities" not in pools[pool]["profile"], (stack, pool)
            assert labels[name][PSS_ENFORCE] == "restricted", (stack, name)
            seen.add((stack, name))
    assert ("onprem", "speech") in seen
