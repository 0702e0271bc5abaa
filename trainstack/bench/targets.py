"""What a benchmark promises and whether a run kept it: printed before the run's JSON line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """One promise: `what` (a name and its bound, e.g. `preview_overhead_ratio <= 1.25`), the
    value measured and whether it holds."""

    what: str
    value: object
    met: bool

    def line(self) -> str:
        return f"  {'ok    ' if self.met else 'MISSED'} {self.what} (measured {self.value})"


def report(targets: list[Target]) -> list[str]:
    """A line per target, then `result: pass` or `result: FAIL` naming what was missed."""
    missed = [t.what for t in targets if not t.met]
    lines = ["targets:", *(t.line() for t in targets)]
    if missed:
        lines.append(f"result: FAIL ({len(missed)} of {len(targets)} missed: {'; '.join(missed)})")
    else:
        lines.append(f"result: pass (all {len(targets)} targets met)")
    return lines
