"""A team's fences in its namespace: quota, defaults, RBAC and network policy."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from trainstack.builders import labels
from trainstack.builders.monitoring.common import DCGM_PORT
from trainstack.builders.monitoring.values import dcgm_enabled_here
from trainstack.config.model import PlatformConfig, Team
from trainstack.config.monitoring import MONITORING_NAMESPACE
from trainstack.contracts.runtime import HEALTH_PORT_DEFAULT

MEMBER_ROLE = "trainstack-team-member"
METRICS_PORT = HEALTH_PORT_DEFAULT  # Prometheus scrapes the runtime here


def team_group(team: Team) -> str:
    """The Kubernetes group a team's people act as (EKS access entries or the IdP)."""
    return f"trainstack:team:{team.name}"


def _meta(cfg: PlatformConfig, team: Team, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": team.namespace,
        "labels": {**labels.base_labels(cfg.stack), labels.TEAM: team.name},
    }


def resource_quota(cfg: PlatformConfig, team: Team) -> dict[str, Any]:
    """Fences that cannot deadlock a gang: no compute dimension.

    GPUs, fabric devices, CPU and memory are fenced by the team's Volcano queue (its
    capability) and, since pods reach a team namespace only through Volcano Jobs (the member
    Role), by the `volcano-scheduled` rule keeping those pods on Volcano. A quota on them would
    count pending pods: without the `enqueue` action Volcano creates every pod of each job it
    admits, so two jobs that together exceed the quota each hold a partial gang for ever
    (volcano#1387, volcano#4492; issue 15 #6, shown in tests/e2e/test_scheduling.py).
    What stays: no Service of a team may open the namespace to the outside.
    """
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta(cfg, team, "team-quota"),
        "spec": {"hard": {"services.loadbalancers": "0", "services.nodeports": "0"}},
    }


def limit_range(cfg: PlatformConfig, team: Team) -> dict[str, Any]:
    cpu_ratio = cfg.policy.max_cpu_limit_request_ratio
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": _meta(cfg, team, "team-defaults"),
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "defaultRequest": {"cpu": "1", "memory": "2Gi"},
                    # Defaults within the ratios, so a container left to them is admitted.
                    "default": {"cpu": f"{min(2.0, cpu_ratio):g}", "memory": "2Gi"},
                    # The policy's own ratios (request-limit-ratio): with others, the
                    # LimitRanger would refuse pods of a job the rules accepted (issue 19 #3).
                    "maxLimitRequestRatio": {
                        "cpu": f"{cpu_ratio:g}",
                        "memory": f"{cfg.policy.max_memory_limit_request_ratio:g}",
                    },
                }
            ]
        },
    }


def member_role(cfg: PlatformConfig, team: Team) -> dict[str, Any]:
    read = ["get", "list", "watch"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(cfg, team, MEMBER_ROLE),
        "rules": [
            {
                "apiGroups": ["batch.volcano.sh"],
                "resources": ["jobs"],
                "verbs": [*read, "create", "update", "patch", "delete"],
            },
            {
                "apiGroups": ["bus.volcano.sh"],
                "resources": ["commands"],
                "verbs": [*read, "create"],
            },
            {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"], "verbs": read},
            {
                "apiGroups": [""],
                "resources": ["pods", "pods/log", "events", "services"],
                "verbs": read,
            },
            {
                "apiGroups": [""],
                "resources": ["pods/exec", "pods/portforward"],
                "verbs": ["create"],
            },
            {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": read},
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": [*read, "create", "update", "patch", "delete"],
            },
        ],
    }


def member_binding(cfg: PlatformConfig, team: Team) -> dict[str, Any]:
    groups = [team_group(team), *team.groups]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(cfg, team, MEMBER_ROLE),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": MEMBER_ROLE},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups
        ],
    }


def network_policies(cfg: PlatformConfig, team: Team) -> list[dict[str, Any]]:
    """Deny by default; allow what distributed training needs.

    EFA and RDMA traffic bypasses the kernel and is not subject to NetworkPolicy; NCCL's
    TCP bootstrap and gloo run between pods of the namespace.
    """
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(cfg, team, "default-deny"),
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }
    same_namespace: list[dict[str, Any]] = [{"podSelector": {}}]
    allow = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(cfg, team, "allow-training"),
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": same_namespace},  # intra-job: rendezvous, NCCL bootstrap, gloo
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}
                            }
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
                },
            ],
            "egress": [
                {"to": same_namespace},
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            }
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
                {
                    # S3, STS, registries. Not the Lustre ports (issue 37): the kernel's Lustre
                    # client mounts from the node, never from a pod, and a pod that reached
                    # the servers could speak LNet from user space and claim any uid
                    # (lustre-release v2_15_0 lnet/lnet/acceptor.c accepts privileged source
                    # ports, which NET_BIND_SERVICE and the safe sysctl
                    # net.ipv4.ip_unprivileged_port_start give a pod).
                    "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                    "ports": [{"protocol": "TCP", "port": 443}],
                },
                *_gpu_evidence_egress(cfg),
                *_object_store_egress(cfg),
            ],
        },
    }
    return [deny, allow]


def _gpu_evidence_egress(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The runtime reads its node's dcgm-exporter (host network, port 9400) for hardware
    evidence. A NetworkPolicy cannot name "this pod's node".

    On EKS no rule is needed, and one would be too wide: the VPC CNI's network policy agent
    allows all traffic between a pod and its own node's IP whatever the policies say
    (aws/aws-network-policy-agent#65, "Ignore policy restrictions against Node IP", for
    aws-network-policy-agent#56; still so in strict mode, #635), while a rule for the VPC's
    CIDR let a team's pods read every node's exporter, other teams' GPUs included (also check
    of issue 39). On an existing cluster the CNI is not known, so the rule names any address.
    """
    if not dcgm_enabled_here(cfg) or cfg.cloud == "aws":
        return []
    return [
        {
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
            "ports": [{"protocol": "TCP", "port": DCGM_PORT}],
        }
    ]


def object_store_port(endpoint: str) -> int:
    """The TCP port of an object store's URL (the scheme's default when it names none)."""
    parts = urlsplit(endpoint)
    return parts.port or (443 if parts.scheme == "https" else 80)


def _object_store_egress(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Jobs copy checkpoints and hand-offs to the existing cluster's object store: its port,
    unless it is HTTPS's, which the rule above allows already (MinIO listens on 9000)."""
    store = cfg.storage.object_store
    if store is None or object_store_port(store.endpoint) == 443:
        return []
    return [
        {
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
            "ports": [{"protocol": "TCP", "port": object_store_port(store.endpoint)}],
        }
    ]


def team_manifests(cfg: PlatformConfig, team: Team) -> list[dict[str, Any]]:
    return [
        resource_quota(cfg, team),
        limit_range(cfg, team),
        member_role(cfg, team),
        member_binding(cfg, team),
        *network_policies(cfg, team),
    ]
