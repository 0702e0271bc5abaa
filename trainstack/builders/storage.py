"""Storage as data: FSx/S3/IAM inputs, per-team volumes and claims, the NVMe cache's facts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainstack.builders import labels
from trainstack.builders.pools import TRAINING_UID
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig, Team
from trainstack.contracts import runtime as runtime_contract

LUSTRE_PORTS = ((988, 988), (1018, 1023))  # LNet, and the ports Lustre servers call back on
FSX_CSI_DRIVER = "fsx.csi.aws.com"
LUSTRE_VERSION = "2.15"
DATASETS_PATH = "/datasets"  # file-system path linked to S3 and the jobs' mount point
CHECKPOINTS_MOUNT = "/checkpoints"  # the runtime's TRAINSTACK_CHECKPOINT_DIR default
CHECKPOINTS_DIR = "/checkpoints"  # on the shared file system: one directory per team below
# Each team's two claims on the shared Lustre file system (issue 37), each a volume rooted at
# its own directory: `checkpoints` at /checkpoints/<team>, read-write; `datasets` at
# /datasets, mounted read-only by the kernel (see team_volumes). On EFS, `checkpoints` is the
# team's access point.
CHECKPOINTS_CLAIM = "checkpoints"
DATASETS_CLAIM = "datasets"
# In existingLustre.volumeHandle and volumeAttributes: replaced by the volume's directory on
# the file system (`/checkpoints/<team>`, `/datasets`, or nothing for its root).
PATH_PLACEHOLDER = "{path}"
# Each team's checkpoint directory: root-owned, group TRAINER_GID, setgid, group-writable.
# The kubelet creates a job's sub-path directory below it as root with the directory's mode,
# fchmod'ed with the setgid bit kept, and the kernel gives it the parent's group (k8s.io/
# kubernetes v1.37.2 pkg/kubelet/kubelet_pods.go makeMounts: `GetMode(volumePath)`, then
# pkg/volume/util/subpath/subpath_linux.go doSafeMakeDir: Mkdirat, Fchmod with ModeSetgid ->
# S_ISGID; Lustre v2_15_0 mdd_dir.c mdd_create_sanity_check: "Directories are special, and
# always inherit S_ISGID"): root:10001 2770, which the trainer (uid and gid 10001) writes
# through its group. No root step in a team's pod is needed, so none is allowed.
TRAINER_GID = TRAINING_UID
TEAM_DIR_MODE = "2770"
# The platform's own claim on the whole file system, in the system namespace, for the layout
# job (layout_job) alone: no team namespace can name it.
ROOT_CLAIM = "shared-filesystem-root"
# The node cache agent's CSI driver (builders/cache.py): what jobs' inline volumes name.
CACHE_DRIVER = "cache.trainstack.io"
TRAINING_SERVICE_ACCOUNT = "training"
CHECKPOINT_PREFIX = "teams/"
# The same bucket's other per-team prefixes: job logs, which only the node log collector writes
# and the team reads (docs/logs.md), and the hand-offs of finished jobs, which the team's jobs
# write (trainstack_runtime/handoff.py). Neither starts with CHECKPOINT_PREFIX, so the team's
# checkpoint grants reach neither.
LOG_PREFIX = "logs/teams/"
ARTIFACT_PREFIX = "artifacts/teams/"


def team_retention(cfg: PlatformConfig, team: Team) -> tuple[int, int]:
    """(checkpoint days, log days) the bucket keeps this team's data: its own, else the
    platform's."""
    storage = cfg.storage
    return (
        team.checkpoint_retention_days or storage.retention_days,
        team.log_retention_days or storage.log_retention_days,
    )


def team_checkpoint_dir(team: Team) -> str:
    """Each team's checkpoints live in their own directory of the shared file system, the
    root of the team's `checkpoints` volume."""
    return f"{CHECKPOINTS_DIR}/{team.name}"


def s3_prefix_arn(bucket: str, prefix: str) -> str:
    return f"arn:aws:s3:::{bucket}/{prefix}*"


def s3_read_statements(bucket: str, prefix: str, name: str) -> list[dict[str, Any]]:
    """List and read one prefix (statements `List<name>`, `Read<name>`), nothing else."""
    return [
        {
            "Sid": f"List{name}",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": f"arn:aws:s3:::{bucket}",
            "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
        },
        {
            "Sid": f"Read{name}",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": s3_prefix_arn(bucket, prefix),
        },
    ]


