"""Monitoring: kube-prometheus-stack, dcgm-exporter, scrape objects, rules and dashboards."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from trainstack.builders import dashboards as d
from trainstack.builders import monitoring as b
from trainstack.components.kube import addon_release, apply_manifest
from trainstack.config.model import PlatformConfig


@dataclass(frozen=True)
class MonitoringArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource
    # Team namespaces (PodMonitors) and Volcano (its namespace) must exist first.
    depends_on: list[pulumi.Resource]


class Monitoring(pulumi.ComponentResource):
    """Prometheus with Alertmanager on, GPU and training alerts, per-team GPU accounting."""

    def __init__(
        self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:k8s:Monitoring", name, None, opts)
        cfg = self._config = args.config
        child = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)
        ns = apply_manifest(f"{name}-ns", b.monitoring_namespace(cfg), child)
        in_ns = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[ns]))
        stack = self._release(name, "kube-prometheus-stack", b.kps_values(cfg), in_ns)
        if b.dcgm_enabled_here(cfg):
            counters = apply_manifest(f"{name}-dcgm-counters", b.dcgm_configmap(cfg), in_ns)
            self._release(
                name,
                "dcgm-exporter",
                b.dcgm_values(cfg),
                pulumi.ResourceOptions.merge(in_ns, pulumi.ResourceOptions(depends_on=[counters])),
            )
        # Monitors and rules are CRs: their CRDs arrive with kube-prometheus-stack.
        after = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[stack, *args.depends_on])
        )
        for manifest in b.service_monitors(cfg):
            apply_manifest(f"{name}-sm-{manifest['metadata']['name']}", manifest, after)
        for manifest in b.pod_monitors(cfg):
            meta = manifest["metadata"]
            apply_manifest(f"{name}-pm-{meta['namespace']}-{meta['name']}", manifest, after)
        for manifest in b.prometheus_rules(cfg):
            apply_manifest(f"{name}-rules-{manifest['metadata']['name']}", manifest, after)
        for manifest in d.dashboard_configmaps(cfg):
            apply_manifest(f"{name}-dashboard-{manifest['metadata']['name']}", manifest, in_ns)
        self.register_outputs({})

    def _release(
        self, name: str, key: str, values: dict[str, object], opts: pulumi.ResourceOptions
    ) -> pulumi.Resource:
        return addon_release(f"{name}-{key}", key, self._config, values=values, opts=opts)
