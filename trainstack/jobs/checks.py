"""A job spec against the platform it runs on: team, pool, shape, quota, storage, priority.

Every rule that needs the platform stack's outputs (jobs/platform.py PlatformView); the spec's
own rules are in jobs/spec.py, and jobs/render.py renders only specs these pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainstack.builders.cache import cache_source_issue
from trainstack.catalog import allocatable, catalog
from trainstack.config.errors import ConfigError, ConfigIssue, did_you_mean
from trainstack.jobs import fractional
from trainstack.jobs.platform import PlatformView, profile
from trainstack.jobs.spec import JobSpec, cpu_millis, memory_bytes

PYTHONS = ("python", "python3")


def cache_source(spec: JobSpec, view: PlatformView) -> str:
    """Where the node cache agent fetches the job's data version from (checked here, rendered
    into the pod's CSI volume)."""
    assert spec.data is not None
    if spec.data.cache_from is not None:
        return spec.data.cache_from
    repo = view.dataset_repository()
    assert repo is not None, "platform_issues requires a repository"
    return f"{repo}{spec.data.dataset}/{spec.data.version}/"


def platform_issues(spec: JobSpec, view: PlatformView, stack_team: str | None) -> list[ConfigIssue]:
    """Rules that need the platform: team, pool, shape, quota, storage, priority."""
    issues: list[ConfigIssue] = []
    if stack_team is not None and spec.team != stack_team:
        issues.append(
            ConfigIssue(
                "job.metadata.team",
                f"{spec.team!r} is not this stack's team {stack_team!r}; a team deploys only "
                "its own jobs",
            )
        )
    team = view.team(spec.team)
    if team is None:
        msg = f"team {spec.team!r} is not in the platform registry"
        return [*issues, ConfigIssue("job.metadata.team", msg)]
    pool = view.pool(spec.pool)
    if pool is None:
        names = view.pool_names()
        return [
            *issues,
            ConfigIssue(
                "job.spec.pool",
                f"unknown pool {spec.pool!r}{did_you_mean(spec.pool, names)}; the platform has: "
                f"{', '.join(names) or 'no GPU pools'}",
            ),
        ]
    shape = _shape_issues(spec, view, pool)
    quota = _quota_issues(spec, view, team, pool)
    if any(i.path == "job.spec.workers.gpus" for i in shape):
        # The totals (capability, nodes) follow from a per-replica count no node can hold:
        # the cause alone, not a derived error first (issue 41 #4: `gpus: 16` on 8-GPU nodes
        # led with "64 GPUs exceeds team vision's capability").
        quota = [i for i in quota if i.path != "job.spec.workers"]
    return [*issues, *shape, *quota, *_storage_issues(spec, view)]


def _shape_issues(spec: JobSpec, view: PlatformView, pool: Mapping[str, Any]) -> list[ConfigIssue]:
    """Does one replica fit the pool's nodes (a slice of them, on a sliced pool)?"""
    issues: list[ConfigIssue] = []
    sliced = bool(fractional.slices(pool))
    if sliced:
        issues += fractional.slice_issues(spec, view, pool)
    else:
        try:
            profile(pool).resources_for(spec.workers.gpus)
        except ValueError as err:
            issues.append(ConfigIssue("job.spec.workers.gpus", f"pool {spec.pool}: {err}"))
    if "instanceType" not in pool:
        return issues
    node = catalog()[pool["instanceType"]]
    wanted = spec.workers.gpu_memory
    if not sliced and wanted is not None and memory_bytes(wanted) > node.gpu_memory_gib * 2**30:
        issues.append(
            ConfigIssue(
                "job.spec.workers.gpuMemory",
                f"{wanted} per GPU, but pool {spec.pool}'s {node.gpu_model} GPUs have "
                f"{node.gpu_memory_gib}Gi; choose a larger-GPU pool",
            )
        )
    # Every task's replicas run on the pool's nodes (parameter servers too: one gang, one
    # pool), so a task that no node can hold keeps the whole gang pending forever.
    tasks = [("workers", spec.workers.resources)]
    if spec.parameter_servers is not None:
        tasks.append(("parameterServers", spec.parameter_servers.resources))
    # Against what the kubelet gives pods, not the catalog's size: the EKS AMI reserves CPU
    # and memory for the kubelet and the EFA hugepages leave memory (catalog.allocatable).
    fit = allocatable(node, profile(pool).hugepages_mi_per_node)
    reserved = (
        f"(the EKS AMI's kubelet reserves {fit.reserved_cpu_millis}m CPU and "
        f"{fit.reserved_memory_mi}Mi memory, hugepages and eviction threshold included; "
        "docs/jobs.md, Node allocatable)"
    )
    for task, res in tasks:
        if cpu_millis(res.cpu) > fit.cpu_millis:
            issues.append(
                ConfigIssue(
                    f"job.spec.{task}.cpu",
                    f"{res.cpu} CPUs per replica, but a {node.name} node gives pods at most "
                    f"{fit.cpu_millis}m of its {node.vcpu} vCPUs {reserved}; request at most "
                    f"{fit.cpu_millis}m, less what the node's daemons request",
                )
            )
        if memory_bytes(res.memory) > fit.memory_bytes_at_most:
            issues.append(
                ConfigIssue(
                    f"job.spec.{task}.memory",
                    f"{res.memory} per replica, but a {node.name} node gives pods less than "
                    f"{fit.memory_bytes_at_most // 2**20}Mi of its {node.memory_gib}Gi "
                    f"{reserved}; request at most {fit.memory_bytes_estimate // 2**30}Gi "
                    "(Karpenter's estimate of the memory the kernel leaves)",
                )
            )
    return issues