def team_s3_policy(cfg: PlatformConfig, team: Team, key_arn: str) -> dict[str, Any]:
    """Datasets read-only, the team's own checkpoint prefix read-write, nothing else."""
    storage = cfg.storage
    statements: list[dict[str, Any]] = []
    lustre = storage.lustre
    if lustre is not None and lustre.data_repository is not None:
        repo = lustre.data_repository
        statements += s3_read_statements(repo.bucket, repo.prefix, "Datasets")
    if storage.checkpoint_bucket is not None:
        prefix = f"{CHECKPOINT_PREFIX}{team.name}/"
        statements += [
            {
                "Sid": "ListOwnCheckpoints",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{storage.checkpoint_bucket}",
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            },
            {
                "Sid": "ReadWriteOwnCheckpoints",
                "Effect": "Allow",
                # The tagging actions let a writer mark the copies a newer checkpoint
                # superseded, which is all the lifecycle rule expires (SUPERSEDED_TAG);
                # PutObject with an x-amz-tagging header needs s3:PutObjectTagging too
                # (S3 API reference, PutObject, "Permissions").
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                    "s3:GetObjectTagging",
                    "s3:PutObjectTagging",
                ],
                "Resource": s3_prefix_arn(storage.checkpoint_bucket, prefix),
            },
            *s3_read_statements(storage.checkpoint_bucket, f"{LOG_PREFIX}{team.name}/", "OwnLogs"),
            {
                "Sid": "ListOwnArtifacts",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{storage.checkpoint_bucket}",
                "Condition": {"StringLike": {"s3:prefix": [f"{ARTIFACT_PREFIX}{team.name}/*"]}},
            },
            {
                # The hand-off of a finished job: model, report, manifest (handoff.py).
                "Sid": "ReadWriteOwnArtifacts",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                "Resource": s3_prefix_arn(
                    storage.checkpoint_bucket, f"{ARTIFACT_PREFIX}{team.name}/"
                ),
            },
            {
                "Sid": "CheckpointEncryption",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                "Resource": key_arn,
            },
        ]
    return {"Version": "2012-10-17", "Statement": statements}


def irsa_trust_policy(
    oidc_arn: str, issuer_host: str, namespace: str, account: str
) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": oidc_arn},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {
                    "StringEquals": {
                        f"{issuer_host}:sub": f"system:serviceaccount:{namespace}:{account}",
                        f"{issuer_host}:aud": "sts.amazonaws.com",
                    }
                },
            }
        ],
    }


def checkpoint_bucket_policy(bucket_arn: str) -> dict[str, Any]:
    """Refuse any request that is not over TLS ("aws:SecureTransport": "false"; S3 user guide,
    security best practices, "Enforce encryption of data in transit")."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket_arn, f"{bucket_arn}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ],
    }


# A checkpoint copy a newer one replaced. S3 lifecycle rules cannot keep "the latest object
# under each prefix", so age alone would also expire a paused job's only checkpoint; whoever
# writes the copies tags those a newer checkpoint supersedes (trainstack_runtime.s3copies,
# with the team role's s3:PutObjectTagging), and only they expire by age (issue 39 #8).
SUPERSEDED_TAG = runtime_contract.SUPERSEDED_TAG


def checkpoint_lifecycle_rules(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Per team (team_retention): superseded checkpoint copies expire after its checkpoint
    days, a job's latest copy never (issue 17: a plain `expiration` on the prefix deleted the
    latest checkpoint of a job paused longer); its job logs after its log days. Hand-offs
    never expire. Deleted or overwritten versions under each prefix go noncurrentVersionDays
    later. (S3 user guide, lifecycle configuration elements: a filter `and` of prefix and
    tags; one configuration holds at most 1,000 rules, 2 per team here.)"""
    storage = cfg.storage
    rules: list[dict[str, Any]] = []
    for team in cfg.registry.teams:
        checkpoint_days, log_days = team_retention(cfg, team)
        prefix = f"{CHECKPOINT_PREFIX}{team.name}/"
        rules += [
            {
                "id": f"expire-superseded-checkpoints-{team.name}",
                "status": "Enabled",
                "filter": {"and": {"prefix": prefix, "tags": {SUPERSEDED_TAG: "true"}}},
                "expiration": {"days": checkpoint_days},
            },
            {
                "id": f"expire-logs-{team.name}",
                "status": "Enabled",
                "filter": {"prefix": f"{LOG_PREFIX}{team.name}/"},
                "expiration": {"days": log_days},
            },
        ]
    for what, prefix in (
        ("checkpoint", CHECKPOINT_PREFIX),
        ("log", LOG_PREFIX),
        ("artifact", ARTIFACT_PREFIX),
    ):
        rules.append(
            {
                "id": f"expire-deleted-{what}-versions",
                "status": "Enabled",
                "filter": {"prefix": prefix},
                "noncurrentVersionExpiration": {"noncurrentDays": storage.noncurrent_version_days},
                "abortIncompleteMultipartUpload": {"daysAfterInitiation": 2},
            }
        )
    return rules


