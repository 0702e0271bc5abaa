"""The CrossGuard pack's `--policy-pack-config` files, generated from the stack files.

`pulumi preview --policy-pack policies --policy-pack-config policies/config/<stack>.json`
must judge by the settings `trainstack preview` and the admission policies use, so the file
is never written by hand: `trainstack policy-config` (`make policy-config`) writes one per
stack from `settings.pack_config` and `settings.levels`, and a test fails when a checked-in
file is stale.

The format is the CLI's unversioned one (pkg/v3 resource/analyzer/config.go,
parsePolicyConfigs): `all` and, per policy, an object with `enforcementLevel` and config
properties. The CLI fills every property a file leaves out with its schema default
(createConfigWithDefaults), and those defaults are the pack's, not the stack's; so every
policy that declares the pack's config schema gets every property, and no policy can fall
back to a default that differs from the stack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainstack.config import ConfigError, ConfigIssue, PlatformConfig, TeamStackConfig
from trainstack.policy.pack import CONFIG_SCHEMA, crossguard_policies
from trainstack.policy.settings import levels, pack_config
from trainstack.preview.engine import Previewer

CONFIG_DIR = Path("policies") / "config"  # under the project root
# The pack's own level (policies/__main__.py). The CLI applies `all` first and then each
# policy's entry (applyConfig), and every policy has one, so `all` decides nothing alone.
ALL = "mandatory"


def config_document(cfg: PlatformConfig) -> dict[str, Any]:
    """The `--policy-pack-config` document for a platform's stacks (its own, its teams')."""
    properties = pack_config(cfg)
    schema = CONFIG_SCHEMA.properties
    missing, extra = sorted(set(schema) - set(properties)), sorted(set(properties) - set(schema))
    if missing or extra:
        # One list of properties: the schema. Adding a setting means adding it to both.
        raise ValueError(
            f"settings.pack_config and pack.CONFIG_SCHEMA disagree: missing {missing}, "
            f"not in the schema {extra}"
        )
    rule_levels = levels(cfg)
    document: dict[str, Any] = {"all": ALL}
    for policy in crossguard_policies():
        entry: dict[str, Any] = {"enforcementLevel": rule_levels[policy.name]}
        if policy.config_schema is not None:
            entry |= {key: properties[key] for key in policy.config_schema.properties}
        document[policy.name] = entry
    return document


def render(cfg: PlatformConfig) -> str:
    return json.dumps(config_document(cfg), indent=2) + "\n"


def platform_config(previewer: Previewer, stack: str) -> PlatformConfig:
    """A platform stack's config, or the one of the platform stack a team stack names."""
    config, _ = previewer.load(stack)
    if isinstance(config, TeamStackConfig):
        source = str(previewer.project.stack_file(stack))
        name = config.platform_stack_name
        if not previewer.project.stack_file(name).is_file():
            raise ConfigError(
                source,
                [ConfigIssue("trainstack:team.platformStack", f"no stack file for {name!r}")],
            )
        config, _ = previewer.load(name)
        if not isinstance(config, PlatformConfig):
            raise ConfigError(
                source,
                [ConfigIssue("trainstack:team.platformStack", f"{name!r} is a team stack")],
            )
    assert isinstance(config, PlatformConfig)
    return config


def config_path(previewer: Previewer, stack: str) -> Path:
    return previewer.project.root / CONFIG_DIR / f"{stack}.json"


def generate(previewer: Previewer, stack: str) -> str:
    return render(platform_config(previewer, stack))


def stale(previewer: Previewer, stacks: list[str]) -> list[str]:
    """Stacks whose checked-in file is missing or differs from what would be generated."""
    return [
        stack
        for stack in stacks
        if not (path := config_path(previewer, stack)).is_file()
        or path.read_text(encoding="utf-8") != generate(previewer, stack)
    ]


def orphans(previewer: Previewer) -> list[Path]:
    """Config files for stacks that no longer have a stack file."""
    folder = previewer.project.root / CONFIG_DIR
    known = set(previewer.project.stacks())
    return sorted(p for p in folder.glob("*.json") if p.stem not in known)


def write(previewer: Previewer, stacks: list[str]) -> list[Path]:
    """Write the files of `stacks`; the paths whose content changed."""
    changed = []
    for stack in stacks:
        text = generate(previewer, stack)
        path = config_path(previewer, stack)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed
