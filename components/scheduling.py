"""Volcano: the chart, priority classes, queues from the registry, HyperNodes, and the
admission policies on Volcano objects (queue ownership, Commands)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from trainstack.builders import admission, labels
from trainstack.builders import scheduling as b
from trainstack.builders.addons import pre_installed
from trainstack.builders.platform import namespace
from trainstack.components.kube import addon_release, apply_manifest
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
        # A pre-installed Volcano's namespace is its owners' (it exists; creating it would
        # fail), so the platform creates the namespace only for the release it installs.
        ns = (
            []
            if pre_installed(cfg, "volcano")
            else [
                apply_manifest(
                    f"{name}-ns",
                    namespace(
                        b.VOLCANO_NAMESPACE,
                        {**labels.base_labels(cfg.stack), labels.ROLE: "system"},
                    ),
                    child,
                )
            ]
        )
        # Volcano's CRDs are templates of this release (chart v1.15.1 has no crds/ folder), so
        # `helm uninstall`, which deleting or replacing the Release runs, deletes them and with
        # them every Volcano Job, Queue and PodGroup. Pulumi never uninstalls it
        # (retain_on_delete); production refuses to delete or replace it (protect).
        # docs/scheduling.md, "Upgrading and removing Volcano".
        keep = pulumi.ResourceOptions(
            depends_on=ns, retain_on_delete=True, protect=cfg.environment == "production"
        )
        release = addon_release(
            f"{name}-chart",
            "volcano",
            cfg,
            values=b.volcano_values(cfg),
            opts=pulumi.ResourceOptions.merge(child, keep),
        )
        for manifest in b.priority_classes(cfg):
            apply_manifest(f"{name}-priority-{manifest['metadata']['name']}", manifest, child)
        # Queues and HyperNodes are CRs: their CRDs arrive with the chart (or, pre-installed,
        # are read and checked first).
        after_chart = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[release])
        )
        # A child after its parent: Volcano's webhook refuses a queue whose parent it cannot
        # find ("failed to get parent queue", validate_queue.go validateHierarchicalQueue).
        # That holds for `pulumi preview` too: with server-side apply the provider dry-runs
        # each create against the API server, webhooks included, unless an input is still
        # unknown (pulumi-kubernetes provider/pkg/provider/provider.go Create, `skipPreview :=
        # hasComputedValue(newInputs) || ...`). So a child's spec.parent is taken from its
        # parent's id: unknown while the parent is itself only previewed, the same name once
        # it exists. A plain string made the first preview of every hierarchy fail.
        created: dict[str, pulumi.CustomResource] = {}
        for queue in b.queues(cfg):
            parent_name = queue["spec"].get("parent", "")
            parent = created.get(parent_name)
            queue_name = queue["metadata"]["name"]
            opts = after_chart
            if parent is not None:
                opts = pulumi.ResourceOptions.merge(
                    after_chart, pulumi.ResourceOptions(depends_on=[parent])
                )
                spec = {**queue["spec"], "parent": _named(parent.id, parent_name)}
                queue = {**queue, "spec": spec}  # noqa: PLW2901 (the same queue, linked)
            created[queue_name] = apply_manifest(f"{name}-queue-{queue_name}", queue, opts)
        if cfg.scheduling.topology_aware:
            for manifest in b.hypernodes(cfg):
                apply_manifest(
                    f"{name}-hypernode-{manifest['metadata']['name']}", manifest, after_chart
                )
        for role, policy in (
            ("queue-ownership", admission.queue_ownership_policy(cfg)),
            ("job-commands", admission.command_policy(cfg)),
        ):
            for manifest in policy:
                kind = "binding" if manifest["kind"].endswith("Binding") else "policy"
                apply_manifest(f"{name}-{role}-{kind}", manifest, after_chart)
        self.register_outputs({})


def _named(known_when: pulumi.Output[str], name: str) -> pulumi.Output[str]:
    """`name`, known only once `known_when` is (see the queues in Volcano)."""
    return known_when.apply(lambda _: name)
