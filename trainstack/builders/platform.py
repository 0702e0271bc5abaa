"""Kubernetes manifests every platform stack installs, whatever the cloud."""

from __future__ import annotations

import json
from typing import Any

from trainstack import outputs as out
from trainstack.builders import labels
from trainstack.builders.labels import TEAM_PRIORITY_ANNOTATION
from trainstack.builders.scheduling import team_scheduling
from trainstack.builders.storage import team_storage
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig, Team

PLATFORM_CONFIGMAP = "trainstack-platform"
GP3_STORAGE_CLASS = "gp3-encrypted"


def namespace(
    name: str, extra_labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": extra_labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def system_namespace(cfg: PlatformConfig) -> dict[str, Any]:
    return namespace(
        SYSTEM_NAMESPACE,
        {
            **labels.base_labels(cfg.stack),
            labels.ROLE: "system",
            # Platform controllers run privileged DaemonSets (device plugins) here.
            "pod-security.kubernetes.io/enforce": "privileged",
        },
    )


# Pod Security level of team namespaces: `restricted`, which the API server's PodSecurity
# admission applies to every pod created there, the ones Volcano's controller creates from a
# member's Job included (issue 37). The job layer's pods meet it with no exception since the
# root `checkpoint-dir` init container is gone (builders/storage.py TEAM_DIR_MODE); RDMA pods
# add no capability (builders/fabric.py, IPC_LOCK). The rules (`no-privileged`,
# `hardened-pods`) refuse at the Job what the pods would be refused, out of the member's sight.
TEAM_POD_SECURITY = "restricted"


def team_namespace(cfg: PlatformConfig, team: Team) -> dict[str, Any]:
    team_labels = {
        **labels.base_labels(cfg.stack),
        labels.ROLE: "team",
        labels.TEAM: team.name,
        "pod-security.kubernetes.io/enforce": TEAM_POD_SECURITY,
    }
    if team.group:
        team_labels[labels.GROUP] = team.group
    return namespace(
        team.namespace,
        team_labels,
        {
            labels.OWNERS: ",".join(team.owners),
            # Read by the queue-ownership admission policy (builders/scheduling.py).
            TEAM_PRIORITY_ANNOTATION: ",".join(team.priority_classes),
            # Read by the max-duration admission policy (trainstack/policy).
            labels.TEAM_MAX_JOB_HOURS_ANNOTATION: f"{team.max_job_hours:g}",
            # Read by the gpu-placement admission policy: the pools the team may pin.
            labels.TEAM_POOLS_ANNOTATION: ",".join(team.pools),
        },
    )


def registry_entry(team: Team) -> dict[str, Any]:
    """One team as the registry publishes it (in-cluster ConfigMap and `team/<name>`)."""
    return {
        "name": team.name,
        "group": team.group,
        "namespace": team.namespace,
        "owners": list(team.owners),
        "quota": {"gpus": team.quota.gpus},
        "maxJobHours": team.max_job_hours,
        "priorityClasses": list(team.priority_classes),
    }


def registry_groups(cfg: PlatformConfig) -> list[dict[str, Any]]:
    return [{"name": g.name, "owners": list(g.owners)} for g in cfg.registry.groups]


def registry_document(cfg: PlatformConfig) -> dict[str, Any]:
    """The whole team registry, as published to the cluster."""
    return {
        "groups": registry_groups(cfg),
        "teams": [registry_entry(t) for t in cfg.registry.teams],
    }


def team_document(cfg: PlatformConfig, team: Team) -> dict[str, Any]:
    """A team's `team/<name>` slice: what its team stack needs from the platform."""
    return {
        **registry_entry(team),
        "scheduling": team_scheduling(cfg, team),
        "storage": team_storage(cfg, team),
    }


def team_outputs(cfg: PlatformConfig) -> dict[str, str]:
    """`team/<name>` -> the team's slice as compact JSON (see trainstack.outputs)."""
    return {
        out.team_output(t.name): json.dumps(
            team_document(cfg, t), sort_keys=True, separators=(",", ":")
        )
        for t in cfg.registry.teams
    }


def platform_configmap(cfg: PlatformConfig) -> dict[str, Any]:
    """In-cluster discovery: tools and admission policies read the registry from here."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": PLATFORM_CONFIGMAP,
            "namespace": SYSTEM_NAMESPACE,
            "labels": labels.base_labels(cfg.stack),
        },
        "data": {
            "cloud": cfg.cloud,
            "environment": cfg.environment,
            "clusterName": cfg.cluster_name,
            "kubernetesVersion": cfg.kubernetes_version,
            "registry.json": json.dumps(registry_document(cfg), sort_keys=True, indent=2),
        },
    }


def gp3_storage_class(cfg: PlatformConfig) -> dict[str, Any]:
    """Encrypted gp3 as the default class: EKS's built-in gp2 class is unencrypted."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": GP3_STORAGE_CLASS,
            "labels": labels.base_labels(cfg.stack),
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": "ebs.csi.aws.com",
        "parameters": {"type": "gp3", "encrypted": "true", "fsType": "ext4"},
        "reclaimPolicy": "Delete" if cfg.environment == "development" else "Retain",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
    }
