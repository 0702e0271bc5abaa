"""Issue 39 #5, #6: `pulumi up` keeps the size the autoscaler set, on the system node group as on
the GPU pools, and a raised minimum reaches EKS with a desired size it accepts.

EKS refuses an UpdateNodegroupConfig whose minimum exceeds its desired size ("Minimum capacity
N can't be greater than desired size M"; hashicorp/terraform-provider-aws#18310,
terraform-aws-modules/terraform-aws-eks#3306); with `ignoreChanges` on the desired size the
provider sends the size from the stack's state next to the new minimum, so the program reads
the live size and clamps it into the new bounds when they exclude it. These tests answer the
program's `aws:eks/getNodeGroup` invoke as AWS would and read what it asks the engine for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from pulumi.runtime import MockCallArgs

from tests.components import test_eks, test_gpu
from tests.conftest import Recorded
from trainstack.builders import nodegroups as ng
from trainstack.config.model import NodeGroupSize
from trainstack.preview.mocks import RecordingMocks

GET_NODE_GROUP = "aws:eks/getNodeGroup:getNodeGroup"


class LiveNodeGroups(RecordingMocks):
    """AWS with node groups of these desired sizes ({name: size}); any other is not found."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__()
        self.sizes = sizes
        self.asked: list[dict[str, Any]] = []

    def call(self, args: MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        if args.token != GET_NODE_GROUP:
            return super().call(args)
        self.asked.append(dict(args.args))
        name = args.args["nodeGroupName"]
        if name not in self.sizes:
            return {}, [("couldn't find resource", "nodeGroupName")]
        size = self.sizes[name]
        return {"scalingConfigs": [{"desiredSize": size, "minSize": 0, "maxSize": 99}]}, []


@pytest.mark.parametrize(
    ("live", "desired", "ignored"),
    [
        (None, 2, True),  # a new group (or offline): the configured size
        (3, 2, True),  # inside [2, 6]: the autoscaler's, left alone
        (1, 2, False),  # the minimum was raised past it: sent, clamped up
        (9, 6, False),  # the maximum was lowered under it: sent, clamped down
        (2, 2, True),
        (6, 2, True),
    ],
)
def test_the_live_size_is_kept_unless_the_bounds_exclude_it(
    live: int | None, desired: int, ignored: bool
) -> None:
    size = NodeGroupSize(min=2, desired=2, max=6)
    assert ng.desired_size(size, live) == (desired, [ng.DESIRED_SIZE] if ignored else [])


def _pool(run_program: Callable[..., Recorded], live: dict[str, int], minimum: int) -> Any:
    pool = test_gpu.efa_pool("p5.48xlarge", size={"min": minimum, "max": 8})
    mocks = LiveNodeGroups(live)

    def run(program: Callable[[], Any], stack: str = "test") -> Recorded:
        return run_program(program, stack, mocks=mocks)

    cfg = test_gpu.platform([pool])
    rec = test_gpu.run_pool(run, cfg)
    assert mocks.asked == [{"clusterName": cfg.cluster_name, "nodeGroupName": "gpu"}]
    return rec.one("aws:eks/nodeGroup:NodeGroup", "pool-nodes")


def test_a_gpu_pool_whose_minimum_rises_past_its_live_size_sends_an_accepted_size(
    run_program: Callable[..., Recorded],
) -> None:
    """Before the fix: desired size ignored, so EKS got min 4 with the state's desired 1."""
    nodes = _pool(run_program, {"gpu": 1}, minimum=4)
    assert nodes.inputs["scalingConfig"] == {"minSize": 4, "desiredSize": 4, "maxSize": 8}
    assert "ignoreChanges" not in nodes.options


def test_a_gpu_pool_inside_its_bounds_keeps_the_autoscalers_size(
    run_program: Callable[..., Recorded],
) -> None:
    nodes = _pool(run_program, {"gpu": 5}, minimum=4)
    assert nodes.options["ignoreChanges"] == [ng.DESIRED_SIZE]
    # A first deployment: nothing to read, the configured size, ignored afterwards.
    first = _pool(run_program, {}, minimum=4)
    assert first.inputs["scalingConfig"]["desiredSize"] == 4
    assert first.options["ignoreChanges"] == [ng.DESIRED_SIZE]


def test_the_system_node_group_keeps_its_size_and_accepts_a_new_minimum(
    run_program: Callable[..., Recorded],
) -> None:
    """#5: the autoscaler auto-discovers the system group (EKS tags managed node groups for
    it); before the fix `pulumi up` reset it to its configured desired size."""
    cfg = test_eks.platform()
    assert cfg.aws is not None
    grown = run_program(test_eks.build(cfg), mocks=LiveNodeGroups({"system": 3}))
    group = grown.one("aws:eks/nodeGroup:NodeGroup", "c-system")
    assert group.options["ignoreChanges"] == [ng.DESIRED_SIZE]
    system = replace(cfg.aws.cluster.system_node_group, size=NodeGroupSize(4, 4, 6))
    raised = replace(
        cfg, aws=replace(cfg.aws, cluster=replace(cfg.aws.cluster, system_node_group=system))
    )
    group = run_program(test_eks.build(raised), mocks=LiveNodeGroups({"system": 3})).one(
        "aws:eks/nodeGroup:NodeGroup", "c-system"
    )
    assert group.inputs["scalingConfig"] == {"minSize": 4, "desiredSize": 4, "maxSize": 6}
    assert "ignoreChanges" not in group.options


def test_the_offline_preview_reads_nothing_live(run_program: Callable[..., Recorded]) -> None:
    """The product's mocks answer no invoke: the plan shows the configured size, ignored."""
    group = run_program(test_eks.build(test_eks.platform())).one(
        "aws:eks/nodeGroup:NodeGroup", "c-system"
    )
    assert group.inputs["scalingConfig"] == {"minSize": 2, "desiredSize": 2, "maxSize": 4}
    assert group.options["ignoreChanges"] == [ng.DESIRED_SIZE]
