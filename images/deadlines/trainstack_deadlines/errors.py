"""Exit codes and the errors that map onto them."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes of ``trainstack-deadlines`` (docs/deadlines.md)."""

    OK = 0
    SETUP = 1  # the program cannot start: registry, credentials, state ConfigMap (the message says)
    USAGE = 2  # bad arguments (argparse uses 2 as well)
    PASS_FAILED = 3  # --once: the pass hit API errors (they are logged, one line each)


class SetupError(Exception):
    """Something the operator must fix before the enforcer can run; the message says what."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
