"""The platform's copies of the images' contract modules (trainstack/contracts/).

The platform package and the images' packages install apart: the platform never pulls the
training runtime (torch) or the deadline enforcer, and the images never pull the platform
(Pulumi). Each contract is therefore one module kept as two byte-identical files, the
platform's and the image's (docs/architecture.md, "Packaging"). These tests hold them
identical, standard-library only, and the only place the platform takes them from.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = ROOT / "trainstack"
COPIES = {
    "runtime": ROOT / "images" / "runtime" / "trainstack_runtime" / "contract.py",
    "deadlines": ROOT / "images" / "deadlines" / "trainstack_deadlines" / "contract.py",
    "health": ROOT / "images" / "health" / "trainstack_health" / "contract.py",
}
IMAGE_PACKAGES = {
    "trainstack_runtime",
    "trainstack_deadlines",
    "trainstack_prewarm",
    "trainstack_health",
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_copies_are_identical(name: str) -> None:
    ours = PLATFORM / "contracts" / f"{name}.py"
    theirs = COPIES[name]
    assert ours.read_bytes() == theirs.read_bytes(), (
        f"{ours.relative_to(ROOT)} and {theirs.relative_to(ROOT)} differ: edit one, then "
        f"`cp {ours.relative_to(ROOT)} {theirs.relative_to(ROOT)}` (or the other way round); "
        "a changed value is a breaking change for images already deployed"
    )


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("name", sorted(COPIES))
def test_contract_imports_the_standard_library_only(name: str) -> None:
    imported = _imported_modules(PLATFORM / "contracts" / f"{name}.py")
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_platform_never_imports_an_image_package() -> None:
    """The wheel declares no image package, so importing one would fail once installed."""
    offenders = [
        f"{path.relative_to(ROOT)}: {sorted(modules)}"
        for path in [*sorted(PLATFORM.rglob("*.py")), ROOT / "__main__.py"]
        if (modules := _imported_modules(path) & IMAGE_PACKAGES)
    ]
    assert offenders == []
