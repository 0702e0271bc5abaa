"""Cross-field rules and model building for GPU pools (part of the one loader pass).

Everything AWS would reject at launch (EFA on a type without it, a pool across zones,
spot on a reservation) is caught here, at preview time, with the field and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from trainstack.catalog import catalog
from trainstack.config import model as m
from trainstack.config.checks import dict_items, duplicate_names, size_issues
from trainstack.config.errors import ConfigIssue, did_you_mean, join_path
from trainstack.config.interfaces import pod_interfaces, socket_ifname_matches
from trainstack.config.sharing import build_sharing

AWS_FABRICS = ("efa", "tcp")
EXISTING_FABRICS = ("infiniband", "roce", "tcp")
RESERVED_CAPACITY = ("reservation", "capacityBlock")
AWS_ONLY = (
    "instanceType",
    "availabilityZone",
    "capacity",
    "placementGroup",
    "instanceStore",
    "size",
    "diskSizeGiB",
)
EXISTING_ONLY = (
    "nodeSelector",
    "gpusPerNode",
    "nodes",
    "rdma",
    "socketIfname",
    "cpusPerNode",
    "memoryGiBPerNode",
)


def network_zones(doc: Mapping[str, Any]) -> set[str] | None:
    """Zones the platform's private subnets are in, or None if unknown (bad config)."""
    aws = doc.get("aws")
    network = aws.get("network") if isinstance(aws, Mapping) else None
    if not isinstance(network, Mapping):
        return None
    if isinstance(network.get("availabilityZones"), list):
        return {z for z in network["availabilityZones"] if isinstance(z, str)}
    vpc = network.get("existingVpc")
    if isinstance(vpc, Mapping):
        return {
            s["availabilityZone"]
            for _, s in dict_items(vpc.get("privateSubnets"))
            if isinstance(s.get("availabilityZone"), str)
        }
    return None


def pool_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    cloud = doc.get("cloud")
    pools_path = join_path(root, "gpuPools")
    pools = list(dict_items(doc.get("gpuPools")))
    issues = duplicate_names(pools, pools_path, "pool")
    zones = network_zones(doc)
    for index, pool in pools:
        path = join_path(pools_path, index)
        if cloud == "aws":
            issues += _aws_pool(pool, path, zones)
        elif cloud == "existing":
            issues += _existing_pool(pool, path)
    return issues


def _misplaced(
    pool: Mapping[str, Any], path: str, keys: tuple[str, ...], cloud: str
) -> list[ConfigIssue]:
    return [
        ConfigIssue(join_path(path, key), f"not used with cloud: {cloud}; remove it")
        for key in keys
        if key in pool
    ]


