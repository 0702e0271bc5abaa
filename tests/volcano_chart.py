"""Volcano's own sources at the version the platform pins, read from the Go module cache.

The e2e toolchain builds Volcano from `volcano.sh/volcano@v<chart version>` (the chart version
is the tag without `v`: ../shared/reference/aws-gpu-platform-facts.md §6), so the module cache
holds the exact chart (`installer/helm/chart/volcano/`) and controller sources. Tests that
read them skip when the cache is absent. Nothing here is copied into the repository.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainstack.builders.scheduling import VOLCANO_CHART

CHART_DIR = "installer/helm/chart/volcano"
RELEASE = "volcano"  # components/scheduling.py installs the chart under this release name


def go_module_cache() -> Path:
    env = os.environ.get("GOMODCACHE")
    return Path(env) if env else Path.home() / "go" / "pkg" / "mod"


def volcano_source() -> Path:
    """`volcano.sh/volcano@v<pinned chart version>` in the module cache, or skip."""
    path = go_module_cache() / f"volcano.sh/volcano@v{VOLCANO_CHART['version']}"
    if not (path / CHART_DIR / "Chart.yaml").is_file():
        pytest.skip(f"Volcano sources absent from the Go module cache ({path}); `go mod download`")
    return path


_ACTION_LINE = re.compile(r"^\s*\{\{.*\}\}\s*$")
_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")


def template_documents(text: str, namespace: str) -> list[dict[str, Any]]:
    """The plain-YAML documents of a chart template, good enough to read names and ports.

    Lines that are only template actions (`{{- if … }}`, `{{- end }}`, `toYaml` blocks) are
    dropped, `.Release.Name`/`.Release.Namespace` are filled in and any other action becomes a
    placeholder string. Documents that still do not parse are skipped.
    """

    def fill(match: re.Match[str]) -> str:
        action = match.group(1)
        if action == ".Release.Name":
            return RELEASE
        if action == ".Release.Namespace":
            return namespace
        return "TEMPLATED"

    lines = [_ACTION.sub(fill, line) for line in text.splitlines() if not _ACTION_LINE.match(line)]
    documents = []
    for chunk in "\n".join(lines).split("\n---"):
        try:
            doc = yaml.safe_load(chunk)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and "kind" in doc:
            documents.append(doc)
    return documents
