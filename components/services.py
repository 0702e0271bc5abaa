"""What every platform installs on its cluster: system namespace, registry, team namespaces."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from trainstack.builders import platform as b
from trainstack.components.kube import apply_manifest
from trainstack.config.model import PlatformConfig


@dataclass(frozen=True)
class PlatformServicesArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource


class PlatformServices(pulumi.ComponentResource):
    """Cluster-side foundation; later capabilities (Volcano, monitoring) add to it."""

    team_namespaces: dict[str, str]
    # Depend on these, not on the whole component: a dependency on a component means one
    # on every child, which grows with the number of teams for every dependent resource.
    system_namespace: pulumi.Resource
    namespace_resources: dict[str, pulumi.Resource]
    storage_classes: list[str]

    def __init__(
        self, name: str, args: PlatformServicesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:k8s:PlatformServices", name, None, opts)
        cfg = args.config
        child = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)
        system_ns = apply_manifest(f"{name}-system-ns", b.system_namespace(cfg), child)
        self.system_namespace = system_ns
        self.namespace_resources = {}
        in_system_ns = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[system_ns])
        )
        apply_manifest(f"{name}-registry", b.platform_configmap(cfg), in_system_ns)
        self.team_namespaces = {}
        for team in cfg.registry.teams:
            self.namespace_resources[team.name] = apply_manifest(
                f"{name}-ns-{team.name}", b.team_namespace(cfg, team), child
            )
            self.team_namespaces[team.name] = team.namespace
        self.storage_classes = []
        if cfg.cloud == "aws":
            storage_class = b.gp3_storage_class(cfg)
            apply_manifest(f"{name}-gp3", storage_class, child)
            self.storage_classes.append(storage_class["metadata"]["name"])
        self.register_outputs(
            {"teamNamespaces": self.team_namespaces, "storageClasses": self.storage_classes}
        )