def _aws_pool(pool: Mapping[str, Any], path: str, zones: set[str] | None) -> list[ConfigIssue]:
    issues = _misplaced(pool, path, EXISTING_ONLY, "aws")
    fabric = pool.get("fabric")
    if fabric in ("infiniband", "roce"):
        issues.append(
            ConfigIssue(
                join_path(path, "fabric"),
                f"{fabric} pools are declared over existing nodes (cloud: existing); "
                "on AWS use efa or tcp",
            )
        )
    for key in ("instanceType", "size"):
        if key not in pool:
            issues.append(ConfigIssue(join_path(path, key), "required for an AWS pool"))
    known = catalog()
    instance = None
    itype = pool.get("instanceType")
    if isinstance(itype, str):
        if itype not in known:
            issues.append(
                ConfigIssue(
                    join_path(path, "instanceType"),
                    f"unknown instance type {itype!r}{did_you_mean(itype, known)}; "
                    f"supported: {', '.join(known)}",
                )
            )
        else:
            instance = known[itype]
    if fabric == "efa" and instance is not None and not instance.supports_efa:
        with_efa = [
            n for n, t in known.items() if t.supports_efa and t.gpu_model == instance.gpu_model
        ]
        issues.append(
            ConfigIssue(
                join_path(path, "fabric"),
                f"{itype} has no EFA; use fabric: tcp, or an EFA type such as "
                f"{', '.join(with_efa) or 'p5.48xlarge'}",
            )
        )
    zone = pool.get("availabilityZone")
    capacity = pool.get("capacity")
    kind = capacity.get("type") if isinstance(capacity, Mapping) else None
    reserved = kind in RESERVED_CAPACITY
    placement = pool.get("placementGroup", default_placement_group(fabric, kind))
    issues += _placement_checks(placement, kind, join_path(path, "placementGroup"))
    # A reservation or block holds instances in one zone; a node group given every zone's
    # subnets launches outside it ("only specify the subnet in the same Availability Zone as
    # the capacity reservation", EKS user guide, capacity-blocks-mng).
    choices = f" (one of {', '.join(sorted(zones))})" if zones else ""
    if zone is None and (fabric == "efa" or bool(placement)):
        why = "EFA pools" if fabric == "efa" else "pools with a placement group"
        issues.append(
            ConfigIssue(
                join_path(path, "availabilityZone"),
                f"required: {why} must stay in one availability zone{choices}",
            )
        )
    elif zone is None and reserved:
        issues.append(
            ConfigIssue(
                join_path(path, "availabilityZone"),
                "required: a reservation or capacity block holds instances in one zone; name "
                f"that zone{choices} so the node group launches only there",
            )
        )
    if isinstance(zone, str) and zones is not None and zone not in zones:
        issues.append(
            ConfigIssue(
                join_path(path, "availabilityZone"),
                f"{zone!r} has no private subnet of this platform; use one of "
                f"{', '.join(sorted(zones))}",
            )
        )
    if (
        pool.get("instanceStore") == "raid0"
        and instance is not None
        and not instance.has_instance_store
    ):
        issues.append(
            ConfigIssue(
                join_path(path, "instanceStore"), f"{itype} has no NVMe instance store; use none"
            )
        )
    issues += _size_checks(pool.get("size"), join_path(path, "size"))
    issues += _capacity_checks(pool.get("capacity"), join_path(path, "capacity"), pool.get("size"))
    return issues


def default_placement_group(fabric: object, capacity_type: object) -> bool:
    """A new cluster placement group for EFA pools bought on demand or spot; none on a
    reservation or capacity block, whose instances launch where the capacity was reserved
    (a group it was not created in can refuse launches the reservation has room for)."""
    return fabric == "efa" and capacity_type not in RESERVED_CAPACITY


def _placement_checks(placement: object, kind: object, path: str) -> list[ConfigIssue]:
    """Issue 39 #7. EC2 places a Capacity Block's instances together itself, and a placement
    constraint can fail launches the block has room for (EC2 user guide, ec2-capacity-blocks;
    aws-parallelcluster ec2_validators.py PlacementGroupCapacityTypeValidator). A capacity
    reservation serves a cluster placement group only if it was created in that group, and
    one cannot be moved into a group later (EC2 user guide, cr-cpg): a group trainstack
    creates holds no reservation, so only the reservation's own group can be named."""
    if placement is False or placement is None:
        return []
    if kind == "capacityBlock":
        return [
            ConfigIssue(
                path,
                f"{placement!r}: a capacity block places its instances together itself, and a "
                "placement group can refuse launches the block has room for; remove it",
            )
        ]
    if kind == "reservation" and placement is True:
        return [
            ConfigIssue(
                path,
                "true creates a new placement group, which no reservation is in, so launches "
                "can fail while the reservation has room; name the cluster placement group "
                "the reservation was created in, or remove it",
            )
        ]
    return []


def _size_checks(size: object, path: str) -> list[ConfigIssue]:
    if not isinstance(size, Mapping):
        return []
    return size_issues(size, path, ("min", "desired", "max"), default_min=0)


