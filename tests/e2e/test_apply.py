"""Every Kubernetes object of every example stack, applied to a real API server with Volcano's
webhooks and the platform's own admission policies in the path.

Two properties, tested apart so that one defect does not hide the other:
- each object is accepted on its own merits and keeps every field that was sent (the API
  server prunes fields a CRD does not declare, silently);
- the dependencies the plan declares are enough: applied in dependency order (one order the
  Pulumi engine may choose, see deploy.py), nothing is refused for arriving too early.
"""

from __future__ import annotations

import pytest

from tests.conftest import EXAMPLE_STACKS
from trainstack.builders import labels
from trainstack.config.model import TeamStackConfig
from trainstack.kube import Kube
from trainstack.preview.engine import Previewer
from trainstack.sandbox import deploy
from trainstack.sandbox.cluster import KWOK_ANNOTATION, ControlPlane

PLATFORMS = [s for s in EXAMPLE_STACKS if s != "vision"]


def _deploy_platform_for(previewer: Previewer, stack: str) -> str | None:
    """The platform a team stack needs deployed first, or None for a platform stack."""
    cfg, _ = previewer.load(stack)
    return cfg.platform_stack_name if isinstance(cfg, TeamStackConfig) else None


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_every_object_is_accepted_and_kept_whole(
    stack: str, control_plane: ControlPlane, kube: Kube, previewer: Previewer
) -> None:
    deploy.reset(kube)
    platform = _deploy_platform_for(previewer, stack)
    if platform:
        base = deploy.converge(kube, previewer.preview(platform))
        assert not base.errors, base.errors
    plan = previewer.preview(stack)
    outcome = deploy.converge(kube, plan, dry_run_first=True)
    assert not outcome.errors, "\n".join(f"{k}: {v}" for k, v in outcome.errors.items())
    assert not outcome.pruned, outcome.pruned
    applied, _ = deploy.items(plan)
    assert len(outcome.live) == len(applied)
    assert set(outcome.skipped.values()) <= set(deploy.UNSERVED.values())
    control_plane.check()


@pytest.mark.parametrize("stack", PLATFORMS)
def test_declared_dependencies_suffice(stack: str, kube: Kube, previewer: Previewer) -> None:
    """Dry run, then for real, wave by wave; nothing refused for arriving before what it needs."""
    deploy.reset(kube)
    outcome = deploy.apply_in_order(kube, previewer.preview(stack))
    # Issue 15 #5: queues used to depend on the release alone, and a child could reach
    # Volcano's webhook before its parent ("failed to get parent queue").
    assert not outcome.errors, "\n".join(f"{k}: {v}" for k, v in outcome.errors.items())


def test_unserved_groups_are_only_those_named(previewer: Previewer) -> None:
    """Skipping is explicit: every skipped object belongs to a group with a stated reason."""
    skipped = {}
    for stack in PLATFORMS:
        _, reasons = deploy.items(previewer.preview(stack))
        skipped |= reasons
    assert skipped, "onprem's NicClusterPolicy should be the one skipped object"
    assert all(label.startswith("NicClusterPolicy") for label in skipped)


def test_reset_deletes_the_pods_of_deleted_nodes_at_once(kube: Kube) -> None:
    """deploy.reset deletes the simulated nodes; a pod bound to one is then deleted
    gracefully by nobody (no kwok confirms it), and the pod garbage collector removes it only
    after its 40 s quarantine, its namespace waiting with it. delete_pods_now (what reset and
    restore_platform call) deletes with a zero grace period, which the API server carries
    out at once (sandbox/deploy.py, the sources cited there)."""
    deploy.reset(kube)
    namespace, name = "reset-probe", "reset-probe-node"
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {labels.MANAGED_BY: labels.MANAGER}},
        }
    )
    deploy.create_nodes(
        kube,
        [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_ANNOTATION: "fake"},
                    "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
                },
            }
        ],
    )
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "namespace": namespace},
            "spec": {
                "nodeName": name,
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "main", "image": "registry.example.com/probe:1"}],
            },
        }
    )
    kube.delete("v1", "Node", name)
    kube.delete("v1", "Pod", "probe", namespace)  # graceful, as the namespace controller does
    pending = kube.get_or_none("v1", "Pod", "probe", namespace)
    assert pending is not None
    assert pending["metadata"].get("deletionTimestamp")
    assert not deploy.delete_pods_now(kube, {namespace})  # one was there
    assert kube.get_or_none("v1", "Pod", "probe", namespace) is None  # and is gone already
    assert deploy.delete_pods_now(kube, {namespace})
    deploy.reset(kube)
    assert kube.get_or_none("v1", "Namespace", namespace) is None


def test_the_default_scheduler_starts_once(control_plane: ControlPlane) -> None:
    """A second start while kube-scheduler runs starts nothing and says so, so that a caller
    (test_pulumi_stacks.owners_cluster) stops only the one it started; before, a second
    process replaced the first in `processes`, which then ran on unstopped."""
    assert control_plane.start_default_scheduler()
    first = control_plane.processes["kube-scheduler"]
    try:
        assert not control_plane.start_default_scheduler()
        assert control_plane.processes["kube-scheduler"] is first
    finally:
        control_plane.stop_default_scheduler()
    assert "kube-scheduler" not in control_plane.processes
    assert not first.alive()
