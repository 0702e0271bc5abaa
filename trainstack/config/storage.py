"""FSx for Lustre rules (capacity steps, throughput tiers) and storage model building.

Sizes AWS would reject at create time are preview errors that name the nearest valid
values. Facts: ../shared/reference/aws-gpu-platform-facts.md §4.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from trainstack.config import model as m
from trainstack.config.checks import dict_items
from trainstack.config.errors import ConfigIssue, join_path

THROUGHPUT = {"PERSISTENT_2": (125, 250, 500, 1000)}
# EFA-enabled file systems grow in throughput-dependent steps.
EFA_STEPS = {125: 38400, 250: 19200, 500: 9600, 1000: 4800}
SSD_FIRST_STEPS = (1200, 2400)
SSD_INCREMENT = 2400
MAX_CAPACITY_GIB = 2_400_000  # beyond this, raise an AWS quota first


def valid_capacity(capacity: int, deployment: str, efa: bool, throughput: int | None) -> bool:
    del deployment  # SCRATCH_2 and PERSISTENT_2 (SSD) share the step rule
    if efa:
        step = EFA_STEPS.get(throughput or 0)
        return step is not None and capacity % step == 0
    return capacity in SSD_FIRST_STEPS or (capacity > 0 and capacity % SSD_INCREMENT == 0)


def nearest_capacities(capacity: int, efa: bool, throughput: int | None) -> list[int]:
    """The valid sizes just below and just above `capacity`."""
    if efa:
        step = EFA_STEPS.get(throughput or 0, 4800)
        below, above = (capacity // step) * step, -(-capacity // step) * step
    else:
        candidates = [*SSD_FIRST_STEPS, (capacity // SSD_INCREMENT) * SSD_INCREMENT]
        candidates.append(-(-capacity // SSD_INCREMENT) * SSD_INCREMENT)
        below = max((c for c in candidates if 0 < c <= capacity), default=0)
        above = min(c for c in candidates if c >= capacity) if capacity > 0 else SSD_FIRST_STEPS[0]
        above = max(above, SSD_FIRST_STEPS[0])
    return sorted({v for v in (below, above) if v > 0})


def nearest(value: int, choices: tuple[int, ...]) -> int:
    return min(choices, key=lambda c: (abs(c - value), c))


def _cloud_checks(storage: Mapping[str, Any], path: str, cloud: object) -> list[ConfigIssue]:
    """What each kind of cluster can use: the storage trainstack creates on aws, the one an
    existing cluster already has there."""
    issues: list[ConfigIssue] = []
    for key, allowed in (("lustre", "aws"), ("existingLustre", "existing")):
        if key in storage and cloud in ("aws", "existing") and cloud != allowed:
            other = "existingLustre" if key == "lustre" else "lustre"
            issues.append(
                ConfigIssue(
                    join_path(path, key),
                    f"only used with cloud: {allowed}, but cloud is {cloud}; use {other}",
                )
            )
    if "objectStore" in storage and cloud == "aws":
        issues.append(
            ConfigIssue(
                join_path(path, "objectStore"),
                "only used with cloud: existing; on aws the platform creates its bucket "
                "(storage.checkpoints.bucket)",
            )
        )
    if "efs" in storage and cloud == "existing":
        issues.append(
            ConfigIssue(join_path(path, "efs"), "EFS is created on aws only; use existingLustre")
        )
    return issues


def storage_checks(doc: Mapping[str, Any], root: str, zones: set[str] | None) -> list[ConfigIssue]:
    storage = doc.get("storage")
    if not isinstance(storage, Mapping):
        return []
    path = join_path(root, "storage")
    cloud = doc.get("cloud")
    issues = _cloud_checks(storage, path, cloud)
    if "efs" in storage and "lustre" in storage:
        issues.append(
            ConfigIssue(
                join_path(path, "efs"),
                "checkpoints already go to Lustre; remove efs (it is for setups without Lustre)",
            )
        )
    existing = storage.get("existingLustre")
    if isinstance(existing, Mapping):
        issues += _existing_lustre_checks(existing, join_path(path, "existingLustre"))
    lustre = storage.get("lustre")
    if isinstance(lustre, Mapping) and cloud == "aws":
        issues += _lustre_checks(lustre, join_path(path, "lustre"), zones)
        issues += _lustre_zone_checks(lustre, join_path(path, "lustre"), doc.get("gpuPools"))
    checkpoints = storage.get("checkpoints")
    if cloud == "existing" and isinstance(checkpoints, Mapping) and "bucket" in checkpoints:
        issues.append(
            ConfigIssue(
                join_path(path, "checkpoints", "bucket"),
                "S3 checkpoint copies are created on aws only; remove it",
            )
        )
    cache = storage.get("nvmeCache")
    if isinstance(cache, Mapping):
        issues += _cache_checks(cache, join_path(path, "nvmeCache"), cloud)
    if isinstance(cache, Mapping):
        issues += _cache_rate_checks(cache, join_path(path, "nvmeCache"), doc.get("gpuPools"))
    if "nvmeCache" in storage and cloud == "aws":
        pools = [p for _, p in dict_items(doc.get("gpuPools"))]
        if not any(p.get("instanceStore") != "none" for p in pools):
            issues.append(
                ConfigIssue(
                    join_path(path, "nvmeCache"),
                    "no GPU pool keeps an NVMe instance store (instanceStore: raid0); "
                    "add one or remove nvmeCache",
                )
            )
    return issues


PATH_PLACEHOLDER = "{path}"  # = builders/storage.PATH_PLACEHOLDER (config never imports them)


def _existing_lustre_checks(existing: Mapping[str, Any], path: str) -> list[ConfigIssue]:
    """Issue 37 #1: every volume is rooted at its own directory, so the handle carries
    `{path}`. A handle without it gave each team's volume the whole file system, where a
    symlink in a team's checkpoint directory reached every other team's: the kubelet follows
    it on the host and checks only that it stays inside the volume (k8s.io/kubernetes
    v1.37.2 pkg/volume/util/subpath/subpath_linux.go doBindSubPath)."""
    handle = existing.get("volumeHandle")
    if not isinstance(handle, str) or PATH_PLACEHOLDER in handle:
        return []
    team = " ({team} is no longer replaced: each team's volume is rooted by {path})"
    return [
        ConfigIssue(
            join_path(path, "volumeHandle"),
            f"{handle!r} has no {PATH_PLACEHOLDER}: each team's checkpoints and the datasets "
            "are volumes of their own, rooted at their directory, and {path} says where that "
            f"directory goes{team if '{team}' in handle else ''}. Drivers that mount the "
            "handle (lustre.csi.hpe.com): e.g. mgs@tcp:/fsname{path}; drivers that read the "
            "file system from volumeAttributes: append {path} to the handle and write it "
            "into their sub-directory attribute",
        )
    ]


# The instance-store array nodeadm mounts at /mnt/k8s-disks/0 also holds these, bind-mounted
# from <array>/<basename> (amazon-eks-ami templates/al2023/runtime/bin/setup-local-disks).
ARRAY_PARENT = "/mnt/k8s-disks"
NODE_STATE_DIRS = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/soci-snapshotter-grpc",
    "/var/log/pods",
)
DEFAULT_CACHE_DIR = "/mnt/trainstack-cache"


def _overlaps(path: str, other: str) -> bool:
    """`path` is `other`, inside it, or above it."""
    a, b = posixpath.normpath(path), posixpath.normpath(other)
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _and_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _cache_checks(cache: Mapping[str, Any], path: str, cloud: object) -> list[ConfigIssue]:
    """The provisioner deletes what is in every released volume under hostDir
    (sig-storage-local-static-provisioner pkg/deleter/deleter.go): hostDir must hold nothing
    but cache mount points."""
    issues: list[ConfigIssue] = []
    host_dir = cache.get("hostDir")
    if isinstance(host_dir, str) and host_dir.startswith("/"):
        fix = (
            "and the provisioner deletes everything in a released volume; use a directory of "
            f"its own, such as {DEFAULT_CACHE_DIR} (the default)"
        )
        state = [d for d in NODE_STATE_DIRS if _overlaps(host_dir, d)]
        if _overlaps(host_dir, ARRAY_PARENT):
            issues.append(
                ConfigIssue(
                    join_path(path, "hostDir"),
                    f"{host_dir!r} holds the node's instance-store array, where nodeadm also "
                    "keeps /var/lib/kubelet, /var/lib/containerd and /var/log/pods, " + fix,
                )
            )
        elif state:
            issues.append(
                ConfigIssue(
                    join_path(path, "hostDir"),
                    f"{host_dir!r} holds {_and_list(state)}, " + fix,
                )
            )
    if "volumesPerNode" in cache and cloud == "existing":
        issues.append(
            ConfigIssue(
                join_path(path, "volumesPerNode"),
                "only used with cloud: aws (the node's user data makes the directories); on an "
                "existing cluster every mount point you prepare under hostDir is one volume",
            )
        )
    issues += _cache_source_checks(cache, path)
    return issues


# What a directory source may not hold or sit in: the agent reads it as root and every team
# reads what it copies (the kubelet's client key and every pod's volumes, the cache itself).
NODE_PRIVATE_DIRS = (
    *NODE_STATE_DIRS,
    ARRAY_PARENT,
    *("/etc", "/root", "/boot", "/proc", "/sys", "/dev", "/run", "/var/run"),
)


def _cache_source_checks(cache: Mapping[str, Any], path: str) -> list[ConfigIssue]:
    """Directory sources (normalised: the schema's pattern) against hostDir and the node's
    own state."""
    issues: list[ConfigIssue] = []
    sources = cache.get("sources")
    host_dir = cache.get("hostDir", DEFAULT_CACHE_DIR)
    for i, source in enumerate(sources if isinstance(sources, list) else []):
        if not isinstance(source, str) or posixpath.normpath(source) + "/" != source:
            continue  # S3, or not a normalised directory: the schema's pattern says so
        private = (host_dir, *NODE_PRIVATE_DIRS) if isinstance(host_dir, str) else NODE_PRIVATE_DIRS
        held = [d for d in dict.fromkeys(private) if _overlaps(source, d)]
        if held:
            issues.append(
                ConfigIssue(
                    join_path(path, "sources", i),
                    f"{source!r} overlaps {_and_list(held)}: every team reads a source through "
                    "the cache agent, which reads as root; list only dataset directories, such "
                    "as /fsx/datasets/",
                )
            )
    return issues


DEFAULT_REQUEST_RATE_BUDGET = 2750  # = the schema's default for nvmeCache.requestRateBudget


def _cache_rate_checks(cache: Mapping[str, Any], path: str, pools: object) -> list[ConfigIssue]:
    """Every node that can run the cache agent gets budget / nodes requests/s as its ceiling
    (trainstack.builders.cache.node_request_rate), counted in whole requests per window: a
    budget below the node count would leave a node less than one request/s."""
    budget = cache.get("requestRateBudget", DEFAULT_REQUEST_RATE_BUDGET)
    listed = [p for p in pools if isinstance(p, Mapping)] if isinstance(pools, list) else []
    nodes = 0
    for pool in listed:
        size = pool.get("size")
        count = size.get("max") if isinstance(size, Mapping) else pool.get("nodes")
        nodes += count if isinstance(count, int) and not isinstance(count, bool) else 0
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not 1 <= budget < nodes:
        return []
    return [
        ConfigIssue(
            join_path(path, "requestRateBudget"),
            f"{budget:g} requests/s shared by up to {nodes} nodes that run the cache agent is "
            "less than one request/s each; raise it to at least the node count",
        )
    ]


def _lustre_zone_checks(lustre: Mapping[str, Any], path: str, pools: object) -> list[ConfigIssue]:
    """Lustre serves one zone: a GPU pool in another reads every batch and writes every
    checkpoint across zones, slower and billed per GB each way (EC2 "Data transfer within the
    same AWS Region"). An error unless the config says it accepts that (issue 17 #8)."""
    listed = [p for p in pools if isinstance(p, Mapping)] if isinstance(pools, list) else []
    zoned = [p for p in listed if isinstance(p.get("availabilityZone"), str)]
    # Without a zone of its own, Lustre goes to the first EFA pool's (build_storage).
    efa_zones = [p["availabilityZone"] for p in zoned if p.get("fabric") == "efa"]
    zone = lustre.get("availabilityZone") or (efa_zones[0] if efa_zones else None)
    if not isinstance(zone, str) or lustre.get("allowCrossZone") is True:
        return []
    away = [
        f"{p.get('name')} ({p['availabilityZone']})" for p in zoned if p["availabilityZone"] != zone
    ]
    if not away:
        return []
    return [
        ConfigIssue(
            join_path(path, "availabilityZone"),
            f"Lustre is in {zone} but GPU pools {', '.join(away)} are not: every read and "
            "checkpoint would cross zones (slower, and billed per GB each way); put the pools "
            "and Lustre in one zone, or set allowCrossZone: true to accept it",
        )
    ]


def _lustre_checks(
    lustre: Mapping[str, Any], path: str, zones: set[str] | None
) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    deployment = lustre.get("deploymentType", "PERSISTENT_2")
    throughput = lustre.get("perUnitStorageThroughput")
    efa = lustre.get("efa", False) is True
    tiers = THROUGHPUT.get(str(deployment))
    if isinstance(throughput, int):
        if tiers is None:
            issues.append(
                ConfigIssue(
                    join_path(path, "perUnitStorageThroughput"),
                    f"{deployment} has no throughput tier; remove it or use PERSISTENT_2",
                )
            )
        elif throughput not in tiers:
            issues.append(
                ConfigIssue(
                    join_path(path, "perUnitStorageThroughput"),
                    f"{throughput} MB/s/TiB is not a {deployment} tier; nearest valid value "
                    f"is {nearest(throughput, tiers)} (allowed: {', '.join(map(str, tiers))})",
                )
            )
    elif tiers is not None and "perUnitStorageThroughput" not in lustre:
        issues.append(
            ConfigIssue(
                join_path(path, "perUnitStorageThroughput"),
                f"required for {deployment}: one of {', '.join(map(str, tiers))} MB/s/TiB",
            )
        )
    if efa and deployment != "PERSISTENT_2":
        issues.append(
            ConfigIssue(join_path(path, "efa"), f"EFA needs PERSISTENT_2, not {deployment}")
        )
    capacity = lustre.get("storageCapacityGiB")
    tier = throughput if isinstance(throughput, int) else None
    # EFA steps depend on a valid tier; without one, the errors above already apply.
    efa = efa and deployment == "PERSISTENT_2" and tier in EFA_STEPS
    if isinstance(capacity, int) and not valid_capacity(capacity, str(deployment), efa, tier):
        near = nearest_capacities(capacity, efa, tier)
        rule = (
            f"multiples of {EFA_STEPS.get(tier or 0, '?')} GiB when EFA-enabled at {tier} MB/s/TiB"
            if efa
            else "1200, 2400, then steps of 2400 GiB"
        )
        issues.append(
            ConfigIssue(
                join_path(path, "storageCapacityGiB"),
                f"{capacity} GiB is not a valid size ({rule}); nearest valid values: "
                f"{' or '.join(map(str, near))}",
            )
        )
    if isinstance(capacity, int) and capacity > MAX_CAPACITY_GIB:
        issues.append(
            ConfigIssue(join_path(path, "storageCapacityGiB"), f"above {MAX_CAPACITY_GIB} GiB")
        )
    zone = lustre.get("availabilityZone")
    if isinstance(zone, str) and zones is not None and zone not in zones:
        issues.append(
            ConfigIssue(
                join_path(path, "availabilityZone"),
                f"{zone!r} has no private subnet of this platform; "
                f"use one of {', '.join(sorted(zones))}",
            )
        )
    return issues


def build_storage(
    doc: Mapping[str, Any], cluster_name: str, pools: tuple[m.GpuPool, ...], zones: tuple[str, ...]
) -> m.Storage:
    storage = doc["storage"]
    lustre = None
    if "lustre" in storage:
        raw = storage["lustre"]
        efa_zones = [
            p.aws.availability_zone
            for p in pools
            if p.aws and p.fabric == "efa" and p.aws.availability_zone
        ]
        zone = raw.get("availabilityZone") or (efa_zones[0] if efa_zones else zones[0])
        repo = raw.get("dataRepository")
        lustre = m.Lustre(
            deployment_type=raw["deploymentType"],
            storage_capacity_gib=raw["storageCapacityGiB"],
            per_unit_storage_throughput=raw.get("perUnitStorageThroughput"),
            efa=raw["efa"],
            availability_zone=zone,
            data_repository=(
                m.DataRepository(
                    bucket=repo["bucket"],
                    prefix=repo["prefix"],
                    auto_import=tuple(repo["autoImport"]),
                    auto_export=tuple(repo["autoExport"]),
                )
                if repo
                else None
            ),
        )
    existing = None
    if "existingLustre" in storage:
        raw = storage["existingLustre"]
        existing = m.ExistingLustre(
            csi_driver=raw["csiDriver"],
            volume_handle=raw["volumeHandle"],
            volume_attributes=tuple(sorted(raw["volumeAttributes"].items())),
            capacity_gib=raw["capacityGiB"],
        )
    cache = None
    if "nvmeCache" in storage:
        raw = storage["nvmeCache"]
        cache = m.NvmeCache(
            host_dir=posixpath.normpath(raw["hostDir"]),
            max_concurrent_fetches=raw["maxConcurrentFetchesPerSource"],
            volumes_per_node=raw["volumesPerNode"],
            sources=tuple(raw["sources"]),
            agent_image=raw["agentImage"],
            registrar_image=raw["registrarImage"],
            request_rate_budget=float(raw["requestRateBudget"]),
            reserve_percent=float(raw["reservePercent"]),
            kubelet_dir=raw["kubeletDir"],
        )
    checkpoints = storage["checkpoints"]
    bucket = None
    if doc["cloud"] == "aws":
        bucket = checkpoints.get("bucket", f"{cluster_name}-checkpoints")
    efs = m.Efs(throughput_mode=storage["efs"]["throughputMode"]) if "efs" in storage else None
    return m.Storage(
        lustre=lustre,
        efs=efs,
        existing_lustre=existing,
        layout_image=storage["layoutImage"],
        nvme_cache=cache,
        checkpoint_bucket=bucket,
        retention_days=checkpoints["retentionDays"],
        noncurrent_version_days=checkpoints["noncurrentVersionDays"],
        log_retention_days=storage["logs"]["retentionDays"],
        log_collector=storage["logs"]["collector"],
        object_store=(
            m.ObjectStore(
                endpoint=storage["objectStore"]["endpoint"].rstrip("/"),
                bucket=storage["objectStore"]["bucket"],
                region=storage["objectStore"]["region"],
                credentials_secret=storage["objectStore"]["credentialsSecret"],
                collector_secret=storage["objectStore"]["collectorSecret"],
            )
            if "objectStore" in storage
            else None
        ),
    )
