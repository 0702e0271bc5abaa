"""The plan: a deterministic document of every resource, and the files written from it."""

from __future__ import annotations

import base64
import binascii
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainstack.preview.mocks import ResourceRecord
from trainstack.preview.synth import SECRET_PLACEHOLDER, SynthResult

PLAN_VERSION = 1
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
# How the Pulumi wire protocol marks a secret value inside a property map.
_SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"


def normalise(value: Any) -> Any:
    """Canonical form: ints for the wire's floats (`2`, not `2.0`), maps sorted, secrets masked.

    Map order from the engine is not stable between runs; sorting makes plans
    byte-identical. Done by one JSON round trip: the C encoder sorts, and Python code runs
    only per float (and per map when the value holds a secret).
    """
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return _normalise(value)  # not plain JSON data: walk it
    hook = _mask_secret if _SECRET_SIG in text else None
    return json.loads(text, parse_float=_number, object_hook=hook)


def _number(text: str) -> float | int:
    number = float(text)
    return int(number) if number.is_integer() else number


def _mask_secret(value: dict[str, Any]) -> Any:
    """Plans are shared in pull requests: a secret never appears, only its placeholder."""
    return SECRET_PLACEHOLDER if value.get(_SECRET_SIG_KEY) == _SECRET_SIG else value


def _normalise(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        masked = _mask_secret(value)
        if masked is not value:
            return masked
        return {k: _normalise(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


def _urn_ref(urn: str) -> str:
    """`type::name` of a URN, the stable identity of a resource in the plan."""
    if not urn:
        return ""
    head, _, name = urn.rpartition("::")
    return f"{head.rsplit('$', 1)[-1].rsplit('::', 1)[-1]}::{name}"


def _provider_ref(provider: str) -> str:
    urn = provider.split("::", 1)[0] if provider.count("::") == 1 else provider.rsplit("::", 1)[0]
    return _urn_ref(urn)


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    parent: str
    provider: str
    custom: bool
    inputs: dict[str, Any]
    dependencies: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)  # mocks.options_of
    # Per input property, the resources (`type::name`) its value comes from. Used by the
    # stack rules at preview; not written to plan.json (every reference would be there twice).
    property_dependencies: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)

    @property
    def ref(self) -> str:
        return f"{self.type}::{self.name}"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": self.type, "name": self.name, "parent": self.parent or None}
        if self.provider:
            doc["provider"] = self.provider
        doc["custom"] = self.custom
        if self.dependencies:
            doc["dependencies"] = list(self.dependencies)
        if self.options:
            doc["options"] = self.options
        doc["inputs"] = self.inputs
        return doc


def _resource(record: ResourceRecord) -> Resource:
    parent = _urn_ref(record.parent_urn)
    if parent.startswith("pulumi:pulumi:Stack::"):
        parent = ""
    return Resource(
        type=record.type,
        name=record.name,
        parent=parent,
        provider=_provider_ref(record.provider) if record.provider else "",
        custom=record.custom,
        inputs=normalise(record.inputs),
        dependencies=tuple(sorted(_urn_ref(d) for d in record.dependencies)),
        options=record.options,
        property_dependencies={
            k: tuple(_urn_ref(u) for u in urns) for k, urns in record.property_dependencies.items()
        },
    )


@dataclass(frozen=True)
class Plan:
    stack: str
    kind: str  # platform | team
    resources: tuple[Resource, ...]
    outputs: dict[str, Any]
    # Policy-pack findings: {"rule", "resource", "message", "level"} (see trainstack/policy).
    violations: tuple[dict[str, str], ...] = ()

    @property
    def mandatory_violations(self) -> list[dict[str, str]]:
        return [v for v in self.violations if v["level"] == "mandatory"]

    def as_referenced(self) -> tuple[dict[str, Any], list[str]]:
        """What a StackReference to this stack reads offline (RecordingMocks.stack_outputs):
        the outputs, and the names of the secret ones (masked in the plan)."""
        return self.outputs, sorted(k for k, v in self.outputs.items() if v == SECRET_PLACEHOLDER)

    @classmethod
    def from_synth(cls, result: SynthResult, kind: str) -> Plan:
        resources = sorted((_resource(r) for r in result.records), key=lambda r: (r.type, r.name))
        outputs = {
            key: SECRET_PLACEHOLDER if key in result.secret_outputs else normalise(value)
            for key, value in sorted(result.outputs.items())
        }
        return cls(result.stack, kind, tuple(resources), outputs)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "stack": self.stack,
            "kind": self.kind,
            "resources": [r.to_json() for r in self.resources],
            "outputs": self.outputs,
            "policy": {"violations": list(self.violations)},
        }

    def kubernetes_objects(self) -> list[tuple[Resource, dict[str, Any]]]:
        """Each Kubernetes object exactly as it would be applied."""
        objects: list[tuple[Resource, dict[str, Any]]] = []
        for resource in self.resources:
            inputs = resource.inputs
            if resource.type.startswith("kubernetes:") and "kind" in inputs and resource.custom:
                # Conventional order on top; everything below is sorted.
                head: dict[str, Any] = {
                    k: inputs[k] for k in ("apiVersion", "kind", "metadata") if k in inputs
                }
                rest = {k: v for k, v in inputs.items() if k not in head}
                objects.append((resource, {**head, **rest}))
        return objects

    def helm_releases(self) -> list[Resource]:
        return [r for r in self.resources if r.type == HELM_RELEASE]

    def aws_resources(self) -> list[Resource]:
        return [r for r in self.resources if r.type.startswith("aws:") and r.custom]

    def counts_by_component(self) -> dict[str, Counter[str]]:
        """Custom resources per owning component (the nearest non-custom ancestor)."""
        by_ref = {r.ref: r for r in self.resources}
        counts: dict[str, Counter[str]] = {}
        for resource in self.resources:
            if not resource.custom:
                continue
            owner = resource.parent
            while owner and owner in by_ref and by_ref[owner].custom:
                owner = by_ref[owner].parent
            counts.setdefault(owner or "(stack)", Counter())[resource.type] += 1
        return dict(sorted(counts.items()))


