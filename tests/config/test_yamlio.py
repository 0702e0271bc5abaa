"""The strict YAML loader: aliases that loop or explode are refused, and the fast path for
texts without aliases reads every document exactly as the full loader does."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from trainstack import yamlio

LOOP = "a: &x [1, *x]\n"
# Five levels of ten aliases each: 111,111 values from a few lines.
EXPLOSION = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 10) if prev else ', '.join(['1'] * 10)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d"], "abcde", strict=True)
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (LOOP, "an alias refers to a map or list that contains it"),
        (EXPLOSION, "expands to more than 100000 values through aliases"),
        ("a: 1\na: 2\n", "duplicate key 'a'"),
    ],
)
def test_refused(text: str, message: str) -> None:
    with pytest.raises(yamlio.YamlSyntaxError) as refused:
        yamlio.load(text, "f.yaml")
    assert message in refused.value.problem


def test_aliases_that_neither_loop_nor_explode_are_read() -> None:
    assert yamlio.load("a: &a [1]\nb: *a\n") == {"a": [1], "b": [1]}


def test_the_alias_free_path_is_taken_only_without_a_star() -> None:
    assert yamlio._loader("a: 1\n") is yamlio._AliasFreeLoader
    # A `*` anywhere, even inside a quoted string, takes the full loader.
    assert yamlio._loader('a: "x*y"\n') is yamlio.StrictLoader
    assert yamlio._loader("a: 1\n" + " " * yamlio.MAX_VALUES) is yamlio.StrictLoader


def test_every_stack_file_and_job_spec_reads_the_same_on_both_paths() -> None:
    files = [
        *ROOT.glob("stacks/*.yaml"),
        *ROOT.glob("job_specs/**/*.yaml"),
        *ROOT.glob("tests/config/fixtures/**/*.yaml"),
        *ROOT.glob("tests/jobs/fixtures/**/*.yaml"),
    ]
    assert len(files) > 50
    for path in files:
        text = Path(path).read_text(encoding="utf-8")
        if "*" in text:
            continue  # read by the full loader anyway
        try:
            expected = yaml.load(text, Loader=yamlio.StrictLoader)
        except yaml.YAMLError:
            with pytest.raises(yaml.YAMLError):
                yaml.load(text, Loader=yamlio._AliasFreeLoader)
            continue
        assert yaml.load(text, Loader=yamlio._AliasFreeLoader) == expected, path
