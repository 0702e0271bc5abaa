"""Mode "replace" against moto's EC2 Auto Scaling (a real AWS API emulator, through a real
boto3 client): the group an EKS managed node group makes, tagged as EKS tags it, an instance
in it, and the controller's call marking that instance Unhealthy. A group of another cluster
is refused before any write. moto enforces no IAM: the policy that refuses the same on AWS is
asserted in tests/builders/test_health_iam.py.

The tags: EKS creates a managed node group's Auto Scaling group with the keys `eks`,
`eks:cluster-name` and `eks:nodegroup-name` (the AWS managed policy
AWSServiceRoleForAmazonEKSNodegroup v11, statement AllowASGCreationByEKS, allows EKS
CreateAutoScalingGroup only with those tag keys; read from iann0036/iam-dataset
aws/managedpolicies/AWSServiceRoleForAmazonEKSNodegroup.json at 2073fa52), and tags it for the
Cluster Autoscaler's discovery (awsdocs/amazon-eks-user-guide latest/ug/nodes/
managed-node-groups.adoc, "Managed node groups concepts").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from trainstack_health import contract
from trainstack_health.repair import decide
from trainstack_health.repair.aws import AutoScaling, Replacer, ReplaceRefused
from trainstack_health.repair.controller import run_once
from trainstack_health.repair.metrics import ERRORS, REPAIRS

from tests.health.test_repair_controller import FakeKube, deps
from tests.health.test_repair_decide import NOW, node_obj
from trainstack.builders import health_iam

REGION = "us-west-2"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


def node_group(cluster: str, nodegroup: str) -> tuple[Any, str]:
    """An Auto Scaling group as EKS makes one for a managed node group, with one instance."""
    ec2 = boto3.client("ec2", region_name=REGION)
    template = f"eks-{cluster}-{nodegroup}"
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"},
    )
    group = f"eks-{nodegroup}-0ac9a3f2-1234-5678-9abc-def012345678"
    tags = {
        "eks:cluster-name": cluster,
        "eks:nodegroup-name": nodegroup,
        f"k8s.io/cluster-autoscaler/{cluster}": "owned",
        "k8s.io/cluster-autoscaler/enabled": "true",
    }
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=group,
        MinSize=1,
        MaxSize=2,
        DesiredCapacity=1,
        LaunchTemplate={"LaunchTemplateName": template, "Version": "$Latest"},
        AvailabilityZones=[f"{REGION}a"],
        Tags=[
            {"Key": k, "Value": v, "PropagateAtLaunch": True, "ResourceId": group,
             "ResourceType": "auto-scaling-group"}
            for k, v in tags.items()
        ],
    )  # fmt: skip
    found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
    instance = found["AutoScalingGroups"][0]["Instances"][0]["InstanceId"]
    return autoscaling, instance


def health(autoscaling: Any, instance: str) -> str:
    found = autoscaling.describe_auto_scaling_instances(InstanceIds=[instance])
    return str(found["AutoScalingInstances"][0]["HealthStatus"])


@pytest.mark.usefixtures("aws")
def test_replacer_marks_this_clusters_instance_unhealthy() -> None:
    autoscaling, instance = node_group("prod", "gpu-h100")
    assert health(autoscaling, instance) == "Healthy"
    group = Replacer(autoscaling, "prod").replace(instance)
    assert group.startswith("eks-gpu-h100-")
    assert health(autoscaling, instance) == "Unhealthy"


class Recording:
    """The real client, with its calls written down (to prove a refusal writes nothing)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: list[str] = []

    def describe_auto_scaling_instances(self, **kwargs: Any) -> Any:
        self.calls.append("DescribeAutoScalingInstances")
        return self.client.describe_auto_scaling_instances(**kwargs)

    def describe_auto_scaling_groups(self, **kwargs: Any) -> Any:
        self.calls.append("DescribeAutoScalingGroups")
        return self.client.describe_auto_scaling_groups(**kwargs)

    def set_instance_health(self, **kwargs: Any) -> Any:
        self.calls.append("SetInstanceHealth")
        return self.client.set_instance_health(**kwargs)


