"""Register a Kubernetes manifest (a plain dict) as the matching Pulumi resource."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainstack.builders import addons as a
from trainstack.config.model import PlatformConfig


def resource_token(api_version: str, kind: str) -> str:
    """The pulumi-kubernetes type token: `kubernetes:core/v1:Namespace`,
    `kubernetes:storage.k8s.io/v1:StorageClass`, `kubernetes:batch.volcano.sh/v1alpha1:Job`."""
    group, _, version = api_version.rpartition("/")
    return f"kubernetes:{group or 'core'}/{version}:{kind}"


def apply_manifest(
    resource_name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions
) -> pulumi.CustomResource:
    """The manifest, unchanged, under the kind's pulumi-kubernetes token.

    The provider sees exactly what the typed SDK classes would send (they only translate
    Python names back to these wire names), without paying for that translation on every
    object; what the preview records is exactly what the builder produced.
    """
    assert opts.provider is not None, f"{resource_name}: Kubernetes children need a provider"
    token = resource_token(manifest["apiVersion"], manifest["kind"])
    return pulumi.CustomResource(token, resource_name, dict(manifest), opts)


def addon_release(
    resource_name: str,
    key: str,
    cfg: PlatformConfig,
    *,
    values: Mapping[str, Any],
    opts: pulumi.ResourceOptions,
    namespace: str | None = None,
) -> pulumi.Resource:
    """Add-on `key` (builders/addons.py) from where the stack says it comes from.

    A Helm Release of the pinned chart from its public repository, a mirror or a local chart
    directory; or, for a pre-installed add-on, a PreInstalledAddon that reads and checks what
    is there. Either way, what depends on the add-on (its CRs) depends on what this returns.
    """
    addon = a.ADDONS[key]
    namespace = namespace or addon.namespace
    if a.pre_installed(cfg, key):
        return PreInstalledAddon(
            resource_name,
            PreInstalledAddonArgs(cfg, key),
            # Only where it sits and what it waits for: nothing is installed, so nothing is
            # retained or protected (reads cannot be).
            pulumi.ResourceOptions(
                parent=opts.parent, provider=opts.provider, depends_on=opts.depends_on
            ),
        )
    try:
        chart = a.release_args(cfg, key, Path.cwd())  # the program's directory
    except a.AddonSourceError as err:
        raise pulumi.RunError(f"stack {cfg.stack}: trainstack:platform.{err}") from None
    repository = chart.pop("repository_opts", None)
    return k8s.helm.v3.Release(
        resource_name,
        name=key,
        namespace=namespace,
        values=dict(values),
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(**repository) if repository else None,
        opts=opts,
        **chart,
    )


@dataclass(frozen=True)
class PreInstalledAddonArgs:
    config: PlatformConfig
    key: str


class PreInstalledAddon(pulumi.ComponentResource):
    """An add-on the cluster's owners installed: its CRDs and version objects, read through
    the stack's provider (a read of a missing object fails the preview), each checked by its
    probe; a failed check is an error on this resource that fails preview and up."""

    def __init__(
        self, name: str, args: PreInstalledAddonArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:k8s:PreInstalledAddon", name, None, opts)
        provider = opts.provider if opts else None
        self._stack = args.config.stack
        assert provider is not None, f"{name}: reads of a pre-installed add-on need a provider"
        for probe in a.probes(args.config, args.key):
            # Only the parts this kind has: in a preview the SDK resolves a registered key the
            # read did not return as unknown, and one unknown part would skip the check.
            read = pulumi.CustomResource(
                resource_token(probe.api_version, probe.kind),
                f"{name}-{probe.role}",
                dict.fromkeys(probe.fields),
                pulumi.ResourceOptions(parent=self, provider=provider, id=probe.id),
            )
            parts = [read.__dict__[f] for f in probe.fields]  # the read's outputs
            pulumi.Output.all(*parts).apply(functools.partial(self._check, probe))
        self.register_outputs({})

    def _check(self, probe: a.Probe, values: list[Any]) -> None:
        obj = {k: v for k, v in zip(probe.fields, values, strict=True) if v is not None}
        if not obj:
            # Nothing was read: the offline preview's mocks (trainstack/preview/mocks.py).
            # A real read of a missing object fails in the engine before this runs, and one
            # of an existing object always has its kind and metadata.
            return
        problem = probe.problem(obj)
        if problem is not None:
            # Raised in an apply, it surfaces when the program ends (the SDK awaits every
            # output then): a RunError is printed as its message alone and fails the run.
            raise pulumi.RunError(f"stack {self._stack}: trainstack:platform.{problem}")
