"""`make bench-preview`: offline preview at organisation scale against the mock engine's floor.

1. Generate an organisation (8 GPU pools, 50 teams, one team stack per team, 500 jobs) and
   preview every stack with trainstack's Previewer, as `trainstack preview` does.
2. Replay the very same resources (types, names, parents, providers and inputs, taken from
   each plan right after its preview) through the same mock engine (`run_mocked`) with no
   trainstack code in between: the floor no program can beat.
3. Do both again for the organisation 10x larger (500 teams, 5000 jobs).

The last line printed is one JSON object: resources, preview and replay seconds,
`preview_overhead_ratio` (preview / replay, target <= 1.25) and `scaling_ratio_10x`
(preview time at 10x / at 1x, target <= 11); before it, each target with its measured value
and a `result: pass` or `result: FAIL` line (the exit status stays 0). Timings are of one run
on this machine. A process's one-time start-up (imports, schema compilation) is measured
first, on a one-team organisation, and reported apart (`startup_s`,
`preview_overhead_ratio_with_startup`).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from trainstack.bench.org import OrgSize, generate
from trainstack.bench.targets import Target, report
from trainstack.config.project import Project
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan, Resource
from trainstack.preview.synth import run_mocked

STACK_REFERENCE = "pulumi:pulumi:StackReference"
OVERHEAD_TARGET = 1.25  # preview / replay of the same resources
SCALING_SLACK = 1.1  # preview time at FACTOR x the organisation <= FACTOR x this


def targets(summary: dict[str, object], factor: int) -> list[Target]:
    """The benchmark's promises, checked against one run's summary."""
    ratio = float(str(summary["preview_overhead_ratio"]))
    found = [
        Target(f"preview_overhead_ratio <= {OVERHEAD_TARGET}", ratio, ratio <= OVERHEAD_TARGET)
    ]
    if factor > 1:
        bound = round(factor * SCALING_SLACK, 2)
        scaling = float(str(summary[f"scaling_ratio_{factor}x"]))
        found.append(Target(f"scaling_ratio_{factor}x <= {bound}", scaling, scaling <= bound))
    return found


def jobs_available(program_dir: Path) -> bool:
    """Whether this trainstack has the job layer (team stacks with `jobs`)."""
    schema = program_dir / "trainstack" / "schemas" / "team.schema.json"
    try:
        return "jobs" in json.loads(schema.read_text(encoding="utf-8"))["properties"]
    except (OSError, KeyError, ValueError):
        return False


def _order(resources: tuple[Resource, ...]) -> list[Resource]:
    """Parents, providers and dependencies before the resources that name them (plans are
    sorted by type)."""
    by_ref = {r.ref: r for r in resources}
    done: set[str] = set()
    ordered: list[Resource] = []

    def visit(resource: Resource) -> None:
        if resource.ref in done:
            return
        done.add(resource.ref)
        for ref in (resource.parent, resource.provider, *resource.dependencies):
            if ref in by_ref:
                visit(by_ref[ref])
        ordered.append(resource)

    for resource in resources:
        visit(resource)
    return ordered


def replay_program(plan: Plan) -> Any:
    """A Pulumi program that registers the plan's resources as raw resources."""

    def program() -> None:
        made: dict[str, pulumi.Resource] = {}
        for r in _order(plan.resources):
            parent = made.get(r.parent)
            provider = made.get(r.provider)
            # The engine received each resource's dependencies (from depends_on and from
            # Outputs in its inputs); the replay passes its inputs as plain values and
            # declares the same dependencies explicitly.
            opts = pulumi.ResourceOptions(
                parent=parent,
                provider=provider if isinstance(provider, pulumi.ProviderResource) else None,
                depends_on=[made[d] for d in r.dependencies if d in made] or None,
            )
            if r.type.startswith("pulumi:providers:"):
                pkg = r.type.split(":", 2)[2]
                made[r.ref] = pulumi.ProviderResource(pkg, r.name, dict(r.inputs), opts)
            elif r.type == STACK_REFERENCE:
                made[r.ref] = pulumi.StackReference(r.name, str(r.inputs.get("name")), opts)
            elif r.custom:
                made[r.ref] = pulumi.CustomResource(r.type, r.name, dict(r.inputs), opts)
            else:
                # As Pulumi components register (trainstack's all do): the resource, then
                # RegisterResourceOutputs (empty: plans do not record component outputs).
                component = pulumi.ComponentResource(r.type, r.name, None, opts)
                component.register_outputs({})
                made[r.ref] = component

    return program


@dataclass
class Measured:
    stacks: int
    resources: int
    jobs: int
    preview_s: float
    replay_s: float
    extrapolated: bool = False  # the deadline passed: times scaled up from the stacks done


