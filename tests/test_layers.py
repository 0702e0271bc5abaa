"""Imports point down (issue 38): config -> builders -> policy -> jobs -> components -> program.

docs/architecture.md draws the layers; this holds the package to them. Each module of
`trainstack` (the components through their `trainstack/components` link) belongs to one layer,
and may import only from its own layer or those below: an upward import makes a lower layer
depend on everything above it (the loader on the builders, the policy on the preview engine),
and the order stops meaning anything. Imports inside functions count too: they are deferred,
not absent. A module in no layer fails the test until it is placed.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trainstack"

# Lowest first. A name is a subpackage or a module directly under trainstack/.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("contracts",),  # what the images share with the platform: standard library only
    # the model and its checks (slices: the MIG catalog beside the instance catalog)
    ("config", "catalog", "slices", "yamlio", "outputs", "data", "schemas"),
    ("builders",),  # pure functions: config -> manifests and AWS inputs
    ("policy",),  # the rules over what the builders make
    ("jobs", "documents"),  # job specs rendered against a platform
    ("components",),  # Pulumi ComponentResources
    # what runs them
    (
        "program",
        "preview",
        "diff",
        "bench",
        "logs",
        "kube",
        "sandbox",
        "explain",
        "report",
        "terminal",
        "cli",
    ),
)
LAYER = {name: level for level, names in enumerate(LAYERS) for name in names}


def part_of(module: str) -> str:
    """The layer name of `trainstack.<name>[.…]`."""
    return module.split(".")[1]


def modules() -> dict[str, Path]:
    """Every module of the package, through the components' link (Path.rglob would not
    follow it: os.walk does, with followlinks)."""
    found = {}
    for folder, _dirs, files in os.walk(PACKAGE, followlinks=True):
        for file in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / file
            relative = path.relative_to(PACKAGE).with_suffix("")
            name = ".".join(("trainstack", *relative.parts))
            found[name.removesuffix(".__init__")] = path
    return dict(sorted(found.items()))


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported trainstack module) for every import in the file, at any depth."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("trainstack.")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            if base == "trainstack":  # `from trainstack import outputs`: each name a module
                found += [(node.lineno, f"trainstack.{a.name}") for a in node.names]
            elif base.startswith("trainstack."):
                found.append((node.lineno, base))
    return found


def upward(found: dict[str, Path]) -> list[str]:
    problems = []
    for module, path in found.items():
        if module == "trainstack":
            continue
        level = LAYER[part_of(module)]
        for line, target in imports(path, module):
            target_level = LAYER.get(part_of(target))
            if target_level is not None and target_level > level:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                problems.append(
                    f"{where}:{line}: {module} ({part_of(module)}, layer "
                    f"{level}) imports {target} ({part_of(target)}, layer {target_level}): move "
                    "what both need to the lower layer"
                )
    return problems


def test_every_module_is_in_a_layer() -> None:
    unplaced = sorted({part_of(m) for m in modules() if m != "trainstack"} - set(LAYER))
    assert unplaced == [], f"place these in tests/test_layers.py LAYERS: {unplaced}"


def test_imports_point_down() -> None:
    problems = upward(modules())
    assert problems == [], "\n".join(problems)


def test_the_components_are_the_top_level_folder() -> None:
    """`components/` at the repository's top level, importable as `trainstack.components` (the
    wheel and mypy follow the link; docs/architecture.md, Packaging)."""
    link = PACKAGE / "components"
    assert link.is_symlink()
    assert link.resolve() == (ROOT / "components").resolve()
    assert "trainstack.components.platform" in modules()


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("from trainstack.preview.engine import Previewer\n", "imports trainstack.preview.engine"),
        ("from trainstack import cli\n", "imports trainstack.cli"),
        ("def f():\n    from ..components import platform\n", "trainstack.components"),
    ],
    ids=["absolute", "from the package", "relative, deferred"],
)
def test_an_upward_import_is_found(tmp_path: Path, source: str, problem: str) -> None:
    """The check itself, on a builder that imports upward (issue 38 saw it fail on the main of
    the time: the loader imported builders.network and policy.rules, config.pools builders.
    fabric, and policy.config_files the preview engine)."""
    path = tmp_path / "builders" / "bad.py"
    path.parent.mkdir()
    path.write_text(source)
    found = upward({"trainstack.builders.bad": path})
    assert len(found) == 1, found
    assert problem in found[0]
