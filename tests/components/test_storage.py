"""PlatformStorage: FSx for Lustre, the data repository association, the checkpoint bucket,
per-team IAM, and the claims in team namespaces."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import Recorded
from trainstack.builders.storage import checkpoint_lifecycle_rules, team_storage
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
    rules = {r["id"]: r for r in lifecycle.inputs["rules"]}
    assert set(rules) == {
        *(f"expire-superseded-checkpoints-{t}" for t in ("vision", "nlp", "recsys")),
        *(f"expire-logs-{t}" for t in ("vision", "nlp", "recsys")),
        *(f"expire-deleted-{w}-versions" for w in ("checkpoint", "log", "artifact")),
    }
    # Only copies a newer checkpoint superseded expire by age: a job paused for longer than
    # the retention keeps its latest checkpoint (issue 17, also-check); per team.
    superseded = rules["expire-superseded-checkpoints-vision"]
    assert superseded["expiration"] == {"days": 60}
    assert superseded["filter"] == {
        "and": {"prefix": "teams/vision/", "tags": {"trainstack.io/superseded": "true"}}
    }
    logs = rules["expire-logs-nlp"]
    assert logs["expiration"] == {"days": 30}  # storage.logs.retentionDays' default
    assert logs["filter"] == {"prefix": "logs/teams/nlp/"}
    # Hand-offs never expire: no rule with an expiration reaches artifacts/.
    assert not any(
        "expiration" in r and "artifacts/" in json.dumps(r["filter"]) for r in rules.values()
    )
    deleted = rules["expire-deleted-checkpoint-versions"]
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
    # Its logs it reads, never writes (only the collector does); its hand-offs it writes.
    assert "arn:aws:s3:::acme-trainstack-prod-checkpoints/logs/teams/vision/*" in vision
    assert "arn:aws:s3:::acme-trainstack-prod-checkpoints/artifacts/teams/vision/*" in vision
    assert "arn:aws:s3:::acme-ml-datasets/datasets/*" in vision
    statements = json.loads(
        rec.one("aws:iam/rolePolicy:RolePolicy", "p-storage-team-vision").inputs["policy"]
    )["Statement"]
    datasets = next(s for s in statements if s["Sid"] == "ReadDatasets")
    assert datasets["Action"] == ["s3:GetObject"]  # read-only
    logs = next(s for s in statements if s["Sid"] == "ReadOwnLogs")
    assert logs["Action"] == ["s3:GetObject"]  # the collector alone writes a team's logs
    writes = [s for s in statements if "s3:PutObject" in s["Action"]]
    assert sorted(s["Resource"] for s in writes) == [
        "arn:aws:s3:::acme-trainstack-prod-checkpoints/artifacts/teams/vision/*",
        "arn:aws:s3:::acme-trainstack-prod-checkpoints/teams/vision/*",
    ]
    # issue 39 #8: the writer of a team's copies may tag the superseded ones, which is all
    # the lifecycle rule expires; on its own prefix only, like the rest of its writes.
    tagging = [
        s for s in statements if {"s3:PutObjectTagging", "s3:GetObjectTagging"} <= set(s["Action"])
    ]
    assert [s["Resource"] for s in tagging] == [
        "arn:aws:s3:::acme-trainstack-prod-checkpoints/teams/vision/*"
    ]
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
    """Issue 37 #1: two claims per team on the shared file system, each a volume rooted at its
    own directory, each PV with a handle of its own.

    `checkpoints` is a Lustre fileset mount of /checkpoints/<team>: the FSx CSI driver mounts
    `<dnsname>@tcp:/<mountname>` from volumeAttributes without checking the name
    (kubernetes-sigs/aws-fsx-csi-driver v1.9.0 pkg/driver/node.go NodePublishVolume), so the
    directory goes into `mountname`. `datasets` is /datasets with `ro` in its mount options,
    which the driver appends to its mount: the kernel refuses writes whatever a pod says (the
    PV's csi.readOnly reaches only ControllerPublish, never called with attachRequired:
    false). The handle is only a key to the driver, and the kubelet's volume name
    (kubernetes/kubernetes#91556), so each PV's is `<fs id>::<role>`.
    """
    rec = run(run_program, prod)
    pv = rec.one("kubernetes:core/v1:PersistentVolume", "p-storage-vision-checkpoints-pv").inputs
    assert pv["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert pv["spec"]["csi"]["volumeHandle"] == "p-storage-lustre-id::vision-checkpoints"
    attributes = pv["spec"]["csi"]["volumeAttributes"]
    assert attributes["mountname"].endswith("/checkpoints/vision")
    assert pv["spec"]["claimRef"] == {"namespace": "vision", "name": "checkpoints"}
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["mountOptions"] == ["flock"]
    data = rec.one("kubernetes:core/v1:PersistentVolume", "p-storage-vision-datasets-pv").inputs
    assert data["spec"]["csi"]["volumeAttributes"]["mountname"] == attributes["mountname"].replace(
        "/checkpoints/vision", "/datasets"
    )
    assert data["spec"]["mountOptions"] == ["ro", "flock"]
    assert data["spec"]["accessModes"] == ["ReadWriteMany"]  # the driver takes no ReadOnlyMany
    assert data["spec"]["claimRef"] == {"namespace": "vision", "name": "datasets"}
    handles = [
        r.inputs["spec"]["csi"]["volumeHandle"]
        for r in rec.of_type("kubernetes:core/v1:PersistentVolume")
    ]
    assert len(handles) == len(set(handles))
    assert set(handles) == {
        f"p-storage-lustre-id::{t.name}-{claim}"
        for t in prod.registry.teams
        for claim in ("checkpoints", "datasets")
    } | {"p-storage-lustre-id::shared-filesystem-root"}
    pvc = rec.one(
        "kubernetes:core/v1:PersistentVolumeClaim", "p-storage-vision-checkpoints-pvc"
    ).inputs
    assert pvc["metadata"]["namespace"] == "vision"
    assert pvc["spec"]["volumeName"] == "vision-checkpoints"


def test_the_platform_lays_out_each_teams_directory_first(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    """The root of each team's checkpoints volume must exist (a fileset mount of a missing
    directory fails) and be root:10001 2770, so the kubelet-made job directories are the
    trainer's through its group: a Job in the system namespace, from the platform's own claim
    on the whole file system, before any team's volumes (builders/layout.py)."""
    rec = run(run_program, prod)
    root = rec.one("kubernetes:core/v1:PersistentVolume", "p-storage-root-pv").inputs
    assert root["spec"]["claimRef"] == {
        "namespace": "trainstack-system",
        "name": "shared-filesystem-root",
    }
    assert "/" not in root["spec"]["csi"]["volumeAttributes"]["mountname"]
    job = rec.one("kubernetes:batch/v1:Job", "p-storage-layout")
    assert job.inputs["metadata"]["namespace"] == "trainstack-system"
    args = job.inputs["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:7] == ["layout", "--root", "/fs", "--gid", "10001", "--mode", "2770"]
    dirs = [args[i + 1] for i, a in enumerate(args) if a == "--team-dir"]
    assert dirs == [f"/checkpoints/{t.name}" for t in prod.registry.teams]
    sc = job.inputs["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FSETID"]}
    assert sc["readOnlyRootFilesystem"] is True
    claims = {r.name: r for r in rec.of_type("kubernetes:core/v1:PersistentVolume")}
    for team in prod.registry.teams:
        for claim in ("checkpoints", "datasets"):
            pv = claims[f"p-storage-{team.name}-{claim}-pv"]
            assert job.urn in pv.dependencies, (team.name, claim)


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
    pv = rec.one("kubernetes:core/v1:PersistentVolume", "p-storage-speech-checkpoints-pv").inputs
    # The operator's handle with the volume's directory for {path}: drivers differ in what
    # they read from it (HPE's lustre.csi.hpe.com mounts the volume id itself:
    # HewlettPackard/lustre-csi-driver pkg/hpelustre/nodeserver.go NodePublishVolume,
    # `source := volumeID`), so a Lustre fileset mount of the team's directory.
    assert pv["spec"]["csi"] == {
        "driver": "lustre.csi.hpe.com",
        "volumeHandle": "mgs.lab.internal@tcp:/trainfs/checkpoints/speech",
        "volumeAttributes": {"fsName": "trainfs", "mgsAddress": "mgs.lab.internal@tcp"},
    }
    handles = sorted(
        r.inputs["spec"]["csi"]["volumeHandle"]
        for r in rec.of_type("kubernetes:core/v1:PersistentVolume")
    )
    assert handles == [
        "mgs.lab.internal@tcp:/trainfs",
        "mgs.lab.internal@tcp:/trainfs/checkpoints/speech",
        "mgs.lab.internal@tcp:/trainfs/datasets",
    ]


