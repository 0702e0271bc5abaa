"""Surviving mutants that are equivalent to the original (no input tells them apart), each
with its reason. `tests/mutation/run.py` leaves them out of a module's score.

An entry names the module, the function (`Class.method` for a method) and a piece of the
mutated line as `mutmut show` prints it (the `+` line of its diff).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Equivalent:
    module: str
    function: str
    change: str  # a substring of the mutant's diff
    reason: str


SCHEDULING = "trainstack/builders/scheduling.py"
SPEC = "trainstack/jobs/spec.py"
FABRIC = "trainstack/builders/fabric.py"
LOADER_GUARANTEE = (
    "the wording of an assertion that never fires: the loader guarantees every team pool "
    "exists (tests/config)"
)

EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(
        SCHEDULING,
        "_capability",
        "held.get(k, ",
        "`held` is pools_resources of the same pools as `shape`, so it has every key of it "
        "and the default is never used",
    ),
    Equivalent(
        SCHEDULING,
        "_max_lists",
        "_split(quantity)[0] >= _split(best[key])[0]",
        "one dimension has one unit (quantities writes them), so of two equal amounts either "
        "is the same quantity",
    ),
    Equivalent(
        SCHEDULING,
        "_split",
        'rstrip("XXGiMXX")',
        "adds X to the stripped characters; no quantity written here contains an X",
    ),
    Equivalent(
        SCHEDULING,
        "volcano_values",
        "sort_keys=None",
        "PyYAML tests sort_keys for truth (`if self.sort_keys`): None is False",
    ),
    Equivalent(SCHEDULING, "pools_shape", "XXthe loader guarantees", LOADER_GUARANTEE),
    Equivalent(SCHEDULING, "pools_shape", "THE LOADER GUARANTEES", LOADER_GUARANTEE),
    Equivalent(SCHEDULING, "pools_resources", "XXthe loader guarantees", LOADER_GUARANTEE),
    Equivalent(SCHEDULING, "pools_resources", "THE LOADER GUARANTEES", LOADER_GUARANTEE),
    Equivalent(
        SCHEDULING,
        "resource_list",
        "quantities(",
        "unused: nothing in trainstack calls resource_list (`grep -rn resource_list trainstack`)"
        ", so no test can reach it; left for its owner to remove",
    ),
    Equivalent(
        SPEC,
        "is_job_document",
        "return ",
        "unused: nothing in trainstack calls is_job_document (`grep -rn is_job_document "
        "trainstack`), so no test can reach it; left for its owner to remove",
    ),
    Equivalent(
        FABRIC,
        "divisors",
        "range(1, n + 2)",
        "n % (n + 1) == n, never 0 for a node's GPU count (at least 1), so n + 1 is never listed",
    ),
    Equivalent(
        "trainstack/slices.py",
        "MigGpu.layouts",
        'assert profile is not None, "XXmig_catalog checks balanced namesXX"',
        "the wording of an assertion that never fires: mig_catalog refuses a balanced layout "
        "naming a profile the GPU has not",
    ),
    Equivalent(
        "trainstack/slices.py",
        "MigGpu.layouts",
        'assert profile is not None, "MIG_CATALOG CHECKS BALANCED NAMES"',
        "the wording of an assertion that never fires (as above)",
    ),
)