def _pv(
    cfg: PlatformConfig,
    name: str,
    namespace: str,
    *,
    claim: str,
    access: str,
    csi: dict[str, Any],
    capacity_gib: int,
    mount_options: tuple[str, ...] = ("flock",),
    extra_labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A static PV bound to exactly one claim. Pre-bound (`claimRef`): a PV without one
    binds the first claim of any namespace that matches it (k8s.io/component-helpers
    v0.37.2 storage/volume/pv_helpers.go FindMatchingVolume), and a claim naming a PV bound
    to another namespace's claim stays Pending (pv_controller.go syncUnboundClaim)."""
    meta_labels = {**labels.base_labels(cfg.stack), **(extra_labels or {})}
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": meta_labels},
        "spec": {
            "capacity": {"storage": f"{capacity_gib}Gi"},
            "accessModes": [access],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "mountOptions": list(mount_options),
            "claimRef": {"namespace": namespace, "name": claim},
            "csi": csi,
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace, "labels": meta_labels},
        "spec": {
            "accessModes": [access],
            "storageClassName": "",
            "volumeName": name,
            "resources": {"requests": {"storage": f"{capacity_gib}Gi"}},
        },
    }
    return [volume, pvc]


def _team_pv(
    cfg: PlatformConfig,
    team: Team,
    *,
    claim: str,
    access: str,
    csi: dict[str, Any],
    capacity_gib: int,
    mount_options: tuple[str, ...] = ("flock",),
) -> list[dict[str, Any]]:
    """A static PV bound to exactly one claim in the team's namespace."""
    return _pv(
        cfg,
        f"{team.name}-{claim}",
        team.namespace,
        claim=claim,
        access=access,
        csi=csi,
        capacity_gib=capacity_gib,
        mount_options=mount_options,
        extra_labels={labels.TEAM: team.name},
    )


def shared_capacity_gib(cfg: PlatformConfig) -> int:
    storage = cfg.storage
    if storage.lustre is not None:
        return storage.lustre.storage_capacity_gib
    if storage.existing_lustre is not None:
        return storage.existing_lustre.capacity_gib
    return 0


# A volume's source on the shared file system: (directory, e.g. "/datasets"; its PV's unique
# role, e.g. "vision-datasets") -> the PV's `csi`.
CsiAt = Callable[[str, str], dict[str, Any]]


def team_volumes(cfg: PlatformConfig, team: Team, csi_at: CsiAt) -> list[dict[str, Any]]:
    """The team's two volumes on the shared file system, each rooted at its own directory.

    `checkpoints` at /checkpoints/<team>, read-write: a job mounts its own sub-path. The
    kubelet resolves a sub-path on the host, following symlinks, and refuses a result
    outside the volume (k8s v1.37.2 pkg/volume/util/subpath/subpath_linux.go doBindSubPath,
    safeOpenSubPath), and the volume's root is the team's directory: no sub-path, symlink
    or `..` a member can name reaches another team (issue 37 #1). Inside the pod, `..` at a
    mount's root stays in the pod's own file system.

    `datasets` at /datasets, read-only by its mount options: the CSI driver appends them to
    its `mount -t lustre`, so the kernel refuses every write, whatever the pod says
    (aws-fsx-csi-driver v1.9.0 pkg/driver/node.go NodePublishVolume; the PV's `csi.readOnly`
    is only for ControllerPublish, which attachRequired: false never calls). Access mode
    ReadWriteMany all the same: the FSx driver takes only single-node-writer and
    multi-node-multi-writer (controller.go isValidVolumeCapabilities).

    Two volumes of one file system in a pod need two handles: the kubelet names a CSI volume
    `<driver>^<volumeHandle>` (csi_plugin.go GetVolumeName), and a pod with two PVs of one
    name waits forever (kubernetes/kubernetes#91556; rule pv-unique-volume-handle).
    """
    capacity = shared_capacity_gib(cfg)
    return [
        *_team_pv(
            cfg,
            team,
            claim=CHECKPOINTS_CLAIM,
            access="ReadWriteMany",
            csi=csi_at(team_checkpoint_dir(team), f"{team.name}-{CHECKPOINTS_CLAIM}"),
            capacity_gib=capacity,
        ),
        *_team_pv(
            cfg,
            team,
            claim=DATASETS_CLAIM,
            access="ReadWriteMany",
            csi=csi_at(DATASETS_PATH, f"{team.name}-{DATASETS_CLAIM}"),
            capacity_gib=capacity,
            mount_options=("ro", "flock"),
        ),
    ]


