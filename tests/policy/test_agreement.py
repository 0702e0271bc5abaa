"""Three enforcers, one verdict, for every example stack (issue 19 #2).

For each stack (the examples, and `dev-advisory`, which lowers rules to advisory and changes
thresholds the examples leave at their defaults) every row of the rule table
(tests/policy/test_equivalence.py CASES, mutations of a valid job) is applied to the demo job
rendered for one of the stack's teams, and judged by

- the Python rules as `trainstack preview` runs them: `evaluate` with the stack's
  `pack_config` and `levels`;
- the CrossGuard pack driven as the Pulumi CLI drives it with the stack's
  `--policy-pack-config` file, the checked-in `policies/config/<stack>.json` (generated for
  the variant): tests/policy/crossguard.py `analyze_configured`;
- the CEL admission policy of the row's rule, taken from the platform stack's own plan with
  its binding (Deny, or Warn and Audit for an advisory rule), evaluated with cel-python in the
  team's Namespace as the platform creates it (tests/policy/cel.py).

The first two must report the same rules, levels and messages for every rule; CEL, which
runs one policy per rule, must agree with them on the row's rule. The API server's column is
tests/e2e/test_admission.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

import pytest

from tests.conftest import EXAMPLE_STACKS, ROOT
from tests.policy import stacks
from tests.policy.cel import evaluate as cel_admits
from tests.policy.crossguard import analyze_configured
from tests.policy.test_equivalence import CASES, Mutation
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.policy.pack import evaluate
from trainstack.policy.rules import K8S_RULES
from trainstack.policy.settings import levels, pack_config
from trainstack.preview.engine import Previewer
from trainstack.preview.policy_config import CONFIG_DIR, config_document

K8S = [r.name for r in K8S_RULES]
_CEL: dict[str, bool] = {}


def _by_rule(
    found: Iterable[tuple[str, str, str]],
) -> dict[str, tuple[str, tuple[str, ...]]]:
    levels: dict[str, set[str]] = {}
    messages: dict[str, list[str]] = {}
    for rule, level, message in found:
        levels.setdefault(rule, set()).add(level)
        messages.setdefault(rule, []).append(message)
    assert all(len(lv) == 1 for lv in levels.values()), levels
    return {rule: (lv.pop(), tuple(sorted(messages[rule]))) for rule, lv in levels.items()}


class Table:
    """One stack's judges."""

    def __init__(self, judged: stacks.Judged) -> None:
        self.judged = judged
        self.config = pack_config(judged.cfg)
        self.levels = levels(judged.cfg)
        checked_in = ROOT / CONFIG_DIR / f"{judged.stack}.json"
        self.document = (
            json.loads(checked_in.read_text())
            if judged.stack in EXAMPLE_STACKS
            else config_document(judged.cfg)
        )
        self.admission = judged.admission()
        self.namespace = judged.namespace()

    def row(self, mutate: Mutation | None) -> dict[str, Any]:
        job = copy.deepcopy(self.judged.job)
        if mutate is not None:
            mutate(job)
        return job

    def python(self, job: dict[str, Any]) -> dict[str, tuple[str, tuple[str, ...]]]:
        """rule -> (level, messages) of every rule the preview finds broken."""
        found = evaluate([(VOLCANO_JOB, "job", job)], self.config, self.levels)
        return _by_rule((v.rule, v.level, v.message) for v in found)

    def crossguard(self, job: dict[str, Any]) -> dict[str, tuple[str, tuple[str, ...]]]:
        found = analyze_configured([(VOLCANO_JOB, "job", job)], self.document)
        return _by_rule((rule, level, message) for rule, _, message, level in found)

    def cel(self, rule: str, job: dict[str, Any]) -> tuple[bool, str]:
        """(admitted, the level a refusal has: Deny is mandatory, Warn is advisory)."""
        policy, binding = self.admission[rule]
        actions = binding["spec"]["validationActions"]
        # cel-python walks its parse tree (about 75 ms a row): stacks that share a platform,
        # policy and base job (prod and its team stack vision) are evaluated once.
        key = json.dumps([policy["spec"], job, self.namespace], sort_keys=True)
        if key not in _CEL:
            _CEL[key] = cel_admits(policy, job, self.namespace)
        return _CEL[key], "mandatory" if "Deny" in actions else "advisory"


@pytest.fixture(scope="module")
def tables(variants: Previewer) -> dict[str, Table]:
    return {stack: Table(stacks.judged(variants, stack)) for stack in stacks.TABLE_STACKS}


def test_the_table_covers_every_example_stack() -> None:
    assert set(EXAMPLE_STACKS) <= set(stacks.TABLE_STACKS)


@pytest.mark.parametrize("stack", stacks.TABLE_STACKS)
def test_each_stack_has_valid_and_invalid_rows_for_every_rule(
    stack: str, tables: dict[str, Table]
) -> None:
    table = tables[stack]
    assert set(table.admission) == set(K8S), "one admission policy per Kubernetes rule"
    rejected = dict.fromkeys(K8S, False)
    admitted = dict.fromkeys(K8S, False)
    for rule, _, mutate, _ in CASES:
        if rule in table.python(table.row(mutate)):
            rejected[rule] = True
        else:
            admitted[rule] = True
    assert [r for r, seen in rejected.items() if not seen] == [], "rules nothing rejects"
    assert [r for r, seen in admitted.items() if not seen] == [], "rules nothing admits"


def test_the_variant_lowers_levels_in_all_three(tables: dict[str, Table]) -> None:
    """dev-advisory's advisory rules are advisory in every enforcer; its table rows hit them."""
    table = tables["dev-advisory"]
    for rule in ("pinned-images", "shm-sized", "request-limit-ratio"):
        assert table.levels[rule] == "advisory"
        assert table.document[rule]["enforcementLevel"] == "advisory"
        assert "Deny" not in table.admission[rule][1]["spec"]["validationActions"]


@pytest.mark.parametrize("stack", stacks.TABLE_STACKS)
@pytest.mark.parametrize(
    ("rule", "case", "mutate", "admitted"), CASES, ids=[f"{r}: {c}" for r, c, _, _ in CASES]
)
def test_three_enforcers_agree(
    stack: str,
    rule: str,
    case: str,
    mutate: Mutation | None,
    admitted: bool,
    tables: dict[str, Table],
) -> None:
    del case, admitted  # the verdict is the stack's, whatever it is; they must share it
    table = tables[stack]
    job = table.row(mutate)
    python = table.python(job)
    assert table.crossguard(job) == python
    cel_ok, cel_level = table.cel(rule, job)
    assert cel_ok is (rule not in python), python.get(rule)
    if not cel_ok:
        assert python[rule][0] == cel_level
