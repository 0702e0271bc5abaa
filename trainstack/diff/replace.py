"""Which input changes force a resource to be replaced, and which resources hold state.

A mock preview never talks to a provider, so `trainstack diff` infers replacement from the
inputs that changed, using this table. Property paths use the plan's wire names (camelCase,
as in `plan.json`), dotted, without list indices: `vpcConfig.subnetIds`, `spec.accessModes`.
A rule matches a changed path when one is a prefix of the other, so a change anywhere below
`spec` of a PersistentVolumeClaim, or the whole `launchTemplate` object, both count.

Sources (the property lists are transcribed from these, then trimmed to the inputs
trainstack sets; `docs/diff.md` has the table in prose):

- AWS: pulumi-aws bridges terraform-provider-aws, whose `ForceNew: true` schema attributes
  become Pulumi's "forces replacement" (replaceOnChanges in the provider schema). Read from
  hashicorp/terraform-provider-aws `internal/service/<service>/<resource>.go`, e.g.
  `internal/service/fsx/lustre_file_system.go` (`deployment_type`, `subnet_ids`,
  `security_group_ids`, `kms_key_id`, `storage_type`, `per_unit_storage_throughput`,
  `file_system_type_version`, ... are ForceNew; `resourceLustreFileSystemSchemaCustomizeDiff`
  forces a new file system when `storage_capacity` decreases, or on any change for SCRATCH_1).
- Kubernetes: pulumi-kubernetes `provider/pkg/provider/diff.go` (`forceNew` table):
  `.metadata.name` and `.metadata.namespace` for every kind; PersistentVolumeClaim `.spec`;
  StorageClass `.parameters` and `.provisioner`; ConfigMap `.data`/`.binaryData`; Secret
  `.type`/`.data`/`.stringData`; batch Job `.spec.template`/`.spec.selector`; RoleBinding
  and ClusterRoleBinding `.roleRef`; Service `.spec.clusterIP`/`.spec.type`.

Where the table is unsure it errs towards "replace": a false alarm costs a reviewer a
minute, a missed replacement of a file system costs its data.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ALWAYS = "always"
DECREASE = "decrease"  # replaced only when the new value is smaller (sizes that only grow)


@dataclass(frozen=True)
class Rule:
    path: str
    when: str = ALWAYS
    note: str = ""


def _rules(*paths: str | Rule) -> tuple[Rule, ...]:
    return tuple(p if isinstance(p, Rule) else Rule(p) for p in paths)


# Resource type -> input properties whose change forces replacement.
AWS_REPLACE_ON_CHANGE: dict[str, tuple[Rule, ...]] = {
    "aws:eks/cluster:Cluster": _rules(
        "name",
        "roleArn",
        "bootstrapSelfManagedAddons",
        "accessConfig.bootstrapClusterCreatorAdminPermissions",
        "kubernetesNetworkConfig.serviceIpv4Cidr",
        "kubernetesNetworkConfig.ipFamily",
        "encryptionConfig.provider.keyArn",
        "outpostConfig",
    ),
    "aws:eks/nodeGroup:NodeGroup": _rules(
        "clusterName",
        "nodeGroupName",
        "nodeGroupNamePrefix",
        "nodeRoleArn",
        "subnetIds",
        "amiType",
        "capacityType",
        "instanceTypes",
        "diskSize",
        "remoteAccess",
        "launchTemplate.id",
        "launchTemplate.name",
    ),
    "aws:eks/addon:Addon": _rules("clusterName", "addonName"),
    "aws:eks/accessEntry:AccessEntry": _rules("clusterName", "principalArn", "type"),
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": _rules(
        "clusterName", "principalArn", "policyArn", "accessScope"
    ),
    "aws:fsx/lustreFileSystem:LustreFileSystem": _rules(
        "deploymentType",
        "subnetIds",
        "securityGroupIds",
        "kmsKeyId",
        "storageType",
        "driveCacheType",
        "fileSystemTypeVersion",
        "perUnitStorageThroughput",
        "importPath",
        "exportPath",
        "importedFileChunkSize",
        "copyTagsToBackups",
        "backupId",
        "efaEnabled",
        Rule("storageCapacity", DECREASE, "FSx for Lustre can only grow in place"),
    ),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": _rules(
        "fileSystemId", "fileSystemPath", "dataRepositoryPath", "batchImportMetaDataOnCreate"
    ),
    "aws:s3/bucket:Bucket": _rules("bucket", "bucketPrefix", "objectLockEnabled"),
    "aws:s3/bucketVersioning:BucketVersioning": _rules("bucket", "expectedBucketOwner"),
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": (
        _rules("bucket", "expectedBucketOwner")
    ),
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": _rules(
        "bucket", "expectedBucketOwner"
    ),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": _rules("bucket"),
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": _rules("bucket"),
    "aws:ec2/vpc:Vpc": _rules("cidrBlock", "ipv4IpamPoolId", "ipv4NetmaskLength"),
    "aws:ec2/subnet:Subnet": _rules(
        "vpcId", "cidrBlock", "availabilityZone", "availabilityZoneId", "outpostArn"
    ),
    "aws:ec2/securityGroup:SecurityGroup": _rules("name", "namePrefix", "vpcId", "description"),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": _rules("securityGroupId"),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": _rules("securityGroupId"),
    "aws:ec2/launchTemplate:LaunchTemplate": _rules("name", "namePrefix"),
    "aws:ec2/placementGroup:PlacementGroup": _rules(
        "name", "strategy", "partitionCount", "spreadLevel"
    ),
    "aws:ec2/natGateway:NatGateway": _rules(
        "allocationId", "subnetId", "connectivityType", "privateIp"
    ),
    "aws:ec2/eip:Eip": _rules("domain", "address", "networkBorderGroup", "publicIpv4Pool"),
    "aws:ec2/routeTable:RouteTable": _rules("vpcId"),
    "aws:ec2/internetGateway:InternetGateway": (),  # vpcId attaches and detaches in place
    "aws:ec2/routeTableAssociation:RouteTableAssociation": _rules("subnetId", "gatewayId"),
    "aws:kms/key:Key": _rules(
        "customerMasterKeySpec", "keyUsage", "multiRegion", "customKeyStoreId", "xksKeyId"
    ),
    "aws:iam/role:Role": _rules("name", "namePrefix", "path"),
    "aws:iam/rolePolicy:RolePolicy": _rules("name", "namePrefix", "role"),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": _rules("role", "policyArn"),
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider": _rules("url"),
    "aws:cloudwatch/logGroup:LogGroup": _rules("name", "namePrefix", "logGroupClass"),
}

# Every Kubernetes object: its identity.
KUBERNETES_ALWAYS: tuple[Rule, ...] = _rules(
    "apiVersion", "kind", "metadata.name", "metadata.namespace"
)

KUBERNETES_REPLACE_ON_CHANGE: dict[str, tuple[Rule, ...]] = {
    "kubernetes:core/v1:PersistentVolumeClaim": _rules("spec"),
    "kubernetes:core/v1:ConfigMap": _rules("data", "binaryData"),
    "kubernetes:core/v1:Secret": _rules("type", "data", "stringData"),
    "kubernetes:core/v1:Service": _rules("spec.clusterIP", "spec.type"),
    "kubernetes:storage.k8s.io/v1:StorageClass": _rules("parameters", "provisioner"),
    "kubernetes:batch/v1:Job": _rules("spec.template", "spec.selector"),
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": _rules("roleRef"),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": _rules("roleRef"),
    # A Helm release is identified by its name and namespace.
    "kubernetes:helm.sh/v3:Release": _rules("name", "namespace"),
}

# Resources that hold data or running work: replacing or deleting them loses it.
STATEFUL: dict[str, str] = {
    "aws:fsx/lustreFileSystem:LustreFileSystem": "file system: datasets and checkpoints lost",
    "aws:s3/bucket:Bucket": "bucket: its objects (checkpoints) are lost",
    "aws:eks/cluster:Cluster": "cluster: every workload on it stops",
    "aws:eks/nodeGroup:NodeGroup": "node group: its nodes are drained, running jobs are evicted",
    "aws:kms/key:Key": "KMS key: data encrypted with it becomes unreadable",
    "kubernetes:core/v1:PersistentVolumeClaim": "volume claim: pods using it lose their volume",
    "kubernetes:core/v1:PersistentVolume": "volume: its binding (and data, per reclaim policy)",
    "kubernetes:core/v1:Namespace": "namespace: everything in it is deleted",
    "kubernetes:batch.volcano.sh/v1alpha1:Job": (
        "training job: its pods stop; it starts again from its last checkpoint"
    ),
}

# Why a resource's `replacementTrigger` (a resource option the program sets, recorded in the
# plan's `options`) is there: the engine replaces the resource whenever the value changes.
TRIGGER_REASONS: dict[str, str] = {
    "kubernetes:batch.volcano.sh/v1alpha1:Job": (
        "the Job changed beyond minAvailable, task replicas and priorityClassName, which "
        "Volcano refuses to update in place (admit_job.go validateJobUpdate): deleted and "
        "created again"
    ),
}


def trigger_reasons(
    resource_type: str, before: dict[str, Any], after: dict[str, Any]
) -> list[tuple[str, str]]:
    """A replacement the program asked for through `replacementTrigger`, with its reason."""
    old, new = before.get("replacementTrigger"), after.get("replacementTrigger")
    if old is None or new is None or old == new:
        return []
    why = TRIGGER_REASONS.get(resource_type, "the program's replacementTrigger changed")
    return [("replacementTrigger", why)]


def rules_for(resource_type: str) -> tuple[Rule, ...]:
    if resource_type.startswith("kubernetes:") and resource_type != "kubernetes:helm.sh/v3:Release":
        return KUBERNETES_ALWAYS + KUBERNETES_REPLACE_ON_CHANGE.get(resource_type, ())
    if resource_type.startswith("kubernetes:"):
        return KUBERNETES_REPLACE_ON_CHANGE[resource_type]
    return AWS_REPLACE_ON_CHANGE.get(resource_type, ())


_INDEX = re.compile(r"\[(\d+|name=[^\]]*)\]")  # a position, or a named item (plans.py)


def _covers(rule: str, changed: str) -> bool:
    """A rule on `spec` covers `spec.resources`; a changed `launchTemplate` covers its `id`."""
    path = _INDEX.sub("", changed)
    return path == rule or path.startswith((rule + ".", rule + "[")) or rule.startswith(path + ".")


_QUANTITY = re.compile(r"^([0-9.]+)([KMGTPE]i?)?$")
_FACTORS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_FACTORS |= {f"{k}i": 1024 ** (i + 1) for i, k in enumerate("KMGTPE")}


def as_number(value: Any) -> float | None:
    """Numbers and Kubernetes quantities (`28800Gi`) as floats; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _QUANTITY.match(value)
        if match:
            return float(match.group(1)) * _FACTORS[match.group(2) or ""]
    return None


def _decreased(before: Any, after: Any) -> bool:
    old, new = as_number(before), as_number(after)
    return old is None or new is None or new < old  # unknown shapes: assume the worst


_CONDITIONS: dict[str, Callable[[Any, Any], bool]] = {
    ALWAYS: lambda _before, _after: True,
    DECREASE: _decreased,
}


def replacing_paths(
    resource_type: str, changes: list[tuple[str, Any, Any]]
) -> list[tuple[str, str]]:
    """The changed paths that force replacement, each with the rule's reason."""
    found: list[tuple[str, str]] = []
    rules = rules_for(resource_type)
    for path, before, after in changes:
        for rule in rules:
            if _covers(rule.path, path) and _CONDITIONS[rule.when](before, after):
                reason = rule.note or f"{rule.path} forces replacement"
                if rule.when == DECREASE:
                    reason = f"{rule.path} decreased ({rule.note})" if rule.note else reason
                found.append((path, reason))
                break
    return found