def root_volume(cfg: PlatformConfig, csi_at: CsiAt) -> list[dict[str, Any]]:
    """The whole shared file system, for the platform's layout job in the system namespace."""
    return _pv(
        cfg,
        f"trainstack-{ROOT_CLAIM}",
        SYSTEM_NAMESPACE,
        claim=ROOT_CLAIM,
        access="ReadWriteMany",
        csi=csi_at("", ROOT_CLAIM),
        capacity_gib=shared_capacity_gib(cfg),
    )


def fsx_volume_handle(file_system_id: str, role: str) -> str:
    """`<fs id>::<role>`: one handle per PV on the platform's FSx file system.

    fsx.csi.aws.com mounts `<dnsname>@tcp:/<mountname>` from volumeAttributes and uses the
    volume id only as a non-empty key (kubernetes-sigs/aws-fsx-csi-driver v1.9.0, the chart
    1.17.0 app version: pkg/driver/node.go NodePublishVolume; NodeStage is unimplemented, the
    controller has no PUBLISH_UNPUBLISH capability and the CSIDriver sets attachRequired:
    false). Up to v1.0.0 the id alone was the in-flight key, so two pods on a node
    publishing one id at once were refused (v1.0.0 node.go: `d.inFlight.Insert(volumeID)`).
    """
    return f"{file_system_id}::{role}"


def fsx_mount_name(mount_name: str, directory: str) -> str:
    """The `mountname` attribute of a volume rooted at `directory` (a Lustre fileset mount).

    The driver mounts `<dnsname>@tcp:/<mountname>` without checking the name (v1.9.0
    node.go NodePublishVolume), so `<mountname>/checkpoints/vision` mounts that directory
    alone, as FSx documents ("Mounting specific filesets", FSx Lustre user guide,
    mounting-from-fileset.html); the Lustre servers refuse `..` in it and a directory that
    does not exist (lustre-release v2_15_0 lustre/mdt/mdt_handler.c mdt_lookup_fileset).
    """
    return f"{mount_name}{directory}"


EFS_CSI_DRIVER = "efs.csi.aws.com"
EFS_NOMINAL_GIB = 1024  # EFS is elastic; a PV still needs a capacity
# The access point's POSIX identity: EFS runs every operation through the access point as
# this user, whatever the container's uid, so the images' user needs no match here.
EFS_POSIX_ID = 1000
NFS_PORT = 2049


def efs_access_point_root(team: Team) -> str:
    return f"/teams/{team.name}"


def efs_checkpoint_volume(
    cfg: PlatformConfig, team: Team, volume_handle: Any
) -> list[dict[str, Any]]:
    """The team's checkpoints on EFS, through its own access point (`fs-…::fsap-…`)."""
    return _team_pv(
        cfg,
        team,
        claim=CHECKPOINTS_CLAIM,
        access="ReadWriteMany",
        csi={"driver": EFS_CSI_DRIVER, "volumeHandle": volume_handle},
        capacity_gib=EFS_NOMINAL_GIB,
        mount_options=(),
    )


def existing_lustre_csi(cfg: PlatformConfig, directory: str, role: str) -> dict[str, Any]:
    """The operator's Lustre for one volume: the handle and attributes as configured, with
    `{path}` replaced by the volume's directory (`/checkpoints/<team>`, `/datasets`, or
    nothing for the file system's root).

    trainstack does not invent handles here: Lustre CSI drivers differ in what they read
    from it (HPE's lustre.csi.hpe.com mounts the volume id itself, HewlettPackard/
    lustre-csi-driver pkg/hpelustre/nodeserver.go NodePublishVolume `source := volumeID`;
    the FSx and Azure Lustre drivers read the file system from volumeAttributes:
    kubernetes-sigs/azurelustre-csi-driver pkg/azurelustre/nodeserver.go NodePublishVolume
    mounts `<mds-ip-address>@tcp:/<fs-name>` from the volume context). The loader requires
    `{path}` in the handle (config/storage.py), so every volume's is its own.
    """
    del role
    existing = cfg.storage.existing_lustre
    assert existing is not None
    return {
        "driver": existing.csi_driver,
        "volumeHandle": existing.volume_handle.replace(PATH_PLACEHOLDER, directory),
        "volumeAttributes": {
            k: v.replace(PATH_PLACEHOLDER, directory) for k, v in existing.volume_attributes
        },
    }


