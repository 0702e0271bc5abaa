"""Known defects that a scenario shows, as an exception type of their own.

A scenario that a filed defect breaks is marked
`pytest.mark.xfail(strict=True, raises=DefectSeen, reason=<the issue and defect>)` and raises
DefectSeen only at the check that defect fails. Anything else that goes wrong is an ordinary
failure, so the mark cannot hide a new problem; once the defect is fixed the check passes, the
test XPASSes, and strict mode turns that red until the mark is removed.
"""

from __future__ import annotations

from typing import Any


class DefectSeen(AssertionError):
    """The behaviour a known defect predicts was observed."""


def known(condition: bool, message: str, *details: Any) -> None:
    """Raise DefectSeen with `message` unless `condition` holds."""
    if not condition:
        raise DefectSeen(" ".join([message, *map(str, details)]))
