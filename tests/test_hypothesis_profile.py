"""Property tests run without a wall-clock deadline (tests/conftest.py): a loaded machine must
not fail them."""

from __future__ import annotations

from hypothesis import settings


def test_property_tests_have_no_deadline() -> None:
    assert settings.default.deadline is None
