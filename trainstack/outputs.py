"""Stack outputs: the contract between the platform stack and team stacks.

Team stacks read these through a StackReference; `trainstack preview` feeds the same
names from the offline platform preview. Renaming one is a breaking change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final

CLOUD: Final = "cloud"
ENVIRONMENT: Final = "environment"
CLUSTER_NAME: Final = "clusterName"
KUBERNETES_VERSION: Final = "kubernetesVersion"
KUBECONFIG: Final = "kubeconfig"  # secret; aws only
KUBE_CONTEXT: Final = "kubeContext"  # existing clusters only
ENDPOINT: Final = "endpoint"
OIDC_PROVIDER_ARN: Final = "oidcProviderArn"
OIDC_ISSUER_URL: Final = "oidcIssuerUrl"
REGION: Final = "region"
VPC_ID: Final = "vpcId"
PRIVATE_SUBNET_IDS: Final = "privateSubnetIds"
STORAGE_CLASSES: Final = "storageClasses"
TEAM_NAMESPACES: Final = "teamNamespaces"
REGISTRY: Final = "registry"
GPU_POOLS: Final = "gpuPools"
SCHEDULING: Final = "scheduling"
MONITORING: Final = "monitoring"
STORAGE: Final = "storage"

# One output per team, `team/<name>`: the team's registry entry with its scheduling and
# storage, as a JSON string. A StackReference deserialises every output of the platform, so
# per-team data kept in shared maps made each team stack's read grow with the organisation
# (quadratic over all team stacks); a string per team costs almost nothing to pass over and
# a team stack decodes only its own.
TEAM_PREFIX: Final = "team/"

# Team stack outputs.
TEAM: Final = "team"
NAMESPACE: Final = "namespace"
PLATFORM_STACK: Final = "platformStack"
JOBS: Final = "jobs"  # names of the team's training jobs
# The team's limits as its platform sets them (`team_limits`): what the preview sums the
# team's jobs against (issue 41), and `pulumi stack output limits` shows a team.
LIMITS: Final = "limits"

SECRET_OUTPUTS: Final = frozenset({KUBECONFIG})

# Each platform output: (description, present for aws, present for existing).
PLATFORM_OUTPUTS: Final[dict[str, tuple[str, bool, bool]]] = {
    CLOUD: ("aws or existing", True, True),
    ENVIRONMENT: ("development or production", True, True),
    CLUSTER_NAME: ("EKS cluster name (or the configured name of an existing cluster)", True, True),
    KUBERNETES_VERSION: ("Kubernetes minor version, e.g. 1.33", True, True),
    KUBECONFIG: ("kubeconfig JSON using `aws eks get-token` (secret)", True, False),
    KUBE_CONTEXT: ("kubeconfig context of the existing cluster", False, True),
    ENDPOINT: ("API server URL", True, False),
    OIDC_PROVIDER_ARN: ("IAM OIDC provider ARN for IRSA", True, False),
    OIDC_ISSUER_URL: ("OIDC issuer URL", True, False),
    REGION: ("AWS region", True, False),
    VPC_ID: ("VPC id", True, False),
    PRIVATE_SUBNET_IDS: ("private subnet ids (nodes and pods)", True, False),
    STORAGE_CLASSES: ("StorageClass names the platform created", True, True),
    TEAM_NAMESPACES: ("team name -> namespace", True, True),
    REGISTRY: ("the registry's groups and their owners (teams: `team/<name>`)", True, True),
    STORAGE: ("the dataset repository and the NVMe cache class (teams: `team/<name>`)", True, True),
    SCHEDULING: ("queue mode, priority classes and the capacity summary", True, True),
    f"{TEAM_PREFIX}<name>": (
        "one per team, a JSON string: registry entry (group, namespace, owners, quota, "
        "maxJobHours, priorityClasses), `scheduling` (queue, pools, priority class names, "
        "GPUs, derived quota) and `storage` (claims, sub-paths, mount paths, service account, "
        "checkpoint directory owner, S3 checkpoint URI, cache class)",
        True,
        True,
    ),
    GPU_POOLS: (
        "GPU pools: shape, node selector, taint and fabric profile (devices, NCCL env)",
        True,
        True,
    ),
    MONITORING: (
        "monitoring namespace, chart versions, alert names, receivers, job annotations",
        True,
        True,
    ),
}


def team_output(team: str) -> str:
    """The output name of one team's slice."""
    return f"{TEAM_PREFIX}{team}"


def forget_decoded() -> None:
    """Drop the team slices decoded so far (benchmarks that preview as a new process would)."""
    _decode.cache_clear()


@lru_cache(maxsize=4096)
def _decode(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(text)
    return doc


def team_slice(outputs: Mapping[str, Any], team: str) -> Mapping[str, Any] | None:
    """One team's slice of platform outputs, decoded; None if the platform has no such team.

    Decoded slices are cached by their text and shared: treat them as read-only.
    """
    text = outputs.get(team_output(team))
    return _decode(text) if isinstance(text, str) else None


def team_slices(outputs: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Every team's slice by team name (for reports over whole plans)."""
    return {
        key.removeprefix(TEAM_PREFIX): _decode(value)
        for key, value in outputs.items()
        if key.startswith(TEAM_PREFIX) and isinstance(value, str)
    }


def team_limits(team: Mapping[str, Any]) -> dict[str, Any]:
    """A team stack's `limits` output from its slice of the platform's outputs: its queue's
    GPUs (guarantee, deserved, capability) and the longest maximum duration its jobs may set."""
    gpus = (team.get("scheduling") or {}).get("gpus") or {}
    return {
        "gpus": {k: gpus[k] for k in ("guarantee", "deserved", "capability") if k in gpus},
        "maxJobHours": team.get("maxJobHours"),
    }
