"""Image pre-pull: per GPU pool a DaemonSet holding the pool's images (docs/prepull.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi

from trainstack.builders import prepull as b
from trainstack.components.kube import apply_manifest
from trainstack.config.model import PlatformConfig


@dataclass(frozen=True)
class ImagePrePullArgs:
    config: PlatformConfig
    k8s_provider: pulumi.ProviderResource
    system_namespace: pulumi.Resource
    # pool -> the images of the team stacks' jobs on it (jobs/prepull.py team_job_images)
    team_images: Mapping[str, Sequence[str]] = field(default_factory=dict)


class ImagePrePull(pulumi.ComponentResource):
    """Keeps each GPU pool's training images on every node of the pool."""

    def __init__(
        self, name: str, args: ImagePrePullArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:k8s:ImagePrePull", name, None, opts)
        cfg = args.config
        in_system = pulumi.ResourceOptions(
            parent=self, provider=args.k8s_provider, depends_on=[args.system_namespace]
        )
        images = b.pool_images(cfg, args.team_images)
        # The policy first: a pod that starts before it would have the network for a moment.
        policy = apply_manifest(f"{name}-netpol", b.network_policy(cfg), in_system)
        after_policy = pulumi.ResourceOptions.merge(
            in_system, pulumi.ResourceOptions(depends_on=[policy])
        )
        for pool in b.pools_of(cfg):
            apply_manifest(
                f"{name}-{pool.name}",
                b.daemonset(cfg, pool, images[pool.name]),
                after_policy,
            )
        self.register_outputs({})
