"""RDMA pools on the onprem stack (issues 15, 19): the real API server admits a RoCE job's pods.

The NVIDIA Network Operator's example pods add IPC_LOCK (Mellanox/network-operator v25.7.0
example/rdma-gpu-test-pod1.yml) and run as root. trainstack's trainers run as the images'
non-root user, for whom an added capability never takes effect (containerd v1.7.29
pkg/cri/server/container_create_linux.go WithoutAmbientCaps; kubernetes/kubernetes#56374), so
since issue 19 the pods add none, and since issue 37 (no root `checkpoint-dir` init container)
they meet `restricted` with no exception: the team namespace enforces it, like every other.
PodSecurity admission judges the pods Volcano's controller creates, not the Job, so these tests
put the rendered pod templates in front of the real PodSecurity admission.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import jobs
from tests.e2e.conftest import Deployed, deploy_stack
from trainstack.builders.fabric import NETWORKS_ANNOTATION
from trainstack.kube import ApiError
from trainstack.preview.engine import Previewer
from trainstack.sandbox.cluster import ControlPlane

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
    assert namespace["metadata"]["labels"][PSS_ENFORCE] == "restricted"
    jobs.submit(onprem, roce_job)
    for pod in jobs.wait_running(onprem, roce_job):
        trainer = pod["spec"]["containers"][0]
        assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["metadata"]["annotations"][NETWORKS_ANNOTATION] == "default/roce-net"


def _probe_pod(template: dict[str, Any], namespace: str) -> dict[str, Any]:
    spec = template["spec"]
    spec["volumes"] = []  # the team's claims do not exist there; PodSecurity does not need them
    for container in (*spec["containers"], *spec.get("initContainers", [])):
        container["volumeMounts"] = []
    spec.pop("serviceAccountName")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "roce", "namespace": namespace, **template["metadata"]},
        "spec": spec,
    }


def test_restricted_admits_those_pods_and_refuses_a_root_step(
    onprem: Deployed, roce_job: dict[str, Any]
) -> None:
    """The real PodSecurity admission of the team's namespace, level restricted, on one of the
    job's pod templates: admitted as rendered; refused with the root init container the job
    layer rendered until issue 37 (root, CHOWN, DAC_OVERRIDE, FOWNER), naming it. Before
    issue 19 the trainer itself was refused (IPC_LOCK, no seccomp profile, privilege
    escalation allowed, not runAsNonRoot)."""
    template = copy.deepcopy(roce_job["spec"]["tasks"][0]["template"])
    assert "initContainers" not in template["spec"]
    onprem.kube.create(_probe_pod(copy.deepcopy(template), "speech"), dry_run=True)
    trainer = template["spec"]["containers"][0]
    template["spec"]["initContainers"] = [
        {
            "name": "checkpoint-dir",
            "image": trainer["image"],
            "command": ["install", "-d", "/team/job"],
            "securityContext": {
                "runAsNonRoot": False,
                "runAsUser": 0,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]},
            },
        }
    ]
    with pytest.raises(ApiError) as refused:
        onprem.kube.create(_probe_pod(template, "speech"), dry_run=True)
    assert 'violates PodSecurity "restricted:latest"' in refused.value.message
    assert '"checkpoint-dir"' in refused.value.message
    assert '"trainer"' not in refused.value.message, refused.value.message


def test_the_rules_refuse_an_added_capability(onprem: Deployed, roce_job: dict[str, Any]) -> None:
    """What the namespace would refuse at pod creation, the rules refuse at submission."""
    job = copy.deepcopy(roce_job)
    job["metadata"]["name"] = "roce-sys-admin"
    context = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["securityContext"]
    context["capabilities"]["add"] = ["SYS_ADMIN"]
    with pytest.raises(ApiError) as refused:
        onprem.kube.create(job, as_=onprem.member("speech"), dry_run=True)
    message = refused.value.message
    assert "trainstack-rule-no-privileged" in message or "trainstack-rule-hardened-pods" in message
