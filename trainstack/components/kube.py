"""Register a Kubernetes manifest (a plain dict) as the matching Pulumi resource."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s


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


def helm_release(
    resource_name: str,
    release: str,
    chart: Mapping[str, str],
    *,
    namespace: str,
    values: Mapping[str, Any],
    opts: pulumi.ResourceOptions,
) -> k8s.helm.v3.Release:
    """An upstream chart at its pinned version (`chart`: chart, version, repo)."""
    return k8s.helm.v3.Release(
        resource_name,
        name=release,
        chart=chart["chart"],
        version=chart["version"],
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart["repo"]),
        namespace=namespace,
        values=dict(values),
        opts=opts,
    )
