"""The lines a reviewer reads, exactly (issue 23 #5 and #6).

Each case changes a real plan the way a pull request would and checks whole lines of the
Markdown report: what used to be unreadable (encoded strings, lists by position), missing
(group quotas, updated resources, access) or wrong (one column for two values, untouched
stacks reported as removed).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.diff.conftest import Preview, as_doc
from tests.diff.test_diff import PROD, job, replace_once, with_resources, write_plan_doc
from trainstack.cli import app
from trainstack.diff.render import to_markdown
from trainstack.diff.report import DiffReport, diff_plans
from trainstack.preview.plan import Plan

QUEUE = "kubernetes:scheduling.volcano.sh/v1beta1:Queue"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
RELEASE = "kubernetes:helm.sh/v3:Release"


def lines_of(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    return to_markdown(DiffReport([diff_plans(base, head)])).splitlines()


def resource(plan: dict[str, Any], match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    [found] = [r for r in plan["resources"] if match(r)]
    return found


def with_env(doc: dict[str, Any], env: list[dict[str, str]]) -> dict[str, Any]:
    plan = with_resources(doc, job("resnet"))
    spec = resource(plan, lambda r: r["name"] == "team-vision-job-resnet")["inputs"]["spec"]
    spec["tasks"][0]["template"]["spec"]["containers"][0]["env"] = env
    return plan


A, B = {"name": "A", "value": "1"}, {"name": "B", "value": "2"}
NCCL = {"name": "NCCL_DEBUG", "value": "INFO"}
ENV_ITEM = "spec.tasks[name=worker].template.spec.containers[name=trainer].env"


def env_added(vision: dict[str, Any], _prod: dict[str, Any]) -> tuple[Any, Any, list[str]]:
    return (
        with_env(vision, [A, B]),
        with_env(vision, [A, NCCL, B]),
        [
            f'| vision/resnet | changed | {ENV_ITEM}[name=NCCL_DEBUG] | (absent) | {{"name": '
            '"NCCL_DEBUG", "value": "INFO"} |',
            # every counted update is listed, with its field
            f"| update | Job | team-vision-job-resnet | "
            f'{ENV_ITEM}[name=NCCL_DEBUG] | (absent) | {{"name": "NCCL_DEBUG", "value": '
            '"INFO"} |',
            "<details><summary>0 created, 1 updated: 1 Job</summary>",
        ],
    )


def env_reordered(vision: dict[str, Any], _prod: dict[str, Any]) -> tuple[Any, Any, list[str]]:
    return (
        with_env(vision, [A, B]),
        with_env(vision, [B, A]),
        [f'| vision/resnet | changed | {ENV_ITEM} (order) | ["A", "B"] | ["B", "A"] |'],
    )


def group_quota(_vision: dict[str, Any], prod: dict[str, Any]) -> tuple[Any, Any, list[str]]:
    """The group's guarantee as the plan records it: the capacity output and its Queue."""
    head = copy.deepcopy(prod)
    head["outputs"]["scheduling"]["capacity"]["groups"]["research"]["guarantee"] = 48
    queue = resource(
        head, lambda r: r["type"] == QUEUE and r["name"].endswith("queue-group-research")
    )
    queue["inputs"]["spec"]["guarantee"]["resource"]["nvidia.com/gpu"] = "48"
    return (
        prod,
        head,
        [
            "| group | change | field | before | after |",
            "| research | changed | quota (guaranteed GPUs) | 40 | 48 |",
            f"| update | Queue | {queue['name']} | spec.guarantee.resource.nvidia.com/gpu "
            "| 40 | 48 |",
        ],
    )


def _set_user_data(plan: dict[str, Any], script: str) -> str:
    template = resource(
        plan, lambda r: r["type"] == TEMPLATE and "userData" in r["inputs"] and "h200" in r["name"]
    )
    template["inputs"]["userData"] = base64.b64encode(script.encode()).decode()
    return str(template["name"])


def user_data(_vision: dict[str, Any], prod: dict[str, Any]) -> tuple[Any, Any, list[str]]:
    script = "#!/bin/bash\nset -euo pipefail\nsysctl -w vm.nr_hugepages={}\necho done\n"
    base, head = copy.deepcopy(prod), copy.deepcopy(prod)
    name = _set_user_data(base, script.format(2560))
    _set_user_data(head, script.format(4096))
    return (
        base,
        head,
        [
            f"| update | LaunchTemplate | {name} | userData (base64) line 3 | "
            "sysctl -w vm.nr_hugepages=2560 | sysctl -w vm.nr_hugepages=4096 |"
        ],
    )


def _set_scheduler(plan: dict[str, Any], text: str) -> str:
    chart = resource(
        plan, lambda r: r["type"] == RELEASE and "scheduler_config_override" in json.dumps(r)
    )
    chart["inputs"]["values"]["custom"]["scheduler_config_override"] = text
    return str(chart["name"])


