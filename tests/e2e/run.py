"""`make e2e`: run the e2e suite and print, as the last line, one JSON object of outcome counts.

    {"passed": 41, "failed": 0, "skipped": 0, "xfailed": 12, "xpassed": 0, "errors": 0,
     "seconds": 512.3, "pulumi_up": ["onprem-e2e", "speech"], "second_up_changes": 0,
     "destroy_clean": true, "offline_matches_engine": true}

The last four come from the real-engine scenario (tests/e2e/test_pulumi_stacks.py, which
records them with `record_property`); null when it did not get that far. When the offline
plan and the engine's state differ, the differences are printed above the summary.

The exit status is pytest's, so CI fails on any failure, error or strict xpass. A run where
the tools are missing skips every test, and says so in the counts; with `--require` (CI) any
skip, or no test passing, fails the run: the e2e suite is never skipped silently.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from typing import Any

import pytest

# What the real-engine scenario records (user properties of its call report).
ENGINE_FIELDS = ("pulumi_up", "second_up_changes", "destroy_clean", "offline_matches_engine")
DIFFERENCES = "offline_engine_differences"


class Outcomes:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.properties: dict[str, Any] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.properties.update(dict(report.user_properties))
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if hasattr(report, "wasxfail"):
                self.counts["xfailed" if report.skipped else "xpassed"] += 1
            elif report.when == "setup" and report.failed:
                self.counts["errors"] += 1
            else:
                self.counts[report.outcome] += 1
        elif report.when == "teardown" and report.failed:
            self.counts["errors"] += 1


def main(argv: list[str]) -> int:
    require = "--require" in argv
    argv = [a for a in argv if a != "--require"]
    outcomes = Outcomes()
    start = time.monotonic()
    code = pytest.main(["-m", "e2e", "tests/e2e", *argv], plugins=[outcomes])
    summary: dict[str, Any] = {
        key: outcomes.counts.get(key, 0)
        for key in ("passed", "failed", "skipped", "xfailed", "xpassed", "errors")
    }
    summary["seconds"] = round(time.monotonic() - start, 1)
    summary |= {key: outcomes.properties.get(key) for key in ENGINE_FIELDS}
    for line in outcomes.properties.get(DIFFERENCES) or []:
        print(f"offline plan != engine: {line}", flush=True)
    if require and (summary["skipped"] or not summary["passed"]) and not code:
        print(
            f"--require: {summary['skipped']} skipped, {summary['passed']} passed; the e2e "
            "suite must run whole here (see the skip reasons above)",
            file=sys.stderr,
        )
        code = 1
    print(json.dumps(summary), flush=True)
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