def measure(root: Path, stacks: list[str], deadline: float = float("inf")) -> Measured:
    """Preview every stack and replay each plan right after its preview, timing both.

    Interleaving stack by stack exposes both sides to the same load on a shared machine (a
    preview-all-then-replay-all run drifted by ±20 % between runs). Past `deadline`
    (perf_counter) the remaining stacks are skipped and both times are extrapolated
    linearly from the stacks done (an underestimate when cost per stack grows).
    """
    previewer = Previewer(Project.find(root))
    preview_s = replay_s = 0.0
    plans: list[Plan] = []
    stack_outputs: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for stack in stacks:
        started = time.perf_counter()
        plan = previewer.preview(stack)
        preview_s += time.perf_counter() - started
        plans.append(plan)
        if plan.kind == "platform":
            secrets = sorted(k for k, v in plan.outputs.items() if v == "[secret]")
            stack_outputs[f"acme/trainstack/{plan.stack}"] = (plan.outputs, secrets)
        started = time.perf_counter()
        run_mocked(replay_program(plan), plan.stack, {}, stack_outputs=stack_outputs)
        replay_s += time.perf_counter() - started
        if time.perf_counter() > deadline and len(plans) < len(stacks):
            break
    resources = sum(len(p.resources) for p in plans)
    jobs = sum(1 for p in plans for r in p.resources if r.type.endswith("v1alpha1:Job"))
    if len(plans) < len(stacks):
        scale = (len(stacks) - 1) / max(1, len(plans) - 1)  # team stacks only; platform done
        return Measured(len(plans), resources, jobs, preview_s * scale, replay_s * scale, True)
    return Measured(len(plans), resources, jobs, preview_s, replay_s)


def warm_up(root: Path, size: OrgSize, program_dir: Path, with_jobs: bool) -> float:
    """Preview a one-team organisation; return its wall time.

    What every process pays once, whatever the organisation: importing the program's modules
    (pulumi_aws loads each service's typed classes on first use, ~1 s) and compiling the
    schemas. Measured and reported apart, so the ratios compare per-organisation work; no
    cache carries over (other stack files, other job specs).
    """
    started = time.perf_counter()
    small = OrgSize(pools=size.pools, teams=1, jobs=1)
    stacks = generate(root, small, program_dir=program_dir, with_jobs=with_jobs)
    previewer = Previewer(Project.find(root))
    for stack in stacks:
        previewer.preview(stack)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--factor", type=int, default=10, help="the larger organisation")
    parser.add_argument("--program-dir", type=Path, default=Path.cwd())
    parser.add_argument(
        "--budget-s", type=float, default=600, help="stop previewing the larger org after this"
    )
    args = parser.parse_args(argv)
    program_dir = args.program_dir.resolve()
    print(
        f"targets: preview_overhead_ratio <= {OVERHEAD_TARGET}"
        + (
            f", scaling_ratio_{args.factor}x <= {round(args.factor * SCALING_SLACK, 2)}"
            if args.factor > 1
            else ""
        ),
        file=sys.stderr,
    )
    with_jobs = jobs_available(program_dir)
    base = OrgSize(teams=args.teams, jobs=args.jobs)
    results: dict[str, Measured] = {}
    with tempfile.TemporaryDirectory(prefix="trainstack-bench-") as tmp:
        startup_s = warm_up(Path(tmp) / "warm-up", base, program_dir, with_jobs)
        print(f"start-up (imports, schemas; one-team org): {startup_s:.1f}s", file=sys.stderr)
        deadline = time.perf_counter() + args.budget_s
        sizes = [("1x", base)]
        if args.factor > 1:
            sizes.append((f"{args.factor}x", base.times(args.factor)))
        for label, size in sizes:
            root = Path(tmp) / label
            stacks = generate(root, size, program_dir=program_dir, with_jobs=with_jobs)
            results[label] = m = measure(root, stacks, deadline if label != "1x" else float("inf"))
            note = " (extrapolated: budget reached)" if m.extrapolated else ""
            print(
                f"{label}: {m.stacks}/{len(stacks)} stacks, {m.resources} resources, "
                f"{m.jobs} jobs: preview {m.preview_s:.1f}s, replay {m.replay_s:.1f}s "
                f"(x{m.preview_s / m.replay_s:.2f}){note}",
                file=sys.stderr,
            )
    one = results["1x"]
    big = results.get(f"{args.factor}x", one)
    summary: dict[str, object] = {
        "pools": base.pools,
        "teams": base.teams,
        "jobs": one.jobs,
        "jobs_layer": with_jobs,
        "stacks": one.stacks,
        "resources": one.resources,
        "preview_s": round(one.preview_s, 2),
        "replay_s": round(one.replay_s, 2),
        "preview_overhead_ratio": round(one.preview_s / one.replay_s, 3),
        "startup_s": round(startup_s, 2),
        # An upper bound for a process that previews only this organisation: start-up here
        # also includes the warm-up's own (small) preview.
        "preview_overhead_ratio_with_startup": round((one.preview_s + startup_s) / one.replay_s, 3),
    }
    if args.factor > 1:
        summary |= {
            f"resources_{args.factor}x": big.resources,
            f"preview_{args.factor}x_s": round(big.preview_s, 2),
            f"replay_{args.factor}x_s": round(big.replay_s, 2),
            f"preview_overhead_ratio_{args.factor}x": round(big.preview_s / big.replay_s, 3),
            f"scaling_ratio_{args.factor}x": round(big.preview_s / one.preview_s, 3),
            f"extrapolated_{args.factor}x": big.extrapolated,
        }
    for line in report(targets(summary, args.factor)):
        print(line)
    print(json.dumps(summary, sort_keys=True))  # last: what scripts parse
    return 0


if __name__ == "__main__":
    gc.collect()
    gc.freeze()  # imports are done: keep their objects out of every later collection
    raise SystemExit(main())