def _capacity_checks(capacity: object, path: str, size: object) -> list[ConfigIssue]:
    if not isinstance(capacity, Mapping):
        return []
    kind = capacity.get("type")
    has_id, has_group = "reservationId" in capacity, "reservationGroupArn" in capacity
    issues = []
    if kind in ("onDemand", "spot") and (has_id or has_group):
        issues.append(
            ConfigIssue(
                path,
                f"{kind} capacity cannot target a capacity reservation or capacity block; "
                "use type: reservation or capacityBlock, or remove the reservation",
            )
        )
    if "instanceCount" in capacity and kind not in ("reservation", "capacityBlock"):
        issues.append(
            ConfigIssue(
                join_path(path, "instanceCount"),
                f"only a reservation or capacity block has an instance count, not {kind}; "
                "remove it",
            )
        )
    issues += _window_checks(capacity.get("window"), join_path(path, "window"), kind)
    if kind == "reservation" and has_id == has_group:
        issues.append(
            ConfigIssue(
                path, "a reservation needs exactly one of reservationId or reservationGroupArn"
            )
        )
    if kind == "capacityBlock":
        if not has_id:
            issues.append(
                ConfigIssue(
                    join_path(path, "reservationId"),
                    "required: the capacity block's reservation id (cr-…)",
                )
            )
        if has_group:
            issues.append(
                ConfigIssue(
                    join_path(path, "reservationGroupArn"),
                    "capacity blocks are targeted by reservationId only; remove it",
                )
            )
        if isinstance(size, Mapping) and isinstance(size.get("min"), int) and size["min"] > 0:
            # The block's instances exist only inside its window; a floor outside it
            # leaves the node group degraded.
            issues.append(
                ConfigIssue(
                    join_path(path.rsplit(".", 1)[0], "size", "min"),
                    "must be 0 for a capacity block",
                )
            )
    return issues


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 date-time with its offset, as UTC; None if it is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo is not None else None


def _window_checks(window: object, path: str, kind: object) -> list[ConfigIssue]:
    if not isinstance(window, Mapping):
        return []
    if kind != "capacityBlock":
        return [ConfigIssue(path, f"only a capacity block has a window, not {kind}; remove it")]
    issues = []
    times = {}
    for key in ("start", "end"):
        if key in window:
            times[key] = parse_time(window[key])
            if times[key] is None:
                issues.append(
                    ConfigIssue(
                        join_path(path, key),
                        f"{window[key]!r} is not an RFC 3339 date-time with an offset; "
                        "write it quoted, like '2026-12-01T11:30:00Z'",
                    )
                )
    start, end = times.get("start"), times.get("end")
    if start is not None and end is not None and end <= start:
        issues.append(ConfigIssue(join_path(path, "end"), "must be after start"))
    return issues


def _existing_pool(pool: Mapping[str, Any], path: str) -> list[ConfigIssue]:
    issues = _misplaced(pool, path, AWS_ONLY, "existing")
    fabric = pool.get("fabric")
    if fabric == "efa":
        issues.append(
            ConfigIssue(
                join_path(path, "fabric"), "efa exists only on AWS; use infiniband, roce or tcp"
            )
        )
    for key in ("nodeSelector", "gpusPerNode", "nodes", "cpusPerNode", "memoryGiBPerNode"):
        if key not in pool:
            issues.append(
                ConfigIssue(join_path(path, key), "required for a pool of existing nodes")
            )
    if fabric in ("infiniband", "roce") and "rdma" not in pool:
        issues.append(
            ConfigIssue(
                join_path(path, "rdma"),
                f"required for a {fabric} pool: which RDMA devices to expose",
            )
        )
    if fabric == "tcp" and "rdma" in pool:
        issues.append(
            ConfigIssue(
                join_path(path, "rdma"), "a tcp pool uses no RDMA devices; remove it or set fabric"
            )
        )
    rdma = pool.get("rdma")
    if fabric == "infiniband" and isinstance(rdma, Mapping) and "gidIndex" in rdma:
        issues.append(
            ConfigIssue(join_path(path, "rdma", "gidIndex"), "only used on RoCE; remove it")
        )
    if fabric == "roce" and isinstance(rdma, Mapping) and "secondaryNetwork" not in rdma:
        issues.append(
            ConfigIssue(
                join_path(path, "rdma", "secondaryNetwork"),
                "required for a roce pool: the NetworkAttachmentDefinition over the RoCE NICs "
                "(e.g. the Network Operator's MacvlanNetwork) that gives a pod its address on "
                "the fabric; without it a pod has only eth0",
            )
        )
    network = rdma.get("secondaryNetwork") if isinstance(rdma, Mapping) else None
    ifname = pool.get("socketIfname", "eth0")
    interfaces = pod_interfaces(network if isinstance(network, str) else None)
    if isinstance(ifname, str) and ifname and not socket_ifname_matches(ifname, interfaces):
        issues.append(
            ConfigIssue(
                join_path(path, "socketIfname"),
                f"{ifname!r} matches no interface of a job's pod ({', '.join(interfaces)}): "
                "pods do not see the host's NICs (host networking is refused by the "
                "no-privileged rule); use eth0, the default, for NCCL's bootstrap",
            )
        )
    return issues


