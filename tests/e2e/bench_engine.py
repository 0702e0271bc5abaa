"""The real `pulumi preview` against `trainstack preview`, for the same stacks, as a user sees each.

    python -m tests.e2e.bench_engine [--teams 3] [--jobs-per-team 4] [--repeats 3]

One onprem-like project (tests/e2e/test_pulumi_stacks.py's platform stack, cloud `existing`,
add-ons pre-installed, with `teams` teams) and one team stack per team, each with
`jobs_per_team` job specs (images under `registry.example.com/`), written to
`WORK_DIR/project`. The platform is deployed once with `pulumi up` (not timed: the team
stacks' StackReferences read its outputs from the file backend), then each repeat times:

- the engine: `pulumi preview` of the platform stack and of every team stack, one command
  each, their wall seconds summed. Each is a fresh process tree, as a user's command: the CLI's
  start-up (backend, stack and config, secrets), the Kubernetes provider plugin's start and
  configuration (discovery and OpenAPI from the API server), the language runtime (a Python
  interpreter importing the Pulumi SDK and trainstack), the program, and per resource the
  provider's Check and Diff; for the team stacks' creates also a server-side dry run of each
  object on the API server, admission webhooks included (below), and for the platform's
  pre-installed add-ons a read of the live object. The team stacks run with a team member's
  KUBECONFIG, as test_pulumi_stacks does.
- offline: ONE `trainstack preview PLATFORM TEAM...` command in a fresh process (Python's
  start-up and trainstack's imports included), which previews every stack under Pulumi's mock
  engine in-process, team stacks reading their platform's plan, and writes the plans and the
  policy pack's configs.

The two alternate within each repeat (the engine first in even repeats, offline first in odd
ones), so that a drift of the machine's load falls on both. Reported: the median and
[min, max] of each side, the median and spread of the per-repeat ratio engine / offline
(`offline_speedup`), and what was previewed.

Where the engine side differs from a user's `pulumi preview`: the Python language host is
not built here (tests/e2e/pulumi_engine.py), so the Automation API driver serves the program
from its own interpreter and runs a few short CLI commands ahead of `pulumi preview`
(`pulumi version`, `pulumi stack select`); a language host would start an interpreter of its
own instead. `engine_driver_cli_s` measures those extra commands once per stack, so the
reader can take them off.

Not measured: the network. The control plane listens on 127.0.0.1, so every API call the
provider makes (discovery, reads, dry runs) costs microseconds of latency here, where a real
cluster behind a VPN or a cloud load balancer costs milliseconds each: a real cluster makes
the engine slower, never faster, and leaves the offline side unchanged (it makes no call).
"""

# Server-side dry runs at preview: pulumi-kubernetes at the version toolchain.py builds
# (provider/v4@v4.0.0-20260115033456-f47bc2d6f199, release 4.25.0), provider/pkg/provider/
# provider.go `(*kubeProvider).Create`: with `req.GetPreview()` it returns the inputs unchanged
# only when `skipPreview` (an unknown input, a kind the API server lacks, a Patch resource, or
# client-side apply); otherwise it calls `await.Creation` with `Preview: req.GetPreview()`, and
# provider/pkg/await/await.go `Creation` sends the server-side apply patch with
# `options.DryRun = []string{metav1.DryRunAll}` when `c.Preview`. Updates at preview go the
# same way (await.go `ssaUpdate`/`csaUpdate`, DryRunAll); `Diff` compares locally
# (`k.inputPatch`).

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import reference_dir
from tests.e2e.pulumi_engine import Engine
from tests.e2e.test_pulumi_stacks import (
    PLATFORM,
    PROJECT,
    TEAM,
    Project_,
    job_spec,
    new_engine,
    owners_cluster,
    platform_doc,
)
from trainstack.sandbox import toolchain
from trainstack.sandbox.cluster import ControlPlane

# Team names in order; the first is test_pulumi_stacks's team (its project initialises it).
TEAM_NAMES = (TEAM, "vision", "language", "robotics", "search", "ads", "recsys", "audio")
TIMEOUT_S = 600.0


def team_names(teams: int) -> list[str]:
    names = list(TEAM_NAMES[:teams])
    return names + [f"team-{i}" for i in range(len(names) + 1, teams + 1)]


