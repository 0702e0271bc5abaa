"""`trainstack preview` and `validate`: the real program under mocks, end to end."""

from __future__ import annotations

import filecmp
import json
import re
import shutil
from pathlib import Path

import pulumi
import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import EXAMPLE_STACKS, ROOT, STACKS
from trainstack.cli import app
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.preview.mocks import RecordingMocks
from trainstack.preview.plan import Plan, Resource
from trainstack.preview.summary import capacity_text, jobs_text
from trainstack.preview.synth import run_mocked, synth

FIVE_MISTAKES = ROOT / "tests" / "config" / "fixtures" / "invalid" / "five-mistakes.yaml"
runner = CliRunner()


def make_project(tmp_path: Path, stacks: dict[str, str | Path]) -> Path:
    """A project folder with the real program and the given stack files."""
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    shutil.copy(ROOT / "__main__.py", tmp_path / "__main__.py")
    (tmp_path / "stacks").mkdir()
    for name, source in stacks.items():
        text = source.read_text() if isinstance(source, Path) else source
        (tmp_path / "stacks" / f"Pulumi.{name}.yaml").write_text(text)
    return tmp_path


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_examples_exist() -> None:
    assert {"dev", "prod", "vision", "onprem"} <= set(EXAMPLE_STACKS)


def test_preview_writes_the_whole_plan(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["preview", "dev", "--out", str(tmp_path), "--project-dir", str(ROOT)]
    )
    assert result.exit_code == 0, result.output
    assert "resources by component and type" in result.output
    out = tmp_path / "dev"
    plan = json.loads((out / "plan.json").read_text())
    assert plan["stack"] == "dev"
    assert plan["kind"] == "platform"
    kube = [
        r
        for r in plan["resources"]
        if r["type"].startswith("kubernetes:") and "kind" in r["inputs"]
    ]
    helm = [r for r in plan["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"]
    aws = [r for r in plan["resources"] if r["type"].startswith("aws:")]
    files = tree(out)
    assert len([f for f in files if f.startswith("kubernetes/")]) == len(kube)
    assert len([f for f in files if f.startswith("aws/") and f.endswith(".json")]) == len(aws)
    assert len([f for f in files if f.startswith("helm/")]) == len(helm)
    assert {"nvidia-device-plugin", "volcano"} <= {r["inputs"]["name"] for r in helm}
    release = yaml.safe_load((out / "helm/nvidia-device-plugin.yaml").read_text())
    assert release["chart"] == "nvidia-device-plugin"
    assert release["version"] == "0.18.2"
    namespace = yaml.safe_load((out / "kubernetes/_cluster/namespace-vision.yaml").read_text())
    assert list(namespace)[:3] == ["apiVersion", "kind", "metadata"]
    cluster = json.loads((out / "aws/eks.Cluster/trainstack-dev-cluster-eks.json").read_text())
    assert cluster["version"] == "1.33"
    assert plan["outputs"]["kubeconfig"] == "[secret]"
    assert "get-token" not in (out / "plan.json").read_text(), "secret leaked into the plan"


def test_encoded_configuration_is_written_readable(tmp_path: Path) -> None:
    """Node user data (base64, as EC2 takes it) beside its launch template, decoded; Volcano's
    scheduler configuration (one string in the chart values) as a YAML block (issue 23 #6)."""
    result = runner.invoke(
        app, ["preview", "dev", "--out", str(tmp_path), "--project-dir", str(ROOT)]
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "dev"
    templates = sorted((out / "aws/ec2.LaunchTemplate").glob("*.json"))
    decoded = sorted((out / "aws/ec2.LaunchTemplate").glob("*.user-data.txt"))
    with_data = [t for t in templates if "userData" in json.loads(t.read_text())]
    assert with_data
    assert [d.name.removesuffix(".user-data.txt") for d in decoded] == [t.stem for t in with_data]
    assert decoded[0].read_text().startswith("MIME-Version: 1.0\n")
    volcano = (out / "helm/volcano.yaml").read_text()
    assert "    scheduler_config_override: |\n      actions: " in volcano
    values = yaml.safe_load(volcano)["values"]["custom"]["scheduler_config_override"]
    assert yaml.safe_load(values)["actions"].startswith("allocate")


def test_preview_is_byte_identical_across_runs(tmp_path: Path) -> None:
    stacks = ["prod", "vision", "onprem"]
    for run in ("a", "b"):
        result = runner.invoke(
            app, ["preview", *stacks, "--out", str(tmp_path / run), "--project-dir", str(ROOT)]
        )
        assert result.exit_code == 0, result.output
    compare = filecmp.dircmp(tmp_path / "a", tmp_path / "b")
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    for folder in tree(tmp_path / "a"):
        assert (tmp_path / "a" / folder).read_bytes() == (tmp_path / "b" / folder).read_bytes()
    assert not compare.diff_files


def _row(*cells: object) -> re.Pattern[str]:
    """A rich table row holding `cells` in order, whatever the column widths."""
    return re.compile(r"│\s*" + r"\s*│\s*".join(re.escape(str(c)) for c in cells) + r"\s*│")


def test_platform_preview_prints_the_capacity_arithmetic(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["preview", "prod", "--out", str(tmp_path), "--project-dir", str(ROOT)]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    # The numbers come from the plan the same run wrote: they are what the console must show.
    scheduling = json.loads((tmp_path / "prod" / "plan.json").read_text())["outputs"]["scheduling"]
    cap = scheduling["capacity"]
    assert scheduling["queueMode"] == "hierarchical"
    assert cap["firm"] + cap["elastic"] == cap["total"]
    assert f"{cap['firm']} firm, {cap['elastic']} elastic GPUs ({cap['total']} at maximum" in out
    assert cap["pools"], "prod has GPU pools"
    for name, pool in cap["pools"].items():
        assert _row(name, pool["kind"], pool["firm"], pool["elastic"], pool["why"]).search(out), (
            name
        )
    assert _row("all pools", "", cap["firm"], cap["elastic"], "").search(out)
    assert _row("Σ guarantees", cap["guaranteed"], f"{cap['firm']} firm").search(out)
    assert _row("Σ deserved", cap["deserved"], f"{cap['total']} in all").search(out)
    assert _row("Σ capabilities", cap["capability"], f"{cap['total']} in all").search(out)
    assert "may exceed the cluster" in out
    assert cap["groups"], "prod runs hierarchical queues with groups"
    for name, group in cap["groups"].items():
        assert _row(name, group["guarantee"], group["deserved"]).search(out), name
    assert {"cpu", "memory", "nvidia.com/gpu"} <= set(cap["dimensions"])
    for name, dim in cap["dimensions"].items():
        assert _row(name, dim["cluster"], dim["capabilities"]).search(out), name
    # prod's confined teams, nlp and recsys, may wait while vision holds their pools within
    # its share (config/capacity.py pool_blind): each a row and a warning with its fix.
    assert [e["team"] for e in cap["poolBlind"]] == ["nlp", "recsys"]
    flowing = " ".join(out.split())  # the warnings wrap at the console's width
    for entry in cap["poolBlind"]:
        kept = ", ".join(f"{t} {n}" for t, n in sorted(entry["kept"].items()))
        assert _row(entry["team"], entry["guarantee"]).search(out), entry
        assert f"{entry['firm']} ({entry['pools'][0]}" in out
        assert kept in out
        assert f"team {entry['team']}'s guarantee of {entry['guarantee']} GPUs" in flowing
    assert flowing.count("warning: trainstack:platform.registry.teams[") == 2
    # After the resource summary line, before the policy report.
    assert out.index(" Kubernetes objects, ") < out.index(" elastic GPUs (")
    assert out.rstrip().endswith("policy: no violations")


def test_team_preview_prints_its_jobs_against_its_limits(tmp_path: Path) -> None:
    """Issue 41 #6: a team's preview listed its jobs as resources only, without GPUs, pool,
    priority, duration or their sum against the team's limits."""
    result = runner.invoke(
        app, ["preview", "vision", "--out", str(tmp_path), "--project-dir", str(ROOT)]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "resources by component" in out
    for text in ("capacity", "firm", "Σ", "GPU pools", "group queues"):
        assert text not in out, text
    # The limits come from the platform's team slice, through the team stack's `limits` output.
    plan = json.loads((tmp_path / "vision" / "plan.json").read_text())
    assert plan["outputs"]["limits"] == {
        "gpus": {"guarantee": 16, "deserved": 40, "capability": 64},
        "maxJobHours": 168,
    }
    assert "jobs of team vision" in out
    assert re.search(r"┃\s*job\s*┃\s*GPUs\s*┃\s*pool\s*┃\s*priority\s*┃\s*max duration\s*┃", out)
    assert _row("demo-train", 2, "h100-reserved", "normal", "24h").search(out)
    assert _row("embeddings-ps", 8, "h200-burst", "normal", "48h").search(out)
    assert _row("fsdp-multinode", 32, "h100-block", "normal", "72h").search(out)
    # An elastic job counts from its minimum to its size (issue 43, docs/jobs.md).
    assert _row("elastic-pretrain", "16..32", "h100-reserved", "normal", "72h").search(out)
    assert _row("all jobs", "58..74", "", "", "72h").search(out)
    assert _row("team's limit", 64, "", "", "168h").search(out)
    note = (
        "team vision: 16 GPUs guaranteed, 40 deserved, at most 64 at once (its queue's "
        "capability); all jobs together need 58..74: at their minimums they fit in 64, and "
        "elastic jobs grow only as far as the rest leaves"
    )
    assert " ".join(out.split()).count(note) == 1
    assert out.index(" Kubernetes objects, ") < out.index("jobs of team vision")
    assert out.rstrip().endswith("policy: no violations")


def _team_plan(gpus: list[int], limits: dict[str, object] | None) -> Plan:
    """A team plan with one 1-replica job per entry of `gpus`, and the given `limits`."""
    jobs = tuple(
        Resource(
            VOLCANO_JOB,
            f"team-t-j{i}-volcano",
            "",
            "",
            True,
            {
                "metadata": {
                    "name": f"j{i}",
                    "labels": {"trainstack.io/pool": "p"},
                    "annotations": {"trainstack.io/max-duration-seconds": "5400"},
                },
                "spec": {
                    "priorityClassName": "trainstack-high",
                    "tasks": [
                        {
                            "replicas": 1,
                            "template": {
                                "spec": {
                                    "containers": [
                                        {"resources": {"limits": {"nvidia.com/gpu": str(n)}}}
                                    ]
                                }
                            },
                        }
                    ],
                },
            },
            (),
        )
        for i, n in enumerate(gpus)
    )
    outputs: dict[str, object] = {"team": "t"}
    if limits is not None:
        outputs["limits"] = limits
    return Plan("t", "team", jobs, outputs)


LIMITS = {"gpus": {"guarantee": 4, "deserved": 8, "capability": 12}, "maxJobHours": 24}


@pytest.mark.parametrize(
    ("gpus", "tail"),
    [
        ([2, 2], ""),
        ([4, 2], "; all jobs together need 6, 2 beyond the guarantee: only 4 are held for the "
         "team"),
        ([8, 2], "; all jobs together need 10, 2 above its fair share: teams below theirs may "
         "reclaim those"),
        ([8, 8], "; all jobs together need 16, more than 12: they cannot all run at once, the "
         "rest wait in the queue"),
    ],
)  # fmt: skip
def test_jobs_text_says_what_the_sum_means_for_the_team(gpus: list[int], tail: str) -> None:
    text = jobs_text(_team_plan(gpus, LIMITS), width=200)
    assert _row("j0", gpus[0], "p", "high", "1.5h").search(text)
    assert _row("all jobs", sum(gpus), "", "", "1.5h").search(text)
    assert _row("team's limit", 12, "", "", "24h").search(text)
    lines = [line for line in text.splitlines() if line.startswith("team t:")]
    assert lines == [
        "team t: 4 GPUs guaranteed, 8 deserved, at most 12 at once (its queue's capability)" + tail
    ]


def test_an_elastic_job_counts_from_its_minimum() -> None:
    """Its minimum is what its queue must hold for it; the rest grows into what is left."""
    plan = _team_plan([4, 8], LIMITS)
    task = plan.resources[0].inputs["spec"]["tasks"][0]
    task["replicas"], task["minAvailable"] = 3, 1
    text = jobs_text(plan, width=200)
    words = " ".join(text.split())
    assert _row("j0", "4..12", "p", "high", "1.5h").search(text)
    assert _row("all jobs", "12..20", "", "", "1.5h").search(text)
    assert (
        "; all jobs together need 12..20: at their minimums they fit in 12, and elastic "
        "jobs grow only as far as the rest leaves" in words
    )
    task["minAvailable"] = 2  # 16 at their minimums: more than the capability
    words = " ".join(jobs_text(plan, width=200).split())
    assert "all jobs together need 16, more than 12: they cannot all run at once" in words


def test_jobs_text_of_plans_without_jobs_or_limits() -> None:
    assert jobs_text(Plan("p", "platform", (), {})) == ""
    assert jobs_text(_team_plan([], LIMITS)).strip() == "team t: no jobs"
    old = jobs_text(_team_plan([1], None), width=200)
    assert _row("all jobs", 1, "", "", "1.5h").search(old)
    assert not re.search(r"│\s*team's limit\s*│", old)
    assert "the team's limits are not in this plan" in old


PROD_LIKE: dict[str, object] = {
    "queueMode": "hierarchical",
    "capacity": {
        "pools": {
            "h100-block": {"kind": "capacityBlock", "firm": 0, "elastic": 64, "why": "no window"},
            "h100-reserved": {"kind": "reservation", "firm": 32, "elastic": 0, "why": "res of 4"},
        },
        "firm": 32,
        "elastic": 64,
        "total": 96,
        "guaranteed": 24,
        "deserved": 90,
        "capability": 150,
        "groups": {"research": {"guarantee": 24, "deserved": 80}},
        "dimensions": {
            "cpu": {"cluster": "2304", "capabilities": "3600"},
            "memory": {"cluster": "24576Gi", "capabilities": "100Gi"},
        },
    },
}


def test_capacity_text_is_a_pure_function_of_the_outputs() -> None:
    text = capacity_text({"scheduling": PROD_LIKE})
    assert "capacity (hierarchical queues): 32 firm, 64 elastic GPUs (96 at maximum size)" in text
    assert _row("h100-block", "capacityBlock", 0, 64, "no window").search(text)
    assert _row("all pools", "", 32, 64, "").search(text)
    assert _row("Σ guarantees", 24, "32 firm").search(text)
    assert _row("Σ deserved", 90, "96 in all").search(text)
    assert _row("Σ capabilities", 150, "96 in all").search(text)
    assert _row("research", 24, 80).search(text)
    assert _row("cpu", "2304", "3600", "156%").search(text)
    assert _row("memory", "24576Gi", "100Gi", "0%").search(text)
    # Outputs that arrive as JSON text render the same.
    assert capacity_text({"scheduling": json.dumps(PROD_LIKE)}) == text


def test_capacity_text_shows_each_pool_blind_guarantee_and_its_warning() -> None:
    blind = json.loads(json.dumps(PROD_LIKE))
    blind["capacity"]["poolBlind"] = [
        {
            "team": "nlp",
            "guarantee": 16,
            "pools": ["h100-reserved"],
            "firm": 32,
            "kept": {"vision": 32},
            "left": 0,
            "warning": "trainstack:platform.registry.teams[1].quota.gpus: team nlp's guarantee",
        }
    ]
    text = capacity_text({"scheduling": blind}, width=140)
    assert "guarantees reclaim may not free: Volcano's queues do not know pools" in text
    assert _row("nlp", 16, "32 (h100-reserved)", "vision 32", 0).search(text)
    assert "warning: trainstack:platform.registry.teams[1].quota.gpus: team nlp's" in text
    # None recorded (older plans, or nothing to warn about): no section.
    assert "do not know pools" not in capacity_text({"scheduling": PROD_LIKE})


def test_capacity_text_in_flat_mode_does_not_claim_deserved_shares() -> None:
    flat = json.loads(json.dumps(PROD_LIKE))
    flat["queueMode"] = "flat"
    flat["capacity"]["groups"] = {}
    text = capacity_text({"scheduling": flat})
    assert "capacity (flat queues): 32 firm, 64 elastic GPUs" in text
    assert _row("Σ deserved", "-", "", "flat: shares come from weights").search(text)
    assert "90" not in text
    assert "group queues" not in text


@pytest.mark.parametrize(
    "outputs",
    [
        {},
        {"team": "vision", "namespace": "vision"},
        {"scheduling": {"queueMode": "hierarchical", "priorityClasses": {}}},
        {"scheduling": "not json"},
        {"scheduling": None},
    ],
)
def test_no_capacity_output_prints_nothing(outputs: dict[str, object]) -> None:
    assert capacity_text(outputs) == ""


def test_old_or_partial_capacity_outputs_do_not_crash() -> None:
    # The shape plans had before firm/elastic per pool (build/ from an older checkout).
    old = {"reserved": 32, "onDemand": 32, "spot": 0, "existing": 0, "total": 64}
    text = capacity_text({"scheduling": {"capacity": {**old, "guaranteed": 8, "deserved": 40}}})
    assert "capacity: 64 GPUs at maximum size" in text
    assert _row("Σ guarantees", 8, "").search(text)
    assert _row("Σ deserved", 40, "64 in all").search(text)
    odd = {"pools": {"a": None, "b": "x"}, "groups": {"g": 3}, "dimensions": {"cpu": []}}
    text = capacity_text({"scheduling": {"capacity": odd}})
    assert "no GPU totals in this plan" in text
    assert _row("a", "", "?", "?", "").search(text)
    assert _row("cpu", "?", "?", "").search(text)


def test_five_mistakes_reported_at_once_and_nothing_registered(tmp_path: Path) -> None:
    project = make_project(tmp_path, {"bad": FIVE_MISTAKES})
    result = runner.invoke(
        app, ["preview", "bad", "--project-dir", str(project), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "5 config errors" in result.output
    for path in (
        "trainstack:platform.clusterNmae",
        "trainstack:platform.kubernetesVersion",
        "trainstack:platform.environment",
        "trainstack:platform.registry.teams[0].quota.gpus",
        "trainstack:platform.registry.teams[0].group",
    ):
        assert path in result.output, path
    assert not (tmp_path / "o").exists()


def test_program_itself_refuses_bad_config_before_registering(tmp_path: Path) -> None:
    """The CLI checks first, but `pulumi up` runs the program directly: it must refuse too."""
    config = yaml.safe_load(FIVE_MISTAKES.read_text())["config"]
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match="5 config errors") as caught:
        synth(ROOT, "bad", config, mocks=mocks)
    assert "clusterNmae" in str(caught.value)
    assert mocks.records == []


def test_team_stack_with_unknown_team_fails_cleanly(tmp_path: Path) -> None:
    team = "config:\n  trainstack:team:\n    team: visoin\n    platformStack: o/trainstack/dev\n"
    project = make_project(tmp_path, {"dev": STACKS / "Pulumi.dev.yaml", "t": team})
    result = runner.invoke(
        app, ["preview", "t", "--project-dir", str(project), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    assert "team 'visoin' is not in the registry of platform stack 'dev'" in result.output
    assert "did you mean 'vision'" in result.output
    assert "Traceback" not in result.output


def test_unknown_stack_lists_the_known_ones() -> None:
    result = runner.invoke(app, ["preview", "staging", "--project-dir", str(ROOT)])
    assert result.exit_code == 2  # bad usage, like an unknown option (issue 41 #6)
    assert "no stack file for 'staging'" in result.output
    assert "dev" in result.output
    assert "prod" in result.output


def test_team_plan_feeds_platform_outputs(example_plans: dict[str, Plan]) -> None:
    team = example_plans["vision"]
    assert team.kind == "team"
    assert team.outputs == {
        "jobs": ["demo-train", "elastic-pretrain", "embeddings-ps", "fsdp-multinode"],
        "limits": {"gpus": {"capability": 64, "deserved": 40, "guarantee": 16}, "maxJobHours": 168},
        "namespace": "vision",
        "platformStack": "organization/trainstack/prod",
        "team": "vision",
    }
    provider = next(r for r in team.resources if r.type == "pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == "[secret]"
    assert provider.inputs["namespace"] == "vision"


def test_validate_command() -> None:
    good = [str(STACKS / f"Pulumi.{s}.yaml") for s in EXAMPLE_STACKS]
    result = runner.invoke(app, ["validate", *good])
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok (") == len(good)
    bad = runner.invoke(app, ["validate", str(FIVE_MISTAKES)])
    assert bad.exit_code == 1
    assert "5 config errors" in bad.output


def test_example_stack_files_carry_the_schema_hint() -> None:
    for stack in EXAMPLE_STACKS:
        first = (STACKS / f"Pulumi.{stack}.yaml").read_text().splitlines()[0]
        assert (
            first == "# yaml-language-server: $schema=../trainstack/schemas/stack-file.schema.json"
        )
    assert (ROOT / "trainstack" / "schemas" / "stack-file.schema.json").is_file()


def test_team_preview_reports_every_bad_job_before_registering(tmp_path: Path) -> None:
    project = make_project(
        tmp_path,
        {
            "prod": STACKS / "Pulumi.prod.yaml",
            "vision": STACKS / "Pulumi.vision.yaml",
        },
    )
    jobs = project / "job_specs" / "vision"
    jobs.mkdir(parents=True)
    demo = (ROOT / "job_specs" / "vision" / "demo-train.yaml").read_text()
    (jobs / "a.yaml").write_text(demo.replace("pool: h100-reserved", "pool: h100"))
    latest = re.sub(r"image: .*", "image: registry.example.com/vision/other:latest", demo)
    (jobs / "b.yaml").write_text(latest.replace("demo-train", "other"))
    result = runner.invoke(
        app, ["preview", "vision", "--project-dir", str(project), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1, result.output
    assert "job_specs/vision/a.yaml: job.spec.pool: unknown pool 'h100'" in result.output
    assert "job_specs/vision/b.yaml: job.spec.image:" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_offline_runs_skip_source_positions_and_restore_them() -> None:
    """The SDK hook the offline engine swaps out exists (an SDK upgrade that renames it must
    fail here, not silently slow previews down) and is restored after the run."""
    import pulumi.runtime.resource as sdk  # noqa: PLC0415

    original = sdk._get_stack_trace
    during: list[bool] = []

    def program() -> None:
        during.append(sdk._get_stack_trace is original)
        pulumi.CustomResource("test:index:Thing", "thing", {"size": 1})

    result = run_mocked(program, "s", {})
    assert during == [False]
    assert sdk._get_stack_trace is original
    assert [(r.type, r.inputs) for r in result.records] == [("test:index:Thing", {"size": 1})]
