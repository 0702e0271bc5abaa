"""The CrossGuard pack: every rule through the pack's own policy objects, and the preview's
policy gate. How the Pulumi CLI starts the pack folder: test_pack_host.py."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import EXAMPLE_STACKS, ROOT, STACKS
from tests.policy.crossguard import analyze
from tests.policy.test_equivalence import CASES, CONFIG, Mutation, demo_job
from trainstack.cli import app
from trainstack.config import PlatformConfig, load_stack_file
from trainstack.policy.admission import admission_policies
from trainstack.policy.aws_rules import AWS_RULES
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.policy.pack import crossguard_policies, evaluate
from trainstack.policy.rules import K8S_RULES, RULES
from trainstack.policy.settings import levels, pack_config, rule_config
from trainstack.policy.stack_rules import STACK_RULES
from trainstack.preview.plan import Plan

PACK_CONFIG = {
    "allowedRegistries": list(CONFIG.allowed_registries),
    "teamMaxDurationHours": dict(CONFIG.team_max_duration_hours),
    "teamPriorityClasses": {k: list(v) for k, v in CONFIG.team_priority_classes.items()},
}


def rules_hit(resources: list[tuple[str, str, dict[str, Any]]], config: dict[str, Any]) -> set[str]:
    """The rules that fail, as the preview finds them; the Pulumi analyzer must agree."""
    found = evaluate(resources, config)
    assert sorted((v.rule, v.resource, v.message) for v in found) == analyze(resources, config)
    return {v.rule for v in found}


@pytest.mark.parametrize(
    ("rule", "case", "mutate", "admitted"), CASES, ids=[f"{r}: {c}" for r, c, _, _ in CASES]
)
def test_kubernetes_rules_through_the_crossguard_api(
    rule: str, case: str, mutate: Mutation | None, admitted: bool, example_plans: dict[str, Plan]
) -> None:
    del case
    job = demo_job(example_plans["vision"])
    if mutate is not None:
        mutate(job)
    hit = rules_hit([(VOLCANO_JOB, "job", job)], PACK_CONFIG)
    assert (rule not in hit) is admitted, hit


TEMPLATE = {
    "metadataOptions": {"httpTokens": "required"},
    "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "true"}}],
}
LT = "aws:ec2/launchTemplate:LaunchTemplate"
FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"
EKS = "aws:eks/cluster:Cluster"
ADDON = "aws:eks/addon:Addon"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
OPTIONAL_IMDS = {**TEMPLATE, "metadataOptions": {"httpTokens": "optional"}}
PLAIN_EBS = {**TEMPLATE, "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {}}]}
PROD = {"production": True}


def endpoint(public: bool, cidrs: list[str] | None = None) -> dict[str, Any]:
    vpc: dict[str, Any] = {"endpointPublicAccess": public}
    if cidrs is not None:
        vpc["publicAccessCidrs"] = cidrs
    return {"vpcConfig": vpc}


def cni(values: str | None) -> dict[str, Any]:
    addon: dict[str, Any] = {"addonName": "vpc-cni"}
    if values is not None:
        addon["configurationValues"] = values
    return addon


AWS_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any], bool]] = [
    ("imdsv2-required", LT, TEMPLATE, {}, True),
    ("imdsv2-required", LT, OPTIONAL_IMDS, {}, False),
    ("ebs-encrypted", LT, TEMPLATE, {}, True),
    ("ebs-encrypted", LT, PLAIN_EBS, {}, False),
    ("fsx-encrypted", FSX, {"deploymentType": "PERSISTENT_2", "kmsKeyId": "arn:k"}, {}, True),
    ("fsx-encrypted", FSX, {"deploymentType": "PERSISTENT_2"}, {}, False),
    ("fsx-encrypted", FSX, {"deploymentType": "SCRATCH_2"}, {}, True),
    ("eks-endpoint-not-open", EKS, endpoint(True, ["0.0.0.0/0"]), PROD, False),
    ("eks-endpoint-not-open", EKS, endpoint(True), PROD, False),
    ("eks-endpoint-not-open", EKS, endpoint(True, ["203.0.113.0/24"]), PROD, True),
    ("eks-endpoint-not-open", EKS, endpoint(True, ["0.0.0.0/0"]), {"production": False}, True),
    ("eks-endpoint-not-open", EKS, endpoint(False), PROD, True),
    ("vpc-cni-network-policy", ADDON, cni('{"enableNetworkPolicy": "true"}'), {}, True),
    ("vpc-cni-network-policy", ADDON, cni('{"enableNetworkPolicy": "false"}'), {}, False),
    ("vpc-cni-network-policy", ADDON, cni(None), {}, False),
    ("vpc-cni-network-policy", ADDON, cni("{}"), {}, False),
    # the add-on's configuration schema types the value as a string
    ("vpc-cni-network-policy", ADDON, cni('{"enableNetworkPolicy": true}'), {}, False),
    ("vpc-cni-network-policy", ADDON, {"addonName": "coredns"}, {}, True),
]


@pytest.mark.parametrize(("rule", "rtype", "props", "config", "ok"), AWS_CASES)
def test_aws_rules(
    rule: str, rtype: str, props: dict[str, Any], config: dict[str, Any], ok: bool
) -> None:
    assert (rule not in rules_hit([(rtype, "r", props)], config)) is ok


def bucket_stack(sse: bool, block: dict[str, bool]) -> list[tuple[str, str, dict[str, Any]]]:
    resources: list[tuple[str, str, dict[str, Any]]] = [
        ("aws:s3/bucket:Bucket", "ckpt", {"bucket": "acme-ckpt"})
    ]
    if sse:
        rule = {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}
        resources.append((
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
            "ckpt", {"bucket": "acme-ckpt", "rules": [rule]},
        ))  # fmt: skip
    if block:
        resources.append(
            (
                "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
                "ckpt",
                {"bucket": "ckpt-id", **block},
            )
        )
    return resources


ALL_ON = dict.fromkeys(
    ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"), True
)


def test_s3_stack_rules() -> None:
    assert rules_hit(bucket_stack(True, ALL_ON), {}) == set()
    assert rules_hit(bucket_stack(False, ALL_ON), {}) == {"s3-encrypted"}
    assert rules_hit(bucket_stack(True, {}), {}) == {"s3-public-access-blocked"}
    assert rules_hit(bucket_stack(True, {**ALL_ON, "restrictPublicBuckets": False}), {}) == {
        "s3-public-access-blocked"
    }


LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
SUPERSEDED = {"trainstack.io/superseded": "true"}


def with_lifecycle(*rules: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        *bucket_stack(True, ALL_ON),
        (LIFECYCLE, "ckpt", {"bucket": "acme-ckpt", "rules": list(rules)}),
    ]


def expire(rule_filter: dict[str, Any], status: str = "Enabled") -> dict[str, Any]:
    return {"id": "r", "status": status, "filter": rule_filter, "expiration": {"days": 30}}


@pytest.mark.parametrize(
    ("rules", "hit"),
    [
        # The platform's own: superseded copies per team, logs per team.
        ([expire({"and": {"prefix": "teams/vision/", "tags": SUPERSEDED}})], False),
        ([expire({"prefix": "logs/teams/vision/"})], False),
        ([expire({"prefix": "teams/vision/"}, status="Disabled")], False),
        # An age expiration on checkpoint copies deletes a paused job's only one.
        ([expire({"prefix": "teams/vision/"})], True),
        ([expire({"prefix": "teams/"})], True),
        ([expire({"prefix": "team"})], True),  # covers teams/ too
        ([expire({})], True),  # the whole bucket
        ([expire({"and": {"prefix": "teams/", "tags": {"other": "true"}}})], True),
        (
            [expire({"tag": {"key": "trainstack.io/superseded", "value": "true"}})],
            True,
        ),  # artifacts
        # Hand-offs never expire, tagged or not.
        ([expire({"prefix": "artifacts/teams/vision/"})], True),
        # Versions only: no expiration of current objects.
        (
            [
                {
                    "id": "v",
                    "status": "Enabled",
                    "filter": {"prefix": "teams/"},
                    "noncurrentVersionExpiration": {"noncurrentDays": 7},
                }
            ],
            False,
        ),
    ],
)
def test_lifecycle_rules_never_expire_latest_copies_or_hand_offs(
    rules: list[dict[str, Any]], hit: bool
) -> None:
    assert rules_hit(with_lifecycle(*rules), {}) == ({"s3-expiry-keeps-latest"} if hit else set())


PV = "kubernetes:core/v1:PersistentVolume"


def csi_pv(name: str, driver: str, handle: str) -> tuple[str, str, dict[str, Any]]:
    spec = {"csi": {"driver": driver, "volumeHandle": handle}, "claimRef": {"name": "c"}}
    return (PV, f"pv-{name}", {"metadata": {"name": name}, "spec": spec})


def local_pv(name: str, path: str) -> tuple[str, str, dict[str, Any]]:
    return (PV, f"pv-{name}", {"metadata": {"name": name}, "spec": {"local": {"path": path}}})


FSX_ID = "fs-0123456789abcdef0"
HPE = "lustre.csi.hpe.com"
# (case, the plan's PVs, the Pulumi names the rule flags)
PV_HANDLE_CASES: list[tuple[str, list[tuple[str, str, dict[str, Any]]], set[str]]] = [
    ("one PV", [csi_pv("a", "fsx.csi.aws.com", FSX_ID)], set()),
    (
        "a team's datasets and checkpoints on one file system (issue 15)",
        [csi_pv("vision-datasets", "fsx.csi.aws.com", FSX_ID),
         csi_pv("vision-checkpoints", "fsx.csi.aws.com", FSX_ID)],
        {"pv-vision-datasets", "pv-vision-checkpoints"},
    ),
    (
        "two teams' claims on one file system id",
        [csi_pv("vision-lustre", HPE, "mgs@tcp:/trainfs"),
         csi_pv("nlp-lustre", HPE, "mgs@tcp:/trainfs")],
        {"pv-vision-lustre", "pv-nlp-lustre"},
    ),
    (
        "one handle per team",
        [csi_pv("vision-lustre", "fsx.csi.aws.com", f"{FSX_ID}::vision"),
         csi_pv("nlp-lustre", "fsx.csi.aws.com", f"{FSX_ID}::nlp")],
        set(),
    ),
    (
        "EFS access points of one file system",
        [csi_pv("a", "efs.csi.aws.com", "fs-1::fsap-a"),
         csi_pv("b", "efs.csi.aws.com", "fs-1::fsap-b")],
        set(),
    ),
    (
        "same handle, different drivers",
        [csi_pv("a", "fsx.csi.aws.com", FSX_ID), csi_pv("b", HPE, FSX_ID)],
        set(),
    ),
    (
        "handles are compared exactly",
        [csi_pv("a", HPE, "trainfs"), csi_pv("b", HPE, "TRAINFS")],
        set(),
    ),
    (
        "three PVs, two alike",
        [csi_pv("a", HPE, "x"), csi_pv("b", HPE, "y"), csi_pv("c", HPE, "x")],
        {"pv-a", "pv-c"},
    ),
    (
        "local volumes are not CSI volumes",
        [local_pv("a", "/mnt/trainstack-cache/vol-0"),
         local_pv("b", "/mnt/trainstack-cache/vol-0")],
        set(),
    ),
    (
        "only PersistentVolumes are read",
        [("kubernetes:storage.k8s.io/v1:CSIDriver", "d1", {"spec": {"csi": {"driver": "x"}}}),
         ("kubernetes:storage.k8s.io/v1:CSIDriver", "d2", {"spec": {"csi": {"driver": "x"}}})],
        set(),
    ),
    (
        "claims are not volumes",
        [("kubernetes:core/v1:PersistentVolumeClaim", "c1", {"spec": {"volumeName": "a"}}),
         ("kubernetes:core/v1:PersistentVolumeClaim", "c2", {"spec": {"volumeName": "a"}})],
        set(),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "resources", "flagged"), PV_HANDLE_CASES, ids=[c for c, _, _ in PV_HANDLE_CASES]
)
def test_no_two_persistent_volumes_share_a_csi_volume(
    case: str, resources: list[tuple[str, str, dict[str, Any]]], flagged: set[str]
) -> None:
    """Issue 15 #1. The kubelet names a CSI persistent volume `<driver>^<volumeHandle>`
    (k8s.io/kubernetes@v1.37.2 pkg/volume/csi/csi_plugin.go GetVolumeName) and keys its
    desired state of the world by that name for every device-mountable volume, which all CSI
    PVs are (csi_plugin.go CanDeviceMount; kubelet/volumemanager/cache/
    desired_state_of_world.go AddPodToVolume), so two PVs with one driver and handle are one
    volume to it and a pod using both never starts (kubernetes/kubernetes#91556)."""
    del case
    found = evaluate(resources, {})
    assert sorted((v.rule, v.resource, v.message) for v in found) == analyze(resources, {})
    hits = [v for v in found if v.rule == "pv-unique-volume-handle"]
    assert {v.resource for v in hits} == flagged
    for v in hits:
        assert "Fix: " in v.message
        assert "volumeHandle" in v.message


def test_a_shared_csi_volume_is_named_with_its_twins() -> None:
    resources = [csi_pv("vision-datasets", HPE, "mgs@tcp:/trainfs"),
                 csi_pv("vision-checkpoints", HPE, "mgs@tcp:/trainfs")]  # fmt: skip
    (first, second) = sorted(
        (v for v in evaluate(resources, {}) if v.rule == "pv-unique-volume-handle"),
        key=lambda v: v.resource,
    )
    assert first.resource == "pv-vision-checkpoints"
    assert "PersistentVolume vision-checkpoints" in first.message
    assert "vision-datasets" in first.message
    assert "lustre.csi.hpe.com" in first.message
    assert "'mgs@tcp:/trainfs'" in first.message
    assert "vision-checkpoints" in second.message


def test_network_policies_without_a_managed_cni_get_an_advisory() -> None:
    """On an existing cluster nothing in the stack makes the CNI enforce NetworkPolicy."""
    policies: list[tuple[str, str, dict[str, Any]]] = [
        (NETPOL, "team-speech-networkpolicy-default-deny", {}),
        (NETPOL, "team-speech-networkpolicy-allow-training", {}),
    ]
    assert rules_hit(policies, {}) == {"cni-enforces-network-policy"}
    found = evaluate(policies, {})
    assert [(v.rule, v.level) for v in found] == [("cni-enforces-network-policy", "advisory")]
    assert found[0].resource == "team-speech-networkpolicy-allow-training"
    managed = (ADDON, "cni", cni('{"enableNetworkPolicy": "true"}'))
    assert rules_hit([*policies, managed], {}) == set()
    assert rules_hit([managed], {}) == set()


def test_network_policy_enforcement_in_the_examples(example_plans: dict[str, Plan]) -> None:
    """AWS examples enable enforcement; the existing-cluster example is told it must."""
    for stack, plan in example_plans.items():
        hits = {(v["rule"], v["level"]) for v in plan.violations}
        assert ("vpc-cni-network-policy", "mandatory") not in hits, stack
        if stack == "onprem":
            assert ("cni-enforces-network-policy", "advisory") in hits
        else:
            assert not {rule for rule, _ in hits} & {"cni-enforces-network-policy"}, stack


def test_every_rule_is_in_the_pack() -> None:
    names = [p.name for p in crossguard_policies()]
    assert names == [r.name for r in RULES] + [r.name for r in STACK_RULES]
    assert len(K8S_RULES) + len(AWS_RULES) == len(RULES)


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_examples_have_no_mandatory_violations(stack: str, example_plans: dict[str, Plan]) -> None:
    assert example_plans[stack].mandatory_violations == []


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_the_analyzer_agrees_on_whole_plans(stack: str, example_plans: dict[str, Plan]) -> None:
    """Every resource of the example plans, the production config, one rule made stricter."""
    resources = [(r.type, r.name, r.inputs) for r in example_plans[stack].resources if r.custom]
    config = {**PACK_CONFIG, "production": True, "maxMemoryLimitRequestRatio": 0.5}
    found = evaluate(resources, config)
    assert sorted((v.rule, v.resource, v.message) for v in found) == analyze(resources, config)


def test_preview_fails_on_a_job_that_breaks_a_rule(tmp_path: Path) -> None:
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "stacks").mkdir()
    prod = (STACKS / "Pulumi.prod.yaml").read_text()
    # The platform now only trusts another registry; the demo job's image is not from it.
    allowed = (
        "      allowedRegistries:\n        - 111122223333.dkr.ecr.us-east-1.amazonaws.com/\n"
        "        - registry.example.com/\n"
    )
    assert allowed in prod
    prod = prod.replace(allowed, "      allowedRegistries: [trusted.example.com/]\n")
    (tmp_path / "stacks" / "Pulumi.prod.yaml").write_text(prod)
    shutil.copy(STACKS / "Pulumi.vision.yaml", tmp_path / "stacks" / "Pulumi.vision.yaml")
    shutil.copytree(ROOT / "job_specs", tmp_path / "job_specs")
    result = CliRunner().invoke(
        app, ["preview", "vision", "--project-dir", str(tmp_path), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 3, result.output
    assert "pinned-images" in result.output
    assert "policy: mandatory violations in vision" in result.output
    report = json.loads((tmp_path / "o" / "vision" / "plan.json").read_text())["policy"]
    messages = [v["message"] for v in report["violations"] if v["rule"] == "pinned-images"]
    assert messages, report
    # What is allowed, not only what is not (issue 18, class 9), and where it is set (issue 41):
    # every task of every job, one line each.
    assert {m.split("' ", 1)[1] for m in messages} == {
        "is not from an allowed registry. Fix: use image@sha256:… from trusted.example.com/ "
        "(set in trainstack:platform.policy.allowedRegistries of platform stack prod)"
    }
    assert f"task master: image '{DEMO_IMAGE}' is not from an allowed registry" in "\n".join(
        messages
    )


DEMO_IMAGE = (
    "registry.example.com/vision/demo-train:2025Q1@sha256:"
    "1e5b7f84f31821f24d5f26cc54a918639c1f6cd9cc9e7ccc32f25c93d5213714"
)
# prod's fix for pinned-images: its environment's pin, its registries and where they are set.
PROD_FIX = (
    "use image@sha256:… from 111122223333.dkr.ecr.us-east-1.amazonaws.com/ or "
    "registry.example.com/ (set in trainstack:platform.policy.allowedRegistries of platform "
    "stack prod)"
)


def _pinned_images(stack: str, image: str, example_plans: dict[str, Plan]) -> list[str]:
    """The demo job with `image`, judged by `stack`'s own settings (its stack file)."""
    platform = load_stack_file(STACKS / f"Pulumi.{stack}.yaml")
    assert isinstance(platform, PlatformConfig)
    job = demo_job(example_plans["vision"])
    for task in job["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0]["image"] = image
    found = evaluate([(VOLCANO_JOB, "job", job)], pack_config(platform), levels(platform))
    return sorted(v.message for v in found if v.rule == "pinned-images" and v.level == "mandatory")


def test_prod_refuses_an_image_from_another_registry(example_plans: dict[str, Plan]) -> None:
    """Issue 41 #5: the production example named no registry, so any was accepted."""
    digest = "@sha256:" + "1e5b7f84f31821f24d5f26cc54a918639c1f6cd9cc9e7ccc32f25c93d5213714"
    fix = f"Fix: {PROD_FIX}"
    assert _pinned_images("prod", f"docker.io/someone/train{digest}", example_plans) == [
        f"task {task}: image 'docker.io/someone/train{digest}' is not from an allowed registry. "
        + fix
        for task in ("master", "worker")
    ]
    ecr = f"111122223333.dkr.ecr.us-east-1.amazonaws.com/vision/train{digest}"
    assert _pinned_images("prod", ecr, example_plans) == []
    assert _pinned_images("prod", DEMO_IMAGE, example_plans) == []
    # A tag alone on prod: the fix names the registries the stack sets, and where.
    tagged = "registry.example.com/vision/demo-train:2025Q1"
    assert _pinned_images("prod", tagged, example_plans) == [
        f"task {task}: image '{tagged}' is not pinned by a digest (production). " + fix
        for task in ("master", "worker")
    ]


def test_the_fix_names_no_registry_where_the_stack_allows_any(
    example_plans: dict[str, Plan],
) -> None:
    """Issue 41 #5: dev sets no allowedRegistries, so its fix must not send users to "an
    allowed registry"; the admission policies' messages follow each stack the same way."""
    assert _pinned_images(
        "dev", "registry.example.com/vision/demo-train:latest", example_plans
    ) == [
        f"task {task}: image 'registry.example.com/vision/demo-train:latest' is not pinned by a "
        "build tag or a digest. Fix: use image:<build tag> or image@sha256:…"
        for task in ("master", "worker")
    ]
    messages = {}
    for stack in ("dev", "prod"):
        platform = load_stack_file(STACKS / f"Pulumi.{stack}.yaml")
        assert isinstance(platform, PlatformConfig)
        policy = next(
            m
            for m in admission_policies(rule_config(platform), stack)
            if m["kind"] == "ValidatingAdmissionPolicy"
            and m["metadata"]["name"].endswith("pinned-images")
        )
        messages[stack] = policy["spec"]["validations"][0]["message"].split(". Fix: ")[1]
    assert messages == {
        "dev": "use image:<build tag> or image@sha256:…",
        "prod": PROD_FIX,
    }


def test_advisory_rules_warn_without_failing(
    tmp_path: Path, example_plans: dict[str, Plan]
) -> None:
    job = copy.deepcopy(demo_job(example_plans["vision"]))
    job["spec"]["queue"] = "nlp"
    found = evaluate([(VOLCANO_JOB, "j", job)], {}, {"own-queue": "advisory"})
    assert [(v.rule, v.level) for v in found] == [("own-queue", "advisory")]


def test_advisory_names_are_exactly_the_rules() -> None:
    """`policy.advisory` is checked against the rule names at the edge (an unknown name used to
    be ignored, leaving the meant rule mandatory); the schema's list must follow the pack."""
    from trainstack.config.schema import load_schema  # noqa: PLC0415
    from trainstack.policy.rules import RULES  # noqa: PLC0415
    from trainstack.policy.stack_rules import STACK_RULES  # noqa: PLC0415

    advisory = load_schema("platform.schema.json")["properties"]["policy"]["properties"]["advisory"]
    assert advisory["items"]["enum"] == sorted(r.name for r in (*RULES, *STACK_RULES))
