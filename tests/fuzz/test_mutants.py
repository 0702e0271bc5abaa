"""Mutation fuzzing of stack files and job specs through `trainstack validate` and `preview`.

Every example stack file (stacks/Pulumi.*.yaml) and vision job spec (job_specs/vision/*.yaml)
is mutated (tests/fuzz/mutate.py) and handed to the CLI; the oracles (tests/fuzz/oracles.py)
hold each outcome to the contract: exit 0 with exactly what was written, or exit 1 naming the
file and a JSON path, never a traceback.

Budget (fixed and deterministic under `make test`; `make fuzz` raises it and seeds randomly):

- TRAINSTACK_FUZZ_MUTANTS (2000): mutants through `trainstack validate`, three fifths of them
  stack files, two fifths job specs; the job specs are also checked against the platform with
  `validate --stack vision`, 100 files per invocation (one platform preview per invocation).
- TRAINSTACK_FUZZ_PREVIEWS (100): mutants through the full offline `trainstack preview`.
- TRAINSTACK_FUZZ_RANDOM=1: a random seed (hypothesis prints how to reproduce a failure)
  and the example database (a failure found once is tried first next time).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import SOURCES, Baseline
from tests.fuzz.harness import Cli, Project, Scratch
from tests.fuzz.mutate import MUTATIONS, Mutant, Source, mutate
from tests.fuzz.oracles import (
    Crash,
    Inconsistent,
    Neutral,
    Outcome,
    Unlocated,
    check_accepted,
    check_clean,
    check_located,
    check_plan,
    check_rules_named,
    report,
    split_by_file,
    verdict,
)

T = TypeVar("T")

MUTANTS = int(os.environ.get("TRAINSTACK_FUZZ_MUTANTS", "2000"))
PREVIEWS = int(os.environ.get("TRAINSTACK_FUZZ_PREVIEWS", "100"))
RANDOM = os.environ.get("TRAINSTACK_FUZZ_RANDOM", "") == "1"
BATCH = 100  # job specs per `validate --stack` invocation
JOB_MUTANTS = MUTANTS * 2 // 5
STACK_MUTANTS = MUTANTS - JOB_MUTANTS
VALIDATE_LIMIT_S = 30.0
BATCH_LIMIT_S = 120.0
PREVIEW_LIMIT_S = 120.0

# Paths whose change may leave the plan unchanged, with the reason. Every other change to an
# accepted document must show in the plan.
NEUTRAL: tuple[Neutral, ...] = (
    Neutral(
        r"^job_specs/",
        r"^job\.spec\.workers\.gpuMemory$",
        "a requirement the preview checks against the pool's GPUs; no Kubernetes field has it",
    ),
    Neutral(
        r"^stacks/Pulumi\.vision\.yaml$",
        r"^trainstack:team\.jobs(\[\d+\])?$",
        "globs select a set of files: a repeated glob, or another that selects the same files, "
        "deploys the same jobs",
    ),
)


def computed_defaults(stack: str) -> Callable[[Any], Any]:
    """Defaults trainstack derives in code, not in the schema: leaving them out is no change.

    clusterName: trainstack-<stack> (config/loader.py); a pool's size.desired: its size.min
    (config/pools.py); a RoCE pool's rdma.gidIndex: 3 (builders/fabric.py, NCCL_IB_GID_INDEX).
    """

    def fill(document: Any) -> Any:
        config = document.get("config") if isinstance(document, dict) else None
        platform = config.get("trainstack:platform") if isinstance(config, dict) else None
        if not isinstance(platform, dict):
            return document
        platform.setdefault("clusterName", f"trainstack-{stack}")
        pools = platform.get("gpuPools")
        for pool in pools if isinstance(pools, list) else []:
            size = pool.get("size") if isinstance(pool, dict) else None
            if isinstance(size, dict) and "min" in size:
                size.setdefault("desired", size["min"])
            rdma = pool.get("rdma") if isinstance(pool, dict) else None
            if isinstance(rdma, dict) and pool.get("fabric") == "roce":
                rdma.setdefault("gidIndex", 3)
        return document

    return fill


def budget(examples: int, *, expensive: bool = False) -> Callable[[T], T]:
    """Hypothesis settings: derandomized under `make test`, seeded randomly under `make fuzz`.

    Shrinking is off for the expensive tests (seconds per example, and hundreds of examples
    to shrink one): their mutants are one or two named mutations, readable unshrunk, and a
    failing batch is narrowed to its one failing file by the test itself.
    """
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
    if expensive:
        phases.remove(Phase.shrink)
    options: dict[str, Any] = {}
    if not RANDOM:
        options["database"] = None  # the same examples on every machine, every run
    return settings(
        max_examples=examples,
        derandomize=not RANDOM,
        deadline=None,
        phases=phases,
        print_blob=RANDOM,
        report_multiple_bugs=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
        **options,
    )


class Draws:
    """The mutation engine's Chooser, drawing from hypothesis (so examples shrink)."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def choice(self, options: Sequence[T]) -> T:
        return self.draw(st.sampled_from(options))

    def integer(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))


