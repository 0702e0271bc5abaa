"""RDMA pools on the onprem stack (issue 15): the real API server admits a RoCE job's pods.

Pods on the RDMA shared device plugin add IPC_LOCK, as every NVIDIA Network Operator example
does (Mellanox/network-operator v25.7.0 example/rdma-gpu-test-pod1.yml). Pod Security
`baseline` refuses it (k8s.io/pod-security-admission v0.37.2
policy/check_capabilities_baseline.go), and PodSecurity admission judges the pods Volcano's
controller creates, not the Job a member submits: with `baseline` in the team namespace the Job
is accepted and its pods are refused out of the member's sight. The team's namespace enforces
`privileged` instead, and the `no-privileged` admission rule holds the Job's pods to baseline
plus IPC_LOCK.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import jobs
from tests.e2e.cluster import ControlPlane
from tests.e2e.conftest import Deployed, deploy_stack
from tests.e2e.kube import ApiError
from trainstack.builders.fabric import NETWORKS_ANNOTATION
from trainstack.preview.engine import Previewer

PSS_ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.fixture(scope="module")
def onprem(control_plane: ControlPlane, previewer: Previewer) -> Iterator[Deployed]:
    platform = deploy_stack(control_plane, previewer, "onprem")
    yield platform
    for job in platform.kube.list(*jobs.VOLCANO_JOB):
        jobs.delete(platform, job)


@pytest.fixture(scope="module")
def roce_job(onprem: Deployed) -> dict[str, Any]:
    return jobs.rendered(onprem, jobs.spec("speech", "roce-train", pool="a100-roce", replicas=2))


def test_a_roce_jobs_pods_are_created_and_run(onprem: Deployed, roce_job: dict[str, Any]) -> None:
    namespace = onprem.kube.get("v1", "Namespace", "speech")
    assert namespace["metadata"]["labels"][PSS_ENFORCE] == "privileged"
    jobs.submit(onprem, roce_job)
    for pod in jobs.wait_running(onprem, roce_job):
        trainer = pod["spec"]["containers"][0]
        assert trainer["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert pod["metadata"]["annotations"][NETWORKS_ANNOTATION] == "default/roce-net"


def test_baseline_would_refuse_those_pods(onprem: Deployed, roce_job: dict[str, Any]) -> None:
    """The real PodSecurity admission on one of the job's pod templates, in a namespace that
    enforces baseline: what every team namespace enforced before issue 15."""
    name = "pss-baseline-probe"
    onprem.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {PSS_ENFORCE: "baseline"}},
        }
    )
    template = copy.deepcopy(roce_job["spec"]["tasks"][0]["template"])
    spec = template["spec"]
    spec["volumes"] = []  # the team's claims do not exist there; PodSecurity does not need them
    for container in (*spec["containers"], *spec.get("initContainers", [])):
        container["volumeMounts"] = []
    spec.pop("serviceAccountName")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "roce", "namespace": name, **template["metadata"]},
        "spec": spec,
    }
    try:
        with pytest.raises(ApiError) as refused:
            onprem.kube.create(pod, dry_run=True)
        assert refused.value.status == 403
        assert 'violates PodSecurity "baseline:latest"' in refused.value.message
        assert "IPC_LOCK" in refused.value.message
    finally:
        onprem.kube.delete("v1", "Namespace", name)


def test_no_privileged_still_refuses_other_capabilities(
    onprem: Deployed, roce_job: dict[str, Any]
) -> None:
    """In the privileged namespace the platform's policy, not PodSecurity, refuses SYS_ADMIN."""
    job = copy.deepcopy(roce_job)
    job["metadata"]["name"] = "roce-sys-admin"
    context = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["securityContext"]
    context["capabilities"]["add"].append("SYS_ADMIN")
    with pytest.raises(ApiError) as refused:
        onprem.kube.create(job, as_=onprem.member("speech"), dry_run=True)
    assert "trainstack-rule-no-privileged" in refused.value.message
