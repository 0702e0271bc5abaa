"""The prod queue hierarchy against Volcano's queue webhook (validate_queue.go): created from
nothing, and one team's quota raised and lowered, as `pulumi up` would apply them."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import STACKS
from trainstack.builders.scheduling import queues
from trainstack.config import parse_stack_config, read_stack_file
from trainstack.config.model import PlatformConfig
from trainstack.kube import ApiError, Kube
from trainstack.preview.engine import Previewer
from trainstack.sandbox import deploy


def _prod(change: Callable[[dict[str, Any]], None] | None = None) -> PlatformConfig:
    values = copy.deepcopy(read_stack_file(STACKS / "Pulumi.prod.yaml"))
    if change is not None:
        change(values["trainstack:platform"])
    cfg = parse_stack_config(values, stack="prod", source="e2e")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def _vision_gpus(delta: int, group: bool = False) -> Callable[[dict[str, Any]], None]:
    """vision's guarantee and deserved share by `delta`; with `group`, the guarantee alone,
    and research's quota with it (prod has no room for more deserved shares)."""

    def change(platform: dict[str, Any]) -> None:
        team = next(t for t in platform["registry"]["teams"] if t["name"] == "vision")
        team["quota"]["gpus"] += delta
        if group:
            research = next(g for g in platform["registry"]["groups"] if g["name"] == "research")
            research["quota"]["gpus"] += delta
        else:
            team["quota"]["deserved"] += delta

    return change


def _apply_all(kube: Kube, manifests: list[dict[str, Any]]) -> dict[str, str]:
    """Apply one after another. Volcano's webhook reads queues from an informer cache, so each
    apply is given time to reach it: what is tested is the order, not the cache's lag."""
    refused = {}
    for manifest in manifests:
        try:
            kube.apply(manifest)
        except ApiError as error:
            refused[manifest["metadata"]["name"]] = error.message
        time.sleep(0.5)
    return refused


def test_hierarchy_is_created_from_nothing(kube: Kube, previewer: Previewer) -> None:
    """In the dependency order the plan declares (deploy.waves), queues alone. Issue 15 #5:
    a child used to reach Volcano's webhook before its parent ("failed to get parent queue")."""
    deploy.reset(kube)
    plan = previewer.preview("prod")
    queue_items = [i for i in deploy.items(plan)[0] if i.obj["kind"] == "Queue"]
    refused: dict[str, str] = {}
    for layer in deploy.waves(plan, queue_items):
        refused |= _apply_all(kube, [i.obj for i in reversed(layer)])
    assert not refused, refused


def _top_down(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_name = {q["metadata"]["name"]: q for q in manifests}

    def depth(queue: dict[str, Any]) -> int:
        parent = queue["spec"].get("parent")
        return 0 if parent not in by_name else 1 + depth(by_name[parent])

    return sorted(manifests, key=depth)


def _land(
    kube: Kube, before: list[dict[str, Any]], ordered: list[dict[str, Any]]
) -> dict[str, str]:
    deploy.reset(kube)
    start = _apply_all(kube, _top_down(before))
    assert not start, f"the starting hierarchy was refused: {start}"
    return _apply_all(kube, ordered)


@pytest.mark.parametrize("delta", [8, -8], ids=["raise", "lower"])
def test_quota_change_is_accepted_in_any_order(kube: Kube, delta: int) -> None:
    """Issue 15 #5: within its group's quota a team's change touches its own queue only
    (parents carry envelopes, builders/scheduling.queues), so no order can be wrong. With
    parents at the exact sums, raising was refused when the child landed first and lowering
    when the parent did."""
    before = queues(_prod())
    after = [q for q in queues(_prod(_vision_gpus(delta))) if q not in before]
    assert {q["metadata"]["name"] for q in after} == {"vision"}
    assert not _land(kube, before, after)
    deploy.reset(kube)


def test_group_quota_raised_with_a_team_in_the_engines_order(kube: Kube) -> None:
    """Raising a group's quota with one of its teams changes both; the child depends on its
    parent, so the engine lands the group first, which Volcano accepts. (Lowering both in one
    update would need the reverse order: docs/scheduling.md says to lower the team first.)"""
    before = queues(_prod())
    after = [q for q in queues(_prod(_vision_gpus(8, group=True))) if q not in before]
    assert {q["metadata"]["name"] for q in after} == {"vision", "group-research"}
    assert not _land(kube, before, _top_down(after))
    deploy.reset(kube)
