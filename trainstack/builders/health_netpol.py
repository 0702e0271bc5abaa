"""The health gate's NetworkPolicies (issue 42, docs/health.md): what the node agent and the
repair controller may reach, by the repair mode (builders/netpol.py has the shared rules)."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from trainstack.builders import netpol
from trainstack.builders.monitoring.health import AGENT_APP, REPAIR_APP
from trainstack.config.health import PLATFORM_PROMETHEUS_URL
from trainstack.config.model import PlatformConfig
from trainstack.config.monitoring import MONITORING_NAMESPACE
from trainstack.contracts import health as contract


def agent_network_policy(cfg: PlatformConfig) -> dict[str, Any]:
    """Prometheus scrapes it; it calls only the API server (DNS too: deadlines.network_policy
    says why). The intra-node all-reduce stays inside the pod."""
    return netpol.network_policy(
        cfg,
        AGENT_APP,
        ingress=[netpol.monitoring_ingress(contract.METRICS_PORT)],
        egress=[netpol.dns_egress(), netpol.api_server_egress(cfg)],
    )


def repair_network_policy(cfg: PlatformConfig) -> dict[str, Any]:
    """Prometheus scrapes it; it calls the API server, asks Prometheus for straggler alerts
    and, by mode, EC2 Auto Scaling (and the Pod Identity agent's credentials endpoint, on the
    node's link-local address) or the hook: HTTPS anywhere, as addresses of AWS endpoints and
    hooks are not known in advance."""
    egress = [netpol.dns_egress(), netpol.api_server_egress(cfg)]
    if cfg.health.repair.prometheus_url is not None:
        egress.append(prometheus_egress(cfg.health.repair.prometheus_url))
    if cfg.health.repair.mode in ("replace", "hook"):
        egress.append(netpol.https_egress())
    if cfg.health.repair.mode == "replace":
        egress.append(POD_IDENTITY_EGRESS)
    return netpol.network_policy(
        cfg,
        REPAIR_APP,
        ingress=[netpol.monitoring_ingress(contract.METRICS_PORT)],
        egress=egress,
    )


def prometheus_egress(url: str) -> dict[str, Any]:
    """To the platform's own Prometheus: its namespace on its port; to another one: its port,
    anywhere (its address is not known when the plan is made)."""
    if url == PLATFORM_PROMETHEUS_URL:
        peer: dict[str, Any] = {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}
            }
        }
    else:
        peer = {"ipBlock": {"cidr": netpol.ANYWHERE}}
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"to": [peer], "ports": [{"protocol": "TCP", "port": port}]}


# The EKS Pod Identity agent serves credentials on the node's link-local 169.254.170.23 (EKS
# user guide, "Set up the Amazon EKS Pod Identity Agent", Considerations), over plain HTTP:
# EKS injects AWS_CONTAINER_CREDENTIALS_FULL_URI=http://169.254.170.23/v1/credentials, which
# the SDKs read (EKS user guide, "Understand how EKS Pod Identity works").
POD_IDENTITY_EGRESS: Final = {
    "to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}],
    "ports": [{"protocol": "TCP", "port": 80}],
}
