"""Mutation testing of the core modules against their own tests (`make mutation`, issue 25).

mutmut (PyPI, pinned in pyproject.toml) makes the mutants and runs them: each module in a
scratch copy of the project under build/mutation/<module>/ with its own `[tool.mutmut]`
(mutmut reads its configuration from the working directory and writes its mutated copy,
`mutants/`, there), so the shared working tree is never touched and each module is judged by
its own test files only, not by the golden plans, which catch a change and state no intent.

A module's mutants are all run, or a seeded sample of them (MUTATION_SAMPLE=N, MUTATION_SEED):
mutmut first generates every mutant and collects which tests reach which function, then runs
the chosen mutants by name. A mutant that no own test reaches counts as survived. Survivors
listed in tests/mutation/equivalent.py (each with its reason) are left out of the score.
Output: one line per module (killed / scored, score), its survivors with their diffs, and a
last line of JSON.

    python -m tests.mutation.run [--sample N] [--seed S] [--children C] [module ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.equivalent import EQUIVALENT, Equivalent

ROOT = Path(__file__).resolve().parents[2]
SCRATCH = ROOT / "build" / "mutation"
MUTMUT = Path(sys.executable).parent / "mutmut"


@dataclass(frozen=True)
class Module:
    source: str  # the module mutated, relative to the project root
    tests: tuple[str, ...]  # its own test files (or tests: `file::name`)

    @property
    def dotted(self) -> str:
        return self.source.removesuffix(".py").replace("/", ".")


MODULES = {
    "scheduling": Module(
        "trainstack/builders/scheduling.py", ("tests/builders/test_scheduling.py",)
    ),
    "rules": Module(
        "trainstack/policy/rules.py",
        (
            "tests/policy/test_rules.py",
            "tests/policy/test_equivalence.py",
            "tests/policy/test_updates.py",
        ),
    ),
    # Split from rules.py (issue 38): the rules that keep teams apart, and the AWS ones.
    "isolation": Module(
        "trainstack/policy/isolation.py",
        (
            "tests/policy/test_rules.py",
            "tests/policy/test_equivalence.py",
            "tests/policy/test_updates.py",
        ),
    ),
    "aws_rules": Module(
        "trainstack/policy/aws_rules.py", ("tests/policy/test_pack.py::test_aws_rules",)
    ),
    "spec": Module("trainstack/jobs/spec.py", ("tests/jobs/test_specs.py",)),
    "render": Module(
        "trainstack/jobs/render.py",
        ("tests/jobs/test_render.py", "tests/jobs/test_topology.py", "tests/jobs/test_rdma.py"),
    ),
    "fabric": Module("trainstack/builders/fabric.py", ("tests/builders/test_fabric.py",)),
    # Issue 47: the MIG catalog and slice arithmetic, and a job's slice on a sliced pool.
    "slices": Module("trainstack/slices.py", ("tests/config/test_gpu_sharing.py",)),
    "fractional": Module("trainstack/jobs/fractional.py", ("tests/jobs/test_fractional.py",)),
    # issue 48: which images a pool holds, and the DaemonSet users rely on
    "prepull": Module("trainstack/builders/prepull.py", ("tests/builders/test_prepull.py",)),
    "team-images": Module("trainstack/jobs/prepull.py", ("tests/builders/test_prepull.py",)),
}
# What the tests read besides trainstack/ and tests/ (mutmut copies these into mutants/).
ALSO_COPY = ("stacks", "job_specs", "policies", "images", "Pulumi.yaml", "__main__.py")
KILLED = {1, 3, 24, -24, 36, 152, 255, -9, -11}  # failed, pytest error, timeouts, crashes
SURVIVED = {0, 5, 33}  # passed, or no own test reaches the mutant


def _copy_project(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "node_modules")
    for name in ("trainstack", "tests", *ALSO_COPY):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)


def _toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _mutmut(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # The reference folder the tests read lies beside the real checkout, not the scratch copy.
    env.setdefault("TRAINSTACK_REFERENCE", str(ROOT.parent / "shared" / "reference"))
    return subprocess.run(
        [str(MUTMUT), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def prepare(name: str, module: Module) -> Path:
    work = SCRATCH / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _copy_project(work)
    config = (
        "\n[tool.mutmut]\n"
        'source_paths = ["trainstack"]\n'
        f"only_mutate = {_toml_list([module.source])}\n"
        f"also_copy = {_toml_list(ALSO_COPY)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(module.tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
    )
    (work / "pyproject.toml").write_text(
        (ROOT / "pyproject.toml").read_text(encoding="utf-8") + config, encoding="utf-8"
    )
    return work


def _results(work: Path, module: Module) -> dict[str, int | None]:
    meta = work / "mutants" / f"{module.source}.meta"
    codes: dict[str, int | None] = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    return codes


def generate(work: Path, module: Module, children: int) -> list[str]:
    """Every mutant's name. mutmut generates the mutants and collects its test statistics
    before it filters by name, and stops (an assertion) when no name matches: a probe name
    that matches none does the first two steps only."""
    probe = f"{module.dotted}.x_no_such_function__mutmut_0"
    done = _mutmut(work, "run", "--max-children", str(children), probe)
    meta = work / "mutants" / f"{module.source}.meta"
    if not meta.is_file() or "nothing matches" not in done.stdout + done.stderr:
        raise SystemExit(f"mutmut could not generate the mutants:\n{done.stdout}{done.stderr}")
    return sorted(_results(work, module))


def diff(work: Path, mutant: str) -> str:
    shown = _mutmut(work, "show", mutant).stdout
    return "\n".join(
        line
        for line in shown.splitlines()
        if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
    )


def function_of(module: Module, mutant: str) -> str:
    """The function a mutmut mutant name belongs to: `x_name__mutmut_3` is `name`, a method's
    `xǁClassǁname__mutmut_3` is `Class.name`."""
    name = re.sub(r"__mutmut_\d+$", "", mutant.removeprefix(module.dotted + "."))
    if name.startswith("xǁ"):
        return name.removeprefix("xǁ").replace("ǁ", ".")
    return name.removeprefix("x_")


def excluded(module: Module, mutant: str, change: str) -> Equivalent | None:
    function = function_of(module, mutant)
    for eq in EQUIVALENT:
        if eq.module == module.source and eq.function == function and eq.change in change:
            return eq
    return None


def run_module(
    name: str, module: Module, sample: int, seed: int, children: int
) -> dict[str, object]:
    started = time.monotonic()
    work = prepare(name, module)
    names = generate(work, module, children)
    chosen = names
    if 0 < sample < len(names):
        chosen = sorted(random.Random(f"{seed}:{name}").sample(names, sample))
    done = _mutmut(work, "run", "--max-children", str(children), *chosen)
    codes = _results(work, module)
    missing = [m for m in chosen if codes.get(m) is None]
    if missing:
        raise SystemExit(
            f"{name}: mutmut left {len(missing)} mutants unrun:\n{done.stdout}{done.stderr}"
        )
    killed = [m for m in chosen if codes[m] in KILLED]
    others = [m for m in chosen if m not in killed]
    survived, equivalent = [], []
    for mutant in others:
        change = diff(work, mutant)
        eq = excluded(module, mutant, change)
        (equivalent if eq else survived).append((mutant, codes[mutant], change, eq))
    scored = len(killed) + len(survived)
    score = len(killed) / scored if scored else 1.0
    print(
        f"{name} ({module.source}): {len(killed)} killed / {scored} scored = {score:.1%}; "
        f"{len(chosen)} of {len(names)} mutants run, {len(equivalent)} equivalent; "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    for mutant, code, change, _ in survived:
        why = "no own test reaches it" if code in (5, 33) else "survived"
        print(f"  {why}: {mutant}\n" + "\n".join(f"    {line}" for line in change.splitlines()))
    for mutant, _, _, eq in equivalent:
        assert eq is not None
        print(f"  equivalent: {mutant}: {eq.reason}")
    return {
        "module": module.source,
        "mutants": len(names),
        "run": len(chosen),
        "killed": len(killed),
        "survived": len(survived),
        "equivalent": len(equivalent),
        "score": round(score, 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--sample", type=int, default=int(os.environ.get("MUTATION_SAMPLE", "0")))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("MUTATION_SEED", "25")))
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--min-score", type=float, default=0.9)
    args = parser.parse_args(argv)
    names = args.modules or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}; known: {', '.join(MODULES)}")
    print(f"mutation: modules {', '.join(names)}; sample {args.sample or 'all'}, seed {args.seed}")
    reports = [run_module(n, MODULES[n], args.sample, args.seed, args.children) for n in names]
    print(json.dumps({"sample": args.sample, "seed": args.seed, "modules": reports}))
    return 0 if all(float(str(r["score"])) >= args.min_score for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
