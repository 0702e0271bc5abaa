"""What a YAML file is: a stack file or a job spec, recognised by its shape and `kind`.

`trainstack validate` takes any file. Without this, a job spec with a misspelled `kind`, or
an empty file, was reported as a stack file without `config:`, naming neither the kind nor
the emptiness.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from trainstack.config.errors import ConfigError, ConfigIssue, did_you_mean
from trainstack.config.schema import json_type
from trainstack.jobs.spec import KIND

EXPECTED = f"a stack file (a config: map) or a job spec (kind: {KIND})"


def document_kind(doc: object, source: str) -> Literal["job", "stack"]:
    """ "job" or "stack", or a ConfigError that says what the file is and what was expected."""
    if doc is None:
        raise ConfigError(source, [ConfigIssue("file", f"is empty; expected {EXPECTED}")])
    if not isinstance(doc, Mapping):
        raise ConfigError(
            source,
            [ConfigIssue("file", f"is a YAML {json_type(doc)}, not a map; expected {EXPECTED}")],
        )
    if "config" in doc and "kind" not in doc:
        return "stack"
    if "kind" in doc:
        kind = doc["kind"]
        if kind == KIND:
            return "job"
        if "config" in doc:
            raise ConfigError(
                source,
                [ConfigIssue("kind", f"a stack file has no kind; remove it ({EXPECTED})")],
            )
        raise ConfigError(
            source,
            [
                ConfigIssue(
                    "kind",
                    f"{kind!r} is not a trainstack document kind; a job spec has kind: "
                    f"{KIND}{did_you_mean(str(kind), [KIND])}",
                )
            ],
        )
    if "apiVersion" in doc or "spec" in doc or "metadata" in doc:
        return "job"  # a job spec without its kind: the schema names the missing field
    keys = ", ".join(sorted(map(str, doc))) or "none"
    raise ConfigError(
        source,
        [ConfigIssue("file", f"has neither config: nor kind: (keys: {keys}); expected {EXPECTED}")],
    )
