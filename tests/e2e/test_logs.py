"""Durable per-job logs (issue 44): the collector with the real k8s_attributes processor.

A Volcano job rendered by the job layer runs on the prod platform (kwok "runs" its pods). For
its real pods (names, uids, node) the test writes CRI log files under a temporary root, laid
out as the kubelet lays them out, and runs the collector built from its Go modules
(trainstack/sandbox/toolchain.py, `otelcol`) with `trainstack.builders.logs.collector_config`:
the real k8s_attributes processor watches the real API server, authenticated by a token of a
ServiceAccount holding exactly the rules the chart's kubernetesAttributes preset grants, and the
records go to moto's S3 server on loopback. What is proven: Volcano's labels and annotation are
where the configuration reads them, the informer's label and node filters select the right
pods, and the objects land under `logs/teams/<team>/<job>/` with the right tags.

Not proven here: the chart's rendering (no chart is rendered, docs/testing.md "Helm"), a
kubelet's real log files (containerd's rotation, the directory's permissions), IRSA.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import jobs
from tests.e2e.conftest import Deployed
from tests.logs.test_collector import (
    REGION,
    Collector,
    Line,
    append,
    collector_binary,
    collector_env,
    free_port,
    ms,
    new_bucket,
    objects,
    pod_log,
    records,
    s3,  # noqa: F401  (the fixture: moto's S3 server on loopback)
    s3_client,
    wait_for_records,
)
from trainstack.builders import logs

TEAM = "vision"
JOB = "logs-e2e"
NAMESPACE = "trainstack-logs-e2e"
ACCOUNT = "otel-collector"
# The ClusterRole the chart's kubernetesAttributes preset creates (opentelemetry-collector
# 0.170.0 templates/clusterrole.yaml), and nothing more.
PRESET_RULES = [
    {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "watch", "list"]},
    {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["extensions"], "resources": ["replicasets"], "verbs": ["get", "list", "watch"]},
]
RBAC = "rbac.authorization.k8s.io/v1"


@pytest.fixture
def collector_kubeconfig(prod: Deployed, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig for a ServiceAccount bound to the preset's ClusterRole, by token."""
    kube = prod.kube
    name = f"trainstack-logs-e2e-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": ACCOUNT, "namespace": NAMESPACE},
        }
    )
    kube.create(
        {
            "apiVersion": RBAC,
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": PRESET_RULES,
        }
    )
    kube.create(
        {
            "apiVersion": RBAC,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
        }
    )
    answer = kube.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    path = prod.plane.write_kubeconfig(
        tmp_path / "kubeconfig", ACCOUNT, {"token": answer["status"]["token"]}
    )
    try:
        yield path
    finally:
        kube.delete(RBAC, "ClusterRoleBinding", name)
        kube.delete(RBAC, "ClusterRole", name)
        kube.delete("v1", "Namespace", NAMESPACE)


@pytest.fixture
def job_pods(prod: Deployed) -> Iterator[list[dict[str, Any]]]:
    """A two-replica job of vision (a master and a worker task), Running under kwok."""
    job = jobs.rendered(prod, jobs.spec(TEAM, JOB, pool="h100-reserved", replicas=2, gpus=1))
    jobs.submit(prod, job)
    try:
        yield jobs.wait_running(prod, job, timeout=120)
    finally:
        jobs.delete(prod, job)


@pytest.fixture
def plain_pod(prod: Deployed, job_pods: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """A pod of no Volcano job, on the first job pod's node (bound there directly)."""
    node = job_pods[0]["spec"]["nodeName"]
    pod = prod.kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "logs-e2e-plain", "namespace": "default", "labels": {"app": "x"}},
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "main", "image": "registry.example.com/plain:1"}],
            },
        }
    )
    try:
        yield pod
    finally:
        prod.kube.delete("v1", "Pod", "logs-e2e-plain", "default", grace=0)


