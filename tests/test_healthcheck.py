"""`trainstack healthcheck` (issue 42 #5): the exact lines and exit codes a user meets, and the
rendered job as Volcano, Kubernetes and the platform's own policy see it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner, Result

from tests.conftest import ROOT
from trainstack import outputs as out
from trainstack.cli import app
from trainstack.config.errors import ConfigError
from trainstack.config.model import PlatformConfig
from trainstack.config.project import Project
from trainstack.jobs import healthcheck as hc
from trainstack.jobs.platform import PlatformView
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.policy.pack import evaluate
from trainstack.policy.settings import levels, pack_config
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan, normalise

IMAGE = "registry.example.com/vision/project:0.1.0@sha256:" + "9c4e2a7f" * 8
POOL = "h100-reserved"  # prod: p5.48xlarge, EFA, at most 4 nodes; team vision may use it


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(
        app,
        ["healthcheck", *args, "--project-dir", str(ROOT)],
        env={"COLUMNS": "200", **(env or {})},
    )
    assert isinstance(result.exception, SystemExit | None), result.output
    return result


def lines(result: Result) -> list[str]:
    return [line.rstrip() for line in result.output.splitlines()]


# -- the table: what the user reads, and the exit code -------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        pytest.param(
            ["h100-reservd", "--stack", "vision", "--image", IMAGE],
            2,
            [
                "error: POOL: 1 config error:",
                "  - h100-reservd: unknown pool (did you mean 'h100-reserved'?); the platform "
                "has: h100-block, h100-reserved, h200-burst, h100-slices",
            ],
            id="unknown-pool",
        ),
        pytest.param(
            [POOL, "--stack", "vision", "--image", IMAGE, "--nodes", "5"],
            2,
            [
                "error: --nodes: 1 config error:",
                "  - 5: pool h100-reserved has at most 4 nodes; pass 1 to 4",
            ],
            id="more-nodes-than-the-pool",
        ),
        pytest.param(
            [POOL, "--stack", "visoin", "--image", IMAGE],
            2,
            [
                "error: stack arguments: 1 config error:",
                "  - visoin: no stack file for 'visoin' (did you mean 'vision'?); stacks: dev, "
                "onprem, prod, vision",
            ],
            id="unknown-stack",
        ),
        pytest.param(
            [POOL, "--stack", "vision", "--image", "registry.example.com/vision/project:latest"],
            1,
            [
                "error: healthcheck: 1 config error:",
                "  - job.spec.image: 'registry.example.com/vision/project:latest' uses "
                ":latest, which moves under a running job; pin a version tag or a digest "
                "(@sha256:…)",
            ],
            id="unpinned-image",
        ),
    ],
)
def test_refusals_print_one_error_and_exit_with_its_code(
    args: list[str], code: int, expected: list[str]
) -> None:
    result = run(*args)
    assert result.exit_code == code, result.output
    assert lines(result) == expected


def test_a_render_prints_the_pool_line_and_the_manifest() -> None:
    result = run(POOL, "--stack", "vision", "--image", IMAGE, "--nodes", "3")
    assert result.exit_code == 0, result.output
    first, *rest = result.output.splitlines(keepends=True)
    assert first.rstrip() == (
        "pool h100-reserved: 3 x 8 GPUs, team vision; floor none (catalog intra-node floor: "
        f"{_catalog_floor_text()})"
    )
    job = yaml.safe_load("".join(rest))
    assert (job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]) == (
        "Job",
        "healthcheck-h100-reserved",
        "vision",
    )
    spec = job["spec"]
    assert (spec["queue"], spec["minAvailable"], spec["schedulerName"]) == ("vision", 3, "volcano")
    assert [(t["name"], t["replicas"]) for t in spec["tasks"]] == [("master", 1), ("worker", 2)]
    assert set(spec["plugins"]) == {"svc", "env", "pytorch"}
    for task in spec["tasks"]:
        pod = task["template"]["spec"]
        (container,) = pod["containers"]
        # One replica per node, all of its GPUs and EFA devices: N replicas on N nodes.
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
        assert container["resources"]["requests"]["vpc.amazonaws.com/efa"] == "32"
        assert container["command"] == [
            "python", "-m", "trainstack_runtime.supervisor", "--nproc-per-node", "8",
            "--", "-m", "trainstack_runtime.busbw",
        ]  # fmt: skip
        assert container["args"] == []
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
            {"key": "trainstack.io/pool", "operator": "In", "values": [POOL]}
        ]
        # Only nodes the health gate passed: the gate's taint is not tolerated.
        assert all(t["key"] != "trainstack.io/health" for t in pod["tolerations"])


def _catalog_floor_text() -> str:
    floor = hc.catalog_floor({"instanceType": "p5.48xlarge"})
    return "none" if floor is None else f"{floor:g} GB/s"


def test_an_explicit_floor_goes_to_the_program() -> None:
    result = run(POOL, "--stack", "vision", "--image", IMAGE, "--floor", "95.5")
    assert result.exit_code == 0, result.output
    assert "floor 95.5 GB/s" in lines(result)[0]
    job = yaml.safe_load("".join(result.output.splitlines(keepends=True)[1:]))
    for task in job["spec"]["tasks"]:
        assert task["template"]["spec"]["containers"][0]["args"] == ["--floor", "95.5"]


def test_a_one_node_check_is_held_to_the_catalogs_intra_node_floor() -> None:
    """One node: the all-reduce stays on NVLink, which the catalog's floor is for (the agent's
    own check); across nodes the network bounds it, and only an explicit --floor applies."""
    view = PlatformView(_prod().outputs)
    one = hc.healthcheck(view, POOL, image=IMAGE, nodes=1, team="vision")
    two = hc.healthcheck(view, POOL, image=IMAGE, nodes=2, team="vision")
    floor = hc.catalog_floor({"instanceType": "p5.48xlarge"})
    assert (one.floor_gbps, one.catalog_floor_gbps) == (floor, floor)
    assert (two.floor_gbps, two.catalog_floor_gbps) == (None, floor)
    args = one.manifest["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["args"]
    assert args == ([] if floor is None else ["--floor", f"{floor:g}"])


def test_a_platform_stack_runs_the_check_as_the_first_team_on_the_pool() -> None:
    result = run(POOL, "--stack", "prod", "--image", IMAGE, "--nodes", "1")
    assert result.exit_code == 0, result.output
    job = yaml.safe_load("".join(result.output.splitlines(keepends=True)[1:]))
    # prod: nlp and vision may use h100-reserved; nlp comes first by name.
    allowed = sorted(
        name
        for name, slice_ in out.team_slices(_prod().outputs).items()
        if POOL in slice_["scheduling"]["pools"]
    )
    assert allowed == ["nlp", "vision"]
    assert (job["metadata"]["namespace"], job["spec"]["queue"]) == ("nlp", "nlp")
    assert [t["replicas"] for t in job["spec"]["tasks"]] == [1]


def _prod() -> Plan:
    return Previewer(Project.find(ROOT)).preview("prod")


# -- the manifest as Volcano, Kubernetes and the platform's policy see it ------------------


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    check = hc.healthcheck(PlatformView(_prod().outputs), POOL, image=IMAGE, nodes=4, team="vision")
    return check.manifest


def test_the_job_validates_against_the_volcano_crd(
    manifest: dict[str, Any], reference: Path
) -> None:
    from tests.conformance.crds import crd_errors  # noqa: PLC0415 (needs the reference folder)

    assert crd_errors(reference, normalise(manifest)) == []


def test_the_task_templates_are_valid_pods(manifest: dict[str, Any]) -> None:
    for task in manifest["spec"]["tasks"]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": task["name"], **task["template"]["metadata"]},
            "spec": task["template"]["spec"],
        }
        kubernetes_validate.validate(normalise(pod), "1.33", strict=True)


def test_the_platform_policy_admits_the_job(manifest: dict[str, Any]) -> None:
    """The rules the team namespaces' admission policies enforce find nothing."""
    platform, _ = Previewer(Project.find(ROOT)).load("prod")
    assert isinstance(platform, PlatformConfig)
    found = evaluate(
        [(VOLCANO_JOB, "healthcheck", normalise(manifest))], pack_config(platform), levels(platform)
    )
    assert [v.to_json() for v in found] == []