def test_existing_lustre_path_in_the_attributes(run_program: Callable[..., Recorded]) -> None:
    """`{path}` in an attribute too, for drivers that read the directory from the volume
    context; in the handle, it keeps each volume's handle its own."""
    cfg = load("onprem")
    assert cfg.storage.existing_lustre is not None
    team = cfg.registry.teams[0]
    cfg = replace(
        cfg,
        storage=replace(
            cfg.storage,
            existing_lustre=replace(
                cfg.storage.existing_lustre,
                volume_handle="trainfs{path}",
                volume_attributes=(("sub-dir", "{path}"),),
            ),
        ),
        registry=replace(cfg.registry, teams=(team, replace(team, name="nlp"))),
    )
    rec = run(run_program, cfg)
    csi = {
        r.name: r.inputs["spec"]["csi"] for r in rec.of_type("kubernetes:core/v1:PersistentVolume")
    }
    assert csi["p-storage-nlp-checkpoints-pv"]["volumeHandle"] == "trainfs/checkpoints/nlp"
    assert csi["p-storage-nlp-checkpoints-pv"]["volumeAttributes"] == {
        "sub-dir": "/checkpoints/nlp"
    }
    assert csi["p-storage-speech-datasets-pv"]["volumeAttributes"] == {"sub-dir": "/datasets"}
    assert csi["p-storage-root-pv"]["volumeAttributes"] == {"sub-dir": ""}


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
        "datasetClaim": "datasets",
        "datasetSubPath": "",
        "datasetMountPath": "/datasets",
        "checkpointClaim": "checkpoints",
        "checkpointSubPath": "",
        "checkpointMountPath": "/checkpoints",
        "serviceAccount": "training",
        "checkpointS3Uri": "s3://acme-trainstack-prod-checkpoints/teams/vision/",
        "checkpointRetentionDays": 60,
        "logS3Uri": "s3://acme-trainstack-prod-checkpoints/logs/teams/vision/",
        "logRetentionDays": 30,
        "artifactS3Uri": "s3://acme-trainstack-prod-checkpoints/artifacts/teams/vision/",
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
    # The access point's user owns what jobs write; the team's directory is the access point.
    assert team_storage(cfg, cfg.registry.teams[0])["checkpointSubPath"] == "checkpoints"
    assert rec.of_type("kubernetes:batch/v1:Job") == []  # no shared file system to lay out


def test_a_teams_own_retention_overrides_the_platforms(prod: PlatformConfig) -> None:
    """retention.checkpointDays and logDays of one team change its rules and its outputs
    only; the other teams keep the platform's days."""
    teams = tuple(
        replace(t, checkpoint_retention_days=14, log_retention_days=7) if t.name == "nlp" else t
        for t in prod.registry.teams
    )
    cfg = replace(prod, registry=replace(prod.registry, teams=teams))
    rules = {r["id"]: r for r in checkpoint_lifecycle_rules(cfg)}
    assert rules["expire-superseded-checkpoints-nlp"]["expiration"] == {"days": 14}
    assert rules["expire-logs-nlp"]["expiration"] == {"days": 7}
    assert rules["expire-superseded-checkpoints-vision"]["expiration"] == {"days": 60}
    assert rules["expire-logs-vision"]["expiration"] == {"days": 30}
    nlp = next(t for t in teams if t.name == "nlp")
    storage = team_storage(cfg, nlp)
    assert (storage["checkpointRetentionDays"], storage["logRetentionDays"]) == (14, 7)
