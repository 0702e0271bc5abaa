"""Stack config as the Pulumi engine hands it to the program, through the one loader."""

from __future__ import annotations

import json
from typing import Any

import pulumi

from trainstack.config import StackConfig, parse_stack_config
from trainstack.config.loader import STACK_KINDS


def load_pulumi_config() -> StackConfig:
    """The stack config as Pulumi hands it to the program, through the one loader."""
    values: dict[str, Any] = {}
    for key in STACK_KINDS:
        raw = pulumi.Config("trainstack").get(key.split(":", 1)[1])
        if raw is None:
            continue
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw  # a plain string: the schema reports the wrong type
    stack = pulumi.get_stack()
    return parse_stack_config(values, stack=stack, source=f"stack {stack}")
