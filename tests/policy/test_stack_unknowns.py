"""Issue 19 #6: the S3 stack rules judge a preview where the bucket is new.

At preview a new bucket's id is unknown, so a companion's `bucket` input is the engine's
unknown sentinel; reading it through pulumi_policy's unknown-checking proxy raises, and the
analyzer turned the whole policy into "can't run policy" (advisory). The companions now link
to their bucket through the engine's property dependencies (`propertyDependencies`, known at
preview), and findings carry the bucket's own URN (by name, the bucket and its five
companions, which share one name, were confused).

The requests go through pulumi_policy's own servicer (`_PolicyAnalyzerServicer.AnalyzeStack`,
pulumi-policy 1.21.0 policy.py: it deserializes the properties, wraps them in
`unknown_checking_proxy`, resolves property dependencies to resources and catches
UnknownValueError), the code the pack serves to the CLI.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2
from pulumi.runtime.proto import analyzer_pb2
from pulumi_policy.policy import EnforcementLevel, _PolicyAnalyzerServicer
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from trainstack.policy.pack import PACK_NAME, crossguard_policies
from trainstack.policy.stack_rules import BUCKET, PAB, SSE
from trainstack.preview.plan import Plan

S3_RULES = ("s3-encrypted", "s3-public-access-blocked")


def _urn(rtype: str, name: str) -> str:
    return f"urn:pulumi:prod::trainstack::trainstack:storage:PlatformStorage${rtype}::{name}"


def _request(plan: Plan, *, drop: str | None = None) -> analyzer_pb2.AnalyzeStackRequest:
    """The plan's S3 resources as the engine sends them while the bucket is new."""
    bucket = next(r for r in plan.resources if r.type == BUCKET)
    bucket_urn = _urn(BUCKET, bucket.name)
    resources = []
    for r in plan.resources:
        if not r.type.startswith("aws:s3/") or r.type == drop:
            continue
        props: dict[str, Any] = dict(r.inputs)
        deps: dict[str, Any] = {}
        if r.type != BUCKET:
            assert r.property_dependencies.get("bucket") == (bucket.ref,), r.ref
            props["bucket"] = UNKNOWN_STRING_VALUE  # the new bucket's id
            deps["bucket"] = analyzer_pb2.AnalyzerPropertyDependencies(urns=[bucket_urn])
        properties = struct_pb2.Struct()
        properties.update(props)
        resources.append(
            analyzer_pb2.AnalyzerResource(
                type=r.type,
                name=r.name,
                urn=bucket_urn if r.type == BUCKET else _urn(r.type, r.name),
                properties=properties,
                propertyDependencies=deps,
            )
        )
    return analyzer_pb2.AnalyzeStackRequest(resources=resources)


def _analyze(request: analyzer_pb2.AnalyzeStackRequest) -> list[tuple[str, str, str]]:
    servicer = _PolicyAnalyzerServicer(
        PACK_NAME, "0.0.1", crossguard_policies(), EnforcementLevel.MANDATORY,
        None, None, None, None, None, None, None,
    )  # fmt: skip
    response = servicer.AnalyzeStack(request, None)
    return [
        (d.policyName, d.urn, d.message) for d in response.diagnostics if d.policyName in S3_RULES
    ]


@pytest.fixture(scope="module")
def prod(example_plans: dict[str, Plan]) -> Plan:
    return example_plans["prod"]


def test_a_new_bucket_with_its_companions_passes(prod: Plan) -> None:
    """Before: two "can't run policy" diagnostics, one per S3 rule."""
    assert _analyze(_request(prod)) == []


@pytest.mark.parametrize(
    ("drop", "rule"), [(SSE, "s3-encrypted"), (PAB, "s3-public-access-blocked")]
)
def test_a_missing_companion_is_found_on_the_bucket(prod: Plan, drop: str, rule: str) -> None:
    found = _analyze(_request(prod, drop=drop))
    bucket = next(r for r in prod.resources if r.type == BUCKET)
    assert [(policy, urn) for policy, urn, _ in found] == [(rule, _urn(BUCKET, bucket.name))]
    assert "can't run policy" not in found[0][2]
