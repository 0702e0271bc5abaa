"""Register a Kubernetes manifest (a plain dict) as the matching typed Pulumi resource."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

# API group -> pulumi_kubernetes module name, for the groups trainstack emits.
_GROUP_MODULES = {
    "": "core",
    "apps": "apps",
    "batch": "batch",
    "policy": "policy",
    "storage.k8s.io": "storage",
    "rbac.authorization.k8s.io": "rbac",
    "networking.k8s.io": "networking",
    "scheduling.k8s.io": "scheduling",
    "admissionregistration.k8s.io": "admissionregistration",
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _typed_class(api_version: str, kind: str) -> type[pulumi.CustomResource] | None:
    group, _, version = api_version.rpartition("/")
    module_name = _GROUP_MODULES.get(group)
    if module_name is None:
        return None
    module = importlib.import_module(f"pulumi_kubernetes.{module_name}.{version}")
    cls = getattr(module, kind, None)
    return cls if isinstance(cls, type) and issubclass(cls, pulumi.CustomResource) else None


def apply_manifest(
    resource_name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions
) -> pulumi.CustomResource:
    """Typed resource for built-in kinds, CustomResource for CRDs (Volcano, monitoring).

    The manifest is passed through unchanged, so what the preview records is exactly
    what the builder produced.
    """
    assert opts.provider is not None, f"{resource_name}: Kubernetes children need a provider"
    api_version, kind = manifest["apiVersion"], manifest["kind"]
    body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
    cls = _typed_class(api_version, kind)
    if cls is None:
        return k8s.apiextensions.CustomResource(
            resource_name, api_version=api_version, kind=kind, opts=opts, **body
        )
    return cls(resource_name, opts=opts, **{_snake(k): v for k, v in body.items()})
