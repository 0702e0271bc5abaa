"""Platform composition, platform services and the team stack component."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pulumi
import pytest

from tests.conftest import Recorded
from trainstack import outputs as out
from trainstack.components.platform import Platform
from trainstack.components.team import TeamStack, UnknownTeamError
from trainstack.config import PlatformConfig, TeamStackConfig, load_stack_file

FIXTURES = Path(__file__).parent.parent / "config" / "fixtures" / "valid"


def load(name: str) -> PlatformConfig:
    config = load_stack_file(FIXTURES / name)
    assert isinstance(config, PlatformConfig)
    return config


def test_existing_cluster_creates_nothing_on_aws(run_program: Callable[..., Recorded]) -> None:
    cfg = load("existing-cluster.yaml")
    rec = run_program(lambda: Platform("p", cfg))
    assert not [r for r in rec.records if r.type.startswith(("aws:", "pulumi:providers:aws"))]
    provider = rec.one("pulumi:providers:kubernetes", "p-cluster-k8s")
    assert provider.inputs["context"] == "lab"
    parent = rec.parent_of(provider)
    assert parent is not None
    assert parent.type == "trainstack:k8s:ExistingCluster"


def test_platform_tree_and_kubernetes_children(run_program: Callable[..., Recorded]) -> None:
    cfg = load("minimal-aws.yaml")
    rec = run_program(lambda: Platform("p", cfg), region="eu-west-1")
    top = rec.one("trainstack:platform:Platform", "p")
    assert {(c.type, c.name) for c in rec.children_of(top)} == {
        ("pulumi:providers:aws", "p-aws"),
        ("trainstack:aws:Network", "p-network"),
        ("trainstack:aws:EksCluster", "p-cluster"),
        ("trainstack:k8s:PlatformServices", "p-services"),
        ("trainstack:k8s:Volcano", "p-volcano"),
        ("trainstack:k8s:DeadlineEnforcer", "p-deadlines"),
        ("trainstack:k8s:Monitoring", "p-monitoring"),
        ("trainstack:storage:PlatformStorage", "p-storage"),
        ("trainstack:logs:LogCollector", "p-logs"),  # a checkpoint bucket by default
        ("trainstack:team:TeamResources", "p-team-vision"),
        ("trainstack:policy:AdmissionPolicies", "p-admission"),
    }
    aws_provider = rec.one("pulumi:providers:aws", "p-aws")
    assert aws_provider.inputs["region"] == "eu-west-1"
    assert json.loads(aws_provider.inputs["defaultTags"]) == {
        "tags": {"trainstack:stack": "minimal-aws", "trainstack:managed-by": "trainstack"}
    }
    services = rec.one("trainstack:k8s:PlatformServices", "p-services")
    kube = [
        r for r in rec.records if r.type.startswith("kubernetes:") and r.parent_urn == services.urn
    ]
    assert {(r.type, r.inputs["metadata"]["name"]) for r in kube} == {
        ("kubernetes:core/v1:Namespace", "trainstack-system"),
        ("kubernetes:core/v1:Namespace", "vision"),
        ("kubernetes:core/v1:ConfigMap", "trainstack-platform"),
        ("kubernetes:storage.k8s.io/v1:StorageClass", "gp3-encrypted"),
    }
    for resource in kube:
        assert rec.parent_of(resource) is services
        assert rec.provider_name(resource) == "p-cluster-k8s", resource.name
        assert resource.inputs["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "trainstack"
    team_ns = rec.one("kubernetes:core/v1:Namespace", "p-services-ns-vision")
    assert team_ns.inputs["metadata"]["labels"]["trainstack.io/team"] == "vision"
    storage = rec.one("kubernetes:storage.k8s.io/v1:StorageClass")
    assert storage.inputs["parameters"]["encrypted"] == "true"


def team_program() -> None:
    cfg = TeamStackConfig(stack="t", team="vision", platform_stack="acme/trainstack/prod")
    team = TeamStack("team-vision", cfg)
    pulumi.export("namespace", team.namespace)


def test_team_stack_reads_platform_outputs(run_program: Callable[..., Recorded]) -> None:
    outputs = {
        out.team_output("vision"): json.dumps({"name": "vision", "namespace": "ml-vision"}),
        out.TEAM_NAMESPACES: {"vision": "ml-vision"},
        out.KUBECONFIG: "{}",
        out.CLUSTER_NAME: "c",
    }
    rec = run_program(
        team_program, stack_outputs={"acme/trainstack/prod": (outputs, [out.KUBECONFIG])}
    )
    ref = rec.one("pulumi:pulumi:StackReference", "team-vision-platform")
    assert ref.inputs["name"] == "acme/trainstack/prod"
    provider = rec.one("pulumi:providers:kubernetes", "team-vision-k8s")
    assert provider.inputs["namespace"] == "ml-vision"
    assert rec.result.outputs["namespace"] == "ml-vision"


def test_team_stack_rejects_a_team_missing_from_the_registry(
    run_program: Callable[..., Recorded],
) -> None:
    outputs = {
        out.team_output("nlp"): json.dumps({"name": "nlp", "namespace": "nlp"}),
        out.team_output("speech"): json.dumps({"name": "speech", "namespace": "speech"}),
        out.TEAM_NAMESPACES: {"nlp": "nlp", "speech": "speech"},
    }
    with pytest.raises(
        UnknownTeamError, match=r"team 'vision' is not in the registry .*teams: nlp, speech"
    ):
        run_program(team_program, stack_outputs={"acme/trainstack/prod": (outputs, [])})


def test_team_stack_names_an_outdated_platform_stack(
    run_program: Callable[..., Recorded],
) -> None:
    """A platform deployed before `team/<name>` outputs: say so, not "unknown team"."""
    outputs = {out.TEAM_NAMESPACES: {"vision": "vision"}}
    with pytest.raises(UnknownTeamError, match=r"no 'team/vision' output: an older trainstack"):
        run_program(team_program, stack_outputs={"acme/trainstack/prod": (outputs, [])})