def test_job_logs_are_tagged_by_the_api_servers_pods_and_land_under_the_job(
    prod: Deployed,
    job_pods: list[dict[str, Any]],
    plain_pod: dict[str, Any],
    collector_kubeconfig: Path,
    s3: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    binary = collector_binary()
    node = job_pods[0]["spec"]["nodeName"]
    root = tmp_path / "node"
    traceback = [
        "Traceback (most recent call last):",
        '  File "/app/train.py", line 3, in <module>',
        "    main()",
        "RuntimeError: NCCL watchdog timeout",
    ]
    for i, pod in enumerate([*job_pods, plain_pod]):
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]["name"]
        path = pod_log(root, meta["namespace"], meta["name"], meta["uid"], container, 0)
        append(path, [Line(ms(10 * i), "stdout", f"hello from {meta['name']}")])
        append(path, [Line(ms(10 * i + 1 + k), "stderr", t) for k, t in enumerate(traceback)])
    # A pod the API server has never seen (deleted long ago, or another cluster's).
    ghost = pod_log(root, TEAM, f"{JOB}-worker-9", str(uuid.uuid4()), "trainer", 0)
    append(ghost, [Line(ms(90), "stdout", "ghost")])

    bucket = new_bucket(s3)
    client = s3_client(s3)
    config = logs.collector_config(
        bucket,
        REGION,
        s3,
        include=[f"{root}/var/log/pods/*/*/*.log"],
        storage_dir=str(tmp_path / "storage"),
        health_endpoint=f"127.0.0.1:{free_port()}",
        metrics_host=None,
        kube_auth="kubeConfig",
        node_from_env_var="K8S_NODE_NAME",
        batch_timeout="1s",
    )
    env = collector_env() | {"KUBECONFIG": str(collector_kubeconfig), "K8S_NODE_NAME": node}
    on_node = [p for p in job_pods if p["spec"]["nodeName"] == node]
    with Collector(binary, config, tmp_path, env) as running:
        # The informer syncs at start; records read before it would have no job and be dropped.
        wait_for_records(lambda: records(objects(client, bucket)), 2 * len(on_node), running)
        time.sleep(3)  # anything more (a dropped pod's line, a duplicate) would show too
    shipped = records(objects(client, bucket))

    by_pod = {p["metadata"]["uid"]: p for p in on_node}
    assert {r.resource["k8s.pod.uid"] for r in shipped} == set(by_pod), (
        "only the job's pods on the collector's node (K8S_NODE_NAME) are shipped"
    )
    assert len(shipped) == 2 * len(on_node)
    for r in shipped:
        pod = by_pod[r.resource["k8s.pod.uid"]]
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert r.resource[logs.TEAM] == TEAM
        assert r.resource[logs.JOB] == JOB == labels["volcano.sh/job-name"]
        assert r.resource[logs.TASK] == labels["volcano.sh/task-spec"]
        assert r.resource[logs.TASK] in ("master", "worker")  # the job layer's tasks
        assert r.resource[logs.REPLICA] == labels["volcano.sh/task-index"]
        assert r.resource[logs.ATTEMPT] == annotations["volcano.sh/job-retry-count"] == "0"
        assert r.resource[logs.LOG_PREFIX] == f"logs/teams/{TEAM}/{JOB}"
        assert r.resource["k8s.pod.name"] == pod["metadata"]["name"]
        assert r.resource["k8s.node.name"] == node  # from the API server: the processor ran
        assert r.key.startswith(f"logs/teams/{TEAM}/{JOB}/year="), r.key
        if r.attributes["log.iostream"] == "stderr":
            assert r.body == "\n".join(traceback)
        else:
            assert r.body == f"hello from {pod['metadata']['name']}"
    tasks = sorted(r.resource[logs.TASK] for r in shipped if r.body.startswith("hello"))
    assert tasks == sorted(p["metadata"]["labels"]["volcano.sh/task-spec"] for p in on_node)
    print(json.dumps({"node": node, "pods_on_node": len(on_node), "records": len(shipped)}))
