"""The mutation driver's own bookkeeping (the mutation runs themselves: `make mutation`)."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT
from tests.mutation.equivalent import EQUIVALENT
from tests.mutation.run import MODULES, function_of


def functions(source: str) -> set[str]:
    tree = ast.parse((ROOT / source).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
    return names


@pytest.mark.parametrize("name", MODULES)
def test_every_core_module_and_its_tests_exist(name: str) -> None:
    module = MODULES[name]
    assert (ROOT / module.source).is_file()
    for test in module.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), test
        assert not name or f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), test


def test_every_exclusion_names_a_function_of_a_core_module_and_says_why() -> None:
    sources = {m.source for m in MODULES.values()}
    for eq in EQUIVALENT:
        assert eq.module in sources, eq
        assert eq.function in functions(eq.module), eq
        assert eq.change.strip(), eq
        assert len(eq.reason) > 20, eq


def test_mutant_names_map_to_their_functions() -> None:
    fabric = MODULES["fabric"]
    assert function_of(fabric, "trainstack.builders.fabric.x_divisors__mutmut_7") == "divisors"
    assert (
        function_of(fabric, "trainstack.builders.fabric.xǁFabricProfileǁresources_for__mutmut_2")
        == "FabricProfile.resources_for"
    )
    spec = MODULES["spec"]
    assert function_of(spec, "trainstack.jobs.spec.x__parse_job__mutmut_12") == "_parse_job"
