"""Errors the health programs report to their operator."""

from __future__ import annotations


class SetupError(Exception):
    """Something the operator must fix (a missing token, a malformed expectations file); the
    message says what, and the program prints it and exits 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
