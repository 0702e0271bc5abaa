"""`trainstack diff`: pairs of real previews that differ, and what the report says about them."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.diff.conftest import Preview, as_doc
from tests.test_preview import make_project
from trainstack.cli import app
from trainstack.config.project import Project
from trainstack.diff.plans import ABSENT, VOLCANO_JOB, PlanError, changed_paths, load_plan
from trainstack.diff.render import MARKER, to_json, to_markdown
from trainstack.diff.report import DiffReport, StackDiff, diff_plans
from trainstack.outputs import team_slices
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan

runner = CliRunner()
PROD = (ROOT / "stacks" / "Pulumi.prod.yaml").read_text()
VISION = (ROOT / "stacks" / "Pulumi.vision.yaml").read_text()

GUARANTEES = "Σ guarantees ≤ firm capacity (all pools; elastic GPUs back no guarantee)"
DESERVED = "Σ deserved ≤ total capacity (all pools)"


@pytest.fixture(scope="module")
def prod_base() -> dict[str, Any]:
    return as_doc(Previewer(Project.find(ROOT)).preview("prod"))


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} must occur once in the example stack"
    return text.replace(old, new)


def report_for(base: dict[str, Any], head: dict[str, Any]) -> tuple[StackDiff, str]:
    diff = diff_plans(base, head)
    return diff, to_markdown(DiffReport([diff]))


def test_identical_plans_report_no_changes(example_plans: dict[str, Plan]) -> None:
    for stack, plan in example_plans.items():
        doc = as_doc(plan)
        diff, markdown = report_for(doc, copy.deepcopy(doc))
        assert not diff.has_changes, stack
        assert diff.status == "unchanged"
        assert diff.counts["same"] == sum(1 for r in doc["resources"] if r["custom"])
        assert [diff.teams, diff.storage, diff.jobs, diff.resources] == [[], [], [], []]
        assert (
            markdown == f"{MARKER}\n## trainstack plan diff\n\nNo changes (1 stack(s): {stack}).\n"
        )


def legacy_outputs(doc: dict[str, Any]) -> dict[str, Any]:
    """The plan as trainstack wrote it before `team/<name>` outputs: per-team data in shared
    maps (a pull request's base plan, the first time)."""
    old = copy.deepcopy(doc)
    outputs = old["outputs"]
    slices = team_slices(outputs)
    for name in slices:
        del outputs[f"team/{name}"]
    outputs["registry"]["teams"] = [
        {k: v for k, v in t.items() if k not in ("scheduling", "storage")} for t in slices.values()
    ]
    outputs["scheduling"]["teams"] = {n: t["scheduling"] for n, t in slices.items()}
    return old


def test_plans_from_before_team_outputs_compare_alike(prod_base: dict[str, Any]) -> None:
    base = legacy_outputs(prod_base)
    assert not any(k.startswith("team/") for k in base["outputs"])
    diff, _ = report_for(base, prod_base)
    assert diff.teams == []
    assert len(diff.capacity.checks) >= 2
    assert all(c.ok and c.was_ok is True for c in diff.capacity.checks)


def test_quota_cut_is_reported_per_team(preview: Preview, prod_base: dict[str, Any]) -> None:
    head_text = replace_once(
        PROD,
        "quota: {gpus: 16, deserved: 40, borrowLimit: 24}",
        "quota: {gpus: 8, deserved: 32, borrowLimit: 8}",
    )
    diff, markdown = report_for(prod_base, preview("prod", prod=head_text))
    [vision] = diff.teams
    assert vision.key == "vision"
    assert vision.status == "changed"
    changes = {c.field: (c.before, c.after) for c in vision.changes}
    assert changes == {
        "quota (guaranteed GPUs)": (16, 8),
        "deserved GPUs": (40, 32),
        "borrowLimit GPUs": (24, 8),
        "capability GPUs": (64, 40),
    }
    assert "| vision | changed | quota (guaranteed GPUs) | 16 | 8 |" in markdown
    assert "| vision | changed | borrowLimit GPUs | 24 | 8 |" in markdown
    # Queues change in place; the registry ConfigMap is replaced (pulumi-kubernetes replaces
    # ConfigMaps on data changes); nothing stateful is touched and every check still holds.
    assert [(r.action, r.name) for r in diff.resources] == [
        ("replace", "trainstack-prod-services-registry")
    ]
    # Issue 41 #3: the registry's JSON document was in the reason whole, before and after.
    assert (
        "| replace | kubernetes:core/v1:ConfigMap | trainstack-prod-services-registry | "
        "data.registry.json (json) teams[name=vision].quota.gpus 16 → 8: data forces replacement |"
    ) in markdown.splitlines()
    assert diff.counts["delete"] == 0
    assert diff.counts["update"] >= 1
    assert not diff.stateful_losses
    assert not diff.capacity.over
    assert "⛔" not in markdown
    # The group's guarantee (40) is unchanged: its headroom over its teams grows by vision's 8,
    # so what the queues hold firm (teams and headroom, 48) does not move.
    assert "| guaranteed |" not in markdown
    checks = {c.name: (c.need, c.available, c.was_ok) for c in diff.capacity.checks}
    assert checks == {GUARANTEES: (48, 56, True), DESERVED: (128, 132, True)}


@pytest.mark.parametrize("both", [True, False], ids=["group-and-team", "team-first"])
def test_lowering_a_group_with_its_team_is_flagged(
    preview: Preview, prod_base: dict[str, Any], both: bool
) -> None:
    """Issue 15 #5: the engine lands a parent queue before its children, and Volcano refuses
    a parent lowered below its children's current values; lowering the team alone first, then
    the group, passes."""
    head_text = replace_once(
        PROD,
        "quota: {gpus: 16, deserved: 40, borrowLimit: 24}",
        "quota: {gpus: 8, deserved: 24, borrowLimit: 24}",
    )
    if both:
        head_text = replace_once(
            head_text, "quota: {gpus: 40, deserved: 104}", "quota: {gpus: 24, deserved: 80}"
        )
    diff, markdown = report_for(prod_base, preview("prod", prod=head_text))
    over = sorted((c.name.split(":")[0], c.need, c.available) for c in diff.capacity.over)
    if both:
        # research's teams hold 32 guaranteed and 96 deserved until vision's update lands
        assert over == [("queue group-research", 32, 24), ("queue group-research", 96, 80)]
        assert "⛔" in markdown
        assert "lower the teams in an earlier update" in markdown
    else:
        assert not over, over


def test_pool_shrink_below_guarantees_is_flagged(
    preview: Preview, prod_base: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The config loader refuses this change; the diff must catch it on its own too (plans
    # from an older trainstack, a check that was bypassed), so switch the loader's check off.
    monkeypatch.setattr("trainstack.config.loader.capacity_issues", lambda _cfg: [])
    head_text = replace_once(PROD, "instanceCount: 4}", "instanceCount: 2}")
    head_text = replace_once(
        head_text, "size: {min: 4, desired: 4, max: 4}", "size: {min: 2, desired: 2, max: 2}"
    )
    diff, markdown = report_for(prod_base, preview("prod", prod=head_text))
    [pool] = diff.capacity.pools
    assert pool.key == "h100-reserved"
    assert {c.field: (c.before, c.after) for c in pool.changes} == {
        "GPUs": (32, 16),
        "firm GPUs": (32, 16),
        "maxNodes": (4, 2),
    }
    # Every claim competes for every firm GPU (the block has none): one shortfall, the sum.
    over = {c.name: (c.need, c.available, c.was_ok) for c in diff.capacity.over}
    assert over == {GUARANTEES: (48, 40, True), DESERVED: (128, 116, True)}
    assert f"| {GUARANTEES} | 48 | 40 | ⛔ **OVER** (was ok) |" in markdown
    assert "⛔ **2 capacity check(s) over**" in markdown
    assert "| h100-reserved | changed | GPUs | 32 | 16 |" in markdown
    assert "| firm | 56 | 40 |" in markdown
    # The node group's scaling changes in place: a shrink is not a replacement.
    assert diff.counts["replace"] == 0
    assert not diff.stateful_losses


def test_a_new_pre_pulled_image_is_named_on_its_pool(
    preview: Preview, prod_base: dict[str, Any]
) -> None:
    """An image the pools' nodes will pull (a configured one here; a team's new job does the
    same through its spec) reads as an image added to each pool, not as a DaemonSet's
    containers rewritten (docs/prepull.md)."""
    image = "registry.example.com/trainstack/eval@sha256:" + "e" * 64
    head_text = replace_once(
        PROD,
        "      images:\n",
        f"      images:\n        - {{image: {image}, pools: [h200-burst]}}\n",
    )
    diff, markdown = report_for(prod_base, preview("prod", prod=head_text))
    [pool] = diff.capacity.pools
    assert pool.key == "h200-burst"
    assert [(c.field, c.before, c.after) for c in pool.changes] == [
        ("pre-pulled images added", ABSENT, [image])
    ]
    assert "pre-pulled images added" in markdown


def test_fsx_capacity_decrease_forces_replacement(
    preview: Preview, prod_base: dict[str, Any]
) -> None:
    head_text = replace_once(PROD, "storageCapacityGiB: 28800", "storageCapacityGiB: 24000")
    diff, markdown = report_for(prod_base, preview("prod", prod=head_text))
    lustre = [r for r in diff.resources if r.type.endswith("LustreFileSystem")]
    assert len(lustre) == 1
    assert lustre[0].action == "replace"
    assert lustre[0].stateful
    assert any("storageCapacity decreased" in why for why in lustre[0].reasons)
    assert lustre[0] in diff.stateful_losses
    assert "#### ⚠️ Stateful resources replaced or deleted" in markdown
    assert (
        "- **REPLACE** `aws:fsx/lustreFileSystem:LustreFileSystem` `trainstack-prod-storage-lustre`"
        ": file system: datasets and checkpoints lost. storageCapacity 28800 → 24000: "
        "storageCapacity decreased (FSx for Lustre can only grow in place)"
    ) in markdown
    # The claims' size follows the file system; a claim's spec is immutable in Kubernetes.
    claims = [r for r in diff.resources if r.type == "kubernetes:core/v1:PersistentVolumeClaim"]
    assert claims
    assert all(r.action == "replace" and r.stateful for r in claims)
    # Issue 23 #6: each replaced resource appears once, with its values and why, not again
    # in the Storage section and the replaced table.
    for resource in [*claims, *lustre]:
        assert markdown.count(resource.name) == 1, resource.name
    assert (
        "- **REPLACE** `kubernetes:core/v1:PersistentVolumeClaim` "
        "`trainstack-prod-storage-vision-checkpoints-pvc`: volume claim: pods using it lose their "
        "volume. spec.resources.requests.storage 28800Gi → 24000Gi: spec forces replacement"
    ) in markdown
    assert {e.key for e in diff.storage} == {
        f"PersistentVolume trainstack-prod-storage-{team}-{claim}-pv"
        for team in ("nlp", "recsys", "vision")
        for claim in ("checkpoints", "datasets")
    } | {"PersistentVolume trainstack-prod-storage-root-pv"}
    assert "#### Replaced or deleted resources\n\nOnly the stateful ones above." in markdown


def test_fsx_capacity_increase_is_in_place(preview: Preview, prod_base: dict[str, Any]) -> None:
    head_text = replace_once(PROD, "storageCapacityGiB: 28800", "storageCapacityGiB: 31200")
    diff, _ = report_for(prod_base, preview("prod", prod=head_text))
    assert not [r for r in diff.resources if r.type.endswith("LustreFileSystem")]


def test_fsx_deployment_type_change_forces_replacement(
    preview: Preview, prod_base: dict[str, Any]
) -> None:
    head_text = replace_once(PROD, "deploymentType: PERSISTENT_2", "deploymentType: SCRATCH_2")
    head_text = replace_once(head_text, "        perUnitStorageThroughput: 500\n", "")
    diff, markdown = report_for(prod_base, preview("prod", prod=head_text))
    [lustre] = [r for r in diff.resources if r.type.endswith("LustreFileSystem")]
    assert lustre.action == "replace"
    assert (
        "deploymentType PERSISTENT_2 → SCRATCH_2: deploymentType forces replacement"
        in lustre.reasons
    )
    assert "deploymentType" in markdown
    assert "PERSISTENT_2" in markdown
    assert "SCRATCH_2" in markdown


# -- jobs -------------------------------------------------------------------------------


def job(name: str, replicas: int = 2, gpus: int = 8, image: str = "trainer:1") -> dict[str, Any]:
    """A Volcano Job resource as the job layer registers it (inputs = the manifest)."""
    container = {
        "image": image,
        "name": "trainer",
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
    }
    return {
        "custom": True,
        "name": f"team-vision-job-{name}",
        "parent": "trainstack:team:TeamStack::team-vision",
        "provider": "pulumi:providers:kubernetes::team-vision-k8s",
        "type": VOLCANO_JOB,
        "inputs": {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {
                "labels": {"trainstack.io/job": name},
                "name": name,
                "namespace": "vision",
            },
            "spec": {
                "minAvailable": replicas,
                "queue": "vision",
                "schedulerName": "volcano",
                "tasks": [
                    {
                        "name": "worker",
                        "replicas": replicas,
                        "template": {"spec": {"containers": [container]}},
                    }
                ],
            },
        },
    }


def with_resources(plan: dict[str, Any], *extra: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(plan)
    doc["resources"] = sorted([*doc["resources"], *extra], key=lambda r: (r["type"], r["name"]))
    return doc


def test_jobs_added_removed_and_changed(example_plans: dict[str, Plan]) -> None:
    vision = as_doc(example_plans["vision"])
    base = with_resources(vision, job("resnet"), job("vit"))
    head = with_resources(vision, job("resnet", replicas=4), job("llama", replicas=16))
    diff, markdown = report_for(base, head)
    jobs = {j.key: j for j in diff.jobs}
    assert set(jobs) == {"vision/llama", "vision/resnet", "vision/vit"}
    assert jobs["vision/llama"].status == "added"
    assert jobs["vision/llama"].summary == {
        "queue": "vision",
        "GPUs": 128,
        "tasks": 1,
        "priorityClassName": None,
    }
    assert jobs["vision/vit"].status == "removed"
    assert jobs["vision/vit"].summary["GPUs"] == 16
    resnet = jobs["vision/resnet"]
    assert resnet.status == "changed"
    assert [(c.field, c.before, c.after) for c in resnet.changes] == [
        ("GPUs", 16, 32),
        ("spec.minAvailable", 2, 4),
        ("spec.tasks[name=worker].replicas", 2, 4),  # by name, not position (issue 23 #6)
    ]
    assert "| vision/llama | added |  |  | queue: vision, GPUs: 128, tasks: 1" in markdown
    assert "| vision/vit | removed |  | queue: vision, GPUs: 16" in markdown
    assert "| vision/resnet | changed | spec.tasks[name=worker].replicas | 2 | 4 |" in markdown
    # Before and after in their own columns (issue 23 #6: both were in one).
    assert "| vision/resnet | changed | GPUs | 16 | 32 |" in markdown
    assert diff.counts["create"] == 1
    assert diff.counts["delete"] == 1
    assert "Team stack: quotas live in the platform stack." in markdown


def test_no_jobs_means_no_job_section_rows(example_plans: dict[str, Plan]) -> None:
    vision = as_doc(example_plans["vision"])
    diff, markdown = report_for(with_resources(vision, job("a")), with_resources(vision, job("a")))
    assert not diff.has_changes
    assert "No changes" in markdown


# -- policy -----------------------------------------------------------------------------


def violation(rule: str, resource: str, level: str = "mandatory") -> dict[str, str]:
    return {"rule": rule, "resource": resource, "message": f"{rule} on {resource}", "level": level}


def test_new_and_fixed_policy_violations(prod_base: dict[str, Any]) -> None:
    base, head = copy.deepcopy(prod_base), copy.deepcopy(prod_base)
    base["policy"] = {"violations": [violation("bucket-public", "b1"), violation("old", "x")]}
    head["policy"] = {
        "violations": [
            violation("bucket-public", "b1"),
            violation("gpu-quota", "vision", "advisory"),
        ]
    }
    diff, markdown = report_for(base, head)
    assert diff.has_changes
    assert [(v.rule, v.resource, v.level) for v in diff.policy.new] == [
        ("gpu-quota", "vision", "advisory")
    ]
    assert [(v.rule, v.resource) for v in diff.policy.fixed] == [("old", "x")]
    assert "| new | advisory | gpu-quota | vision | gpu-quota on vision |" in markdown
    assert "| fixed | mandatory | old | x | old on x |" in markdown
    assert "🚫 1 new policy violation(s)" in markdown


def test_policy_report_absent(prod_base: dict[str, Any]) -> None:
    base, head = copy.deepcopy(prod_base), copy.deepcopy(prod_base)
    base.pop("policy", None)
    head.pop("policy", None)
    head["outputs"]["environment"] = "staging"
    diff, markdown = report_for(base, head)
    assert not diff.policy.present
    assert "_no policy report in these plans_" in markdown
    head["policy"] = {"violations": [violation("r", "res")]}
    diff, _ = report_for(base, head)
    assert [v.rule for v in diff.policy.new] == ["r"]
    assert "base plan has no policy report" in diff.policy.note


# -- rendering, folders, CLI ------------------------------------------------------------


def test_reports_are_deterministic(preview: Preview, prod_base: dict[str, Any]) -> None:
    head = preview("prod", prod=replace_once(PROD, "retentionDays: 60", "retentionDays: 30"))
    first = diff_plans(prod_base, head)
    second = diff_plans(copy.deepcopy(prod_base), copy.deepcopy(head))
    assert to_markdown(DiffReport([first])) == to_markdown(DiffReport([second]))
    assert to_json(DiffReport([first])) == to_json(DiffReport([second]))
    doc = json.loads(to_json(DiffReport([first])))
    assert doc["hasChanges"] is True
    [stack] = doc["stacks"]
    assert stack["stack"] == "prod"
    assert stack["counts"]["update"] >= 1
    assert any("Lifecycle" in s["key"] for s in stack["storage"])


def write_plan_doc(folder: Path, doc: dict[str, Any]) -> Path:
    path = folder / doc["stack"] / "plan.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def test_cli_diffs_folders_of_plans(
    tmp_path: Path, example_plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # in no project: a stack without a head plan is removed
    base, head = tmp_path / "base", tmp_path / "head"
    write_plan_doc(base, as_doc(example_plans["dev"]))
    write_plan_doc(base, as_doc(example_plans["onprem"]))
    write_plan_doc(head, as_doc(example_plans["dev"]))
    write_plan_doc(head, as_doc(example_plans["vision"]))
    out_md, out_json = tmp_path / "r" / "report.md", tmp_path / "r" / "report.json"
    result = runner.invoke(
        app,
        ["diff", str(base), str(head), "--markdown-out", str(out_md), "--json-out", str(out_json)],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == out_md.read_text()
    assert "- **onprem** (platform) (stack removed): 0 to create" in result.output
    created = sum(1 for r in as_doc(example_plans["vision"])["resources"] if r["custom"])
    assert f"- **vision** (team) (new stack): {created} to create" in result.output
    assert "- unchanged: dev" in result.output
    doc = json.loads(out_json.read_text())
    assert [s["status"] for s in doc["stacks"]] == ["unchanged", "removed", "added"]
    as_json = runner.invoke(app, ["diff", str(base), str(head), "--format", "json"])
    assert as_json.stdout == out_json.read_text()


def test_cli_errors_name_the_input_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    result = runner.invoke(app, ["diff", str(missing), str(missing)])
    assert result.exit_code == 1
    assert str(missing) in result.output
    assert "trainstack preview" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = runner.invoke(app, ["diff", str(bad), str(bad)])
    assert result.exit_code == 1
    assert "not a readable JSON plan" in result.output
    bad.write_text(json.dumps({"version": 9, "resources": []}))
    with pytest.raises(PlanError, match="plan version 9"):
        load_plan(bad)
    assert "Traceback" not in result.output


def test_real_job_specs_added_removed_and_changed(tmp_path: Path) -> None:
    """Through the job layer: a team stack's job specs change between base and head."""
    if not (ROOT / "job_specs" / "vision" / "demo-train.yaml").is_file():
        pytest.skip("the job layer's example job specs are not in this tree")

    def project(name: str, edit: Callable[[Path], None]) -> dict[str, Any]:
        folder = tmp_path / name
        folder.mkdir()
        make_project(folder, {"prod": PROD, "vision": VISION})
        shutil.copytree(ROOT / "job_specs", folder / "job_specs")
        edit(folder / "job_specs" / "vision")
        return as_doc(Previewer(Project.find(folder)).preview("vision"))

    def head_edit(specs: Path) -> None:
        demo = specs / "demo-train.yaml"
        demo.write_text(replace_once(demo.read_text(), "replicas: 2", "replicas: 4"))
        (specs / "embeddings-ps.yaml").unlink()
        extra = specs / "demo-train-2.yaml"
        extra.write_text(demo.read_text().replace("name: demo-train", "name: demo-train-2"))

    diff, markdown = report_for(project("base", lambda _: None), project("head", head_edit))
    jobs = {j.key: j for j in diff.jobs}
    assert jobs["vision/demo-train-2"].status == "added"
    assert jobs["vision/embeddings-ps"].status == "removed"
    changed = jobs["vision/demo-train"]
    assert changed.status == "changed"
    fields = {(c.field, c.before, c.after) for c in changed.changes}
    assert ("spec.minAvailable", 2, 4) in fields  # a gang of 2 -> 4 pods
    assert ("GPUs", 2, 4) in fields
    assert "| vision/embeddings-ps | removed |" in markdown
    assert "| vision/demo-train-2 | added |" in markdown


@pytest.mark.parametrize(
    ("old", "new", "replaced"),
    [
        # Volcano refuses an update of the image (admit_job.go validateJobUpdate): replace.
        ("demo-train:2025Q1", "demo-train:2025Q2", True),
        # Two nodes to one drops the worker task, which Volcano refuses too.
        ("replicas: 2", "replicas: 1", True),
        # Replicas of the same tasks and minAvailable change in place.
        ("replicas: 2", "replicas: 4", False),
    ],
    ids=["image", "task-removed", "replicas"],
)
def test_job_replacement_follows_what_volcano_refuses(
    tmp_path: Path, old: str, new: str, replaced: bool
) -> None:
    """Issue 15 #4: the plan records the Job's replacementTrigger, and the diff reports a
    replacement exactly when the update would be refused."""

    def project(name: str, text: tuple[str, str] | None) -> dict[str, Any]:
        folder = tmp_path / name
        folder.mkdir()
        make_project(folder, {"prod": PROD, "vision": VISION})
        shutil.copytree(ROOT / "job_specs", folder / "job_specs")
        if text is not None:
            demo = folder / "job_specs" / "vision" / "demo-train.yaml"
            demo.write_text(replace_once(demo.read_text(), *text))
        return as_doc(Previewer(Project.find(folder)).preview("vision"))

    base, head = project("base", None), project("head", (old, new))
    job = next(
        r
        for r in head["resources"]
        if r["type"] == VOLCANO_JOB and r["inputs"]["metadata"]["name"] == "demo-train"
    )
    assert job["options"]["deleteBeforeReplace"] is True  # the name is fixed
    assert "replacementTrigger" in job["options"]
    diff = diff_plans(base, head)
    changes = {(r.type, r.name): r for r in diff.resources}
    change = changes.get((VOLCANO_JOB, job["name"]))
    if replaced:
        assert change is not None, diff.resources
        assert change.action == "replace", change
        assert "Volcano refuses to update in place" in " ".join(change.reasons)
        assert change.stateful.startswith("training job")
        assert diff.counts["replace"] == 1
    else:
        assert change is None, change
        assert diff.counts["replace"] == 0
        assert diff.counts["update"] >= 1


ENV = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]


@pytest.mark.parametrize(
    ("before", "after", "lines"),
    [
        # Issue 23 #6: an env var added showed the whole list twice, as truncated cells.
        (
            ENV,
            [*ENV, {"name": "C", "value": "3"}],
            [("env[name=C]", ABSENT, {"name": "C", "value": "3"})],
        ),
        (
            [{"name": "C", "value": "3"}, *ENV],
            ENV,
            [("env[name=C]", {"name": "C", "value": "3"}, ABSENT)],
        ),
        (ENV, [ENV[0], {"name": "B", "value": "9"}], [("env[name=B].value", "2", "9")]),
        (ENV, ENV[::-1], [("env (order)", ["A", "B"], ["B", "A"])]),
        # Lists of anything else: element-wise when equal in length, whole otherwise.
        (["a", "b"], ["a", "c"], [("env[1]", "b", "c")]),
        # Lists that grew or shrank: the runs that differ, by their slice of the base (issue
        # 41 #3: the whole lists, cut to one length, looked alike).
        (["a"], ["a", "b"], [("env[1:1]", ABSENT, ["b"])]),
        (["a", "b", "c"], ["a", "c"], [("env[1:2]", ["b"], ABSENT)]),
        ([{"x": 1}, {"x": 2}], [{"x": 1}, {"x": 3}, {"x": 2}], [("env[1:1]", ABSENT, [{"x": 3}])]),
        ([{"x": 1}], [{"x": 2}], [("env[0].x", 1, 2)]),
    ],
)
def test_list_items_are_named_by_their_name(before: Any, after: Any, lines: list[Any]) -> None:
    assert changed_paths({"env": before}, {"env": after}) == lines


def test_a_named_item_still_triggers_its_replacement_rule() -> None:
    """replace.py strips `[name=…]` like `[0]` before matching a rule's path."""
    from trainstack.diff.replace import _covers  # noqa: PLC0415

    assert _covers("spec.template", "spec.template.spec.containers[name=trainer].image")
    assert _covers("spec.template", "spec.template.spec.containers[0].image")


def test_a_teams_shorter_log_retention_shows_in_the_diff(
    preview: Preview, prod_base: dict[str, Any]
) -> None:
    """Retention deletes data: a reviewer sees it per team, and the bucket's lifecycle rules
    (per team, builders/storage.py) change with it."""
    head_text = replace_once(
        PROD,
        "quota: {gpus: 16, deserved: 40, borrowLimit: 24}",
        "quota: {gpus: 16, deserved: 40, borrowLimit: 24}\n"
        "          retention: {logDays: 7, checkpointDays: 14}",
    )
    diff, markdown = report_for(prod_base, preview("prod", prod=head_text))
    [vision] = diff.teams
    changes = {c.field: (c.before, c.after) for c in vision.changes}
    assert changes == {"log retention (days)": (30, 7), "checkpoint retention (days)": (60, 14)}
    assert "| vision | changed | log retention (days) | 30 | 7 |" in markdown
    updated = {r.type for r in diff.created_updated if r.action == "update"}
    assert "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration" in updated, updated
    assert not diff.stateful_losses


def sliced(job_doc: dict[str, Any], resource: str, per_pod: int = 1) -> dict[str, Any]:
    """The job's trainers ask for `resource` (a GPU slice) instead of whole GPUs."""
    for task in job_doc["inputs"]["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0]["resources"]["limits"] = {resource: per_pod}
    return job_doc


def test_jobs_moving_to_gpu_slices_show_their_slices(example_plans: dict[str, Plan]) -> None:
    """Issue 47: a job on MIG slices asks for no whole GPU; the diff says which slices, so a
    reviewer sees `GPUs 16 -> 0` with `slices: 2 x mig-1g.10gb`, not a job that vanished."""
    vision = as_doc(example_plans["vision"])
    base = with_resources(vision, job("eval"))
    head = with_resources(
        vision,
        sliced(job("eval"), "nvidia.com/mig-1g.10gb"),
        sliced(job("probe", replicas=1), "nvidia.com/gpu.shared"),
    )
    diff, markdown = report_for(base, head)
    jobs = {j.key: j for j in diff.jobs}
    assert jobs["vision/probe"].summary["slices"] == "1 x gpu.shared"
    changes = {c.field: (c.before, c.after) for c in jobs["vision/eval"].changes}
    assert changes["slices"] == ("(whole GPUs)", "2 x mig-1g.10gb")
    assert changes["GPUs"] == (16, 0)
    assert "| vision/eval | changed | slices | (whole GPUs) | 2 x mig-1g.10gb |" in markdown


def test_a_pool_cut_into_slices_shows_in_the_diff(
    preview: Preview, prod_base: dict[str, Any]
) -> None:
    head = preview(
        "prod",
        prod=replace_once(PROD, "mig: {layout: all-1g.10gb}", "mig: {layout: all-balanced}"),
    )
    diff, _ = report_for(prod_base, head)
    [pool] = [p for p in diff.capacity.pools if p.key == "h100-slices"]
    assert {c.field: (c.before, c.after) for c in pool.changes} == {
        "slices": ("7 x 1g.10gb", "2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb")
    }
