"""The GPU node health gate (issue 42, docs/health.md): the agent's DaemonSet, the repair
controller's Deployment, their identities, RBAC, admission policies and expectations, and on
AWS the repair controller's IAM role through EKS Pod Identity."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from trainstack.builders import health as b
from trainstack.builders import health_netpol as n
from trainstack.builders.health_iam import repair_policy, repair_trust_policy
from trainstack.components.kube import apply_manifest
from trainstack.config.model import PlatformConfig
from trainstack.contracts import health as contract


@dataclass(frozen=True)
class NodeHealthAws:
    """What the repair controller needs on AWS: its role is associated with its
    ServiceAccount in this cluster."""

    provider: pulumi.ProviderResource
    cluster_name: pulumi.Input[str]


@dataclass(frozen=True)
class NodeHealthArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource
    system_namespace: pulumi.Resource
    aws: NodeHealthAws | None = None


def child_name(name: str, manifest: dict[str, Any]) -> str:
    """`<component>-<kind>-<object name>`, with the namespace before the object's name where
    it is not the system namespace: one RoleBinding of a name is made in every team namespace
    (builders/health_access.py), and child names must be unique (they are the URN)."""
    meta = manifest["metadata"]
    namespace = meta.get("namespace")
    where = "" if namespace in (None, contract.SYSTEM_NAMESPACE) else f"{namespace}-"
    return f"{name}-{manifest['kind'].lower()}-{where}{meta['name']}"


class NodeHealth(pulumi.ComponentResource):
    """Only where the gate is on and there are GPU pools (the platform checks before)."""

    def __init__(
        self, name: str, args: NodeHealthArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:k8s:NodeHealth", name, None, opts)
        cfg = args.config
        child = pulumi.ResourceOptions(
            parent=self, provider=args.k8s_provider, depends_on=[args.system_namespace]
        )
        identity: list[pulumi.Resource] = []
        if args.aws is not None and cfg.health.repair.mode == "replace":
            identity = self._repair_identity(name, cfg, args.aws)
        # Admission and RBAC first: the programs must never act before what holds them does.
        access = [apply_manifest(child_name(name, m), m, child) for m in b.access(cfg)]
        expectations = apply_manifest(child_name(name, b.configmap(cfg)), b.configmap(cfg), child)
        for policy in (n.agent_network_policy(cfg), n.repair_network_policy(cfg)):
            apply_manifest(child_name(name, policy), policy, child)
        workload = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[*access, expectations, *identity])
        )
        daemonset = b.agent_daemonset(cfg)
        self.agent = apply_manifest(child_name(name, daemonset), daemonset, workload)
        deployment = b.repair_deployment(cfg)
        self.repair = apply_manifest(child_name(name, deployment), deployment, workload)
        self.register_outputs({})

    def _repair_identity(
        self, name: str, cfg: PlatformConfig, on: NodeHealthAws
    ) -> list[pulumi.Resource]:
        """The repair controller's IAM role (Pod Identity trust), its policy, and the
        association with its ServiceAccount, as the autoscaler's (components/autoscaler.py)."""
        opts = pulumi.ResourceOptions(parent=self, provider=on.provider)
        role = aws.iam.Role(
            f"{name}-repair-role",
            assume_role_policy=json.dumps(repair_trust_policy(), sort_keys=True),
            opts=opts,
        )
        # SetInstanceHealth on the cluster's own Auto Scaling groups only (by EKS's tag),
        # builders/health_iam.py.
        policy = aws.iam.RolePolicy(
            f"{name}-repair-policy",
            role=role.id,
            policy=json.dumps(repair_policy(cfg.cluster_name), sort_keys=True),
            opts=opts,
        )
        made: list[pulumi.Resource] = [role, policy]
        made.append(
            aws.eks.PodIdentityAssociation(
                f"{name}-repair-identity",
                cluster_name=on.cluster_name,
                namespace=contract.SYSTEM_NAMESPACE,
                service_account=contract.REPAIR_SERVICE_ACCOUNT,
                role_arn=role.arn,
                opts=opts,
            )
        )
        return made
