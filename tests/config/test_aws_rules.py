"""What AWS accepts, checked at preview time: each rule with a config it refuses (and the exact
message) and a config it accepts. docs/aws.md lists every rule with its source and its tests;
the invalid and valid fixtures cover the rules that read better as whole stack files."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from trainstack.catalog import InstanceType, catalog
from trainstack.config import ConfigError, PlatformConfig, parse_stack_config

P = "trainstack:platform."
REGION_ZONES = ["us-east-1a", "us-east-1b"]
RESERVATION_ID = "cr-0a1b2c3d4e5f60718"
GROUP_ARN = "arn:aws:resource-groups:us-east-1:111122223333:group/gpus"
APPEND = "+"
RESERVATION = "reservation id (cr-…)"
EC2_RESERVATION_ARN = "arn:aws:ec2:us-east-1:111122223333:capacity-reservation/cr-1"
CORE_PINS = {  # every add-on an EKS platform installs, pinned as in stacks/Pulumi.prod.yaml
    "vpc-cni": "v1.20.4-eksbuild.1",
    "coredns": "v1.12.2-eksbuild.4",
    "kube-proxy": "v1.33.3-eksbuild.6",
    "eks-pod-identity-agent": "v1.3.8-eksbuild.2",
    "aws-ebs-csi-driver": "v1.48.0-eksbuild.1",
}


def base() -> dict[str, Any]:
    """An AWS platform the preview accepts: one EFA pool in the first zone."""
    return {
        "cloud": "aws",
        "kubernetesVersion": "1.33",
        "aws": {
            "region": "us-east-1",
            "network": {"vpcCidr": "10.0.0.0/16", "availabilityZones": list(REGION_ZONES)},
        },
        "registry": {
            "teams": [{"name": "vision", "owners": ["a@example.com"], "quota": {"gpus": 0}}]
        },
        "gpuPools": [
            {
                "name": "h100",
                "instanceType": "p5.48xlarge",
                "fabric": "efa",
                "availabilityZone": "us-east-1a",
                "size": {"max": 2},
            }
        ],
    }


def with_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """`base()` with each dotted path set (`gpuPools.+` appends a pool)."""
    doc = base()
    for path, value in changes.items():
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        node: Any = doc
        for key in parents:
            node = node[key]
        if last == APPEND:
            node.append(copy.deepcopy(value))
        else:
            node[last] = copy.deepcopy(value)
    return {"trainstack:platform": doc}


def messages(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, stack="t", source="test")
    return sorted(str(issue) for issue in caught.value.issues)


def load(values: dict[str, Any]) -> PlatformConfig:
    config = parse_stack_config(values, stack="t", source="test")
    assert isinstance(config, PlatformConfig)
    return config


def existing_vpc(*zones: str, vpc_id: str = "vpc-0123456789abcdef0") -> dict[str, Any]:
    return {
        "existingVpc": {
            "vpcId": vpc_id,
            "privateSubnets": [
                {"id": f"subnet-0aaaaaaaaaaaaaaa{i + 1}", "availabilityZone": zone}
                for i, zone in enumerate(zones)
            ],
        }
    }


TCP_POOL = {"name": "l40s", "instanceType": "g6e.12xlarge", "fabric": "tcp", "size": {"max": 2}}
TCP_POOL_B = {**TCP_POOL, "availabilityZone": "us-east-1b"}
RETENTION_DAYS = (
    "1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, "
    "2922, 3288, 3653"
)


# (changes to base(), every message the preview reports), grouped as docs/aws.md groups them.
def _block_window() -> dict[str, str]:
    return {"start": "2030-01-01T11:30:00Z", "end": "2030-01-15T11:30:00Z"}


REFUSED = [
    # -- network
    pytest.param(
        {"aws.network.vpcCidr": "10.0.0.1/16"},
        [
            f"{P}aws.network.vpcCidr: '10.0.0.1/16' is not a network address "
            "(10.0.0.1/16 has host bits set)"
        ],
        id="vpc-cidr-not-a-network-address",
    ),
    pytest.param(
        {"aws.network.vpcCidr": "10.0.0.0/8"},
        [
            f"{P}aws.network.vpcCidr: '10.0.0.0/8' has prefix /8; use /16 to /20 "
            "(pods take VPC addresses, so GPU clusters need room)"
        ],
        id="vpc-cidr-larger-than-aws-allows",
    ),
    pytest.param(
        {"aws.network.availabilityZones": ["us-east-1a"], "gpuPools": []},
        [f"{P}aws.network.availabilityZones: ['us-east-1a'] is too short"],
        id="new-vpc-one-zone",
    ),
    pytest.param(
        {"aws.network": existing_vpc("us-east-1a")},
        [
            f"{P}aws.network.existingVpc.privateSubnets: [{{'id': 'subnet-0aaaaaaaaaaaaaaa1', "
            "'availabilityZone': 'us-east-1a'}] is too short"
        ],
        id="existing-vpc-one-subnet",
    ),
    pytest.param(
        {"aws.network": existing_vpc("us-east-1a", "us-west-2b")},
        [
            f"{P}aws.network.existingVpc.privateSubnets[1].availabilityZone: zone 'us-west-2b' "
            "is not in region 'us-east-1'"
        ],
        id="existing-subnet-zone-outside-region",
    ),
    pytest.param(
        {"aws.region": "us-east"},
        [
            f"{P}aws.network.availabilityZones[0]: zone 'us-east-1a' is not in region 'us-east'",
            f"{P}aws.network.availabilityZones[1]: zone 'us-east-1b' is not in region 'us-east'",
            f"{P}aws.region: 'us-east' does not match the expected format "
            "^[a-z]{2}(-gov)?-[a-z]+-[0-9]$ (An AWS region code, e.g. us-east-1.)",
        ],
        id="region-code-format",
    ),
    pytest.param(
        {"aws.network.availabilityZones": ["us-east-1a", "use1-az1"]},
        [
            f"{P}aws.network.availabilityZones[1]: 'use1-az1' does not match the expected format "
            "^[a-z]{2}(-gov)?-[a-z]+-[0-9][a-z]$ (An availability zone name (not a zone ID "
            "such as use1-az1), e.g. us-east-1a.)",
            f"{P}aws.network.availabilityZones[1]: zone 'use1-az1' is not in region 'us-east-1'",
        ],
        id="zone-name-not-zone-id",
    ),
    pytest.param(
        {"aws.network": existing_vpc("us-east-1a", "us-east-1b", vpc_id="vpc-123")},
        [
            f"{P}aws.network.existingVpc.vpcId: 'vpc-123' does not match the expected format "
            "^vpc-[0-9a-f]{8,17}$ (A VPC ID, e.g. vpc-0abc1234def567890.)"
        ],
        id="vpc-id-format",
    ),
    # -- cluster and IAM
    pytest.param(
        {
            "aws.cluster": {
                "endpoint": {
                    "publicAccess": False,
                    "privateAccess": True,
                    "publicAccessCidrs": ["203.0.113.0/24"],
                }
            }
        },
        [
            f"{P}aws.cluster.endpoint.publicAccessCidrs: has no effect with publicAccess: false; "
            "remove it"
        ],
        id="public-cidrs-without-public-endpoint",
    ),
    pytest.param(
        {"kubernetesVersion": "1.27"},
        [
            f"{P}kubernetesVersion: '1.27' does not match the expected format "
            '^1\\.(2[89]|3[0-7])$ (Kubernetes minor version of the cluster, e.g. "1.33". '
            "Pinned: upgrades are explicit.)"
        ],
        id="kubernetes-version-eks-does-not-offer",
    ),
    pytest.param(
        {"aws.cluster": {"logging": ["api", "kubelet"]}},
        [
            f"{P}aws.cluster.logging[1]: 'kubelet' is not one of api, audit, authenticator, "
            "controllerManager, scheduler"
        ],
        id="control-plane-log-type",
    ),
    pytest.param(
        {"aws.cluster": {"logRetentionDays": 45}},
        [
            f"{P}aws.cluster.logRetentionDays: 45 is not one of {RETENTION_DAYS} "
            "(did you mean '545'?)"
        ],
        id="log-retention-cloudwatch-does-not-offer",
    ),
    pytest.param(
        {"aws.cluster": {"secretsKmsKeyArn": "alias/eks"}},
        [
            f"{P}aws.cluster.secretsKmsKeyArn: 'alias/eks' does not match the expected format "
            "^arn:aws[-a-z]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$ (Use this KMS key for envelope "
            "encryption of Secrets; by default trainstack creates one with rotation on.)"
        ],
        id="secrets-key-not-a-key-arn",
    ),
    pytest.param(
        {"aws.cluster": {"adminPrincipalArns": ["arn:aws:iam::111122223333:group/admins"]}},
        [
            f"{P}aws.cluster.adminPrincipalArns[0]: 'arn:aws:iam::111122223333:group/admins' "
            "does not match the expected format ^arn:aws[-a-z]*:iam::[0-9]{12}:(role|user)/.+$ "
            "(An IAM role or user ARN, e.g. arn:aws:iam::123456789012:role/platform-admins.)"
        ],
        id="access-entry-for-an-iam-group",
    ),
    pytest.param(
        {"aws.cluster": {"addons": {**CORE_PINS, "vpc-cni": "1.20.4"}}},
        [
            f"{P}aws.cluster.addons.vpc-cni: '1.20.4' does not match the expected format "
            "^v[0-9]+\\.[0-9]+\\.[0-9]+-eksbuild\\.[0-9]+$ (An EKS add-on version as `aws eks "
            "describe-addon-versions` lists it, e.g. v1.20.4-eksbuild.1.)"
        ],
        id="addon-version-not-an-eks-build",
    ),
    pytest.param(
        {"aws.cluster": {"addons": {**CORE_PINS, "VPC_CNI": "v1.20.4-eksbuild.1"}}},
        [
            f"{P}aws.cluster.addons.VPC_CNI: 'VPC_CNI' does not match the expected format "
            "^[a-z][a-z0-9-]*$ (An EKS add-on name, e.g. vpc-cni.)"
        ],
        id="addon-name-format",
    ),
    pytest.param(
        {"aws.cluster": {"systemNodeGroup": {"minSize": 1, "desiredSize": 5, "maxSize": 3}}},
        [f"{P}aws.cluster.systemNodeGroup: desiredSize 5 is above maxSize 3"],
        id="system-nodes-desired-above-max",
    ),
    pytest.param(
        {"aws.cluster": {"systemNodeGroup": {"minSize": 0, "desiredSize": 1, "maxSize": 101}}},
        [
            f"{P}aws.cluster.systemNodeGroup.maxSize: 101 is greater than the maximum of 100",
            f"{P}aws.cluster.systemNodeGroup.minSize: 0 is less than the minimum of 1",
        ],
        id="system-nodes-size-bounds",
    ),
    pytest.param(
        {"aws.cluster": {"systemNodeGroup": {"diskSizeGiB": 16385}}},
        [f"{P}aws.cluster.systemNodeGroup.diskSizeGiB: 16385 is greater than the maximum of 16384"],
        id="system-nodes-root-volume-above-gp3-max",
    ),
    # -- node groups
    pytest.param(
        {"gpuPools.0.size": {"max": 0}},
        [f"{P}gpuPools[0].size.max: 0 is less than the minimum of 1"],
        id="pool-max-size-zero",
    ),
    pytest.param(
        {"gpuPools.0.size": {"max": 1001}},
        [f"{P}gpuPools[0].size.max: 1001 is greater than the maximum of 1000"],
        id="pool-max-size-above-node-group-quota",
    ),
    pytest.param(
        {"gpuPools.0.diskSizeGiB": 16385},
        [f"{P}gpuPools[0].diskSizeGiB: 16385 is greater than the maximum of 16384"],
        id="pool-root-volume-above-gp3-max",
    ),
    pytest.param(
        {"gpuPools.0.availabilityZone": "us-west-2a"},
        [
            f"{P}gpuPools[0].availabilityZone: 'us-west-2a' has no private subnet of this "
            "platform; use one of us-east-1a, us-east-1b"
        ],
        id="pool-zone-outside-the-region",
    ),
    # -- capacity
    pytest.param(
        {"gpuPools.0.capacity": {"type": "dedicated"}},
        [
            f"{P}gpuPools[0].capacity.type: 'dedicated' is not one of onDemand, spot, "
            "reservation, capacityBlock"
        ],
        id="capacity-type-eks-has-no-equivalent",
    ),
    pytest.param(
        {"gpuPools.0.capacity": {"type": "onDemand", "reservationId": RESERVATION_ID}},
        [
            f"{P}gpuPools[0].capacity: onDemand capacity cannot target a capacity reservation "
            "or capacity block; use type: reservation or capacityBlock, or remove the reservation"
        ],
        id="on-demand-with-a-reservation",
    ),
    pytest.param(
        {
            "gpuPools.0.capacity": {
                "type": "reservation",
                "reservationId": RESERVATION_ID,
                "reservationGroupArn": GROUP_ARN,
            }
        },
        [
            f"{P}gpuPools[0].capacity: a reservation needs exactly one of reservationId or "
            "reservationGroupArn"
        ],
        id="reservation-with-two-targets",
    ),
    pytest.param(
        {"gpuPools.0.capacity": {"type": "capacityBlock"}},
        [f"{P}gpuPools[0].capacity.reservationId: required: the capacity block's {RESERVATION}"],
        id="capacity-block-without-reservation-id",
    ),
    pytest.param(
        {"gpuPools.0.capacity": {"type": "reservation", "reservationId": "cr-XYZ"}},
        [
            f"{P}gpuPools[0].capacity.reservationId: 'cr-XYZ' does not match the expected "
            "format ^cr-[0-9a-f]{8,17}$ (An EC2 capacity reservation ID, e.g. "
            "cr-0abc1234def567890.)"
        ],
        id="reservation-id-format",
    ),
    pytest.param(
        {
            "gpuPools.0.capacity": {
                "type": "reservation",
                "reservationGroupArn": EC2_RESERVATION_ARN,
            }
        },
        [
            f"{P}gpuPools[0].capacity.reservationGroupArn: 'arn:aws:ec2:us-east-1:111122223333:"
            "capacity-reservation/cr-1' does not match the expected format "
            "^arn:aws[-a-z]*:resource-groups:[a-z0-9-]+:[0-9]{12}:group/.+$ (A capacity "
            "reservation group (resource group) ARN, e.g. arn:aws:resource-groups:us-east-1:"
            "123456789012:group/p5-reservations.)"
        ],
        id="reservation-group-is-a-resource-group-arn",
    ),
    pytest.param(
        {
            "gpuPools.0.capacity": {
                "type": "reservation",
                "reservationId": RESERVATION_ID,
                "instanceCount": 0,
            }
        },
        [f"{P}gpuPools[0].capacity.instanceCount: 0 is less than the minimum of 1"],
        id="reservation-of-no-instances",
    ),
    # -- storage
    pytest.param(
        {"storage": {"lustre": {"deploymentType": "PERSISTENT_1", "storageCapacityGiB": 1200}}},
        [
            f"{P}storage.lustre.deploymentType: 'PERSISTENT_1' is not one of PERSISTENT_2, "
            "SCRATCH_2 (did you mean 'PERSISTENT_2'?)"
        ],
        id="lustre-deployment-type-not-offered",
    ),
    pytest.param(
        {
            "storage": {
                "lustre": {
                    "storageCapacityGiB": 19200,
                    "perUnitStorageThroughput": 125,
                    "efa": True,
                }
            }
        },
        [
            f"{P}storage.lustre.storageCapacityGiB: 19200 GiB is not a valid size (multiples of "
            "38400 GiB when EFA-enabled at 125 MB/s/TiB); nearest valid values: 38400"
        ],
        id="lustre-efa-step-at-125",
    ),
    pytest.param(
        {"storage": {"lustre": {"storageCapacityGiB": 2402400, "perUnitStorageThroughput": 250}}},
        [f"{P}storage.lustre.storageCapacityGiB: above 2400000 GiB"],
        id="lustre-above-the-quota",
    ),
    pytest.param(
        {
            "gpuPools.+": TCP_POOL_B,
            "storage": {"lustre": {"deploymentType": "SCRATCH_2", "storageCapacityGiB": 1200}},
        },
        [
            f"{P}storage.lustre.availabilityZone: Lustre is in us-east-1a but GPU pools l40s "
            "(us-east-1b) are not: every read and checkpoint would cross zones (slower, and "
            "billed per GB each way); put the pools and Lustre in one zone, or set "
            "allowCrossZone: true to accept it"
        ],
        id="lustre-zone-from-the-efa-pool-crosses-zones",
    ),
    pytest.param(
        {
            "storage": {
                "lustre": {
                    "storageCapacityGiB": 1200,
                    "perUnitStorageThroughput": 125,
                    "dataRepository": {
                        "bucket": "My_Bucket",
                        "prefix": "/datasets",
                        "autoImport": ["MODIFIED"],
                    },
                }
            }
        },
        [
            f"{P}storage.lustre.dataRepository.autoImport[0]: 'MODIFIED' is not one of NEW, "
            "CHANGED, DELETED",
            f"{P}storage.lustre.dataRepository.bucket: 'My_Bucket' does not match the expected "
            "format ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$ (An S3 bucket name: 3-63 lowercase letters, "
            "digits, '.' and '-', e.g. acme-training-data.)",
            f"{P}storage.lustre.dataRepository.prefix: '/datasets' does not match the expected "
            "format ^([^/].*/)?$ (Key prefix within the bucket that the file system links to: "
            "empty for the whole bucket, or ending in '/' without a leading '/', e.g. datasets/.)",
        ],
        id="data-repository-bucket-prefix-events",
    ),
    pytest.param(
        {"storage": {"checkpoints": {"bucket": "ab"}}},
        [
            f"{P}storage.checkpoints.bucket: 'ab' does not match the expected format "
            "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$ (aws: S3 bucket for durable checkpoint copies "
            "(created). Default: <cluster>-checkpoints.)"
        ],
        id="checkpoint-bucket-name",
    ),
    pytest.param(
        {"aws.cluster": {"addons": {"vpc-cni": "v1.20.4-eksbuild.1"}}},
        [
            f"{P}aws.cluster.addons: pins 1 add-on versions but not {addon} (every EKS cluster "
            "gets it), which EKS would install at its default version; pin it (aws eks "
            f"describe-addon-versions --addon-name {addon} --kubernetes-version <version>) or "
            "pin none"
            for addon in ("kube-proxy", "coredns", "eks-pod-identity-agent", "aws-ebs-csi-driver")
        ],
        id="addons-pinned-in-part",
    ),
    pytest.param(
        {
            "aws.cluster": {"addons": CORE_PINS},
            "storage": {"lustre": {"deploymentType": "SCRATCH_2", "storageCapacityGiB": 1200}},
        },
        [
            f"{P}aws.cluster.addons: pins 5 add-on versions but not aws-fsx-csi-driver "
            "(storage.lustre needs it), which EKS would install at its default version; pin it "
            "(aws eks describe-addon-versions --addon-name aws-fsx-csi-driver "
            "--kubernetes-version <version>) or pin none"
        ],
        id="addons-pinned-but-not-the-fsx-csi-driver",
    ),
    # -- placement groups on reserved capacity (issue 39 #7)
    pytest.param(
        {
            "gpuPools.0.capacity": {
                "type": "capacityBlock",
                "reservationId": RESERVATION_ID,
                "window": _block_window(),
            },
            "gpuPools.0.size": {"min": 0, "max": 2},
            "gpuPools.0.placementGroup": True,
        },
        [
            f"{P}gpuPools[0].placementGroup: True: a capacity block places its instances "
            "together itself, and a placement group can refuse launches the block has room "
            "for; remove it"
        ],
        id="capacity-block-in-a-placement-group",
    ),
    pytest.param(
        {
            "gpuPools.0.capacity": {"type": "reservation", "reservationId": RESERVATION_ID},
            "gpuPools.0.placementGroup": True,
        },
        [
            f"{P}gpuPools[0].placementGroup: true creates a new placement group, which no "
            "reservation is in, so launches can fail while the reservation has room; name the "
            "cluster placement group the reservation was created in, or remove it"
        ],
        id="reservation-in-a-new-placement-group",
    ),
    pytest.param(
        {"gpuPools.0.placementGroup": "has space"},
        [
            f"{P}gpuPools[0].placementGroup: 'has space' does not match the expected format "
            "^[!-~]+$ (aws: true: a new cluster placement group for the pool; a name: an "
            "existing one (the group a capacity reservation was created in); false: none. "
            "Default: on for EFA pools bought on demand or spot, off on reservations and "
            "capacity blocks.)"
        ],
        id="placement-group-name-format",
    ),
    pytest.param(
        {"storage": {"efs": {"throughputMode": "provisioned"}}},
        [f"{P}storage.efs.throughputMode: 'provisioned' is not one of elastic, bursting"],
        id="efs-throughput-mode-not-offered",
    ),
]


@pytest.mark.parametrize(("changes", "expected"), REFUSED)
def test_aws_refuses(changes: dict[str, Any], expected: list[str]) -> None:
    assert messages(with_changes(changes)) == sorted(expected)


# (changes to base(), what the model reads back, its value): the accepted side of each rule.
ACCEPTED: list[Any] = [
    # -- network
    pytest.param(
        {"aws.network.vpcCidr": "10.0.0.0/20"},
        lambda c: c.aws.network.cidr,
        "10.0.0.0/20",
        id="vpc-cidr-smallest-trainstack-allows",
    ),
    pytest.param(
        {"aws.network": existing_vpc("us-east-1a", "us-east-1b")},
        lambda c: [s.availability_zone for s in c.aws.network.private_subnets],
        ["us-east-1a", "us-east-1b"],
        id="existing-vpc-two-zones-in-region",
    ),
    # -- cluster and IAM
    pytest.param(
        {
            "kubernetesVersion": "1.28",
            "aws.cluster": {
                "endpoint": {"publicAccess": True, "publicAccessCidrs": ["203.0.113.0/24"]},
                "logging": ["api", "audit", "authenticator", "controllerManager", "scheduler"],
                "logRetentionDays": 3653,
                "secretsKmsKeyArn": "arn:aws:kms:us-east-1:111122223333:key/1234abcd",
                "adminPrincipalArns": [
                    "arn:aws:iam::111122223333:role/admins",
                    "arn:aws:iam::111122223333:user/alice",
                ],
                "addons": CORE_PINS,
            },
        },
        lambda c: (
            c.aws.cluster.endpoint.public_cidrs,
            len(c.aws.cluster.logging),
            c.aws.cluster.log_retention_days,
            {a.name: a.version for a in c.aws.cluster.addons},
        ),
        (("203.0.113.0/24",), 5, 3653, CORE_PINS),
        id="cluster-settings-eks-accepts",
    ),
    pytest.param(
        {
            "aws.cluster": {
                "systemNodeGroup": {
                    "minSize": 1,
                    "desiredSize": 1,
                    "maxSize": 100,
                    "diskSizeGiB": 16384,
                }
            }
        },
        lambda c: (
            c.aws.cluster.system_node_group.size.max,
            c.aws.cluster.system_node_group.disk_size_gib,
        ),
        (100, 16384),
        id="system-nodes-at-their-bounds",
    ),
    # -- node groups
    pytest.param(
        {"gpuPools.0.size": {"max": 1000}, "gpuPools.0.diskSizeGiB": 16384},
        lambda c: (c.gpu_pools[0].aws.size.max, c.gpu_pools[0].aws.disk_size_gib),
        (1000, 16384),
        id="pool-at-its-bounds",
    ),
    pytest.param(
        {"gpuPools.0": {**TCP_POOL, "instanceStore": "raid0"}},
        lambda c: (c.gpu_pools[0].aws.availability_zone, c.gpu_pools[0].aws.instance_store_raid0),
        (None, True),
        id="tcp-pool-across-zones-with-its-instance-store",
    ),
    # -- capacity
    pytest.param(
        {
            "gpuPools.0.capacity": {
                "type": "capacityBlock",
                "reservationId": RESERVATION_ID,
                "instanceCount": 2,
                "window": _block_window(),
            }
        },
        lambda c: (c.gpu_pools[0].aws.capacity.type, c.gpu_pools[0].aws.size.min),
        ("capacityBlock", 0),
        id="capacity-block-by-id-from-zero",
    ),
    pytest.param(
        {
            "gpuPools.0.capacity": {
                "type": "reservation",
                "reservationId": RESERVATION_ID,
                "instanceCount": 2,
            }
        },
        lambda c: c.gpu_pools[0].aws.capacity.reservation_id,
        RESERVATION_ID,
        id="reservation-by-id",
    ),
    pytest.param(
        {"gpuPools.0.capacity": {"type": "reservation", "reservationId": RESERVATION_ID}},
        lambda c: (c.gpu_pools[0].aws.placement_group, c.gpu_pools[0].aws.placement_group_name),
        (False, None),
        id="efa-reservation-without-a-placement-group-by-default",
    ),
    pytest.param(
        {
            "gpuPools.0.capacity": {"type": "reservation", "reservationId": RESERVATION_ID},
            "gpuPools.0.placementGroup": "odcr-group",
        },
        lambda c: (c.gpu_pools[0].aws.placement_group, c.gpu_pools[0].aws.placement_group_name),
        (True, "odcr-group"),
        id="reservation-in-the-placement-group-it-was-created-in",
    ),
    pytest.param(
        {},
        lambda c: (c.gpu_pools[0].aws.placement_group, c.gpu_pools[0].aws.placement_group_name),
        (True, None),
        id="efa-on-demand-pool-gets-a-new-placement-group",
    ),
    pytest.param(
        {"gpuPools.0.capacity": {"type": "reservation", "reservationGroupArn": GROUP_ARN}},
        lambda c: c.gpu_pools[0].aws.capacity.reservation_group_arn,
        GROUP_ARN,
        id="reservation-by-resource-group",
    ),
    pytest.param(
        {"gpuPools.0.capacity": {"type": "spot"}},
        lambda c: c.gpu_pools[0].aws.capacity.reservation_id,
        None,
        id="spot-without-a-reservation",
    ),
    # -- storage
    pytest.param(
        {
            "storage": {
                "lustre": {
                    "storageCapacityGiB": 4800,
                    "perUnitStorageThroughput": 1000,
                    "efa": True,
                }
            }
        },
        lambda c: (c.storage.lustre.efa, c.storage.lustre.availability_zone),
        (True, "us-east-1a"),
        id="lustre-efa-step-at-1000",
    ),
    pytest.param(
        {"storage": {"lustre": {"storageCapacityGiB": 2400000, "perUnitStorageThroughput": 250}}},
        lambda c: c.storage.lustre.storage_capacity_gib,
        2400000,
        id="lustre-at-the-quota",
    ),
    pytest.param(
        {
            "gpuPools.+": {**TCP_POOL_B, "availabilityZone": "us-east-1a"},
            "storage": {"lustre": {"deploymentType": "SCRATCH_2", "storageCapacityGiB": 2400}},
        },
        lambda c: c.storage.lustre.availability_zone,
        "us-east-1a",
        id="lustre-and-pools-in-one-zone",
    ),
    pytest.param(
        {
            "storage": {
                "lustre": {
                    "storageCapacityGiB": 1200,
                    "perUnitStorageThroughput": 125,
                    "dataRepository": {
                        "bucket": "acme-ml.datasets",
                        "prefix": "datasets/",
                        "autoImport": ["NEW", "CHANGED", "DELETED"],
                    },
                },
                "checkpoints": {"bucket": "acme-checkpoints"},
            }
        },
        lambda c: (c.storage.lustre.data_repository.bucket, c.storage.checkpoint_bucket),
        ("acme-ml.datasets", "acme-checkpoints"),
        id="s3-bucket-names-and-import-events",
    ),
    pytest.param(
        {
            "aws.cluster": {"addons": {**CORE_PINS, "aws-fsx-csi-driver": "v1.7.0-eksbuild.1"}},
            "storage": {"lustre": {"deploymentType": "SCRATCH_2", "storageCapacityGiB": 1200}},
        },
        lambda c: {a.name: a.version for a in c.aws.cluster.addons}["aws-fsx-csi-driver"],
        "v1.7.0-eksbuild.1",
        id="addons-all-pinned-with-lustre",
    ),
    pytest.param(
        {"storage": {"efs": {"throughputMode": "bursting"}}},
        lambda c: c.storage.efs.throughput_mode,
        "bursting",
        id="efs-bursting",
    ),
]


@pytest.mark.parametrize(("changes", "read", "expected"), ACCEPTED)
def test_aws_accepts(
    changes: dict[str, Any], read: Callable[[PlatformConfig], object], expected: object
) -> None:
    assert read(load(with_changes(changes))) == expected


# -- instance store: no catalog type lacks one, so the rule is shown on a made-up type ----------


@pytest.fixture
def type_without_instance_store(monkeypatch: pytest.MonkeyPatch) -> str:
    known = catalog()
    bare: InstanceType = replace(known["g5.xlarge"], name="g5.bare", nvme_gb=0)
    monkeypatch.setattr("trainstack.config.pools.catalog", lambda: {**known, bare.name: bare})
    return bare.name


def test_raid0_needs_an_instance_store(type_without_instance_store: str) -> None:
    pool = {**TCP_POOL_B, "instanceType": type_without_instance_store, "instanceStore": "raid0"}
    assert messages(with_changes({"gpuPools.0": pool})) == [
        f"{P}gpuPools[0].instanceStore: g5.bare has no NVMe instance store; use none"
    ]


def test_every_catalog_type_has_an_instance_store() -> None:
    """Why the rule above needs a made-up type: the default, raid0, fits every real one."""
    assert all(t.has_instance_store for t in catalog().values())
    cfg = load(with_changes({"gpuPools.0": {**TCP_POOL_B, "instanceType": "g5.xlarge"}}))
    assert cfg.gpu_pools[0].aws is not None
    assert cfg.gpu_pools[0].aws.instance_store_raid0
