"""PlatformStorage: FSx for Lustre, the data repository association, the checkpoint bucket,
per-team IAM, and the claims in team namespaces."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import Recorded
from trainstack.builders.storage import team_storage
from trainstack.components.platform import Platform
from trainstack.config import PlatformConfig, load_stack_file
from trainstack.outputs import team_slice

STACKS = Path(__file__).parent.parent.parent / "stacks"


def load(stack: str) -> PlatformConfig:
    cfg = load_stack_file(STACKS / f"Pulumi.{stack}.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


@pytest.fixture(scope="module")
def prod() -> PlatformConfig:
    return load("prod")


def run(run_program: Callable[..., Recorded], cfg: PlatformConfig) -> Recorded:
    return run_program(lambda: Platform("p", cfg), region="us-east-1")


def test_lustre_file_system(run_program: Callable[..., Recorded], prod: PlatformConfig) -> None:
    rec = run(run_program, prod)
    fs = rec.one("aws:fsx/lustreFileSystem:LustreFileSystem", "p-storage-lustre")
    inputs = fs.inputs
    assert inputs["deploymentType"] == "PERSISTENT_2"
    assert inputs["perUnitStorageThroughput"] == 500
    assert inputs["storageCapacity"] == 28800
    assert inputs["dataCompressionType"] == "LZ4"
    assert inputs["fileSystemTypeVersion"] == "2.15"
    assert inputs["subnetIds"] == "p-network-private-us-east-1a-id"  # the H100 block's zone
    assert inputs["securityGroupIds"] == ["p-storage-lustre-sg-id"]
    assert inputs["kmsKeyId"].endswith(":key/p-storage-key")
    parent = rec.parent_of(fs)
    assert parent is not None
    assert parent.type == "trainstack:storage:PlatformStorage"


def test_lustre_security_group_rules(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    rec = run(run_program, prod)
    rules = {
        r.name: (r.inputs["fromPort"], r.inputs["toPort"], r.inputs["referencedSecurityGroupId"])
        for r in rec.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.name.startswith("p-storage-lustre-")
    }
    node_sg = next(v[2] for k, v in rules.items() if k.startswith("p-storage-lustre-nodes-"))
    assert node_sg.startswith("sg-")
    # Both directions: the nodes admit LNet from the file system (issue 17, also-check).
    back = {
        r.name: (
            r.inputs["fromPort"],
            r.inputs["securityGroupId"],
            r.inputs["referencedSecurityGroupId"],
        )
        for r in rec.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.name.startswith("p-storage-lustre-to-nodes-")
    }
    assert back == {
        "p-storage-lustre-to-nodes-988": (988, node_sg, "p-storage-lustre-sg-id"),
        "p-storage-lustre-to-nodes-1018": (1018, node_sg, "p-storage-lustre-sg-id"),
    }
    rules = {k: v for k, v in rules.items() if not k.startswith("p-storage-lustre-to-nodes-")}
    assert rules == {
        "p-storage-lustre-nodes-988": (988, 988, node_sg),
        "p-storage-lustre-nodes-1018": (1018, 1023, node_sg),
        "p-storage-lustre-self-988": (988, 988, "p-storage-lustre-sg-id"),
        "p-storage-lustre-self-1018": (1018, 1023, "p-storage-lustre-sg-id"),
    }


def test_efa_lustre_gets_what_fsx_requires_of_it(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    """FSx refuses an EFA-enabled file system without a metadata configuration and a group
    allowing all traffic within itself and from its clients (FSx Lustre guide, cannot-create-fs;
    pulumi-aws LustreFileSystem.efa_enabled). Before, the preview passed and AWS refused."""
    assert prod.storage.lustre is not None
    efa = replace(
        prod,
        storage=replace(
            prod.storage,
            lustre=replace(
                prod.storage.lustre, efa=True, storage_capacity_gib=28800 // 9600 * 9600
            ),
        ),
    )
    rec = run(run_program, efa)
    fs = rec.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    assert fs["efaEnabled"] is True
    assert fs["metadataConfiguration"] == {"mode": "AUTOMATIC"}
    everything = {
        r.name: r.inputs["referencedSecurityGroupId"]
        for r in rec.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.inputs["ipProtocol"] == "-1" and r.name.startswith("p-storage-lustre-efa-")
    }
    assert everything["p-storage-lustre-efa-self"] == "p-storage-lustre-sg-id"
    assert everything["p-storage-lustre-efa-nodes"].startswith("sg-")
    plain = run(run_program, prod)
    assert (
        "metadataConfiguration" not in plain.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    )


def test_data_repository_association_and_csi(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    rec = run(run_program, prod)
    dra = rec.one("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    assert dra.inputs["dataRepositoryPath"] == "s3://acme-ml-datasets/datasets/"
    assert dra.inputs["fileSystemPath"] == "/datasets"
    assert dra.inputs["fileSystemId"] == "p-storage-lustre-id"
    assert dra.inputs["s3"]["autoImportPolicy"]["events"] == ["NEW", "CHANGED", "DELETED"]
    addon = rec.one("aws:eks/addon:Addon", "p-cluster-aws-fsx-csi-driver")
    # Static volumes only: the driver needs no AWS role, and AmazonFSxFullAccess could delete
    # every file system in the account (issue 17, also-check).
    assert "podIdentityAssociations" not in addon.inputs
    policies = {
        r.inputs["policyArn"]
        for r in rec.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert not any(p.endswith("/AmazonFSxFullAccess") for p in policies)


def test_checkpoint_bucket_is_hardened(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    rec = run(run_program, prod)
    bucket = rec.one("aws:s3/bucket:Bucket")
    assert bucket.inputs["bucket"] == "acme-trainstack-prod-checkpoints"
    block = rec.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(
        block[k] is True
        for k in (
            "blockPublicAcls",
            "blockPublicPolicy",
            "ignorePublicAcls",
            "restrictPublicBuckets",
        )
    )
    # Issue 17 (also-check): nothing reaches the checkpoints without TLS.
    policy = json.loads(rec.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    [deny] = policy["Statement"]
    assert deny["Effect"] == "Deny"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"][1] == deny["Resource"][0] + "/*"
    versioning = rec.one("aws:s3/bucketVersioning:BucketVersioning").inputs
    assert versioning["versioningConfiguration"] == {"status": "Enabled"}
    sse = rec.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    )
    rule = sse.inputs["rules"][0]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    assert rule["bucketKeyEnabled"] is True
    lifecycle = rec.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    superseded, deleted = lifecycle.inputs["rules"]
    # Only copies a newer checkpoint superseded expire by age: a job paused for longer than
    # the retention keeps its latest checkpoint (issue 17, also-check).
    assert superseded["expiration"] == {"days": 60}
    assert superseded["filter"] == {
        "and": {"prefix": "teams/", "tags": {"trainstack.io/superseded": "true"}}
    }
    assert "expiration" not in deleted
    assert deleted["filter"] == {"prefix": "teams/"}
    assert deleted["noncurrentVersionExpiration"] == {"noncurrentDays": 7}
    ownership = rec.one("aws:s3/bucketOwnershipControls:BucketOwnershipControls").inputs
    assert ownership["rule"] == {"objectOwnership": "BucketOwnerEnforced"}


def policy_resources(rec: Recorded, team: str) -> set[str]:
    policy = json.loads(
        rec.one("aws:iam/rolePolicy:RolePolicy", f"p-storage-team-{team}").inputs["policy"]
    )
    return {
        r
        for s in policy["Statement"]
        for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])
    }


def test_team_iam_is_confined_to_its_own_prefixes(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    rec = run(run_program, prod)
    vision = policy_resources(rec, "vision")
    nlp = policy_resources(rec, "nlp")
    assert "arn:aws:s3:::acme-trainstack-prod-checkpoints/teams/vision/*" in vision
    assert "arn:aws:s3:::acme-trainstack-prod-checkpoints/teams/nlp/*" in nlp
    assert not any("teams/nlp" in r for r in vision)
    assert not any("teams/vision" in r for r in nlp)
    assert "arn:aws:s3:::acme-ml-datasets/datasets/*" in vision
    statements = json.loads(
        rec.one("aws:iam/rolePolicy:RolePolicy", "p-storage-team-vision").inputs["policy"]
    )["Statement"]
    datasets = next(s for s in statements if s["Sid"] == "ReadDatasets")
    assert datasets["Action"] == ["s3:GetObject"]  # read-only
    trust = json.loads(
        rec.one("aws:iam/role:Role", "p-storage-team-vision").inputs["assumeRolePolicy"]
    )
    condition = trust["Statement"][0]["Condition"]["StringEquals"]
    assert any(v == "system:serviceaccount:vision:training" for v in condition.values())
    account = rec.one("kubernetes:core/v1:ServiceAccount", "p-storage-sa-vision")
    assert account.inputs["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::000000000000:role/p-storage-team-vision"
    }


def test_team_claims(run_program: Callable[..., Recorded], prod: PlatformConfig) -> None:
    """One claim per team on the shared file system, its PV with a handle of its own.

    A team's pods mount the claim once, with a datasets and a checkpoints sub-path (issue 15:
    the kubelet keys CSI volumes by driver and handle, kubernetes/kubernetes#91556). The FSx
    CSI driver mounts `<dnsname>@tcp:/<mountname>` from volumeAttributes and uses the volume
    id only as a non-empty key (kubernetes-sigs/aws-fsx-csi-driver v1.9.0, the chart 1.17.0
    app version: pkg/driver/node.go NodePublishVolume; no NodeStage, controllerCaps without
    PUBLISH_UNPUBLISH, CSIDriver attachRequired: false), so each team's PV can carry
    `<fs id>::<team>`.
    """
    rec = run(run_program, prod)
    pv = rec.one("kubernetes:core/v1:PersistentVolume", "p-storage-vision-lustre-pv").inputs
    assert pv["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert pv["spec"]["csi"]["volumeHandle"] == "p-storage-lustre-id::vision"
    assert sorted(pv["spec"]["csi"]["volumeAttributes"]) == ["dnsname", "mountname"]
    assert pv["spec"]["claimRef"] == {"namespace": "vision", "name": "lustre"}
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert "readOnly" not in pv["spec"]["csi"]  # datasets: read-only per mount, in the pod
    handles = {
        r.inputs["spec"]["csi"]["volumeHandle"]
        for r in rec.of_type("kubernetes:core/v1:PersistentVolume")
    }
    assert handles == {f"p-storage-lustre-id::{t.name}" for t in prod.registry.teams}
    pvc = rec.one("kubernetes:core/v1:PersistentVolumeClaim", "p-storage-vision-lustre-pvc").inputs
    assert pvc["metadata"]["namespace"] == "vision"
    assert pvc["spec"]["volumeName"] == "vision-lustre"
    # One claim per team; registration order follows the mock engine's output resolution.
    assert sorted(
        r.name for r in rec.of_type("kubernetes:core/v1:PersistentVolumeClaim")
    ) == sorted(f"p-storage-{t.name}-lustre-pvc" for t in prod.registry.teams)


def test_dev_uses_the_nvme_cache_and_scratch_lustre(run_program: Callable[..., Recorded]) -> None:
    rec = run(run_program, load("dev"))
    fs = rec.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    assert fs["deploymentType"] == "SCRATCH_2"
    assert "kmsKeyId" not in fs
    releases = [r.name for r in rec.of_type("kubernetes:helm.sh/v3:Release")]
    assert not [r for r in releases if r.startswith("p-storage")]  # no local-volume provisioner
    agent = rec.one("kubernetes:apps/v1:DaemonSet", "p-storage-cache-agent").inputs
    volumes = {v["name"]: v for v in agent["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cache"]["hostPath"] == {"path": "/mnt/trainstack-cache", "type": "Directory"}
    driver = rec.one("kubernetes:storage.k8s.io/v1:CSIDriver", "p-storage-cache-driver").inputs
    assert driver["spec"]["volumeLifecycleModes"] == ["Ephemeral"]
    account = rec.one("kubernetes:core/v1:ServiceAccount", "p-storage-cache-sa").inputs
    assert account["automountServiceAccountToken"] is False
    # IRSA: the agent reads its sources (dev: nvmeCache.sources), nothing else.
    policy = json.loads(
        rec.one("aws:iam/rolePolicy:RolePolicy", "p-storage-cache-agent").inputs["policy"]
    )
    assert {s["Sid"]: s["Resource"] for s in policy["Statement"]} == {
        "ListSource0": "arn:aws:s3:::acme-datasets",
        "ReadSource0": "arn:aws:s3:::acme-datasets/*",
    }


def test_existing_cluster_uses_its_lustre_and_creates_nothing_on_aws(
    run_program: Callable[..., Recorded],
) -> None:
    rec = run(run_program, load("onprem"))
    assert not [r for r in rec.records if r.type.startswith("aws:")]
    pv = rec.one("kubernetes:core/v1:PersistentVolume", "p-storage-speech-lustre-pv").inputs
    # The operator's handle as written: drivers differ in what they read from it (HPE's
    # lustre.csi.hpe.com mounts the volume id itself: HewlettPackard/lustre-csi-driver
    # pkg/hpelustre/nodeserver.go NodePublishVolume, `source := volumeID`).
    assert pv["spec"]["csi"] == {
        "driver": "lustre.csi.hpe.com",
        "volumeHandle": "mgs.lab.internal@tcp:/trainfs",
        "volumeAttributes": {"fsName": "trainfs", "mgsAddress": "mgs.lab.internal@tcp"},
    }
    assert len(rec.of_type("kubernetes:core/v1:PersistentVolume")) == 1  # one team


def test_existing_lustre_handle_per_team(run_program: Callable[..., Recorded]) -> None:
    """`{team}` in existingLustre.volumeHandle gives each team's PV its own handle, for
    drivers that read the file system from volumeAttributes."""
    cfg = load("onprem")
    assert cfg.storage.existing_lustre is not None
    team = cfg.registry.teams[0]
    cfg = replace(
        cfg,
        storage=replace(
            cfg.storage,
            existing_lustre=replace(cfg.storage.existing_lustre, volume_handle="trainfs-{team}"),
        ),
        registry=replace(cfg.registry, teams=(team, replace(team, name="nlp"))),
    )
    rec = run(run_program, cfg)
    handles = sorted(
        r.inputs["spec"]["csi"]["volumeHandle"]
        for r in rec.of_type("kubernetes:core/v1:PersistentVolume")
    )
    assert handles == ["trainfs-nlp", "trainfs-speech"]


def test_storage_output_for_the_job_layer(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    def program() -> None:
        import pulumi  # noqa: PLC0415

        for key, value in Platform("p", prod).outputs.exports().items():
            pulumi.export(key, value)

    rec = run_program(program)
    vision = team_slice(rec.result.outputs, "vision")
    assert vision is not None
    assert rec.result.outputs["storage"] == {
        "datasetRepository": "s3://acme-ml-datasets/datasets/",
    }
    assert vision["storage"] == {
        "datasetClaim": "lustre",
        "datasetSubPath": "datasets",
        "datasetMountPath": "/datasets",
        "checkpointClaim": "lustre",
        "checkpointSubPath": "checkpoints/vision",
        "checkpointMountPath": "/checkpoints",
        "serviceAccount": "training",
        "checkpointOwner": 10001,
        "checkpointS3Uri": "s3://acme-trainstack-prod-checkpoints/teams/vision/",
    }


def test_efs_checkpoints_for_small_setups(run_program: Callable[..., Recorded]) -> None:
    cfg = load_stack_file(
        Path(__file__).parent.parent / "config" / "fixtures" / "valid" / "efs.yaml"
    )
    assert isinstance(cfg, PlatformConfig)
    rec = run(run_program, cfg)
    fs = rec.one("aws:efs/fileSystem:FileSystem").inputs
    assert fs["encrypted"] is True
    assert fs["kmsKeyId"].endswith(":key/p-storage-key")
    assert len(rec.of_type("aws:efs/mountTarget:MountTarget")) == 2  # one per zone
    point = rec.one("aws:efs/accessPoint:AccessPoint", "p-storage-efs-vision").inputs
    assert point["rootDirectory"]["path"] == "/teams/vision"
    assert point["posixUser"] == {"uid": 1000, "gid": 1000}
    nfs = rec.one("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "p-storage-efs-nfs")
    assert (nfs.inputs["fromPort"], nfs.inputs["toPort"]) == (2049, 2049)
    pv = rec.one("kubernetes:core/v1:PersistentVolume", "p-storage-vision-checkpoints-pv").inputs
    assert pv["spec"]["csi"] == {
        "driver": "efs.csi.aws.com",
        "volumeHandle": "p-storage-efs-id::p-storage-efs-vision-id",
    }
    assert rec.of_type("aws:fsx/lustreFileSystem:LustreFileSystem") == []
    assert [r.name for r in rec.of_type("kubernetes:core/v1:PersistentVolume")] == [
        "p-storage-vision-checkpoints-pv"
    ]  # no dataset claim without a dataset file system
    addon = rec.one("aws:eks/addon:Addon", "p-cluster-aws-efs-csi-driver")
    assert addon.inputs["podIdentityAssociations"][0]["serviceAccount"] == "efs-csi-controller-sa"
    # The access point's user owns what jobs write: no directory for the job layer to create.
    assert "checkpointOwner" not in team_storage(cfg, cfg.registry.teams[0])
