"""`make bench-preview`: offline preview at organisation scale against the mock engine's floor.

1. Generate an organisation (8 GPU pools, 50 teams, one team stack per team, 500 jobs) and
   preview every stack with trainstack's Previewer, as `trainstack preview` does.
2. Replay the very same resources (types, names, parents, providers, inputs and
   dependencies, taken from each plan right after its preview) and the stack's outputs
   through the same mock engine (`run_mocked`) with no trainstack code in between: the
   floor no program can beat.
3. Do both again for the organisation 10x larger (500 teams, 5000 jobs).

Times are CPU seconds of this process (both sides run in it; a busy neighbour on a shared
machine moves neither), each part started with gc.freeze() so a collection walks only what
that part allocated. The 1x organisation is measured `--repeats` times (3), the larger one
`--repeats-large` times (2), each repeat as a new process would preview (nothing parsed is
kept); the ratios reported are the median repeat's, with their spread ([min, max]).

The last line printed is one JSON object: resources, preview and replay seconds,
`preview_overhead_ratio` and `preview_overhead_ratio_10x` (preview / replay, target <= 1.10
each), `scaling_ratio_10x` (preview time at 10x / at 1x, target <= 11), and where the time
goes (`preview_phases_s`: CPU seconds per phase of the previews, and `program_over_replay`,
the program's own work and its Outputs beyond the engine's); before it, each target with
its measured value and a `result: pass` or `result: FAIL` line (the exit status stays 0).
A process's one-time start-up (imports, schema compilation) is measured first, on a
one-team organisation, and reported apart (`startup_s`,
`preview_overhead_ratio_with_startup`). `make bench-preview` adds the real engine's
preview of an existing-cluster organisation (tests/e2e/bench_preview.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi

from trainstack.bench.org import OrgSize, generate
from trainstack.bench.targets import Target, report
from trainstack.config.project import Project
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.preview.engine import Previewer, forget_parsed
from trainstack.preview.plan import Plan, Resource
from trainstack.preview.synth import SECRET_PLACEHOLDER, run_mocked

STACK_REFERENCE = "pulumi:pulumi:StackReference"
OVERHEAD_TARGET = 1.10  # preview / replay of the same resources, at 1x and at 10x
SCALING_SLACK = 1.1  # preview time at FACTOR x the organisation <= FACTOR x this


def targets(summary: dict[str, object], factor: int) -> list[Target]:
    """The benchmark's promises, checked against one run's summary."""
    keys = ["preview_overhead_ratio"] + (
        [f"preview_overhead_ratio_{factor}x"] if factor > 1 else []
    )
    found = []
    for key in keys:
        ratio = float(str(summary[key]))
        found.append(Target(f"{key} <= {OVERHEAD_TARGET}", ratio, ratio <= OVERHEAD_TARGET))
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


def declared_dependencies(resources: tuple[Resource, ...]) -> dict[str, list[str]]:
    """Per resource, what to declare in depends_on so that the SDK sends the engine exactly
    the plan's dependencies, at the least cost to the SDK.

    A plan records dependencies as the engine received them, each component expanded into
    its descendants: the SDK adds a local component's custom children and, through its
    component children, theirs, but not the children of a custom resource (pulumi 3.272.0
    runtime/rpc.py `_add_dependency`). A program depends on a component with one entry; one
    entry per expanded dependency made the SDK resolve, check and walk each of them (275,000
    at 10x), and the floor cost more than the platform's program itself. So every component
    whose whole expansion the resource depends on is declared instead of its descendants,
    largest first, and the rest one by one: the same dependencies, as a program declares
    them (tests/diff/test_bench.py compares them)."""
    by_ref = {r.ref: r for r in resources}
    children: dict[str, list[str]] = {}
    for r in resources:
        if r.parent in by_ref:
            children.setdefault(r.parent, []).append(r.ref)
    expansion: dict[str, frozenset[str]] = {}

    def expand(ref: str) -> frozenset[str]:
        if ref not in expansion:
            found: set[str] = set()
            for child in children.get(ref, ()):
                found |= {child} if by_ref[child].custom else expand(child)
            expansion[ref] = frozenset(found)
        return expansion[ref]

    declared: dict[str, list[str]] = {}
    for r in resources:
        wanted = {d for d in r.dependencies if d in by_ref}
        candidates: set[str] = set()
        for ref in wanted:
            parent = by_ref[ref].parent
            while parent in by_ref and not by_ref[parent].custom and parent not in candidates:
                candidates.add(parent)
                parent = by_ref[parent].parent
        covered: set[str] = set()
        chosen: list[str] = []
        for component in sorted(candidates, key=lambda c: (-len(expand(c)), c)):
            part = expand(component)
            if part and part <= wanted and not part <= covered:
                chosen.append(component)
                covered |= part
        declared[r.ref] = chosen + sorted(wanted - covered)
    return declared


def replay_program(plan: Plan) -> Any:
    """A Pulumi program that registers the plan's resources as raw resources. The order and
    the dependencies to declare are worked out here, before the program runs: the replay
    times the engine's work, not its own bookkeeping."""
    ordered = _order(plan.resources)
    declared = declared_dependencies(plan.resources)

    def program() -> None:
        made: dict[str, pulumi.Resource] = {}
        for r in ordered:
            parent = made.get(r.parent)
            provider = made.get(r.provider)
            # The engine received each resource's dependencies (from depends_on and from
            # Outputs in its inputs); the replay passes its inputs as plain values and
            # declares the same dependencies explicitly.
            opts = pulumi.ResourceOptions(
                parent=parent,
                provider=provider if isinstance(provider, pulumi.ProviderResource) else None,
                depends_on=[made[d] for d in declared[r.ref] if d in made] or None,
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
        # The stack's outputs: the engine receives them as the root's outputs, as it does the
        # program's exports (secret ones stay secret).
        for key, value in plan.outputs.items():
            pulumi.export(
                key, pulumi.Output.secret(value) if value == SECRET_PLACEHOLDER else value
            )

    return program


@dataclass
class Measured:
    stacks: int
    resources: int
    jobs: int
    # Per repeat: CPU seconds of every preview and of every replay, and wall seconds of the
    # previews (what a user waits for).
    preview_s: list[float] = field(default_factory=list)
    replay_s: list[float] = field(default_factory=list)
    preview_wall_s: list[float] = field(default_factory=list)
    # Per repeat: CPU seconds per phase of the previews (Previewer.phase_s).
    phase_s: list[dict[str, float]] = field(default_factory=list)
    extrapolated: bool = False  # the deadline passed: times scaled up from the stacks done

    @property
    def ratios(self) -> list[float]:
        return [p / r for p, r in zip(self.preview_s, self.replay_s, strict=True)]

    @property
    def ratio(self) -> float:
        """The median of the repeats' preview / replay (of the middle two for an even count)."""
        return statistics.median(self.ratios)

    @property
    def median_repeat(self) -> int:
        """The repeat whose ratio is the median (the lower middle one for an even count)."""
        return self.ratios.index(statistics.median_low(self.ratios))


def _cpu() -> float:
    """CPU seconds of this process, all threads (the mock monitor answers on a thread pool).

    CPU time, not wall time: both sides run in this one process, so their ratio is what
    trainstack adds, and a busy neighbour on a shared machine (steal time) moves neither.
    """
    return time.process_time()


def measure(
    root: Path, stacks: list[str], *, repeats: int = 1, deadline: float = float("inf")
) -> Measured:
    """Preview every stack and replay each plan right after its preview, `repeats` times.

    Interleaving stack by stack exposes both sides to the same load on a shared machine.
    Before each timed part, gc.freeze() moves what exists into the permanent generation
    (CPython gc docs): a collection then walks only what that part allocated, not the
    plans of every stack done before it, whose cost would otherwise fall on whichever side
    happened to trigger it. Each repeat starts as a new process would, with nothing parsed
    (`forget_parsed`). Past `deadline` (perf_counter) the remaining stacks of the first
    repeat are skipped and its times extrapolated linearly from the stacks done (an
    underestimate when cost per stack grows); no further repeat runs.
    """
    found = Measured(0, 0, 0)
    for _ in range(repeats):
        forget_parsed()
        previewer = Previewer(Project.find(root))
        preview_s = replay_s = wall_s = 0.0
        resources = jobs = done = 0
        stack_outputs: dict[str, tuple[dict[str, Any], list[str]]] = {}
        for stack in stacks:
            gc.freeze()
            started, wall = _cpu(), time.perf_counter()
            plan = previewer.preview(stack)
            preview_s += _cpu() - started
            wall_s += time.perf_counter() - wall
            done += 1
            resources += len(plan.resources)
            jobs += sum(1 for r in plan.resources if r.type == VOLCANO_JOB)
            if plan.kind == "platform":
                stack_outputs[f"acme/trainstack/{plan.stack}"] = plan.as_referenced()
            replay = replay_program(plan)
            gc.freeze()
            started = _cpu()
            run_mocked(replay, plan.stack, {}, stack_outputs=stack_outputs)
            replay_s += _cpu() - started
            if time.perf_counter() > deadline and done < len(stacks):
                break
        gc.unfreeze()
        found.phase_s.append(dict(previewer.phase_s))
        del previewer
        scale = 1.0
        if done < len(stacks):  # team stacks only: the platform is done
            scale = (len(stacks) - 1) / max(1, done - 1)
            found.extrapolated = True
        found.stacks, found.resources, found.jobs = done, resources, jobs
        found.preview_s.append(preview_s * scale)
        found.replay_s.append(replay_s * scale)
        found.preview_wall_s.append(wall_s * scale)
        if found.extrapolated:
            break
    return found


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


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--factor", type=int, default=10, help="the larger organisation")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of the 1x org")
    parser.add_argument(
        "--repeats-large", type=int, default=2, help="measurements of the larger org"
    )
    parser.add_argument("--program-dir", type=Path, default=Path.cwd())
    parser.add_argument(
        "--budget-s", type=float, default=600, help="stop previewing the larger org after this"
    )
    return parser