def build_pools(doc: Mapping[str, Any]) -> tuple[m.GpuPool, ...]:
    """Typed pools from a validated, default-filled document."""
    pools = []
    for raw in doc.get("gpuPools", []):
        if doc["cloud"] == "aws":
            instance = catalog()[raw["instanceType"]]
            size = raw["size"]
            capacity = raw["capacity"]
            store = raw.get("instanceStore", "raid0" if instance.has_instance_store else "none")
            placement = raw.get(
                "placementGroup", default_placement_group(raw["fabric"], raw["capacity"]["type"])
            )
            aws_pool = m.AwsPool(
                instance_type=instance.name,
                availability_zone=raw.get("availabilityZone"),
                size=m.NodeGroupSize(
                    min=size["min"], desired=size.get("desired", size["min"]), max=size["max"]
                ),
                capacity=m.Capacity(
                    type=capacity["type"],
                    reservation_id=capacity.get("reservationId"),
                    reservation_group_arn=capacity.get("reservationGroupArn"),
                    instance_count=capacity.get("instanceCount"),
                    window=_window(capacity.get("window")),
                ),
                placement_group=placement is not False,
                placement_group_name=placement if isinstance(placement, str) else None,
                instance_store_raid0=store == "raid0",
                disk_size_gib=raw["diskSizeGiB"],
            )
            existing = None
        else:
            aws_pool = None
            rdma = raw.get("rdma")
            existing = m.ExistingPool(
                node_selector=tuple(sorted(raw["nodeSelector"].items())),
                gpus_per_node=raw["gpusPerNode"],
                nodes=raw["nodes"],
                cpus_per_node=raw["cpusPerNode"],
                memory_gib_per_node=raw["memoryGiBPerNode"],
                socket_ifname=raw["socketIfname"],
                rdma=(
                    m.RdmaSettings(
                        resource_name=rdma["resourceName"],
                        interfaces=tuple(rdma["interfaces"]),
                        hcas=rdma["hcas"],
                        gid_index=rdma.get("gidIndex"),
                        secondary_network=rdma.get("secondaryNetwork"),
                    )
                    if rdma
                    else None
                ),
            )
        pools.append(
            m.GpuPool(
                name=raw["name"],
                fabric=raw["fabric"],
                aws=aws_pool,
                existing=existing,
                sharing=build_sharing(doc, raw),
            )
        )
    return tuple(pools)


def _window(window: Mapping[str, str] | None) -> tuple[datetime, datetime] | None:
    if window is None:
        return None
    start, end = parse_time(window["start"]), parse_time(window["end"])
    assert start is not None, "checked by _window_checks"
    assert end is not None, "checked by _window_checks"
    return start, end