@pytest.mark.usefixtures("aws")
def test_another_clusters_group_is_refused_without_a_write() -> None:
    autoscaling, instance = node_group("staging", "gpu-h100")
    recording = Recording(autoscaling)
    client: AutoScaling = recording
    with pytest.raises(ReplaceRefused, match="eks:cluster-name='staging', not 'prod'"):
        Replacer(client, "prod").replace(instance)
    assert recording.calls == ["DescribeAutoScalingInstances", "DescribeAutoScalingGroups"]
    assert health(autoscaling, instance) == "Healthy"


@pytest.mark.usefixtures("aws")
def test_instance_in_no_group_is_refused() -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    loose = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)
    instance = loose["Instances"][0]["InstanceId"]
    recording = Recording(boto3.client("autoscaling", region_name=REGION))
    with pytest.raises(ReplaceRefused, match="is in no Auto Scaling group"):
        Replacer(recording, "prod").replace(instance)
    assert "SetInstanceHealth" not in recording.calls


@pytest.mark.usefixtures("aws")
def test_a_pass_replaces_the_failed_node_and_refuses_the_other_clusters() -> None:
    """The controller end to end with the real client: the node of this cluster is marked
    Unhealthy and labelled requested; a node whose instance belongs to another cluster's
    group is refused, counted, left drained, and its instance untouched."""
    autoscaling, ours = node_group("prod", "gpu-h100")
    _, theirs = node_group("staging", "gpu-a100")
    drained = decide.drained_at_text(NOW - 600)
    kube = FakeKube(
        [
            node_obj("ours", progress="drained", drained_at=drained,
                     provider_id=f"aws:///{REGION}a/{ours}"),
            node_obj("theirs", progress="drained", drained_at=drained, pool="a100",
                     provider_id=f"aws:///{REGION}a/{theirs}"),
        ],
        [],
    )  # fmt: skip
    d = deps(kube, replacer=Replacer(autoscaling, "prod"))
    result = run_once(d, now=NOW)
    assert health(autoscaling, ours) == "Unhealthy"
    assert health(autoscaling, theirs) == "Healthy"
    labels = {name: n["metadata"]["labels"][contract.REPAIR_LABEL]
              for name, n in kube.nodes.items()}  # fmt: skip
    assert labels == {"ours": "requested", "theirs": "drained"}
    assert result.errors == 1
    assert d.metrics.value(ERRORS, operation="replace") == 1
    assert d.metrics.value(REPAIRS, pool="h100", action="replace") == 1
    assert d.metrics.value(REPAIRS, pool="a100", action="replace") == 0


@pytest.mark.usefixtures("aws")
def test_the_iam_policy_allows_exactly_the_calls_made() -> None:
    """Every API call the replacement makes (botocore's own operation names, recorded on the
    real client) is an action of trainstack/builders/health_iam.repair_policy, and the policy
    has no action the controller never calls."""
    autoscaling, instance = node_group("prod", "gpu-h100")
    made: list[str] = []
    sent: list[dict[str, Any]] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        made.append(f"autoscaling:{model.name}")
        sent.append(params)

    autoscaling.meta.events.register("before-call.auto-scaling.*", record)
    Replacer(autoscaling, "prod").replace(instance)
    granted = {
        action
        for statement in health_iam.repair_policy("prod")["Statement"]
        for action in statement["Action"]
    }
    assert set(made) == granted
    assert made[-1] == "autoscaling:SetInstanceHealth"
    # botocore's serialized query parameters: the grace period is not respected
    assert sent[-1]["body"] == {
        "Action": "SetInstanceHealth",
        "Version": "2011-01-01",
        "InstanceId": instance,
        "HealthStatus": "Unhealthy",
        "ShouldRespectGracePeriod": "false",
    }
