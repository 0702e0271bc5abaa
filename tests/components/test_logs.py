"""The node log collector on AWS: its role writes only under logs/teams/, by IRSA for its own
ServiceAccount, and the pinned chart gets that role; a stack can leave it out."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from tests.components.test_storage import load, run
from tests.conftest import Recorded
from trainstack.builders import logs
from trainstack.components.platform import Platform
from trainstack.config import PlatformConfig

ROLE = "aws:iam/role:Role"
POLICY = "aws:iam/rolePolicy:RolePolicy"
RELEASE = "kubernetes:helm.sh/v3:Release"


@pytest.fixture(scope="module")
def prod() -> PlatformConfig:
    return load("prod")


def test_the_collectors_role_writes_job_logs_and_nothing_else(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    rec = run(run_program, prod)
    policy = json.loads(rec.one(POLICY, "p-logs-policy").inputs["policy"])
    statements = {s["Sid"]: s for s in policy["Statement"]}
    assert statements["WriteJobLogs"]["Action"] == ["s3:PutObject", "s3:AbortMultipartUpload"]
    assert statements["WriteJobLogs"]["Resource"] == (
        "arn:aws:s3:::acme-trainstack-prod-checkpoints/logs/teams/*"
    )
    assert statements["LogEncryption"]["Resource"].endswith(":key/p-storage-key")
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert not actions & {"s3:GetObject", "s3:ListBucket", "s3:DeleteObject"}  # write-only
    trust = json.loads(rec.one(ROLE, "p-logs-role").inputs["assumeRolePolicy"])
    condition = trust["Statement"][0]["Condition"]["StringEquals"]
    assert "system:serviceaccount:trainstack-system:log-collector" in condition.values()


def test_the_pinned_chart_runs_as_the_role(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    rec = run(run_program, prod)
    release = rec.one(RELEASE, "p-logs-release")
    inputs = release.inputs
    assert (inputs["chart"], inputs["version"]) == ("opentelemetry-collector", "0.170.0")
    assert inputs["namespace"] == "trainstack-system"
    account = inputs["values"]["serviceAccount"]
    assert account["name"] == logs.SERVICE_ACCOUNT
    assert account["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::000000000000:role/p-logs-role"
    }
    exporter = inputs["values"]["alternateConfig"]["exporters"]
    (s3,) = [v for k, v in exporter.items() if k.startswith("awss3")]
    assert s3["s3uploader"]["s3_bucket"] == "acme-trainstack-prod-checkpoints"
    assert s3["s3uploader"]["region"] == "us-east-1"
    parent = rec.parent_of(release)
    assert parent is not None
    assert parent.type == "trainstack:logs:LogCollector"


def test_a_stack_may_leave_the_collector_out(
    run_program: Callable[..., Recorded], prod: PlatformConfig
) -> None:
    cfg = replace(prod, storage=replace(prod.storage, log_collector=False))
    rec = run(run_program, cfg)
    assert not [r for r in rec.of_type(RELEASE) if r.name == "p-logs-release"]
    assert not rec.of_type("trainstack:logs:LogCollector")


def test_on_an_existing_cluster_it_writes_to_the_object_store_with_its_own_keys(
    run_program: Callable[..., Recorded],
) -> None:
    """onprem: no AWS resource; the chart gets the store's endpoint (path-style) and the keys
    of the Secret its owners keep in trainstack-system."""
    cfg = load("onprem")
    rec = run_program(lambda: Platform("p", cfg), region="us-east-1")
    assert not [r for r in rec.records if r.type.startswith("aws:")]
    values = rec.one(RELEASE, "p-logs-release").inputs["values"]
    assert values["extraEnvsFrom"] == [{"secretRef": {"name": "trainstack-log-collector"}}]
    assert "annotations" not in values["serviceAccount"]
    exporter = values["alternateConfig"]["exporters"]
    (s3,) = [v for k, v in exporter.items() if k.startswith("awss3")]
    assert s3["s3uploader"]["s3_bucket"] == "dgx-training"
    assert s3["s3uploader"]["endpoint"] == "https://minio.lab.internal:9000"
    assert s3["s3uploader"]["s3_force_path_style"] is True