class _ReadableDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks: an embedded configuration (Volcano's scheduler
    configuration in its chart values, a script) reads as itself, not as one escaped line."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_ReadableDumper.add_representer(str, _represent_str)


def _dump_yaml(doc: Any) -> str:
    text: str = yaml.dump(
        doc, Dumper=_ReadableDumper, sort_keys=False, default_flow_style=False, width=100
    )
    return text


def decoded_user_data(inputs: dict[str, Any]) -> str | None:
    """An EC2 launch template's user data as the node reads it (the plan holds it base64
    encoded, as EC2 takes it), or None if it has none or it is not text."""
    encoded = inputs.get("userData")
    if not isinstance(encoded, str):
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _short_type(resource_type: str) -> str:
    """aws:eks/cluster:Cluster -> eks.Cluster"""
    _, module, kind = resource_type.split(":", 2)
    return f"{module.split('/')[0]}.{kind}"


def write_plan(plan: Plan, out_dir: Path) -> list[Path]:
    """Write plan.json, one YAML per Kubernetes object, one JSON per AWS resource.

    The directory is replaced, so files of resources that no longer exist do not linger.
    """
    if out_dir.exists():
        shutil.rmtree(out_dir)
    written: list[Path] = []

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)

    write(out_dir / "plan.json", json.dumps(plan.to_json(), indent=2, sort_keys=True) + "\n")
    for _, manifest in plan.kubernetes_objects():
        meta = manifest.get("metadata", {})
        folder = meta.get("namespace", "_cluster")
        write(
            out_dir / "kubernetes" / folder / f"{manifest['kind'].lower()}-{meta.get('name')}.yaml",
            _dump_yaml(manifest),
        )
    for release in plan.helm_releases():
        # Charts render only in a real engine; the release's chart, version and values
        # are what a reviewer needs to see.
        inputs = release.inputs
        doc = {
            "chart": inputs.get("chart"),
            "version": inputs.get("version"),
            "repository": (inputs.get("repositoryOpts") or {}).get("repo"),
            "namespace": inputs.get("namespace"),
            "values": inputs.get("values", {}),
        }
        write(out_dir / "helm" / f"{inputs.get('name', release.name)}.yaml", _dump_yaml(doc))
    for resource in plan.aws_resources():
        folder = out_dir / "aws" / _short_type(resource.type)
        write(
            folder / f"{resource.name}.json",
            json.dumps(resource.inputs, indent=2, sort_keys=True) + "\n",
        )
        user_data = decoded_user_data(resource.inputs)
        if user_data is not None:  # beside it, decoded: what a reviewer reads
            write(folder / f"{resource.name}.user-data.txt", user_data)
    return written
