"""Training jobs for scenarios, made the way teams make them: a job spec, checked and rendered
against the platform stack's outputs by `trainstack.jobs.render` (what TrainingJob deploys).

Scenario knobs that no spec has (a pod exiting with a code, after a delay) are pod-template
annotations read by the kwok stages (trainstack/sandbox/kwok-stages.yaml).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tests.e2e.conftest import Deployed
from trainstack.builders.fabric import GPU_RESOURCE
from trainstack.builders.pools import gpus_per_node, max_nodes
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import build
from trainstack.kube import Identity, wait_for

EXIT_CODE = "e2e.trainstack.io/exit-code"
EXIT_AFTER = "e2e.trainstack.io/exit-after"
EVICT_AFTER = "e2e.trainstack.io/evict-after"  # kwok-stages.yaml: pod-evicted
VOLCANO_JOB = ("batch.volcano.sh/v1alpha1", "Job")
QUEUE = ("scheduling.volcano.sh/v1beta1", "Queue")
PODGROUP = ("scheduling.volcano.sh/v1beta1", "PodGroup")


def spec(
    team: str,
    name: str,
    *,
    pool: str,
    replicas: int | dict[str, int] = 1,  # a number, or an elastic range {min, max[, size]}
    gpus: int = 1,
    priority: str = "normal",
    max_retries: int = 3,
    max_preemptions: int = 100,
    cpu: str = "4",
    memory: str = "16Gi",
) -> dict[str, Any]:
    return {
        "apiVersion": "trainstack.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "team": team},
        "spec": {
            # A digest: the prod platform is a production stack (pinned-images, docs/policies.md).
            "image": f"registry.example.com/{team}/e2e:1.0@sha256:{'e' * 64}",
            "command": ["python", "-m", "train"],
            "pool": pool,
            "workers": {"replicas": replicas, "gpus": gpus, "cpu": cpu, "memory": memory},
            "checkpoint": {"intervalSeconds": 600},
            "maxDurationHours": 24,
            "priority": priority,
            "retry": {"maxRetries": max_retries, "maxPreemptions": max_preemptions},
        },
    }


def rendered(platform: Deployed, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The Volcano Job the team stack would deploy for this spec on this platform."""
    return render(build(doc, f"e2e:{doc['metadata']['name']}"), PlatformView(platform.plan.outputs))


def exiting(job: dict[str, Any], code: int, after: str = "1s", task: str | None = None) -> None:
    """Make the pods of `task` (default: all) exit with `code` after `after` running."""
    for entry in job["spec"]["tasks"]:
        if task is None or entry["name"] == task:
            meta = entry["template"].setdefault("metadata", {})
            meta.setdefault("annotations", {}).update({EXIT_CODE: str(code), EXIT_AFTER: after})


def submit(platform: Deployed, job: dict[str, Any], as_: Identity | None = None) -> None:
    team = job["metadata"]["namespace"]
    platform.kube.create(job, as_=as_ or platform.member(team))


def pods(platform: Deployed, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    meta = job["metadata"]
    return platform.kube.list(
        "v1", "Pod", meta["namespace"], labels=f"volcano.sh/job-name={meta['name']}"
    )


def live(platform: Deployed, job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    result: dict[str, Any] = platform.kube.get(*VOLCANO_JOB, meta["name"], meta["namespace"])
    return result


def phase(platform: Deployed, job: Mapping[str, Any]) -> str:
    return str(live(platform, job).get("status", {}).get("state", {}).get("phase", ""))


def replicas(job: Mapping[str, Any]) -> int:
    return sum(int(t["replicas"]) for t in job["spec"]["tasks"])


def running_pods(platform: Deployed, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(platform, job)
        if p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def bound_pods(platform: Deployed, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [p for p in pods(platform, job) if p["spec"].get("nodeName")]


def wait_running(platform: Deployed, job: Mapping[str, Any], timeout: float = 60) -> list[Any]:
    """Every replica Running; returns the pods."""
    want = replicas(job)
    return wait_for(
        f"{job['metadata']['name']}: {want} pods Running",
        lambda: found if len(found := running_pods(platform, job)) == want else None,
        timeout=timeout,
    )


def stays_unscheduled(
    platform: Deployed, job: Mapping[str, Any], seconds: float = 8
) -> list[dict[str, Any]]:
    """Watch for `seconds` (several scheduling cycles); return any pod that got a node."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        bound = bound_pods(platform, job)
        if bound:
            return bound
        time.sleep(0.5)
    return []


def delete(platform: Deployed, job: Mapping[str, Any]) -> None:
    meta = job["metadata"]
    platform.kube.delete(*VOLCANO_JOB, meta["name"], meta["namespace"])

    def gone() -> bool:
        return platform.kube.get_or_none(*VOLCANO_JOB, meta["name"], meta["namespace"]) is None

    wait_for(f"job {meta['name']} deleted", gone, timeout=60)
    wait_for(f"pods of {meta['name']} gone", lambda: not pods(platform, job), timeout=60)


# -- what the scheduler did: queues, pools, GPUs held ------------------------------------------


def queue_gpus(platform: Deployed, team: str, level: str) -> int:
    """GPUs of the team queue's `guarantee`, `deserved` or `capability`, as the stack made it."""
    spec = platform.kube.get(*QUEUE, team)["spec"]
    values = spec["guarantee"]["resource"] if level == "guarantee" else spec.get(level, {})
    return int(values.get(GPU_RESOURCE, 0))


def running_gpus(platform: Deployed, team: str, pool: str = "") -> int:
    """GPUs the team's running pods hold, on one pool's nodes (named `<pool>-<n>`) or all."""
    total = 0
    for pod in platform.kube.list("v1", "Pod", team):
        node = pod["spec"].get("nodeName") or ""
        if pod.get("status", {}).get("phase") == "Running" and node.startswith(pool):
            for container in pod["spec"]["containers"]:
                total += int(container["resources"].get("requests", {}).get(GPU_RESOURCE, 0))
    return total


def pool_gpus(platform: Deployed, name: str) -> int:
    """GPUs of a pool at its maximum size (the simulated nodes: sandbox/nodes.py)."""
    pool = platform.cfg.pool(name)
    assert pool is not None
    return gpus_per_node(pool) * max_nodes(pool)


def podgroup(platform: Deployed, job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The PodGroup Volcano made for `job` (it owns it), once it exists."""
    uid = live(platform, job)["metadata"]["uid"]
    for group in platform.kube.list(*PODGROUP, job["metadata"]["namespace"]):
        if any(ref.get("uid") == uid for ref in group["metadata"].get("ownerReferences", [])):
            found: dict[str, Any] = group
            return found
    return None