@st.composite
def mutants(
    draw: st.DrawFn,
    sources: Sequence[Source],
    max_steps: int = 2,
    names: Sequence[str] = MUTATIONS,
) -> Mutant:
    return mutate(draw(st.sampled_from(sources)), Draws(draw), max_steps, names)


# Previews are costly and only accepted mutants reach the plan: one mutation each, drawn
# mostly from those that keep a document valid (a removed optional key, a changed number,
# a spelled-out default, an alias, a comment); damage that YAML rejects is left to validate.
PREVIEW_MUTATIONS = (
    *("renumber", "delete-key", "edit-string") * 3,
    *("delete-item", "duplicate-item", "truncate-string", "anchor-alias") * 2,
    *("multi-document", "yaml-special", "delete-line") * 2,
    *("duplicate-key", "retype", "rename-key", "swap-list-map", "break-indentation"),
    *("truncate-file", "not-utf8"),
)


def weighted(kind: str | None = None) -> list[Source]:
    """Example files, the larger ones repeated: prod has the most to break."""
    weights = {"stacks/Pulumi.prod.yaml": 3, "stacks/Pulumi.vision.yaml": 1}
    return [s for s in SOURCES if kind in (None, s.kind) for _ in range(weights.get(s.rel, 2))]


def check_validated(outcome: Outcome, mutant: Mutant, file_name: str) -> None:
    """One file through `validate`: accepted exactly as written, or rejected with a location."""
    check_clean(outcome, mutant, (0, 1))
    if outcome.exit_code == 0:
        check_accepted(mutant, outcome)
    else:
        check_located(outcome.output, file_name, mutant, outcome)


# -- the examples themselves pass every oracle (the oracles are not too strict) -------------


def test_examples_pass_every_oracle(cli: Cli, project: Project, baseline: Baseline) -> None:
    for source in SOURCES:
        unchanged = Mutant(source, (), source.text.encode("utf-8"))
        path = project.root / source.rel
        extra = ["--stack", "vision"] if source.kind == "job" else []
        args = ["validate", str(path), *extra, "--project-dir", str(project.root)]
        outcome = cli.run(args, BATCH_LIMIT_S)
        assert outcome.exit_code == 0, outcome.output
        check_validated(outcome, unchanged, path.name)
        document = check_accepted(unchanged, outcome)
        assert document == baseline.documents[source.rel]


# -- validate ---------------------------------------------------------------------------------


@budget(STACK_MUTANTS)
@given(mutant=mutants(weighted("stack")))
def test_validate_stack_mutants(mutant: Mutant, cli: Cli, scratch: Scratch) -> None:
    """`trainstack validate <stack file>`: exact acceptance or a located error."""
    path = scratch.place(mutant)
    outcome = cli.run(["validate", str(path)], VALIDATE_LIMIT_S)
    check_validated(outcome, mutant, path.name)


