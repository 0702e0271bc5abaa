"""What every `trainstack` command prints through: the consoles and a user error's one line.

Markup and emoji codes off: user text (patterns like ^[a-z]([-a-z0-9]*[a-z0-9])?$, paths,
values) prints verbatim; rich would take bracket groups for markup tags, and `:tea:` or a
`:100:` line number for emoji codes. A user error is `error: <message>` on stderr, never
wrapped, and exit code 1 (trainstack/cli.py lists the codes).
"""

from __future__ import annotations

from typing import Final

import typer
from rich.console import Console
from rich.text import Text

EXIT_USER_ERROR: Final = 1
out = Console(highlight=False, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, markup=False, emoji=False)


def fail(message: str) -> typer.Exit:
    """Print a user error; raise what it returns (`raise fail(...) from None`)."""
    err.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    return typer.Exit(EXIT_USER_ERROR)
