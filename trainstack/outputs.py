"""Stack outputs: the contract between the platform stack and team stacks.

Team stacks read these through a StackReference; `trainstack preview` feeds the same
names from the offline platform preview. Renaming one is a breaking change.
"""

from __future__ import annotations

from typing import Final

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

# Team stack outputs.
TEAM: Final = "team"
NAMESPACE: Final = "namespace"
PLATFORM_STACK: Final = "platformStack"
JOBS: Final = "jobs"  # names of the team's training jobs

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
    REGISTRY: ("the team registry: groups, teams, owners, quotas", True, True),
    STORAGE: (
        "per team: dataset/checkpoint claims, sub-paths, mount paths, service account, "
        "S3 checkpoint URI, NVMe cache class",
        True,
        True,
    ),
    SCHEDULING: (
        "queues per team, priority classes, derived per-team quotas and the capacity summary",
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
