"""The maximum-duration enforcer: its Deployment, ServiceAccount, RBAC and state ConfigMap."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from trainstack.builders import deadlines as b
from trainstack.components.kube import apply_manifest
from trainstack.config.model import PlatformConfig


@dataclass(frozen=True)
class DeadlineEnforcerArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource
    system_namespace: pulumi.Resource
    namespaces: dict[str, pulumi.Resource]  # team name -> its Namespace


class DeadlineEnforcer(pulumi.ComponentResource):
    """Stops Volcano Jobs of team namespaces that run past their maximum duration
    (docs/deadlines.md)."""

    def __init__(
        self, name: str, args: DeadlineEnforcerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:k8s:DeadlineEnforcer", name, None, opts)
        cfg = args.config
        child = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)
        in_system = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[args.system_namespace])
        )
        account = apply_manifest(f"{name}-sa", b.service_account(cfg), in_system)
        role = apply_manifest(f"{name}-role", b.cluster_role(cfg), child)
        bindings: list[pulumi.Resource] = []
        for team in cfg.registry.teams:
            bindings.append(
                apply_manifest(
                    f"{name}-binding-{team.name}",
                    b.team_binding(cfg, team.namespace),
                    pulumi.ResourceOptions.merge(
                        child,
                        pulumi.ResourceOptions(depends_on=[args.namespaces[team.name], role]),
                    ),
                )
            )
        state_role, state_binding = b.state_role(cfg)
        bindings.append(apply_manifest(f"{name}-state-role", state_role, in_system))
        bindings.append(apply_manifest(f"{name}-state-binding", state_binding, in_system))
        state = apply_manifest(f"{name}-state", b.state_configmap(cfg), in_system)
        apply_manifest(f"{name}-netpol", b.network_policy(cfg), in_system)
        # Started only once it may do its job: a pass before its RBAC fails and is retried.
        apply_manifest(
            f"{name}-deployment",
            b.deployment(cfg),
            pulumi.ResourceOptions.merge(
                in_system, pulumi.ResourceOptions(depends_on=[account, state, *bindings])
            ),
        )
        self.register_outputs({})
