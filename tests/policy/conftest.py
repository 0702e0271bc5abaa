"""Policy test fixtures: the project copy with the variant stacks (tests/policy/stacks.py)."""

from __future__ import annotations

import pytest

from tests.policy import stacks
from trainstack.preview.engine import Previewer


@pytest.fixture(scope="session")
def variants(tmp_path_factory: pytest.TempPathFactory) -> Previewer:
    """Previews of the examples and their variants, from one copy of the project."""
    return stacks.previewer(tmp_path_factory.mktemp("stacks"))