def scheduler(_vision: dict[str, Any], prod: dict[str, Any]) -> tuple[Any, Any, list[str]]:
    text = (
        "actions: {}\ntiers:\n- plugins:\n  - name: priority\n  - name: gang\n"
        "- plugins:\n  - name: binpack\n    arguments:\n      binpack.resources: nvidia.com/gpu\n"
        "  - name: network-topology-aware\n    arguments:\n      weight: {}\n"
    )
    base, head = copy.deepcopy(prod), copy.deepcopy(prod)
    name = _set_scheduler(base, text.format("allocate, preempt, reclaim, backfill", 10))
    _set_scheduler(head, text.format("enqueue, allocate, backfill", 20))
    field = "values.custom.scheduler_config_override (yaml)"
    return (
        base,
        head,
        [
            f"| update | Release | {name} | {field} actions | "
            "allocate, preempt, reclaim, backfill | enqueue, allocate, backfill |",
            f"| update | Release | {name} | "
            f"{field} tiers[1].plugins[name=network-topology-aware].arguments.weight | 10 | 20 |",
        ],
    )


@pytest.mark.parametrize(
    "case",
    [env_added, env_reordered, group_quota, user_data, scheduler],
    ids=lambda case: case.__name__,
)
def test_the_lines_a_reviewer_reads(
    case: Callable[..., tuple[Any, Any, list[str]]], example_plans: dict[str, Plan]
) -> None:
    vision, prod = as_doc(example_plans["vision"]), as_doc(example_plans["prod"])
    base, head, expected = case(vision, prod)
    lines = lines_of(base, head)
    missing = [line for line in expected if line not in lines]
    assert not missing, "\n".join(["missing:", *missing, "report:", *lines])


def test_a_partial_head_leaves_untouched_stacks_unchanged(
    tmp_path: Path, example_plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full base against a `preview --changed-since` head: before, every stack the head did
    not preview was reported removed ("133 to delete", stateful losses)."""
    base, head = tmp_path / "base", tmp_path / "head"
    for stack in ("dev", "prod", "vision"):
        write_plan_doc(base, as_doc(example_plans[stack]))
    changed = with_resources(as_doc(example_plans["vision"]), job("resnet"))
    write_plan_doc(head, changed)
    result = CliRunner().invoke(app, ["diff", str(base), str(head), "--project-dir", str(ROOT)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "- **vision** (team): 1 to create, 0 to update, 0 to replace, 0 to delete" in lines
    assert (
        "- unchanged (not previewed: no head plan, and the stack file is still there): dev, prod"
        in lines
    )
    assert "to delete" not in result.output.replace("0 to delete", "")
    assert "stack removed" not in result.output
    assert "⚠️" not in result.output
    # Without --project-dir, the current folder's project: the head folder is in none, and
    # every stack it did not preview read as removed (issue 41 #3).
    monkeypatch.chdir(ROOT / "stacks")
    result = CliRunner().invoke(app, ["diff", str(base), str(head)])
    assert result.exit_code == 0, result.output
    assert "stack removed" not in result.output
    # Outside a project there is no stack file to look at: a missing head plan is a removal,
    # and the note says so.
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["diff", str(base), str(head)])
    assert "- **prod** (platform) (stack removed)" in result.output
    assert result.stderr == (
        f"note: no project around the current folder or {head} to look for their stack files: "
        "dev, prod "
        "read as removed (pass --project-dir if they were not previewed)\n"
    )


def test_a_new_cluster_admin_from_another_account_is_named_with_its_policy(
    preview: Preview, example_plans: dict[str, Plan]
) -> None:
    """Issue 23 #5: before, "2 to create" and no names."""
    principal = "arn:aws:iam::444455556666:role/contractor-admin"
    head_text = replace_once(
        PROD,
        "          - arn:aws:iam::111122223333:role/platform-ci\n",
        f"          - arn:aws:iam::111122223333:role/platform-ci\n          - {principal}\n",
    )
    head_text = replace_once(
        head_text, "quota: {gpus: 40, deserved: 104}", "quota: {gpus: 48, deserved: 104}"
    )
    lines = lines_of(as_doc(example_plans["prod"]), preview("prod", prod=head_text))
    flagged = "added **⚠️ cluster admin; account 444455556666 new to this stack**"
    expected = [
        "#### Access",
        "| change | access | principal / subject | policy / role / rule | field | before | after |",
        f"| {flagged} | EKS access policy | {principal} | AmazonEKSClusterAdminPolicy "
        "(cluster-wide) |  |  |  |",
        "| added **⚠️ account 444455556666 new to this stack** | EKS access entry | "
        f"{principal} | no Kubernetes groups |  |  |  |",
        "| research | changed | quota (guaranteed GPUs) | 40 | 48 |",
    ]
    missing = [line for line in expected if line not in lines]
    assert not missing, "\n".join(["missing:", *missing, "report:", *lines])
    [summary] = [line for line in lines if line.startswith("- **prod**")]
    assert "🔑 2 access change(s), 2 flagged" in summary
