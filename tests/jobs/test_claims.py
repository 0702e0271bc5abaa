"""Issue 15 #1: what a rendered job mounts is a set of distinct CSI volumes on its node.

The kubelet names a CSI persistent volume `<driver>^<volumeHandle>`
(k8s.io/kubernetes@v1.37.2 pkg/volume/csi/csi_plugin.go GetVolumeName) and keeps one entry
per name in its desired state of the world (kubelet/volumemanager/cache/
desired_state_of_world.go AddPodToVolume). Two pod volumes resolving to the same name, from
two PVs or from one claim listed twice, leave one of them unmounted and the pod in
ContainerCreating (kubernetes/kubernetes#91556, #132921). One claim listed once and mounted
twice with `subPath` is one volume.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.conftest import EXAMPLE_STACKS
from trainstack.policy.objects import VOLCANO_JOB, pods
from trainstack.preview.plan import Plan

PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"


def csi_volumes_by_claim(plan: Plan) -> dict[tuple[str, str], tuple[str, str]]:
    """(namespace, claim) -> (driver, volumeHandle) of the PV the claim is bound to."""
    volumes = {
        r.inputs["metadata"]["name"]: r.inputs["spec"]
        for r in plan.resources
        if r.type == PV and "csi" in r.inputs["spec"]
    }
    result = {}
    for r in plan.resources:
        if r.type == PVC and r.inputs["spec"].get("volumeName") in volumes:
            csi = volumes[r.inputs["spec"]["volumeName"]]["csi"]
            key = (r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"])
            result[key] = (csi["driver"], csi["volumeHandle"])
    return result


def team_jobs(plan: Plan) -> list[dict[str, Any]]:
    return [r.inputs for r in plan.resources if r.type == VOLCANO_JOB]


def _reads_data(pod: dict[str, Any]) -> bool:
    """The pod mounts the team's datasets claim (a spec with `data`; the FSDP example's
    template trains on synthetic data and declares none)."""
    return any(v["name"] == "data" for v in pod["volumes"])


def test_the_example_jobs_mount_lustre(example_plans: dict[str, Plan]) -> None:
    """The demo jobs read datasets from Lustre and checkpoint to it: the case of the issue."""
    jobs = team_jobs(example_plans["vision"])
    assert jobs
    readers = 0
    for job in jobs:
        for _, pod in pods(job):
            paths = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
            assert "/checkpoints" in paths
            if _reads_data(pod):
                readers += 1
                assert any(m.get("readOnly") for m in pod["containers"][0]["volumeMounts"])
    assert readers, "no example job reads a dataset from Lustre"


def test_each_pod_mounts_each_csi_volume_once(example_plans: dict[str, Plan]) -> None:
    by_claim = csi_volumes_by_claim(example_plans["prod"])
    for job in team_jobs(example_plans["vision"]):
        namespace = job["metadata"]["namespace"]
        for task, pod in pods(job):
            claims = [
                v["persistentVolumeClaim"]["claimName"]
                for v in pod["volumes"]
                if "persistentVolumeClaim" in v
            ]
            assert len(claims) == len(set(claims)), (task, claims)
            names = Counter(by_claim[(namespace, claim)] for claim in claims)
            twice = [name for name, count in names.items() if count > 1]
            assert not twice, f"{job['metadata']['name']}/{task}: {twice} from {claims}"


def test_datasets_stay_read_only_and_checkpoints_writable(
    example_plans: dict[str, Plan],
) -> None:
    """Two claims (issue 37): datasets read-only in the claim, the mount and the PV's mount
    options (the kernel's `ro`); checkpoints writable, at the job's own sub-path of the team's
    volume, whose root is the team's directory."""
    pvs = {
        r.inputs["metadata"]["name"]: r.inputs["spec"]
        for r in example_plans["prod"].resources
        if r.type == PV
    }
    readers = 0
    for job in team_jobs(example_plans["vision"]):
        for _, pod in pods(job):
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
            if _reads_data(pod):
                readers += 1
                data = next(m for m in mounts.values() if m["name"] == "data")
                assert data["readOnly"] is True
                assert volumes["data"]["persistentVolumeClaim"] == {
                    "claimName": "datasets",
                    "readOnly": True,
                }
            assert mounts["/checkpoints"].get("readOnly") is not True
            assert mounts["/checkpoints"]["subPath"] == job["metadata"]["name"]
            assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "checkpoints"
    assert readers, "no example job reads a dataset"
    assert "ro" in pvs["vision-datasets"]["mountOptions"]
    assert "ro" not in pvs["vision-checkpoints"]["mountOptions"]
    attrs = pvs["vision-checkpoints"]["csi"]["volumeAttributes"]
    assert attrs["mountname"].endswith("/checkpoints/vision")
    assert pvs["vision-datasets"]["csi"]["volumeAttributes"]["mountname"].endswith("/datasets")


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_no_two_persistent_volumes_of_a_namespace_share_a_csi_volume(
    stack: str, example_plans: dict[str, Plan]
) -> None:
    """Per namespace: a pod uses only its own namespace's claims (stack rule
    pv-unique-volume-handle says why PVs of two namespaces may share one)."""
    handles = Counter(
        (
            r.inputs["spec"]["claimRef"]["namespace"],
            r.inputs["spec"]["csi"]["driver"],
            r.inputs["spec"]["csi"]["volumeHandle"],
        )
        for r in example_plans[stack].resources
        if r.type == PV and "csi" in r.inputs["spec"]
    )
    assert [h for h, n in handles.items() if n > 1] == []
