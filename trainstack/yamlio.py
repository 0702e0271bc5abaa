"""YAML for stack files and job specs: libyaml's safe loader where PyYAML has it.

Previews parse every stack file and job spec of an organisation; the pure-Python loader
was a tenth of a team stack's preview. Both loaders build the same safe types.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainstack.config.errors import ConfigError, ConfigIssue

SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    """`yaml.safe_load`, faster; raises yaml.YAMLError alike."""
    return yaml.load(text, Loader=SafeLoader)


def read(path: Path) -> Any:
    """A YAML file's document, or one ConfigError naming the file and what is wrong."""
    try:
        return load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(
            str(path), [ConfigIssue("file", f"cannot read: {err.strerror}")]
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(str(path), [ConfigIssue("file", f"not valid YAML: {err}")]) from None
