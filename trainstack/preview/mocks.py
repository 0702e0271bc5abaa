"""Recording mocks: every registered resource with its parent, plus plausible computed outputs.

Pulumi's MockResourceArgs carries no parent, so a MockMonitor subclass stashes the raw
gRPC request in a thread-local for new_resource to read (the monitor handles requests
on a thread pool, one request per thread at a time).
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs

FAKE_ACCOUNT = "000000000000"
STACK_REFERENCE = "pulumi:pulumi:StackReference"


@dataclass
class ResourceRecord:
    """One registration as the engine would see it (inputs in wire names)."""

    type: str
    name: str
    inputs: dict[str, Any]
    custom: bool
    parent_urn: str
    provider: str
    dependencies: list[str]
    urn: str = ""
    # Per input property, the URNs its value comes from (the request's propertyDependencies).
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    resource_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Resource options the engine acts on at update time (options_of): what a plan reader
    # needs to tell a replacement or a protected resource from an ordinary update.
    options: dict[str, Any] = field(default_factory=dict)


def options_of(request: Any) -> dict[str, Any]:
    """The lifecycle options of a RegisterResourceRequest that were set, in wire names."""
    if request is None or not hasattr(request, "replaceOnChanges"):
        return {}
    options: dict[str, Any] = {}
    if request.HasField("protect") and request.protect:
        options["protect"] = True
    if request.HasField("retainOnDelete") and request.retainOnDelete:
        options["retainOnDelete"] = True
    if request.deleteBeforeReplace:
        options["deleteBeforeReplace"] = True
    if request.replaceOnChanges:
        options["replaceOnChanges"] = sorted(request.replaceOnChanges)
    if request.ignoreChanges:
        options["ignoreChanges"] = sorted(request.ignoreChanges)
    if request.HasField("replacement_trigger"):
        value = request.replacement_trigger  # a google.protobuf.Value
        kind = value.WhichOneof("kind")
        scalar = kind in ("string_value", "number_value", "bool_value")
        options["replacementTrigger"] = getattr(value, kind) if scalar else str(value)
    return options


def _digest(*parts: str, length: int = 32) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length].upper()


class RecordingMocks(pulumi.runtime.Mocks):
    """Records registrations; answers with deterministic fake outputs.

    `stack_outputs` maps a fully qualified stack name to the outputs a StackReference
    to it should see (from an offline preview of that stack).
    """

    def __init__(
        self,
        region: str = "us-east-1",
        stack_outputs: Mapping[str, tuple[dict[str, Any], list[str]]] | None = None,
    ) -> None:
        self.records: list[ResourceRecord] = []
        self.tls = threading.local()
        self.region = region
        self.stack_outputs = dict(stack_outputs or {})

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        request = getattr(self.tls, "request", None)
        inputs = dict(args.inputs)
        record = ResourceRecord(
            type=args.typ,
            name=args.name,
            inputs=inputs,
            custom=bool(args.custom),
            parent_urn=getattr(request, "parent", "") or "",
            provider=args.provider or "",
            dependencies=sorted(getattr(request, "dependencies", []) or []),
            property_dependencies={
                str(k): sorted(v.urns)
                for k, v in getattr(request, "propertyDependencies", {}).items()
            },
            options=options_of(request),
        )
        self.tls.record = record
        self.records.append(record)
        resource_id = args.resource_id or f"{args.name}-id"
        record.resource_id = resource_id
        if args.typ == STACK_REFERENCE:
            return resource_id, self._stack_reference(str(inputs.get("name", resource_id)))
        if type(request).__name__ == "ReadResourceRequest":
            # A read of what the cluster holds (a pre-installed add-on): offline there is
            # nothing to read, so it yields no state (the probes then check nothing).
            record.extra["read"] = True
            return resource_id, {}
        return resource_id, {**inputs, **self._computed(args.typ, args.name, inputs)}

    def call(self, args: MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        # The program's one provider call reads a node group's live size
        # (components/nodes.live_desired_size); offline there is nothing live, and an empty
        # answer says so. No failures is [], not None: Pulumi's MockMonitor iterates it.
        del args
        return {}, []

    def _stack_reference(self, name: str) -> dict[str, Any]:
        if name not in self.stack_outputs:
            raise pulumi.RunError(
                f"no offline preview of stack {name!r} is available for its StackReference; "
                "preview that platform stack first (trainstack preview does this for team stacks)"
            )
        outputs, secrets = self.stack_outputs[name]
        return {"name": name, "outputs": outputs, "secretOutputNames": secrets}

    def _computed(self, typ: str, name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Outputs the cloud would compute, made up deterministically from the name."""
        if not typ.startswith("aws:"):
            return {}
        service = typ.split(":")[1].split("/", maxsplit=1)[0]
        physical = str(inputs.get("name") or name)
        out: dict[str, Any] = {"name": physical, "arn": self._arn(service, typ, physical)}
        if typ == "aws:eks/cluster:Cluster":
            token = _digest(physical)
            vpc_config = dict(inputs.get("vpcConfig") or {})
            vpc_config["clusterSecurityGroupId"] = f"sg-{token[:17].lower()}"
            out |= {
                "vpcConfig": vpc_config,
                "endpoint": f"https://{token}.gr7.{self.region}.eks.amazonaws.com",
                "certificateAuthority": {
                    "data": base64.b64encode(f"fake-ca-{physical}".encode()).decode()
                },
                "identities": [
                    {
                        "oidcs": [
                            {"issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/{token}"}
                        ]
                    }
                ],
            }
        elif typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            token = _digest(physical, length=8).lower()
            out["dnsName"] = f"fs-{token}.fsx.{self.region}.amazonaws.com"
            out["mountName"] = token
        elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
            out["latestVersion"] = 1
        elif typ == "aws:iam/openIdConnectProvider:OpenIdConnectProvider":
            host = str(inputs.get("url", "")).removeprefix("https://")
            out["arn"] = f"arn:aws:iam::{FAKE_ACCOUNT}:oidc-provider/{host}"
        return out

    def _arn(self, service: str, typ: str, physical: str) -> str:
        kind = typ.rsplit(":", 1)[-1].lower()
        if service == "iam":
            return f"arn:aws:iam::{FAKE_ACCOUNT}:{kind}/{physical}"
        return f"arn:aws:{service}:{self.region}:{FAKE_ACCOUNT}:{kind}/{physical}"


class RecordingMonitor(MockMonitor):
    """Passes each raw request to the mocks so records carry parent and dependencies."""

    mocks: RecordingMocks

    def _wrap(self, handler: Any, request: Any) -> Any:
        tls = self.mocks.tls
        tls.request, tls.record = request, None
        try:
            response = handler(request)
        finally:
            tls.request = None
        if tls.record is not None:  # the root Stack never reaches new_resource
            tls.record.urn = response.urn
        return response

    def RegisterResource(self, request: Any) -> Any:
        return self._wrap(super().RegisterResource, request)

    def ReadResource(self, request: Any) -> Any:
        return self._wrap(super().ReadResource, request)