def bench_platform_doc(kubeconfig: Path, teams: Sequence[str]) -> dict[str, Any]:
    """test_pulumi_stacks's platform with `teams`, each guaranteed one node's GPUs; the pool
    holds one node per team (at least its two), so the guarantees fit its capacity."""
    doc = platform_doc(kubeconfig)
    pool = doc["gpuPools"][0]
    pool["nodes"] = max(int(pool["nodes"]), len(teams))
    doc["registry"]["teams"] = [
        {
            "name": team,
            "owners": [f"{team}-lead@example.com"],
            "quota": {"gpus": pool["gpusPerNode"]},
            "access": {"groups": [f"oidc:{team}-team"]},
        }
        for team in teams
    ]
    return doc


def bench_job_spec(team: str, index: int) -> dict[str, Any]:
    """test_pulumi_stacks's job spec for `team`: one node, within the team's guarantee."""
    spec = job_spec(replicas=1, image=f"registry.example.com/{team}/train:2026.11.1")
    spec["metadata"] = {"name": f"{team}-train-{index}", "team": team}
    return spec


def write_project(
    engine: Engine, root: Path, kubeconfig: Path, teams: Sequence[str], jobs_per_team: int
) -> Project_:
    """The platform stack and one team stack per team, initialised in the engine's backend."""
    project = Project_(engine, root, kubeconfig)  # initialises PLATFORM and TEAM
    project.set_config(PLATFORM, "trainstack:platform", bench_platform_doc(kubeconfig, teams))
    for team in teams:
        if team != TEAM:
            engine.pulumi("stack", "init", team, cwd=root)
        project.set_config(
            team,
            "trainstack:team",
            {
                "team": team,
                "platformStack": f"organization/{PROJECT}/{PLATFORM}",
                "jobs": [f"job_specs/{team}/*.yaml"],
            },
        )
        folder = root / "job_specs" / team
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(1, jobs_per_team + 1):
            spec = bench_job_spec(team, index)
            (folder / f"{spec['metadata']['name']}.yaml").write_text(yaml.safe_dump(spec))
    return project


def trainstack_command() -> list[str]:
    """The `trainstack` console script a user runs: this interpreter's, else the one on PATH."""
    beside = Path(sys.executable).parent / "trainstack"
    found = str(beside) if beside.is_file() else shutil.which("trainstack")
    if found is None:
        raise FileNotFoundError("no `trainstack` command beside this interpreter or on PATH")
    return [found]


