"""Image pre-pull on the real control plane (issue 48; docs/prepull.md).

What runs for real: the API server, the DaemonSet controller (kube-controller-manager: it makes
a pod of each pool's pre-pull DaemonSet for every node its selector and tolerations admit, new
nodes included, and rolls a changed template out with its surge bound), kube-scheduler (it binds
the pods: started for this module only) and the DaemonSets exactly as the prod stack's plan has
them, images from the vision team stack's jobs included.

What kwok stands in for: the kubelet. It pulls nothing; a pod annotated
`e2e.trainstack.io/ready-after` becomes Ready that long after it is bound
(trainstack/sandbox/kwok-stages.yaml), as a pod whose images take that long to pull would. The
image garbage collection, the registry and the pulls themselves cannot run here.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Deployed
from trainstack.builders import labels, prepull
from trainstack.config.model import SYSTEM_NAMESPACE
from trainstack.kube import wait_for
from trainstack.sandbox import deploy, nodes

DAEMONSET = ("apps/v1", "DaemonSet")
POOL = "h100-block"  # prod's pool with the most simulated nodes
READY_AFTER = "e2e.trainstack.io/ready-after"
NEW_NODE = "prepull-new-0"


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _pods(platform: Deployed, pool: str) -> list[dict[str, Any]]:
    selector = f"{labels.APP_NAME}={prepull.APP},{prepull.POOL_LABEL}={pool}"
    return [
        p
        for p in platform.kube.list("v1", "Pod", SYSTEM_NAMESPACE, labels=selector)
        if not p["metadata"].get("deletionTimestamp")
    ]


def _pool_nodes(platform: Deployed, pool: str) -> set[str]:
    found = platform.kube.list("v1", "Node", labels=f"{labels.POOL}={pool}")
    return {n["metadata"]["name"] for n in found}


def _planned(platform: Deployed, pool: str) -> dict[str, Any]:
    name = prepull.daemonset_name(pool)
    return next(
        obj
        for _, obj in platform.plan.kubernetes_objects()
        if obj["kind"] == "DaemonSet" and obj["metadata"]["name"] == name
    )


def _settled(platform: Deployed, pool: str, images: set[str]) -> dict[str, dict[str, Any]]:
    """The pool's pods by node once every node of the pool has one, Ready, holding `images`."""

    def probe() -> dict[str, dict[str, Any]] | None:
        by_node = {p["spec"].get("nodeName"): p for p in _pods(platform, pool)}
        held = [{c["image"] for c in p["spec"]["containers"]} for p in by_node.values()]
        done = (
            set(by_node) == _pool_nodes(platform, pool)
            and all(_ready(p) for p in by_node.values())
            and all(h == images for h in held)
        )
        return by_node if done else None

    return wait_for(f"{pool}'s pre-pull pods on every node", probe, timeout=120)


@pytest.fixture(scope="module")
def pulled(prod: Deployed) -> Iterator[Deployed]:
    assert prod.cfg.pre_pull.enabled, "prod's example pre-pulls its images"
    prod.plane.start_default_scheduler()
    yield prod
    prod.plane.stop_default_scheduler()
    if prod.kube.get_or_none("v1", "Node", NEW_NODE) is not None:
        prod.kube.delete("v1", "Node", NEW_NODE)


def test_each_pools_pods_hold_its_images_on_every_node_of_the_pool_and_only_there(
    pulled: Deployed,
) -> None:
    for pool in pulled.cfg.gpu_pools:
        planned = _planned(pulled, pool.name)
        images = {c["image"] for c in planned["spec"]["template"]["spec"]["containers"]}
        by_node = _settled(pulled, pool.name, images)
        assert set(by_node) == _pool_nodes(pulled, pool.name)
    # the vision team's seed job's image is on the nodes of its pool
    held = {
        c["image"]
        for c in _planned(pulled, "h100-reserved")["spec"]["template"]["spec"]["containers"]
    }
    assert any("/vision/demo-train" in image for image in held)


def test_a_changed_list_pulls_on_at_most_max_parallel_pulls_nodes_at_once(
    pulled: Deployed,
) -> None:
    """A team adds a job: the pool's list gains an image. The DaemonSet controller puts a new
    pod beside the old on at most maxParallelPulls nodes at a time, and each new pod takes
    3 s to pull; never more nodes pull at once, and every node ends with the new list."""
    bound = pulled.cfg.pre_pull.max_parallel_pulls
    members = _pool_nodes(pulled, POOL)
    assert len(members) > bound, "the pool must be larger than the bound to test it"
    ds = pulled.kube.get(*DAEMONSET, prepull.daemonset_name(POOL), SYSTEM_NAMESPACE)
    before = {c["image"] for c in ds["spec"]["template"]["spec"]["containers"]}
    _settled(pulled, POOL, before)
    new = "registry.example.com/vision/new-model@sha256:" + "ab" * 32
    template = copy.deepcopy(ds["spec"]["template"])
    template["spec"]["containers"].append(
        {**template["spec"]["containers"][0], "name": prepull.container_name(new), "image": new}
    )
    template["metadata"].setdefault("annotations", {})[READY_AFTER] = "3s"
    pulled.kube.patch(ds, {"spec": {"template": template}})

    most, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = _pods(pulled, POOL)
        fresh = [p for p in pods if any(c["image"] == new for c in p["spec"]["containers"])]
        pulling = {p["spec"].get("nodeName") for p in fresh if not _ready(p)}
        most = max(most, len(pulling))
        done = {p["spec"].get("nodeName") for p in fresh if _ready(p)}
        if done == members and len(pods) == len(members):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the rollout did not finish: {len(done)} of {len(members)} nodes")
    # never above the bound, and more than one at a time: a bound, not a serialisation
    assert 2 <= most <= bound, f"{most} nodes pulled at once (bound {bound})"
    _settled(pulled, POOL, before | {new})


def test_a_new_node_of_the_pool_receives_the_pools_images(pulled: Deployed) -> None:
    pool = pulled.cfg.pool("h200-burst")
    assert pool is not None
    images = {
        c["image"] for c in _planned(pulled, pool.name)["spec"]["template"]["spec"]["containers"]
    }
    _settled(pulled, pool.name, images)
    node = copy.deepcopy(nodes.pool_nodes(pulled.cfg, pool, 1)[0])
    node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = NEW_NODE
    deploy.create_nodes(pulled.kube, [node])
    by_node = _settled(pulled, pool.name, images)
    assert NEW_NODE in by_node
    # and no other pool's DaemonSet put a pod there
    others = [
        p
        for p in pulled.kube.list(
            "v1", "Pod", SYSTEM_NAMESPACE, labels=f"{labels.APP_NAME}={prepull.APP}"
        )
        if p["spec"].get("nodeName") == NEW_NODE
    ]
    assert [p["metadata"]["labels"][prepull.POOL_LABEL] for p in others] == [pool.name]
