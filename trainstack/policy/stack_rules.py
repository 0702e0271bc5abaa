"""Rules over a whole stack: resources judged together (a bucket and its companions, the
PersistentVolumes of a plan, NetworkPolicies and the CNI that enforces them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainstack.policy.objects import ADDON, Level, as_map, as_seq

# -- stack-level rules: S3 buckets and their companion resources -------------------------------

BUCKET = "aws:s3/bucket:Bucket"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
PAB_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


@dataclass(frozen=True)
class StackResource:
    """A resource as a stack rule sees it. `key` is its identity: the URN under CrossGuard,
    `type::name` in the plan (names repeat: a bucket and its five companions share one).
    `depends_on` maps a property to the keys of the resources its value comes from (the
    engine's property dependencies), which link resources while values are still unknown."""

    type: str
    name: str
    props: Mapping[str, Any]
    key: str = ""
    depends_on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        return self.key or f"{self.type}::{self.name}"


StackCheck = Callable[[Sequence[StackResource]], list[tuple[str, str]]]


@dataclass(frozen=True)
class StackRule:
    name: str
    description: str
    remediation: str
    check: StackCheck  # (identity of the resource, message) per finding
    resource_types: tuple[str, ...]  # what `check` reads; the preview passes only these
    level: Level = "mandatory"


def _bucket_companions(
    resources: Sequence[StackResource], companion: str
) -> dict[str, list[Mapping[str, Any]]]:
    """Each bucket's companion resources, by the bucket's identity.

    Issue 19 #6: a companion names its bucket by id, which is unknown at preview while the
    bucket is new; reading it raised in the analyzer ("can't run policy"). The property
    dependency of `bucket` links them whatever the value is; the value (the bucket's name,
    or `<name>-id` offline) is read only for a companion registered without dependencies.
    """
    buckets = {r.identity: r for r in resources if r.type == BUCKET}

    def by_value(value: str) -> list[str]:
        return [
            key
            for key, b in buckets.items()
            if value in (f"{b.name}-id", str(b.props.get("bucket", b.name)))
        ]

    result: dict[str, list[Mapping[str, Any]]] = {key: [] for key in buckets}
    for r in resources:
        if r.type == companion:
            deps = r.depends_on.get("bucket", ())
            linked = (
                [k for k in deps if k in buckets] if deps else by_value(str(r.props.get("bucket")))
            )
            for key in linked:
                result[key].append(r.props)
    return result


def s3_encrypted(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    found = []
    for name, configs in _bucket_companions(resources, SSE).items():
        algorithms = {
            str(as_map(as_map(r).get("applyServerSideEncryptionByDefault")).get("sseAlgorithm"))
            for c in configs
            for r in as_seq(c.get("rules"))
        }
        if not algorithms & {"aws:kms", "aws:kms:dsse", "AES256"}:
            found.append((name, "bucket has no server-side encryption configuration"))
    return found


def s3_public_access_blocked(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    found = []
    for name, configs in _bucket_companions(resources, PAB).items():
        if not any(all(c.get(flag) is True for flag in PAB_FLAGS) for c in configs):
            found.append((name, "bucket has no public access block with all four settings on"))
    return found


def cni_enforces_network_policy(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """NetworkPolicies in a stack that manages no CNI (an existing cluster): nothing here can
    make them enforced, or check that they are. One finding per stack."""
    policies = sorted(r.identity for r in resources if r.type == NETWORK_POLICY)
    managed = any(r.type == ADDON and r.props.get("addonName") == "vpc-cni" for r in resources)
    if not policies or managed:
        return []
    return [
        (
            policies[0],
            f"{len(policies)} NetworkPolicies (team and platform isolation) are enforced only "
            "if this cluster's CNI enforces NetworkPolicy, which trainstack cannot configure or "
            "check on a cluster it does not create",
        )
    ]


LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
# The platform bucket's prefixes (builders/storage.py): checkpoint copies, whose latest per job
# must never expire by age, and hand-offs, which never expire at all.
CHECKPOINTS_PREFIX = "teams/"
ARTIFACTS_PREFIX = "artifacts/"
SUPERSEDED = ("trainstack.io/superseded", "true")


def _reaches(rule_prefix: str, prefix: str) -> bool:
    """Whether objects under `prefix` can match a rule filtered on `rule_prefix`."""
    return prefix.startswith(rule_prefix) or rule_prefix.startswith(prefix)


def _expiry_scope(rule: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """(prefix, tags) an enabled rule with an expiration filters on; None for other rules."""
    if str(rule.get("status")) != "Enabled" or not rule.get("expiration"):
        return None
    filt = as_map(rule.get("filter"))
    both = as_map(filt.get("and"))
    tags = as_map(both.get("tags"))
    if filt.get("tag"):
        tag = as_map(filt.get("tag"))
        tags = {str(tag.get("key")): tag.get("value")}
    return str(both.get("prefix", filt.get("prefix", "")) or ""), tags


def s3_expiry_keeps_latest(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """No lifecycle rule of a bucket expires, by age alone, checkpoint copies (only copies a
    newer one superseded may expire: S3 cannot keep "the newest object under a prefix", issue
    17) or hand-offs (the model and report of a finished job)."""
    found = []
    for name, configs in _bucket_companions(resources, LIFECYCLE).items():
        for rule in (as_map(r) for c in configs for r in as_seq(c.get("rules"))):
            scope = _expiry_scope(rule)
            if scope is None:
                continue
            prefix, tags = scope
            what = f"lifecycle rule {rule.get('id', '?')} expires {prefix or 'every object'}*"
            if _reaches(prefix, CHECKPOINTS_PREFIX) and tags.get(SUPERSEDED[0]) != SUPERSEDED[1]:
                found.append(
                    (
                        name,
                        f"{what} by age without the tag {SUPERSEDED[0]}={SUPERSEDED[1]}: it "
                        "would delete a paused job's only checkpoint copy",
                    )
                )
            if _reaches(prefix, ARTIFACTS_PREFIX):
                found.append((name, f"{what}, where finished jobs' hand-offs are kept"))
    return found


PERSISTENT_VOLUME = "kubernetes:core/v1:PersistentVolume"


def pv_unique_volume_handle(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """No two CSI PersistentVolumes that one pod could use name the same volume.

    The kubelet names a CSI persistent volume `<driver>^<volumeHandle>` and keeps one entry
    per name (k8s.io/kubernetes@v1.37.2 pkg/volume/csi/csi_plugin.go GetVolumeName,
    CanDeviceMount; kubelet/volumemanager/cache/desired_state_of_world.go AddPodToVolume):
    a pod using two such PVs waits for the second forever (kubernetes/kubernetes#91556).
    A pod uses only claims of its own namespace, so PVs pre-bound to claims of different
    namespaces may share a handle: each team's read-only `datasets` volume on an operator's
    Lustre whose driver mounts the handle itself is one such handle (issue 37). On one node
    the kubelet then publishes that one volume for each pod, from each pod's own PV. A PV
    bound to no claim could serve any namespace, so it may share its handle with none.
    """
    by_volume: dict[tuple[str, str], list[tuple[str, str, str | None]]] = {}
    for r in resources:
        if r.type != PERSISTENT_VOLUME:
            continue  # the analyzer hands a stack policy every resource
        name, props = r.identity, r.props
        spec = as_map(props.get("spec"))
        csi = as_map(spec.get("csi"))
        if not csi:
            continue
        key = (str(csi.get("driver")), str(csi.get("volumeHandle")))
        pv_name = str(as_map(props.get("metadata")).get("name", r.name))
        claim = as_map(spec.get("claimRef"))
        namespace = str(claim["namespace"]) if "namespace" in claim else None
        by_volume.setdefault(key, []).append((name, pv_name, namespace))
    found = []
    for (driver, handle), volumes in by_volume.items():
        for name, pv_name, namespace in volumes:
            clash = sorted(
                p
                for n, p, ns in volumes
                if n != name and (ns is None or namespace is None or ns == namespace)
            )
            if clash:
                found.append(
                    (
                        name,
                        f"PersistentVolume {pv_name} has CSI driver {driver} and volumeHandle "
                        f"{handle!r}, like {', '.join(clash)}, for the same namespace: the "
                        "kubelet takes them for one volume (<driver>^<volumeHandle>), so a pod "
                        "using both never starts (kubernetes/kubernetes#91556)",
                    )
                )
    return found


STACK_RULES: tuple[StackRule, ...] = (
    StackRule("s3-encrypted", "S3 buckets are encrypted at rest",
              "add a BucketServerSideEncryptionConfiguration (aws:kms)", s3_encrypted,
              (BUCKET, SSE)),
    StackRule("s3-public-access-blocked", "S3 buckets block public access",
              "add a BucketPublicAccessBlock with all four settings true",
              s3_public_access_blocked, (BUCKET, PAB)),
    StackRule("s3-expiry-keeps-latest",
              "lifecycle rules never expire a job's latest checkpoint copy or a hand-off",
              "filter age expirations under teams/ on the tag trainstack.io/superseded=true, "
              "and leave artifacts/ out of every expiration (builders/storage.py "
              "checkpoint_lifecycle_rules)", s3_expiry_keeps_latest, (BUCKET, LIFECYCLE)),
    StackRule("cni-enforces-network-policy",
              "NetworkPolicies are enforced by the cluster's CNI",
              "make sure the cluster's CNI enforces NetworkPolicy (Calico, Cilium, or the VPC "
              "CNI with enableNetworkPolicy): README, Existing clusters",
              cni_enforces_network_policy,
              (NETWORK_POLICY, ADDON), level="advisory"),
    StackRule("pv-unique-volume-handle",
              "no two CSI PersistentVolumes share a driver and volumeHandle",
              "give every PersistentVolume its own volumeHandle; for the platform's Lustre on "
              "an existing cluster put {team} into storage.existingLustre.volumeHandle if the "
              "CSI driver reads the file system from volumeAttributes (docs/architecture.md, "
              "Storage)", pv_unique_volume_handle, (PERSISTENT_VOLUME,)),
)  # fmt: skip