def training_service_account(cfg: PlatformConfig, team: Team, role_arn: Any) -> dict[str, Any]:
    """`role_arn` may be a Pulumi Output (or None): builders pass such values through."""
    metadata: dict[str, Any] = {
        "name": TRAINING_SERVICE_ACCOUNT,
        "namespace": team.namespace,
        "labels": {**labels.base_labels(cfg.stack), labels.TEAM: team.name},
    }
    if role_arn is not None:
        metadata["annotations"] = {"eks.amazonaws.com/role-arn": role_arn}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata}


def team_storage(cfg: PlatformConfig, team: Team) -> dict[str, Any]:
    """The claims, mount paths and cache class the job layer wires into a team's pods."""
    storage = cfg.storage
    entry: dict[str, Any] = {}
    if storage.has_shared_filesystem:
        entry |= {
            "datasetClaim": DATASETS_CLAIM,
            "datasetSubPath": "",  # the volume's root is /datasets
            "datasetMountPath": DATASETS_PATH,
        }
    if storage.has_checkpoint_volume:
        entry |= {
            "checkpointClaim": CHECKPOINTS_CLAIM,
            # On Lustre the volume's root is the team's directory; on EFS the team's access
            # point, under which checkpoints have a directory of their own.
            "checkpointSubPath": "" if storage.has_shared_filesystem else "checkpoints",
            "checkpointMountPath": CHECKPOINTS_MOUNT,
            "serviceAccount": TRAINING_SERVICE_ACCOUNT,
        }
    bucket = storage.job_bucket
    if bucket is not None:
        entry |= {
            "checkpointS3Uri": f"s3://{bucket}/{CHECKPOINT_PREFIX}{team.name}/",
            "logS3Uri": f"s3://{bucket}/{LOG_PREFIX}{team.name}/",
            "artifactS3Uri": f"s3://{bucket}/{ARTIFACT_PREFIX}{team.name}/",
        }
    if storage.checkpoint_bucket is not None:  # the platform's bucket: it sets the expiry
        checkpoint_days, log_days = team_retention(cfg, team)
        entry |= {"checkpointRetentionDays": checkpoint_days, "logRetentionDays": log_days}
    store = storage.object_store
    if store is not None:  # an existing cluster's store: where, and the team's credentials
        entry |= {
            "objectStoreEndpoint": store.endpoint,
            "objectStoreRegion": store.region,
            "objectStoreSecret": store.credentials_secret,
        }
    if storage.nvme_cache is not None:
        entry["cacheDriver"] = CACHE_DRIVER
    return entry


def cache_sources(cfg: PlatformConfig) -> list[str]:
    """What the cache agent may fetch from: the Lustre data repository and
    nvmeCache.sources, in that order."""
    storage = cfg.storage
    assert storage.nvme_cache is not None
    sources: list[str] = []
    lustre = storage.lustre
    if lustre is not None and lustre.data_repository is not None:
        repo = lustre.data_repository
        sources.append(f"s3://{repo.bucket}/{repo.prefix}")
    sources += [s for s in storage.nvme_cache.sources if s not in sources]
    return sources


def storage_output(cfg: PlatformConfig) -> dict[str, Any]:
    """Platform-wide storage facts; each team's claims are in its `team/<name>` slice."""
    storage = cfg.storage
    doc: dict[str, Any] = {}
    lustre = storage.lustre
    if lustre is not None and lustre.data_repository is not None:
        repo = lustre.data_repository
        doc["datasetRepository"] = f"s3://{repo.bucket}/{repo.prefix}"
    if storage.nvme_cache is not None:
        doc["cache"] = {
            "driver": CACHE_DRIVER,
            "maxConcurrentFetchesPerSource": storage.nvme_cache.max_concurrent_fetches,
            # What a job's cacheFrom may name: the agent fetches nothing else.
            "sources": cache_sources(cfg),
        }
    return doc
