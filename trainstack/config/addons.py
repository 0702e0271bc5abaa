"""The `addons` section: where each upstream chart comes from (README, "Air-gapped clusters").

The schema (`platform.schema.json`, `properties.addons`) lists the add-ons and the shape of a
source; this module checks what the schema cannot express and builds `model.AddonSource`s.
Which chart and version each add-on is, and how a pre-installed one is checked, are the
builders' (builders/addons.py): config never imports builders.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainstack.config import model as m
from trainstack.config.errors import ConfigIssue, join_path

SOURCES = ("repository", "path", "preInstalled")


def addon_checks(doc: Mapping[str, Any], root: str) -> list[ConfigIssue]:
    """One source per add-on; preInstalled on existing clusters only."""
    section = doc.get("addons")
    if not isinstance(section, Mapping):
        return []
    issues: list[ConfigIssue] = []
    cloud = doc.get("cloud")
    for key, source in section.items():
        if not isinstance(source, Mapping):
            continue
        path = join_path(root, "addons", key)
        given = [s for s in SOURCES if s in source]
        if len(given) > 1:
            issues.append(
                ConfigIssue(
                    path,
                    f"gives {' and '.join(given)}; an add-on comes from one place: keep one of "
                    "repository (a mirror), path (a local chart) or preInstalled",
                )
            )
        if "preInstalled" in source and cloud == "aws":
            issues.append(
                ConfigIssue(
                    join_path(path, "preInstalled"),
                    f"only for cloud: existing; on the EKS cluster it creates the platform "
                    f"installs {key} itself: give repository (a mirror) or path (a local chart) "
                    "if the public repository is out of reach",
                )
            )
    return issues


def build_addons(section: Mapping[str, Any]) -> tuple[tuple[str, m.AddonSource], ...]:
    result = []
    for key, source in sorted(section.items()):
        pre = source.get("preInstalled")
        result.append(
            (
                key,
                m.AddonSource(
                    repository=source.get("repository"),
                    path=source.get("path"),
                    pre_installed=None
                    if pre is None
                    else m.PreInstalled(
                        namespace=pre.get("namespace") if isinstance(pre, dict) else None,
                        release=pre.get("release") if isinstance(pre, dict) else None,
                    ),
                ),
            )
        )
    return tuple(result)
