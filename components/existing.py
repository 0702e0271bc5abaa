"""An existing Kubernetes cluster, reached through a kubeconfig context. Nothing on AWS."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from trainstack.config.model import ExistingCluster as ExistingClusterSettings


class ExistingCluster(pulumi.ComponentResource):
    """Binds the platform to a cluster someone else runs (on-prem, another cloud)."""

    k8s_provider: k8s.Provider

    def __init__(
        self,
        name: str,
        args: ExistingClusterSettings,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("trainstack:k8s:ExistingCluster", name, None, opts)
        # kubeconfig None: the provider falls back to $KUBECONFIG / ~/.kube/config.
        self.k8s_provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=args.kubeconfig,
            context=args.context,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"context": args.context})
