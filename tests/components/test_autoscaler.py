"""Cluster Autoscaler (issue 17 #2): a GPU pool at zero scales up for a pending job.

Each rule below is from kubernetes/autoscaler at cluster-autoscaler-1.33.0 and the chart at
cluster-autoscaler-chart-9.51.0 (builders/autoscaler.py; docs/aws.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from trainstack.builders import autoscaler as a
from trainstack.builders.network import PRIVATE_CLUSTER_ENDPOINTS
from trainstack.builders.pools import GPU_TAINT
from trainstack.config import PlatformConfig, load_stack_file
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.render import render
from trainstack.jobs.spec import build
from trainstack.preview.plan import Plan


def dev() -> PlatformConfig:
    cfg = load_stack_file(ROOT / "stacks" / "Pulumi.dev.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


def quantity(value: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "m": 1e-3}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def whole_node_job(stack: str, team: str, pool: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "trainstack.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "scale-up", "team": team},
        "spec": {
            "image": f"registry.example.com/{team}/train:1.0",
            "command": ["python", "-m", "train"],
            "pool": pool,
            "workers": {"replicas": 2, "gpus": gpus, "cpu": "4", "memory": "16Gi"},
            "checkpoint": {"intervalSeconds": 600},
            "maxDurationHours": 24,
        },
    }


def fits(pod: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """Why `node` could not take `pod` (the predicates CA simulates): resources, node
    selector, taints. Empty when it fits."""
    problems = []
    for container in pod["containers"]:
        for name, amount in container["resources"].get("requests", {}).items():
            have = node["capacity"].get(name)
            if have is None or quantity(str(amount)) > quantity(have):
                problems.append(f"{name}: requests {amount}, template has {have}")
    for key, value in pod.get("nodeSelector", {}).items():
        if node["labels"].get(key) != value:
            problems.append(f"nodeSelector {key}={value}")
    for taint in node["taints"]:
        if not any(
            t.get("key") == taint["key"] and t.get("effect") == taint["effect"]
            for t in pod.get("tolerations", [])
        ):
            problems.append(f"taint {taint['key']}")
    return problems


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_node_templates_take_the_jobs_the_job_layer_renders(
    example_plans: dict[str, Plan], stack: str
) -> None:
    """For every pool, a job using whole nodes, rendered by the job layer from the plan, fits
    the node CA imagines at zero. Before, EFA and hugepages were on no template, so an EFA
    job never scaled its pool up (and no autoscaler was deployed at all)."""
    cfg = load_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    assert isinstance(cfg, PlatformConfig)
    view = PlatformView(example_plans[stack].outputs)
    for pool in cfg.gpu_pools:
        team = next(t for t in cfg.registry.teams if pool.name in t.pools)
        template = a.node_template(cfg, pool)
        # A sliced pool (issue 47) has no whole GPU on its template: a replica per slice.
        gpus = int(template["capacity"].get("nvidia.com/gpu", 1))
        doc = whole_node_job(stack, team.name, pool.name, gpus)
        if pool.sharing is not None:
            doc["spec"]["workers"]["gpuMemory"] = "8Gi"
        job = render(build(doc, "t"), view)
        for task in job["spec"]["tasks"]:
            pod = task["template"]["spec"]
            assert fits(pod, template) == [], (pool.name, task["name"])
            annotations = task["template"]["metadata"]["annotations"]
            assert annotations[a.SAFE_TO_EVICT] == "false"


def test_efa_and_hugepages_are_on_the_node_group_tags() -> None:
    cfg = load_stack_file(ROOT / "stacks" / "Pulumi.prod.yaml")
    assert isinstance(cfg, PlatformConfig)
    pool = cfg.pool("h200-burst")
    assert pool is not None
    assert a.node_group_tags(pool) == {
        "k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa": "16",
        "k8s.io/cluster-autoscaler/node-template/resources/hugepages-2Mi": "5120Mi",
    }
    assert a.node_template(cfg, pool)["taints"] == [GPU_TAINT]


def test_dev_previews_a_pool_at_zero_with_the_autoscaler(
    example_plans: dict[str, Plan],
) -> None:
    """The dev example: l40s-dev at min 0, and the autoscaler deployed to bring it up."""
    cfg = dev()
    assert cfg.gpu_pools[0].aws is not None
    assert cfg.gpu_pools[0].aws.size.min == 0
    plan = example_plans["dev"]
    release = next(
        r
        for r in plan.resources
        if r.type == "kubernetes:helm.sh/v3:Release"
        and r.inputs.get("name") == "cluster-autoscaler"
    )
    assert release.inputs["version"] == a.CHART["version"]
    values = release.inputs["values"]
    assert values["autoDiscovery"]["clusterName"] == cfg.cluster_name
    assert values["rbac"]["serviceAccount"]["name"] == a.SERVICE_ACCOUNT
    association = next(
        r
        for r in plan.resources
        if r.type == "aws:eks/podIdentityAssociation:PodIdentityAssociation"
        and r.inputs.get("serviceAccount") == a.SERVICE_ACCOUNT
    )
    assert association.inputs["namespace"] == a.NAMESPACE
    policy = next(
        json.loads(r.inputs["policy"])
        for r in plan.resources
        if r.type == "aws:iam/rolePolicy:RolePolicy" and "autoscaler" in r.name
    )
    actions = {x for s in policy["Statement"] for x in s["Action"]}
    assert {"autoscaling:SetDesiredCapacity", "eks:DescribeNodegroup"} <= actions
    nodes = next(
        r
        for r in plan.resources
        if r.type == "aws:eks/nodeGroup:NodeGroup" and r.inputs.get("nodeGroupName") == "l40s-dev"
    )
    assert nodes.options["ignoreChanges"] == ["scalingConfig.desiredSize"]


def upstream(path: str) -> str:
    """A file of kubernetes/autoscaler at a pinned tag, from a clone named by
    TRAINSTACK_AUTOSCALER_REPO (read, never copied here); skips without one."""
    default = "/work/.mirror/kubernetes+autoscaler/repo"
    repo = Path(os.environ.get("TRAINSTACK_AUTOSCALER_REPO", default))
    if not repo.exists():
        pytest.skip(f"no kubernetes/autoscaler clone at {repo}; set TRAINSTACK_AUTOSCALER_REPO")
    shown = subprocess.run(
        ["git", f"--git-dir={repo}", "show", path],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        pytest.skip(f"{repo} lacks {path}: {shown.stderr.strip()}")
    return shown.stdout


def test_values_use_only_keys_of_the_pinned_chart_and_flags_of_its_app() -> None:
    chart = yaml.safe_load(
        upstream(
            f"cluster-autoscaler-chart-{a.CHART['version']}:charts/cluster-autoscaler/values.yaml"
        )
    )
    flags = upstream("cluster-autoscaler-1.33.0:cluster-autoscaler/config/flags/flags.go")
    assert (
        yaml.safe_load(
            upstream(
                f"cluster-autoscaler-chart-{a.CHART['version']}:charts/cluster-autoscaler/Chart.yaml"
            )
        )["appVersion"]
        == "1.33.0"
    )

    def missing(values: dict[str, Any], known: dict[str, Any], path: str = "") -> list[str]:
        out = []
        for key, value in values.items():
            if key not in known:
                out.append(path + key)
            elif isinstance(value, dict) and isinstance(known[key], dict) and known[key]:
                # free-form maps ({} in the chart: nodeSelector, annotations) take any key
                out += missing(value, known[key], f"{path}{key}.")
        return out

    values = a.values(dev(), "us-west-2")
    extra_args = values.pop("extraArgs")
    assert missing(values, chart) == []
    assert "extraArgs" in chart
    # extraArgs become --flags (templates/deployment.yaml): each must be a flag of CA 1.33.0
    assert [f for f in extra_args if f'("{f}"' not in flags] == []


def test_a_private_cluster_has_an_endpoint_for_every_service_the_autoscaler_calls() -> None:
    """issue 39 #10: the autoscaler calls eks:DescribeNodegroup (aws_wrapper.go
    getManagedNodegroupInfo at cluster-autoscaler-1.33.0) to build a pool-at-zero's template
    node; a private cluster without the `eks` endpoint never scales an EFA pool up. Every
    service of its role's policy is in the endpoint table, and docs/aws.md prints that table."""
    services = {
        action.split(":", 1)[0]
        for statement in a.iam_policy("c")["Statement"]
        for action in statement["Action"]
    }
    assert services == {"autoscaling", "ec2", "eks"}
    assert services <= set(PRIVATE_CLUSTER_ENDPOINTS)
    text = (ROOT / "docs" / "aws.md").read_text()
    section = text[text.index("## Private clusters: interface endpoints") :]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows == [f"| `{k}` | {v} |" for k, v in PRIVATE_CLUSTER_ENDPOINTS.items()]
