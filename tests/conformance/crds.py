"""Validate custom resources against the upstream CRD schemas in the reference folder.

The API server prunes fields a structural schema does not declare, so a misspelt field
vanishes silently; every object schema with `properties` gets additionalProperties:
false here (except preserve-unknown nodes) to turn that into an error.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# Folder (under the reference dir) holding the CRDs of each API group.
CRD_FOLDERS = {
    "batch.volcano.sh": "volcano/crd-bases",
    "bus.volcano.sh": "volcano/crd-bases",
    "scheduling.volcano.sh": "volcano/crd-bases",
    "topology.volcano.sh": "volcano/crd-bases",
    "monitoring.coreos.com": "prometheus-operator",
    "kubeflow.org": "kubeflow",
}
# Custom resources with no CRD schema available offline, and why that is acceptable.
UNVALIDATED = {
    "mellanox.com": "NVIDIA Network Operator CRD is not in the reference set; "
    "the NicClusterPolicy builder is covered by component tests",
}


def strictify(schema: Any) -> Any:
    if isinstance(schema, dict):
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema.setdefault("additionalProperties", False)
        for value in schema.values():
            strictify(value)
    elif isinstance(schema, list):
        for value in schema:
            strictify(value)
    return schema


@cache
def crd_schemas(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(folder.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = strictify(version["schema"]["openAPIV3Schema"])
                schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def is_custom(api_version: str) -> bool:
    group = group_of(api_version)
    return "." in group and not group.endswith(".k8s.io")


def crd_errors(reference: Path, manifest: dict[str, Any]) -> list[str]:
    """Every schema error of a custom resource (all at once, with paths)."""
    folder = CRD_FOLDERS.get(group_of(manifest["apiVersion"]))
    if folder is None:
        raise LookupError(f"no CRD folder for {manifest['apiVersion']}")
    schemas = crd_schemas(reference / folder)
    schema = schemas.get((manifest["apiVersion"], manifest["kind"]))
    if schema is None:
        raise LookupError(f"no CRD schema for {manifest['apiVersion']} {manifest['kind']}")
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]