class Batch(list[Mutant]):
    """Mutants checked in one invocation; printed short (the failure names the mutant)."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        del cycle
        printer.text(f"Batch of {len(self)} mutants")


@budget(math.ceil(JOB_MUTANTS / BATCH), expensive=True)
@given(batch=st.lists(mutants(weighted("job")), min_size=BATCH, max_size=BATCH).map(Batch))
def test_validate_job_mutants(batch: Batch, cli: Cli, project: Project, scratch: Scratch) -> None:
    """`trainstack validate <spec>` on each, then `validate --stack vision` on all at once.

    One `--stack` invocation previews the platform once (~0.7 s) and then checks every file;
    its output is split by file and each file's part judged alone.
    """
    paths = [scratch.place(m) for m in batch]
    alone = [cli.run(["validate", str(p)], VALIDATE_LIMIT_S) for p in paths]
    for mutant, path, outcome in zip(batch, paths, alone, strict=True):
        check_validated(outcome, mutant, path.name)
    args = ["validate", "--stack", "vision", "--project-dir", str(project.root)]
    together = cli.run([*args, *map(str, paths)], BATCH_LIMIT_S)
    if crashed(together):
        culprit = bisect_crash(cli, args, list(zip(batch, paths, strict=True)))
        if culprit is not None:
            check_clean(culprit[1], culprit[0], (0, 1))
        raise report(Crash, "the batch crashes, no file alone does", batch[0], together)
    parts, stray = split_by_file(together.output, [str(p) for p in paths])
    verdicts = {str(p): verdict(parts[str(p)], str(p)) for p in paths}
    for mutant, path, outcome in zip(batch, paths, alone, strict=True):
        part = parts[str(path)]
        single = Outcome(together.command, together.exit_code, part, None, together.seconds)
        check_clean(single, mutant, (0, 1))
        if verdicts[str(path)] == "ok":
            check_accepted(mutant, single)
            if outcome.exit_code != 0:
                raise report(
                    Inconsistent, "validate rejects it, validate --stack accepts it", mutant, single
                )
        elif verdicts[str(path)] == "error":
            check_located(part, path.name, mutant, single)
        else:
            lost = Outcome(together.command, together.exit_code, "\n".join(stray), None, 0.0)
            raise report(Unlocated, "no verdict for this file in the output", mutant, lost)
    expected = 0 if all(v == "ok" for v in verdicts.values()) else 1
    if together.exit_code != expected:
        raise report(
            Inconsistent, f"exit {together.exit_code} for verdicts {verdicts}", batch[0], together
        )


def crashed(outcome: Outcome) -> bool:
    return outcome.timed_out or not isinstance(outcome.exception, SystemExit | None)


def bisect_crash(
    cli: Cli, args: list[str], pairs: list[tuple[Mutant, Path]]
) -> tuple[Mutant, Outcome] | None:
    """The one file of a crashing multi-file invocation that crashes alone (log2(n) runs)."""
    while len(pairs) > 1:
        half = pairs[: len(pairs) // 2]
        first = cli.run([*args, *(str(p) for _, p in half)], BATCH_LIMIT_S)
        pairs = half if crashed(first) else pairs[len(pairs) // 2 :]
    alone = cli.run([*args, str(pairs[0][1])], BATCH_LIMIT_S)
    return (pairs[0][0], alone) if crashed(alone) else None


# -- preview ----------------------------------------------------------------------------------


@budget(PREVIEWS, expensive=True)
@given(mutant=mutants(weighted(), max_steps=1, names=PREVIEW_MUTATIONS))
def test_preview_mutants(mutant: Mutant, cli: Cli, project: Project, baseline: Baseline) -> None:
    """The full offline preview of the stack a mutant belongs to (job specs: vision).

    The mutant replaces its example in a copy of the project; `validate` and `preview` run on
    it (what validate rejects, preview must reject too), and the plan is compared with the
    unmutated project's.
    """
    source = mutant.source
    stack = source.stack or "vision"
    with project.swapped(source.rel, mutant.content) as path:
        # Plain validate: `--stack` would preview the platform a second time (0.7 s); job
        # specs meet the platform in test_validate_job_mutants and in this preview.
        checked = cli.run(["validate", str(path)], VALIDATE_LIMIT_S)
        outcome = cli.run(
            ["preview", stack, "--out", str(baseline.out), "--project-dir", str(project.root)],
            PREVIEW_LIMIT_S,
        )
    check_validated(checked, mutant, path.name)
    check_clean(outcome, mutant, (0, 1, 3))
    if outcome.exit_code == 1:
        check_located(outcome.output, path.name, mutant, outcome)
        return
    if checked.exit_code != 0:
        raise report(Inconsistent, "validate rejects it, preview accepts it", mutant, outcome)
    document = check_accepted(mutant, outcome)
    plan_file = baseline.out / stack / "plan.json"
    plan: dict[str, Any] = json.loads(plan_file.read_text(encoding="utf-8"))
    if outcome.exit_code == 3:
        check_rules_named(outcome.output, plan, mutant, outcome)
    check_plan(
        mutant,
        document,
        baseline.documents[source.rel],
        plan,
        baseline.plans[stack],
        NEUTRAL,
        outcome,
        source.kind,
        computed_defaults(stack),
    )