def test_the_job_spec_rules_apply_to_the_check() -> None:
    """The job layer's checks run on the check too: 4 nodes of 8 GPUs against a team whose
    capability is 24 GPUs is refused (exit 1 in the CLI), not rendered."""
    outputs = dict(_prod().outputs)
    vision = json.loads(outputs[out.team_output("vision")])
    vision["scheduling"]["gpus"]["capability"] = 24
    outputs[out.team_output("vision")] = json.dumps(vision)
    view = PlatformView(outputs)
    with pytest.raises(ConfigError, match="32 GPUs exceeds team vision's capability of 24"):
        hc.healthcheck(view, POOL, image=IMAGE, nodes=4, team="vision")
    assert hc.healthcheck(view, POOL, image=IMAGE, nodes=3, team="vision").nodes == 3


# -- --submit ------------------------------------------------------------------------------


def _fake_kubectl(folder: Path, code: int) -> Path:
    """A kubectl that records its arguments and standard input, and exits `code`."""
    folder.mkdir()
    script = folder / "kubectl"
    script.write_text(
        f'#!/bin/sh\necho "$@" > "{folder}/args"\ncat > "{folder}/stdin"\nexit {code}\n',
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def test_submit_creates_the_printed_manifest_with_the_kubeconfig(tmp_path: Path) -> None:
    bin_dir = _fake_kubectl(tmp_path / "bin", 0)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    printed = run(POOL, "--stack", "vision", "--image", IMAGE)
    kubeconfig = tmp_path / "kubeconfig"
    result = run(
        POOL, "--stack", "vision", "--image", IMAGE, "--submit",
        "--kubeconfig", str(kubeconfig), env=env,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (bin_dir / "args").read_text().split() == [
        "create", "-f", "-", "--kubeconfig", str(kubeconfig),
    ]  # fmt: skip
    sent = (bin_dir / "stdin").read_text()
    assert sent == "".join(printed.output.splitlines(keepends=True)[1:])


def test_submit_returns_kubectls_failure(tmp_path: Path) -> None:
    bin_dir = _fake_kubectl(tmp_path / "bin", 1)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = run(POOL, "--stack", "vision", "--image", IMAGE, "--submit", env=env)
    assert result.exit_code == 1


def test_submit_without_kubectl_says_how_to_create_the_job(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run(POOL, "--stack", "vision", "--image", IMAGE, "--submit", env={"PATH": str(empty)})
    assert result.exit_code == 1
    assert lines(result)[-1] == (
        "error: --submit needs kubectl on PATH; without --submit the manifest prints for "
        "`kubectl create -f -`"
    )


def test_help_describes_the_command() -> None:
    result = CliRunner().invoke(app, ["healthcheck", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "<bool>" not in result.output
    assert "bus bandwidth" in result.output
