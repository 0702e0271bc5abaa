"""Volcano: the chart, priority classes, queues from the registry, HyperNodes, ownership."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.kube import apply_manifest, helm_release
from trainstack.builders import labels
from trainstack.builders import scheduling as b
from trainstack.builders.platform import namespace
from trainstack.config.model import PlatformConfig


@dataclass(frozen=True)
class VolcanoArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource


class Volcano(pulumi.ComponentResource):
    """Gang scheduling with per-team quotas that the preview has already checked."""

    def __init__(
        self, name: str, args: VolcanoArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:k8s:Volcano", name, None, opts)
        cfg = args.config
        child = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)
        ns = apply_manifest(
            f"{name}-ns",
            namespace(
                b.VOLCANO_NAMESPACE, {**labels.base_labels(cfg.stack), labels.ROLE: "system"}
            ),
            child,
        )
        release = helm_release(
            f"{name}-chart",
            "volcano",
            b.VOLCANO_CHART,
            namespace=b.VOLCANO_NAMESPACE,
            values=b.volcano_values(cfg),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[ns])),
        )
        for manifest in b.priority_classes(cfg):
            apply_manifest(f"{name}-priority-{manifest['metadata']['name']}", manifest, child)
        # Queues and HyperNodes are CRs: their CRDs arrive with the chart.
        after_chart = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[release])
        )
        for manifest in b.queues(cfg):
            apply_manifest(f"{name}-queue-{manifest['metadata']['name']}", manifest, after_chart)
        if cfg.scheduling.topology_aware:
            for manifest in b.hypernodes(cfg):
                apply_manifest(
                    f"{name}-hypernode-{manifest['metadata']['name']}", manifest, after_chart
                )
        for manifest in b.queue_ownership_policy(cfg):
            kind = "binding" if manifest["kind"].endswith("Binding") else "policy"
            apply_manifest(f"{name}-queue-ownership-{kind}", manifest, after_chart)
        self.register_outputs({})
