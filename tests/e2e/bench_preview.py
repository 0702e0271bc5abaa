"""`make bench-preview`: the offline preview against the mock engine's floor
(trainstack/bench/preview.py) and against the real engine (tests/e2e/bench_engine.py), in one
run, one JSON line last.

    python -m tests.e2e.bench_preview [trainstack/bench/preview.py's options]
        [--engine-teams 3] [--engine-jobs-per-team 4] [--engine-repeats 3] [--no-engine]

The engine's side needs the control-plane tools (`make e2e-tools`, which the Makefile target
builds first) and the reference folder; without them it is reported as skipped with the
reason (`engine_skipped`), the offline figures and their targets stand, and the run fails
the `offline_speedup` target rather than claiming it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tests.e2e.bench_engine import Unavailable, measure_on_own_plane
from trainstack.bench import preview as bench
from trainstack.bench.targets import Target

# The claim users care about: the offline preview answers in a fraction of the real engine's
# time for the same stacks (measured about 6.6x for 3 stacks on 2 cores, 2026-12-07).
SPEEDUP_TARGET = 2.0


def parser() -> argparse.ArgumentParser:
    found = bench.parser()
    found.add_argument("--engine-teams", type=int, default=3)
    found.add_argument("--engine-jobs-per-team", type=int, default=4)
    found.add_argument("--engine-repeats", type=int, default=3)
    found.add_argument("--no-engine", action="store_true", help="the offline figures only")
    return found


def targets(summary: dict[str, object], factor: int) -> list[Target]:
    found = bench.targets(summary, factor)
    speedup = summary.get("offline_speedup")
    met = isinstance(speedup, float | int) and speedup >= SPEEDUP_TARGET
    found.append(Target(f"offline_speedup >= {SPEEDUP_TARGET}", speedup, met))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    bench.print_targets(args)
    print(
        f"  and offline_speedup >= {SPEEDUP_TARGET} (the real engine, same stacks)", file=sys.stderr
    )
    summary = bench.run(args)
    if args.no_engine:
        summary["engine_skipped"] = "--no-engine"
    else:
        try:
            engine = measure_on_own_plane(
                teams=args.engine_teams,
                jobs_per_team=args.engine_jobs_per_team,
                repeats=args.engine_repeats,
            )
        except Unavailable as missing:
            summary["engine_skipped"] = str(missing)
        else:
            print(
                f"engine: {engine['engine_stacks']} stacks, {engine['engine_resources']} "
                f"resources: pulumi preview {engine['engine_preview_s']}s, trainstack "
                f"preview {engine['offline_preview_s']}s (wall, each a user's command): "
                f"x{engine['offline_speedup']}",
                file=sys.stderr,
            )
            summary |= engine
    bench.finish(summary, targets(summary, args.factor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
