"""NetworkPolicies for the platform's own pods in the system namespace (issue 37).

Each selects one workload's pods by `app.kubernetes.io/name`, never the whole namespace:
upstream charts run there too (device plugins, the network operator), and what they need is
theirs to say. A selected pod may then reach, and be reached by, only what its workload's
policy lists; traffic between a pod and its own node is always allowed (Kubernetes docs,
Network Policies), which is what the kubelet's probes need.

The peers are the ones the team policies use (builders/teams.py): cluster DNS in kube-system,
Prometheus in the monitoring namespace (config/monitoring.py MONITORING_NAMESPACE).
"""

from __future__ import annotations

from typing import Any, Final

from trainstack.builders import labels
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig
from trainstack.config.monitoring import MONITORING_NAMESPACE

ANYWHERE: Final = "0.0.0.0/0"
HTTPS: Final = 443
# Where a pod reaches the API server: the `kubernetes` Service's port (443), which the
# in-cluster config dials (KUBERNETES_SERVICE_HOST/PORT). Whether a CNI matches egress before
# or after the Service's address translation is not defined (Kubernetes docs, Network
# Policies, ipBlock), so the rule also admits the API servers' own port behind it: 443 on EKS,
# 6443 (kubeadm's default --secure-port) on a cluster trainstack does not create. Neither
# address is known when the plan is made, so the rule names ports, not addresses.
API_SERVER_PORTS: Final = {"aws": (HTTPS,), "existing": (HTTPS, 6443)}


def _namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def dns_egress() -> dict[str, Any]:
    """Cluster DNS, as the team policies allow it."""
    return {
        "to": [_namespace("kube-system")],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }


def https_egress() -> dict[str, Any]:
    """HTTPS anywhere: S3 and STS, whose addresses are not known in advance."""
    return {"to": [{"ipBlock": {"cidr": ANYWHERE}}], "ports": _tcp(HTTPS)}


def api_server_egress(cfg: PlatformConfig) -> dict[str, Any]:
    """The Kubernetes API server (API_SERVER_PORTS)."""
    return {"to": [{"ipBlock": {"cidr": ANYWHERE}}], "ports": _tcp(*API_SERVER_PORTS[cfg.cloud])}


def monitoring_ingress(port: int) -> dict[str, Any]:
    """Prometheus scraping `port`."""
    return {"from": [_namespace(MONITORING_NAMESPACE)], "ports": _tcp(port)}


def network_policy(
    cfg: PlatformConfig,
    app: str,
    *,
    ingress: list[dict[str, Any]],
    egress: list[dict[str, Any]],
) -> dict[str, Any]:
    """The policy of the system namespace's pods labelled `app.kubernetes.io/name: <app>`,
    named after it. Both directions are isolated: no rules for one allows nothing that way
    (an empty list is left out, as the API server would)."""
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": {labels.APP_NAME: app}},
        "policyTypes": ["Ingress", "Egress"],
    }
    if ingress:
        spec["ingress"] = ingress
    if egress:
        spec["egress"] = egress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": labels.app_metadata(cfg.stack, app, app, SYSTEM_NAMESPACE),
        "spec": spec,
    }