def where_the_time_goes(measured: Measured) -> dict[str, float]:
    """The median repeat's CPU seconds per phase of the previews, and the program's time
    beyond the replay of what it registered (`program_over_replay`): the program's own
    work and its use of Outputs, everything else being the mock engine's."""
    repeat = measured.median_repeat
    phases = measured.phase_s[repeat]
    found = {k: round(v, 3) for k, v in phases.items()}
    found["program_over_replay"] = round(phases["program"] - measured.replay_s[repeat], 3)
    return found


def _spread(values: list[float]) -> list[float]:
    return [round(min(values), 3), round(max(values), 3)]


def run(args: argparse.Namespace) -> dict[str, object]:
    """Measure; the summary (what the JSON line holds)."""
    program_dir = args.program_dir.resolve()
    with_jobs = jobs_available(program_dir)
    base = OrgSize(teams=args.teams, jobs=args.jobs)
    results: dict[str, Measured] = {}
    phases: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="trainstack-bench-") as tmp:
        startup_s = warm_up(Path(tmp) / "warm-up", base, program_dir, with_jobs)
        print(f"start-up (imports, schemas; one-team org): {startup_s:.1f}s", file=sys.stderr)
        deadline = time.perf_counter() + args.budget_s
        sizes = [("1x", base, args.repeats)]
        if args.factor > 1:
            sizes.append((f"{args.factor}x", base.times(args.factor), args.repeats_large))
        for label, size, repeats in sizes:
            root = Path(tmp) / label
            stacks = generate(root, size, program_dir=program_dir, with_jobs=with_jobs)
            results[label] = m = measure(
                root, stacks, repeats=repeats, deadline=deadline if label != "1x" else math.inf
            )
            phases[label] = where_the_time_goes(m)
            note = " (extrapolated: budget reached)" if m.extrapolated else ""
            print(
                f"{label}: {m.stacks}/{len(stacks)} stacks, {m.resources} resources, "
                f"{m.jobs} jobs, {len(m.ratios)} repeats: preview "
                f"{statistics.median(m.preview_s):.1f}s CPU "
                f"({statistics.median(m.preview_wall_s):.1f}s wall), replay "
                f"{statistics.median(m.replay_s):.1f}s CPU; preview/replay "
                + ", ".join(f"{r:.3f}" for r in m.ratios)
                + note,
                file=sys.stderr,
            )
            print(
                f"{label}: where the time goes (CPU s, median repeat): "
                + ", ".join(f"{k} {v:.2f}" for k, v in phases[label].items()),
                file=sys.stderr,
            )
    one = results["1x"]
    summary: dict[str, object] = {
        "pools": base.pools,
        "teams": base.teams,
        "jobs": one.jobs,
        "jobs_layer": with_jobs,
        "stacks": one.stacks,
        "resources": one.resources,
        "repeats": len(one.ratios),
        "preview_s": round(statistics.median(one.preview_s), 2),
        "preview_wall_s": round(statistics.median(one.preview_wall_s), 2),
        "replay_s": round(statistics.median(one.replay_s), 2),
        "preview_overhead_ratio": round(one.ratio, 3),
        "preview_overhead_ratio_spread": _spread(one.ratios),
        "preview_phases_s": phases["1x"],
        "startup_s": round(startup_s, 2),
        # An upper bound for a process that previews only this organisation: start-up here
        # also includes the warm-up's own (small) preview.
        "preview_overhead_ratio_with_startup": round(
            (statistics.median(one.preview_wall_s) + startup_s) / statistics.median(one.replay_s),
            3,
        ),
    }
    if args.factor > 1:
        big, f = results[f"{args.factor}x"], args.factor
        summary |= {
            f"resources_{f}x": big.resources,
            f"repeats_{f}x": len(big.ratios),
            f"preview_{f}x_s": round(statistics.median(big.preview_s), 2),
            f"replay_{f}x_s": round(statistics.median(big.replay_s), 2),
            f"preview_overhead_ratio_{f}x": round(big.ratio, 3),
            f"preview_overhead_ratio_{f}x_spread": _spread(big.ratios),
            f"preview_phases_{f}x_s": phases[f"{f}x"],
            f"scaling_ratio_{f}x": round(
                statistics.median(big.preview_s) / statistics.median(one.preview_s), 3
            ),
            # The floor's own growth, which bounds the preview's from below.
            f"replay_scaling_ratio_{f}x": round(
                statistics.median(big.replay_s) / statistics.median(one.replay_s), 3
            ),
            f"extrapolated_{f}x": big.extrapolated,
        }
    return summary


def print_targets(args: argparse.Namespace) -> None:
    bounds = [f"preview_overhead_ratio <= {OVERHEAD_TARGET}"]
    if args.factor > 1:
        bounds += [
            f"preview_overhead_ratio_{args.factor}x <= {OVERHEAD_TARGET}",
            f"scaling_ratio_{args.factor}x <= {round(args.factor * SCALING_SLACK, 2)}",
        ]
    print(f"targets: {', '.join(bounds)}", file=sys.stderr)


def finish(summary: dict[str, object], found: list[Target]) -> None:
    """The targets with their values, then the JSON line (last: what scripts parse)."""
    for line in report(found):
        print(line)
    print(json.dumps(summary, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print_targets(args)
    summary = run(args)
    finish(summary, targets(summary, args.factor))
    return 0


if __name__ == "__main__":
    gc.collect()
    gc.freeze()  # imports are done: keep their objects out of every later collection
    raise SystemExit(main())
