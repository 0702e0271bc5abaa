"""Config contract: JSON Schema files, one loader, frozen typed dataclasses."""

from trainstack.config.errors import ConfigError, ConfigIssue
from trainstack.config.loader import (
    PLATFORM_KEY,
    TEAM_KEY,
    load_stack_file,
    parse_stack_config,
    read_stack_file,
    stack_name_from_path,
)
from trainstack.config.model import PlatformConfig, StackConfig, TeamStackConfig

__all__ = [
    "PLATFORM_KEY",
    "TEAM_KEY",
    "ConfigError",
    "ConfigIssue",
    "PlatformConfig",
    "StackConfig",
    "TeamStackConfig",
    "load_stack_file",
    "parse_stack_config",
    "read_stack_file",
    "stack_name_from_path",
]