def _quota_issues(
    spec: JobSpec, view: PlatformView, team: Mapping[str, Any], pool: Mapping[str, Any]
) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    sched = view.scheduling(spec.team)
    allowed_pools = sched.get("pools", [])
    if allowed_pools and spec.pool not in allowed_pools:
        issues.append(
            ConfigIssue(
                "job.spec.pool",
                f"team {spec.team} may not use pool {spec.pool!r}; its pools: "
                f"{', '.join(allowed_pools)}",
            )
        )
    # An elastic job at its maximum: workers above what the team may ever hold would wait
    # for ever, so the range must fit as the fixed gang does.
    most = spec.workers.scale.max
    total = most * spec.workers.gpus
    # On a sliced pool the units are slices, a GPU's worth of them per GPU of quota (the
    # queue's capability names each slice: builders/scheduling.pools_shape).
    piece = fractional.chosen(spec, pool) if fractional.slices(pool) else None
    per_gpu, unit = (1, "GPUs") if piece is None else (piece.per_gpu, f"{piece.profile} slices")
    gpu_capability = int(sched.get("gpus", {}).get("capability", total))
    capability = gpu_capability * per_gpu
    if total > capability:
        at = "max " if spec.workers.scale.elastic else ""
        fix = (
            "the workers above it could never start: set max to at most "
            f"{capability // spec.workers.gpus}"
            if spec.workers.scale.elastic
            else f"the gang could never start: ask for at most {capability}"
        )
        of = "" if piece is None else f" ({gpu_capability} GPUs x {per_gpu} per GPU)"
        issues.append(
            ConfigIssue(
                "job.spec.workers",
                f"{at}{most} x {spec.workers.gpus} = {total} {unit} exceeds team "
                f"{spec.team}'s capability of {capability} {unit}{of} (quota deserved + "
                f"borrowLimit of {spec.team} in the platform stack's registry); {fix}, or ask "
                "the platform team to raise the quota",
            )
        )
    per_node = int(pool["gpusPerNode"]) * per_gpu
    nodes_needed = -(-total // per_node)
    if nodes_needed > int(pool["maxNodes"]):
        fits = int(pool["maxNodes"]) * per_node // spec.workers.gpus
        fix = f"; set max to at most {fits}" if spec.workers.scale.elastic else ""
        issues.append(
            ConfigIssue(
                "job.spec.workers",
                f"{total} {unit} need {nodes_needed} nodes but pool {spec.pool} has at most "
                f"{pool['maxNodes']}{fix}",
            )
        )
    allowed = team.get("priorityClasses", [])
    if allowed and spec.priority not in allowed:
        issues.append(
            ConfigIssue(
                "job.spec.priority",
                f"team {spec.team} may use {', '.join(allowed)}, not {spec.priority!r}",
            )
        )
    max_hours = float(team.get("maxJobHours", spec.max_duration_hours))
    if spec.max_duration_hours > max_hours:
        issues.append(
            ConfigIssue(
                "job.spec.maxDurationHours",
                f"{spec.max_duration_hours:g} hours exceeds team {spec.team}'s maximum of "
                f"{max_hours:g} (maxJobHours of {spec.team} in the platform stack's registry, "
                "default 168); set at most "
                f"{max_hours:g}, or ask the platform team to raise it",
            )
        )
    if spec.command[0].rsplit("/", 1)[-1] not in PYTHONS:
        issues.append(
            ConfigIssue(
                "job.spec.command",
                f"{spec.command[0]!r}: the runtime supervises Python training; start with "
                "python (e.g. [python, -m, train.main])",
            )
        )
    return issues


def _storage_issues(spec: JobSpec, view: PlatformView) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    storage = view.storage(spec.team)
    if "checkpointClaim" not in storage:
        issues.append(
            ConfigIssue(
                "job.spec.checkpoint",
                "the platform gives this team no checkpoint volume (storage.lustre or "
                "existingLustre); ask the platform team to add one",
            )
        )
    if spec.data is not None and spec.data.source == "lustre" and "datasetClaim" not in storage:
        issues.append(
            ConfigIssue(
                "job.spec.data.source",
                "the platform has no dataset file system (storage.lustre); use source: cache",
            )
        )
    if spec.data is None or spec.data.source != "cache":
        return issues
    if "cacheDriver" not in storage:
        issues.append(
            ConfigIssue(
                "job.spec.data.source",
                "the platform has no NVMe cache (storage.nvmeCache); use lustre",
            )
        )
        return issues
    pool = view.pool(spec.pool)
    if pool is not None and pool.get("datasetCache") is False:
        cached = [name for name in view.pool_names() if (view.pool(name) or {}).get("datasetCache")]
        issues.append(
            ConfigIssue(
                "job.spec.data.source",
                f"pool {spec.pool} has no dataset cache (no instance-store array on its "
                f"nodes); use source: lustre, or a pool with one: {', '.join(cached) or 'none'}",
            )
        )
        return issues
    if spec.data.cache_from is None and view.dataset_repository() is None:
        issues.append(
            ConfigIssue(
                "job.spec.data.cacheFrom",
                "required: the platform has no dataset repository to copy from",
            )
        )
        return issues
    # The node's cache agent fetches with its own credentials, only from these prefixes.
    # Component by component on a normalised path, as the agent checks (builders/cache.py).
    source, allowed = cache_source(spec, view), view.cache_sources()
    refused = cache_source_issue(source, allowed)
    if refused is not None:
        issues.append(ConfigIssue("job.spec.data.cacheFrom", refused))
    return issues


def check(spec: JobSpec, view: PlatformView, stack_team: str | None = None) -> None:
    issues = platform_issues(spec, view, stack_team)
    if issues:
        raise ConfigError(spec.source, issues)