def offline_preview(root: Path, stacks: Sequence[str]) -> float:
    """Wall seconds of one `trainstack preview STACKS --project-dir ROOT`, a fresh process."""
    argv = [*trainstack_command(), "preview", *stacks, "--project-dir", str(root)]
    began = time.perf_counter()
    done = subprocess.run(
        argv, cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    seconds = time.perf_counter() - began
    if done.returncode:
        raise RuntimeError(
            f"`{' '.join(argv)}` exited {done.returncode}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
    return seconds


def engine_preview(
    engine: Engine, root: Path, stacks: Sequence[str], team_env: Mapping[str, str]
) -> tuple[float, dict[str, dict[str, int]], dict[str, str]]:
    """`pulumi preview` of each stack, one command each: summed wall seconds, each stack's
    change summary and the file with what its CLI printed."""
    total, changes, logs = 0.0, {}, {}
    for stack in stacks:
        env = None if stack == PLATFORM else team_env
        began = time.perf_counter()
        result = engine.run(root, stack, "preview", timeout=TIMEOUT_S, env=env)
        total += time.perf_counter() - began
        changes[stack] = {str(op): int(n) for op, n in result["changes"].items()}
        logs[stack] = str(result["log"])
    return total, changes, logs


def driver_cli_seconds(engine: Engine, root: Path, stacks: Sequence[str]) -> float:
    """The short CLI commands the Automation API driver runs ahead of each `pulumi preview`
    and a user's command does not (`pulumi version`, `pulumi stack select`): their wall
    seconds summed over `stacks`, once each."""
    began = time.perf_counter()
    for stack in stacks:
        engine.pulumi("version", cwd=root)
        engine.pulumi("stack", "select", "--stack", stack, cwd=root)
    return time.perf_counter() - began


def plan_resources(root: Path, stacks: Sequence[str]) -> dict[str, int]:
    """Resources each stack's offline plan holds (build/<stack>/plan.json, as written)."""
    counted = {}
    for stack in stacks:
        plan = json.loads((root / "build" / stack / "plan.json").read_text(encoding="utf-8"))
        counted[stack] = len(plan["resources"])
    return counted


def _spread(values: Sequence[float]) -> list[float]:
    return [round(min(values), 3), round(max(values), 3)]


def measure_engine(
    plane: ControlPlane,
    tools: Mapping[str, Path],
    work_dir: Path,
    *,
    teams: int,
    jobs_per_team: int,
    repeats: int,
) -> dict[str, object]:
    """Time the engine's and trainstack's previews of the same stacks on `plane` (see the
    module's docstring). The project is `work_dir/project`, the engine's home, state and CLI
    logs `work_dir/engine`. The plane is test_pulumi_stacks's existing cluster while it runs
    (`owners_cluster`: reset before, reset and uninstalled after)."""
    if teams < 1 or jobs_per_team < 1 or repeats < 1:
        raise ValueError("teams, jobs_per_team and repeats must each be at least 1")
    names = team_names(teams)
    stacks = [PLATFORM, *names]
    engine = new_engine(work_dir / "engine", tools)
    kubeconfig = plane.kubeconfig()
    project = write_project(engine, work_dir / "project", kubeconfig, names, jobs_per_team)
    with owners_cluster(plane, project):
        engine.run(project.root, PLATFORM, "up", timeout=TIMEOUT_S)
        # A team member reaches the existing cluster with a kubeconfig of their own.
        team_env = {"KUBECONFIG": str(kubeconfig)}

        engine_s: list[float] = []
        offline_s: list[float] = []
        changes: dict[str, dict[str, int]] = {}
        logs: dict[str, str] = {}

        def engine_side() -> None:
            nonlocal changes, logs
            seconds, changes, logs = engine_preview(engine, project.root, stacks, team_env)
            engine_s.append(seconds)

        def offline_side() -> None:
            offline_s.append(offline_preview(project.root, stacks))

        sides: tuple[Callable[[], None], Callable[[], None]] = (engine_side, offline_side)
        for repeat in range(repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                side()
        driver_s = driver_cli_seconds(engine, project.root, stacks)

    ratios = [e / o for e, o in zip(engine_s, offline_s, strict=True)]
    resources = plan_resources(project.root, stacks)
    return {
        "engine_preview_s": round(statistics.median(engine_s), 3),
        "engine_preview_spread": _spread(engine_s),
        "offline_preview_s": round(statistics.median(offline_s), 3),
        "offline_preview_spread": _spread(offline_s),
        "offline_speedup": round(statistics.median(ratios), 2),
        "offline_speedup_spread": [round(min(ratios), 2), round(max(ratios), 2)],
        "engine_driver_cli_s": round(driver_s, 3),
        "engine_stacks": len(stacks),
        "engine_teams": teams,
        "engine_jobs": teams * jobs_per_team,
        "engine_resources": sum(resources.values()),
        "engine_resources_by_stack": resources,
        "engine_changes": changes,
        "engine_logs": logs,
        "repeats": repeats,
    }


def arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.bench_engine", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--teams", type=int, default=3)
    parser.add_argument("--jobs-per-team", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (project, plans, CLI logs)"
    )
    return parser.parse_args(argv)


class Unavailable(RuntimeError):
    """What the engine's side needs is not here (tools, reference folder, Volcano sources)."""


def measure_on_own_plane(
    *, teams: int, jobs_per_team: int, repeats: int, keep: bool = False
) -> dict[str, object]:
    """measure_engine on a control plane of its own, started and stopped here; its work
    folder removed at the end unless `keep`. Unavailable names what is missing."""
    try:
        tools = toolchain.locate()
    except toolchain.MissingTools as missing:
        raise Unavailable(str(missing)) from None
    reference = reference_dir()
    if not (reference / "volcano" / "crd-bases").is_dir():
        raise Unavailable(f"reference folder {reference} is absent; set TRAINSTACK_REFERENCE to it")
    workdir = Path(tempfile.mkdtemp(prefix="trainstack-bench-engine-"))
    plane = ControlPlane(tools, workdir / "cp", reference)
    kept = "kept" if keep else "removed at the end unless a step fails; --keep keeps it"
    print(f"work folder: {workdir} ({kept})", file=sys.stderr, flush=True)
    try:
        plane.start()
        result = measure_engine(
            plane, tools, workdir, teams=teams, jobs_per_team=jobs_per_team, repeats=repeats
        )
    except pytest.skip.Exception as skipped:  # a helper's skip: the Volcano sources are absent
        raise Unavailable(str(skipped.msg)) from None
    finally:
        plane.stop()
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
        del result["engine_logs"]  # inside the folder just removed
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(sys.argv[1:] if argv is None else argv)
    try:
        result = measure_on_own_plane(
            teams=args.teams,
            jobs_per_team=args.jobs_per_team,
            repeats=args.repeats,
            keep=args.keep,
        )
    except Unavailable as missing:
        print(missing, file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)  # last: what scripts parse
    return 0


if __name__ == "__main__":
    sys.exit(main())
