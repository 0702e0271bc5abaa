"""The straggler query (repair/decide.straggler_query) evaluated by Prometheus's own engine:
`promtool test rules` with a `promql_expr_test` over recorded `ALERTS` series as Prometheus
writes them (1 at each evaluation while firing, a stale marker when the alert stops:
prometheus docs/configuration/alerting_rules.md "Inspecting alerts during runtime"; `stale`
in input_series as docs/configuration/unit_testing_rules.md describes) and the agent's
last-check gauge. Skipped without promtool (Debian: apt-get install prometheus)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from trainstack_health.repair import decide

FIRING = f'ALERTS{{alertname="{decide.STRAGGLER_ALERT}",alertstate="firing",'
PENDING = f'ALERTS{{alertname="{decide.STRAGGLER_ALERT}",alertstate="pending",'


def checked(node: str) -> str:
    return f'{decide.LAST_CHECK}{{node="{node}",pool="h100",pod="agent-{node}"}}'


# One sample a minute from t=0 (Unix time 0 in promtool); evaluated at 240m.
SERIES = {
    # three episodes of rank 0 and one of rank 1, all after the node's last check: 4
    FIRING + 'node="gpu-1",rank="0"}': "_x9 1x10 stale _x18 1x5 stale _x53 1x30 stale",
    FIRING + 'node="gpu-1",rank="1"}': "_x49 1x5 stale",
    checked("gpu-1"): "1x240",
    # one episode lasting hours counts once
    FIRING + 'node="gpu-2",rank="0"}': "_x4 1x235",
    checked("gpu-2"): "1x240",
    # re-checked at minute 100 (6000 s): the episode before it no longer counts
    FIRING + 'node="gpu-3",rank="0"}': "_x9 1x2 stale _x136 1x5 stale",
    checked("gpu-3"): "1x100 6000x139",
    # an episode that began before the last check and still fires after it: evidence the
    # check has seen
    FIRING + 'node="gpu-4",rank="0"}': "_x49 1x190",
    checked("gpu-4"): "1x99 6000x140",
    # no health check known (no agent metric): nothing counted
    FIRING + 'node="gpu-5",rank="0"}': "_x9 1x2 stale",
    # pending is not firing
    PENDING + 'node="gpu-6",rank="0"}': "_x9 1x2 stale _x9 1x2 stale",
    checked("gpu-6"): "1x240",
}
EXPECTED = {"gpu-1": 4, "gpu-2": 1, "gpu-3": 1}


def test_straggler_query_counts_firings_since_the_last_check(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in SERIES.items()],
                "promql_expr_test": [
                    {
                        "expr": decide.straggler_query(),
                        "eval_time": "240m",
                        "exp_samples": [
                            {"labels": f'{{node="{node}"}}', "value": count}
                            for node, count in EXPECTED.items()
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
