"""Volcano component: what it registers, with which parents, providers and ordering."""

from __future__ import annotations

from collections.abc import Callable

import pulumi_kubernetes as k8s
import yaml

from components.scheduling import Volcano, VolcanoArgs
from tests.builders.test_scheduling import config, team
from tests.conftest import Recorded


def run(run_program: Callable[..., Recorded], **sched: object) -> Recorded:
    groups = [{"name": "research", "owners": ["r@example.com"]}]
    teams = [{**team("vision", 8, ["h100"]), "group": "research"}, team("nlp", 4, ["h200"])]
    cfg = config(teams, groups, **sched)

    def program() -> None:
        Volcano("v", VolcanoArgs(cfg, k8s.Provider("k8s")))

    return run_program(program)


def test_chart_queues_and_order(run_program: Callable[..., Recorded]) -> None:
    rec = run(run_program)
    component = rec.one("trainstack:k8s:Volcano", "v")
    release = rec.one("kubernetes:helm.sh/v3:Release", "v-chart")
    assert release.inputs["chart"] == "volcano"
    assert release.inputs["version"] == "1.15.1"
    assert release.inputs["repositoryOpts"] == {"repo": "https://volcano-sh.github.io/helm-charts"}
    assert release.inputs["namespace"] == "volcano-system"
    conf = yaml.safe_load(release.inputs["values"]["custom"]["scheduler_config_override"])
    assert conf["actions"] == "allocate, preempt, reclaim, backfill"
    queues = rec.of_type("kubernetes:scheduling.volcano.sh/v1beta1:Queue")
    assert sorted(q.inputs["metadata"]["name"] for q in queues) == [
        "group-research",
        "nlp",
        "trainstack",
        "vision",
    ]
    for resource in rec.children_of(component):
        assert rec.provider_name(resource) == "k8s", resource.name
    for queue in queues:
        assert release.urn in queue.dependencies  # CRDs come with the chart
    classes = rec.of_type("kubernetes:scheduling.k8s.io/v1:PriorityClass")
    assert {c.inputs["metadata"]["name"]: c.inputs["value"] for c in classes} == {
        "trainstack-critical": 100000,
        "trainstack-high": 10000,
        "trainstack-normal": 1000,
        "trainstack-preemptible": 100,
    }


def test_queue_ownership_policy_is_bound_to_team_namespaces(
    run_program: Callable[..., Recorded],
) -> None:
    rec = run(run_program)
    policy = rec.one(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
        "v-queue-ownership-policy",
    )
    rules = policy.inputs["spec"]["matchConstraints"]["resourceRules"]
    assert {(r["apiGroups"][0], r["resources"][0]) for r in rules} == {
        ("batch.volcano.sh", "jobs"),
        ("scheduling.volcano.sh", "podgroups"),
    }
    binding = rec.one(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding",
        "v-queue-ownership-binding",
    )
    assert binding.inputs["spec"]["validationActions"] == ["Deny"]
    assert binding.inputs["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"trainstack.io/role": "team"}}
    }


def test_topology_can_be_switched_off(run_program: Callable[..., Recorded]) -> None:
    assert run(run_program).of_type("kubernetes:topology.volcano.sh/v1alpha1:HyperNode")
    assert not run(run_program, topologyAware=False).of_type(
        "kubernetes:topology.volcano.sh/v1alpha1:HyperNode"
    )
