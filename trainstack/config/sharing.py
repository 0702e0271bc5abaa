"""Cross-field rules for fractional GPUs (gpuPools[].gpuSharing), part of the one loader pass.

What the GPU operator's MIG manager and the device plugin would only refuse on the node (a
layout the GPU has not, MIG without the operator) and what would break isolation (a
time-shared GPU in two teams' reach) are refused here, with the field and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainstack.catalog import catalog
from trainstack.config import model as m
from trainstack.config.checks import dict_items
from trainstack.config.errors import ConfigIssue, did_you_mean, join_path
from trainstack.slices import MigGpu, mig_catalog, mig_gpu


def pool_gpu(doc: Mapping[str, Any], pool: Mapping[str, Any]) -> MigGpu | None:
    """The pool's MIG-capable GPU: from its instance type on AWS, its `mig.gpu` elsewhere."""
    if doc.get("cloud") == "aws":
        instance = catalog().get(str(pool.get("instanceType")))
        return None if instance is None else mig_gpu(instance.gpu_model, instance.gpu_memory_gib)
    sharing = pool.get("gpuSharing")
    mig = sharing.get("mig") if isinstance(sharing, Mapping) else None
    name = mig.get("gpu") if isinstance(mig, Mapping) else None
    return mig_catalog().get(name) if isinstance(name, str) else None


def mig_instance_types() -> list[str]:
    return [n for n, t in catalog().items() if mig_gpu(t.gpu_model, t.gpu_memory_gib) is not None]


def sharing_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    pools_path = join_path(root, "gpuPools")
    shared: dict[str, str] = {}  # time-sliced pool name -> its path
    replicas: dict[int, str] = {}  # the first pool with each replica count
    for index, pool in dict_items(doc.get("gpuPools")):
        sharing = pool.get("gpuSharing")
        if not isinstance(sharing, Mapping):
            continue
        path = join_path(pools_path, index, "gpuSharing")
        mig = sharing.get("mig")
        if isinstance(mig, Mapping):
            issues += _mig_issues(doc, pool, mig, join_path(path, "mig"))
        slicing = sharing.get("timeSlicing")
        if isinstance(slicing, Mapping) and isinstance(pool.get("name"), str):
            shared[pool["name"]] = path
            count = slicing.get("replicas")
            if isinstance(count, int) and replicas and count not in replicas:
                first, where = next(iter(replicas.items()))
                issues.append(
                    ConfigIssue(
                        join_path(path, "timeSlicing", "replicas"),
                        f"{count}, but pool {where} shares its GPUs {first} ways: every "
                        "time-shared GPU is the one resource nvidia.com/gpu.shared, which "
                        "queues and GPU-hours can weigh one way only; use "
                        f"replicas: {first}",
                    )
                )
            if isinstance(count, int):
                replicas.setdefault(count, pool["name"])
    issues += _one_team(doc, shared)
    return issues


def _mig_issues(
    doc: Mapping[str, Any], pool: Mapping[str, Any], mig: Mapping[str, Any], path: str
) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    gpu_settings = doc.get("gpu")
    plugin = (
        gpu_settings.get("devicePlugin", "nvidia-device-plugin")
        if isinstance(gpu_settings, Mapping)
        else "nvidia-device-plugin"
    )
    if plugin != "gpu-operator":
        issues.append(
            ConfigIssue(
                path,
                "MIG layouts are made on the nodes by the GPU operator's MIG manager; set "
                "gpu.devicePlugin: gpu-operator (the nvidia-device-plugin chart advertises "
                "MIG instances but cannot create them)",
            )
        )
    known = mig_catalog()
    if doc.get("cloud") == "aws":
        if "gpu" in mig:
            issues.append(
                ConfigIssue(
                    join_path(path, "gpu"),
                    "not used with cloud: aws (the instance type names the GPU); remove it",
                )
            )
        itype = pool.get("instanceType")
        if isinstance(itype, str) and itype in catalog() and pool_gpu(doc, pool) is None:
            instance = catalog()[itype]
            issues.append(
                ConfigIssue(
                    path,
                    f"{itype}'s {instance.gpu_model} GPUs have no MIG; use timeSlicing, or a "
                    f"MIG-capable type: {', '.join(mig_instance_types())}",
                )
            )
    elif "gpu" not in mig:
        issues.append(
            ConfigIssue(
                join_path(path, "gpu"),
                f"required on existing nodes: the pool's GPU, one of {', '.join(known)}",
            )
        )
    elif mig["gpu"] not in known:
        issues.append(
            ConfigIssue(
                join_path(path, "gpu"),
                f"no MIG profiles for {mig['gpu']!r}{did_you_mean(str(mig['gpu']), known)}; "
                f"known: {', '.join(known)}",
            )
        )
    gpu = pool_gpu(doc, pool)
    layout = mig.get("layout")
    if gpu is not None and isinstance(layout, str) and layout not in gpu.layouts():
        layouts = gpu.layouts()
        issues.append(
            ConfigIssue(
                join_path(path, "layout"),
                f"{gpu.name} has no MIG layout {layout!r}{did_you_mean(layout, layouts)}; "
                f"its layouts: {', '.join(layouts)}",
            )
        )
    return issues


def _one_team(doc: Mapping[str, Any], shared: dict[str, str]) -> list[ConfigIssue]:
    """A time-shared GPU shares memory and faults between its processes (device plugin
    v0.18.2 README, "With CUDA Time-Slicing"), so only one team's jobs may reach it: exactly
    one team lists the pool, and every other team lists its pools (no list is every pool)."""
    if not shared:
        return []
    registry = doc.get("registry")
    teams = list(dict_items(registry.get("teams"))) if isinstance(registry, Mapping) else []
    issues = []
    for pool, path in sorted(shared.items()):
        users = [
            str(t.get("name"))
            for _, t in teams
            if not isinstance(t.get("pools"), list) or pool in t["pools"]
        ]
        unlisted = [str(t.get("name")) for _, t in teams if not isinstance(t.get("pools"), list)]
        if len(users) > 1:
            fix = (
                f"; teams without a pools list may use every pool: give {', '.join(unlisted)} one"
                if unlisted
                else ""
            )
            issues.append(
                ConfigIssue(
                    join_path(path, "timeSlicing"),
                    f"time-shared GPUs give no memory or fault isolation, so one team only may "
                    f"use pool {pool}, but {', '.join(users)} may{fix}",
                )
            )
    return issues


def build_sharing(
    doc: Mapping[str, Any], raw: Mapping[str, Any]
) -> m.MigSharing | m.TimeSlicing | None:
    sharing = raw.get("gpuSharing")
    if sharing is None:
        return None
    if "mig" in sharing:
        gpu = pool_gpu(doc, raw)
        assert gpu is not None, "sharing_checks requires a MIG GPU"
        return m.MigSharing(layout=sharing["mig"]["layout"], gpu=gpu.name)
    return m.TimeSlicing(replicas=sharing["timeSlicing"]["replicas"])
