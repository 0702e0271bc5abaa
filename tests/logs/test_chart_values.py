"""The collector's chart values against the pinned chart's own schema.

open-telemetry/opentelemetry-collector ships `values.schema.json` (additionalProperties false
at the top and in most sections), which Helm checks at install: a key the chart does not know,
or a wrong type, fails `pulumi up` there. Read with `git show` at the pinned tag from a clone
of open-telemetry/opentelemetry-helm-charts named by TRAINSTACK_OTEL_CHARTS_REPO (read, never
copied here); skipped without one, as the autoscaler's chart check is.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from trainstack.builders import logs

DEFAULT_REPO = "/work/.mirror/open-telemetry+opentelemetry-helm-charts/repo"


def upstream(name: str) -> str:
    """A file of the pinned chart, from the clone; skips without one."""
    repo = Path(os.environ.get("TRAINSTACK_OTEL_CHARTS_REPO", DEFAULT_REPO))
    if not repo.exists():
        pytest.skip(
            f"no opentelemetry-helm-charts clone at {repo}; set TRAINSTACK_OTEL_CHARTS_REPO"
        )
    tag = f"{logs.CHART['chart']}-{logs.CHART['version']}"
    path = f"{tag}:charts/{logs.CHART['chart']}/{name}"
    shown = subprocess.run(
        ["git", f"--git-dir={repo}", "show", path], capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        pytest.skip(f"{repo} lacks {path}: {shown.stderr.strip()}")
    return shown.stdout


def chart_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(upstream("values.schema.json"))
    return schema


def coalesced(ours: dict[str, Any]) -> dict[str, Any]:
    """What Helm validates: the chart's values.yaml with ours over it, maps merged key by key
    (helm pkg/chartutil coalesce.go CoalesceTables), a null deleting the chart's key."""

    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            out = dict(base)
            for key, value in over.items():
                if value is None:
                    out.pop(key, None)
                else:
                    out[key] = merge(base.get(key), value)
            return out
        return over

    merged: dict[str, Any] = merge(yaml.safe_load(upstream("values.yaml")), ours)
    return merged


@pytest.mark.parametrize(
    "values",
    [
        logs.collector_values("acme-trainstack-prod-checkpoints", "us-east-1"),
        logs.collector_values(
            "dgx-training",
            "us-east-1",
            role_arn="arn:aws:iam::000000000000:role/log-collector",
            endpoint="https://minio.lab.internal:9000",
            credentials_secret="trainstack-log-collector",
        ),
    ],
    ids=["aws", "s3-compatible"],
)
def test_values_satisfy_the_pinned_charts_schema(values: dict[str, Any]) -> None:
    schema = chart_schema()
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(coalesced(values)),
        key=lambda e: list(e.path),
    )
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_the_schema_check_bites() -> None:
    """A key the chart does not know is refused (the check is not vacuous)."""
    schema = chart_schema()
    values = {**logs.collector_values("b", "us-east-1"), "notAChartKey": True}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(coalesced(values)))
    assert not list(
        jsonschema.Draft7Validator(schema).iter_errors(coalesced(logs.collector_values("b", "r")))
    )
