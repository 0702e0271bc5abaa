"""Volcano component: what it registers, with which parents, providers and ordering."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pulumi_kubernetes as k8s
import yaml

from tests.builders.test_scheduling import config, team
from tests.conftest import Recorded
from tests.volcano_chart import CHART_DIR, volcano_source
from trainstack.components.scheduling import Volcano, VolcanoArgs
from trainstack.config.model import Environment


def run(
    run_program: Callable[..., Recorded],
    environment: Environment = "development",
    **sched: object,
) -> Recorded:
    groups = [{"name": "research", "owners": ["r@example.com"]}]
    teams = [{**team("vision", 8, ["h100"]), "group": "research"}, team("nlp", 4, ["h200"])]
    cfg = replace(config(teams, groups, **sched), environment=environment)

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


def test_command_policy_keeps_team_commands_to_jobs(
    run_program: Callable[..., Recorded],
) -> None:
    """Issue 15 #3: a team member's Command may not target a Queue (the e2e scenario in
    tests/e2e/test_rbac.py shows Volcano acting on one); the policy is bound like the other."""
    rec = run(run_program)
    policy = rec.one(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
        "v-job-commands-policy",
    )
    rules = policy.inputs["spec"]["matchConstraints"]["resourceRules"]
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in rules] == [
        (["bus.volcano.sh"], ["commands"], ["CREATE", "UPDATE"])
    ]
    assert policy.inputs["spec"]["failurePolicy"] == "Fail"
    binding = rec.one(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding",
        "v-job-commands-binding",
    )
    assert binding.inputs["spec"]["policyName"] == "trainstack-job-commands"
    assert binding.inputs["spec"]["validationActions"] == ["Deny"]
    assert binding.inputs["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"trainstack.io/role": "team"}}
    }


def test_child_queues_depend_on_their_parent(run_program: Callable[..., Recorded]) -> None:
    """Issue 15 #5: Volcano's webhook refuses a queue whose parent it cannot find yet."""
    rec = run(run_program)
    queues = {
        q.inputs["metadata"]["name"]: q
        for q in rec.of_type("kubernetes:scheduling.volcano.sh/v1beta1:Queue")
    }
    for queue in queues.values():
        parent = queue.inputs["spec"]["parent"]
        if parent in queues:
            assert queues[parent].urn in queue.dependencies, queue.name
    assert queues["trainstack"].urn in queues["group-research"].dependencies
    assert queues["group-research"].urn in queues["vision"].dependencies
    assert queues["trainstack"].urn in queues["nlp"].dependencies


def _discovery(rec: Recorded) -> object:
    release = rec.one("kubernetes:helm.sh/v3:Release", "v-chart")
    return release.inputs["values"]["custom"].get("controller_config_override")


def test_topology_can_be_switched_off(run_program: Callable[..., Recorded]) -> None:
    """One source of HyperNodes at a time: the platform's own (pools), or Volcano's
    discovery from the nodes' labels (the default on AWS with such instance types), or none."""
    hypernode = "kubernetes:topology.volcano.sh/v1alpha1:HyperNode"
    pools = run(run_program, topology={"source": "pools"})
    assert pools.of_type(hypernode)
    assert _discovery(pools) is None
    labels = run(run_program)
    assert not labels.of_type(hypernode)
    assert _discovery(labels) is not None
    off = run(run_program, topologyAware=False)
    assert not off.of_type(hypernode)
    assert _discovery(off) is None


def test_volcano_chart_ships_its_crds_as_release_templates() -> None:
    """The evidence for protecting the release (volcano.sh/volcano@v1.15.1, module cache).

    No `crds/` folder (which Helm installs once and never deletes): every CRD is a template
    (`templates/*_v1*_*.yaml` include `crd/bases/*.yaml`), without a
    `helm.sh/resource-policy: keep` annotation and unconditionally (no value leaves them out). So
    `helm uninstall` (what deleting or replacing the Release runs) deletes the CRDs, and the
    API server deletes every Job, Queue, PodGroup and HyperNode with them.
    """
    chart = volcano_source() / CHART_DIR
    assert not (chart / "crds").exists()
    templates = {p.name: p.read_text(encoding="utf-8") for p in (chart / "templates").iterdir()}
    for crd in ("batch.volcano.sh_jobs", "scheduling.volcano.sh_queues",
                "scheduling.volcano.sh_podgroups", "topology.volcano.sh_hypernodes"):  # fmt: skip
        assert any(f"{crd}.yaml" in text and "if " not in text for text in templates.values()), crd
        assert "resource-policy" not in (chart / "crd" / "bases" / f"{crd}.yaml").read_text()


def test_the_release_is_never_uninstalled_by_pulumi(run_program: Callable[..., Recorded]) -> None:
    """Deleting or replacing the Release (a new name or namespace replaces it:
    pulumi/pulumi-kubernetes provider/pkg/provider/helm_release.go `forceNewFields`) runs
    `helm uninstall`, which takes the CRDs and every Volcano Job and Queue with it."""
    release = run(run_program).one("kubernetes:helm.sh/v3:Release", "v-chart")
    assert release.options == {"retainOnDelete": True}  # development stacks can be destroyed
    production = run(run_program, environment="production").one(
        "kubernetes:helm.sh/v3:Release", "v-chart"
    )
    assert production.options == {"protect": True, "retainOnDelete": True}


def test_a_child_queue_takes_its_parent_from_the_parent_resource(
    run_program: Callable[..., Recorded],
) -> None:
    """`pulumi preview` dry-runs each create on the API server, Volcano's webhook included,
    unless an input is unknown (pulumi-kubernetes provider.go Create, `skipPreview :=
    hasComputedValue(newInputs) || ...`): a child's spec.parent must come from its parent
    queue's outputs, or the first preview of a hierarchy fails ("failed to get parent queue";
    found by tests/e2e/test_pulumi_stacks.py)."""
    rec = run(run_program)
    queues = {
        q.inputs["metadata"]["name"]: q
        for q in rec.of_type("kubernetes:scheduling.volcano.sh/v1beta1:Queue")
    }
    for name, queue in queues.items():
        parent = queue.inputs["spec"].get("parent")
        if parent in queues:
            assert queue.property_dependencies.get("spec") == [queues[parent].urn], name
    assert queues["vision"].inputs["spec"]["parent"] == "group-research"
