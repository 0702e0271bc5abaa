"""Every entry point imports on its own, whatever was imported before it.

A test session imports modules in one order, so an import cycle that only breaks another
order (components.platform first: builders -> catalog -> config -> loader -> builders) passes
the suite and fails `pulumi up`, whose program imports in its own order. Each module here is
imported first thing in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FIRST = [
    "trainstack.components.platform",
    "trainstack.components.team",
    "trainstack.builders.fabric",
    "trainstack.builders.addons",
    "trainstack.catalog",
    "trainstack.config",
    "trainstack.policy.pack",
    "trainstack.preview.engine",
    "trainstack.cli",
]


@pytest.mark.parametrize("module", FIRST)
def test_imports_first(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
