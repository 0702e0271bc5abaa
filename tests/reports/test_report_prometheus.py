"""`trainstack report` against a real Prometheus (Debian's 2.42, on loopback) whose history
is known: two hours of kube-state-metrics, dcgm-exporter and Volcano series, trainstack's
recording rules backfilled over them, and the report's output asserted exactly.

The story, 2026-01-01 00:00 to 02:00 UTC (minute k from the start). Every series has the
same value at both ends of the window, so the answer does not depend on the phase at which
the rules were evaluated (which samples fall at the window's edges):
- vision's pod v-0 holds 8 GPUs of n1 (reservation, 10 USD/GPU-h) for the two hours, at
  50% utilisation: 16 GPU-hours, 8 used, 160 USD.
- nlp's pod n-0 holds 4 GPUs of n2 (capacity block, 4 USD/GPU-h) at 25% from k=30 to 90: 4
  GPU-hours, 1 used, 16 USD.
- vision's pod v-1 runs on n2 at 100% the rest of the time (4 GPU-hours, 4 used, 16 USD) and
  waits for its 4 GPUs while nlp holds them (4 pending GPU-hours). While it runs vision holds
  12 of its 8 deserved: it borrows 4 for an hour, which come out of nlp's 8 unused then (4
  lent GPU-hours).
- Jobs placed in the window: vision's vit-2 (61 min) and vit-3 (2 min), nlp's gpt (1 min);
  vision's vit (placed before the window) is not counted. p50 of 120 s and 3660 s is 1890.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tests.monitoring.conftest import platform, platform_doc
from tests.reports.prometheus import NAME, Server, binaries, layers, prometheus_with_history
from trainstack import report
from trainstack.builders.monitoring import rule_groups

pytestmark = pytest.mark.skipif(
    binaries() is None,
    reason="prometheus and promtool are not installed (Debian: apt-get install prometheus)",
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FROM, TO = "2026-01-01T00:00:00Z", "2026-01-01T02:00:00Z"
MINUTES = range(-10, 131)  # the history, a little wider than the window

Series = dict[str, list[tuple[datetime, float]]]


def _name(name: str, **labels: str) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def add(series: Series, value: Callable[[int], float | None], name: str, **labels: str) -> None:
    """One series, its value at minute k (None: no sample)."""
    samples = [(T0 + timedelta(minutes=k), v) for k in MINUTES if (v := value(k)) is not None]
    series[_name(name, **labels)] = samples


def const(v: float) -> Callable[[int], float | None]:
    return lambda _k: v


def during(
    minutes: Sequence[int], v: float, otherwise: float | None = None
) -> Callable[[int], float | None]:
    """`v` in those minutes, `otherwise` (None: no sample) in the others."""
    return lambda k: v if k in minutes else otherwise


def pod(
    series: Series, team: str, name: str, job: str, node: str, gpus: int, running: Sequence[int]
) -> None:
    add(
        series,
        const(1),
        "kube_pod_labels",
        namespace=team,
        pod=name,
        label_trainstack_io_team=team,
        label_trainstack_io_job=job,
        label_volcano_sh_queue_name=team,
        label_trainstack_io_pool="h100",
    )
    for phase, value in (("Running", during(running, 1, 0)), ("Pending", during(running, 0, 1))):
        add(
            series,
            value,
            "kube_pod_status_phase",
            namespace=team,
            pod=name,
            phase=phase,
        )
    add(
        series,
        const(gpus),
        "kube_pod_container_resource_requests",
        namespace=team,
        pod=name,
        container="trainer",
        node=node,
        resource="nvidia_com_gpu",
        unit="integer",
    )


def history() -> Series:
    s: Series = {}
    for node, capacity in (("n1", "reservation"), ("n2", "capacityBlock")):
        add(
            s,
            const(1),
            "kube_node_labels",
            node=node,
            label_trainstack_io_pool="h100",
            label_trainstack_io_capacity=capacity,
            label_node_kubernetes_io_instance_type="p5.48xlarge",
        )
    nlp = range(30, 90)
    rest = [k for k in MINUTES if k not in nlp]
    pod(s, "vision", "v-0", "vit", "n1", 8, MINUTES)
    pod(s, "nlp", "n-0", "gpt", "n2", 4, nlp)
    pod(s, "vision", "v-1", "vit-2", "n2", 4, rest)
    for team, name, node, gpus, util, alive in (
        ("vision", "v-0", "n1", 8, 50, MINUTES),
        ("nlp", "n-0", "n2", 4, 25, nlp),
        ("vision", "v-1", "n2", 4, 100, rest),
    ):
        for gpu in range(gpus):
            add(
                s,
                during(alive, util),
                "DCGM_FI_DEV_GPU_UTIL",
                namespace=team,
                pod=name,
                node=node,
                gpu=str(gpu),
                Hostname=node,
            )

    def volcano(kind: str, queue: str, value: Callable[[int], float | None]) -> None:
        add(
            s,
            value,
            f"volcano_queue_{kind}_scalar_resources",
            queue_name=queue,
            resource="nvidia.com/gpu",
            job="volcano-scheduler",
        )

    volcano("deserved", "vision", const(8000))
    volcano("deserved", "nlp", const(8000))
    volcano("allocated", "vision", during(nlp, 8000, 12000))
    volcano("allocated", "nlp", during(nlp, 4000, 0))
    volcano("request", "vision", const(12000))
    volcano("request", "nlp", during(nlp, 4000, 0))
    for queue, job, ms, placed, alive in (
        ("vision", "vit", 30_000, -20, range(-10, 131)),
        ("vision", "vit-2", 3_660_000, 91, range(91, 131)),
        ("vision", "vit-3", 120_000, 100, range(100, 131)),
        ("nlp", "gpt", 60_000, 30, range(30, 90)),
    ):
        labels = {"job_name": job, "queue": queue, "job_namespace": queue}
        add(
            s,
            during(alive, ms),
            "volcano_e2e_job_scheduling_duration",
            **labels,
        )
        add(
            s,
            during(alive, (T0 + timedelta(minutes=placed)).timestamp()),
            "volcano_e2e_job_scheduling_last_time",
            **labels,
        )
    return s


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    groups = rule_groups(platform())
    with prometheus_with_history(
        tmp_path_factory.mktemp("prometheus"),
        history(),
        groups,
        T0 + timedelta(minutes=MINUTES[0]),
        T0 + timedelta(minutes=MINUTES[-1]),
    ) as running:
        yield running


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    report.register(app)

    @app.callback()
    def _root() -> None:
        """A root, so `report` stays a subcommand as in trainstack's CLI."""

    result = CliRunner().invoke(app, ["report", *args])
    return result.exit_code, result.stdout, result.stderr


CSV = (
    "from,to,team,gpu_hours_allocated,gpu_hours_used,cost_usd,borrowed_gpu_hours,"
    "lent_gpu_hours,pending_gpu_hours,jobs_started,wait_p50_s,wait_p90_s,wait_p99_s\n"
    f"{FROM},{TO},nlp,4.00,1.00,16.00,0.00,4.00,0.00,1,60.0,60.0,60.0\n"
    f"{FROM},{TO},vision,20.00,12.00,176.00,4.00,0.00,4.00,2,1890.0,3306.0,3624.6\n"
)


def test_csv_exactly(server: Server) -> None:
    code, out, err = invoke(
        "--prometheus", server.url, "--from", FROM, "--to", TO, "--format", "csv"
    )
    assert (code, err) == (0, "")
    assert out == CSV


def test_markdown_exactly(server: Server) -> None:
    code, out, err = invoke("--prometheus", server.url, "--from", FROM, "--to", TO)
    assert (code, err) == (0, "")
    assert out == (
        f"# GPU usage by team, {FROM} to {TO}\n"
        "\n"
        "| team | GPU-hours allocated | GPU-hours used | cost (USD) | GPU-hours borrowed "
        "| GPU-hours lent | GPU-hours pending | jobs started | wait p50 (s) | wait p90 (s) "
        "| wait p99 (s) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| nlp | 4.00 | 1.00 | 16.00 | 0.00 | 4.00 | 0.00 | 1 | 60.0 | 60.0 | 60.0 |\n"
        "| vision | 20.00 | 12.00 | 176.00 | 4.00 | 0.00 | 4.00 | 2 | 1890.0 | 3306.0 | 3624.6 |\n"
        "\n"
        "Cost: GPU-hours allocated times USD per GPU-hour from the price table the accounting "
        "rules were deployed with (an estimate; the AWS Cost and Usage Report is the bill). "
        "Borrowed: above the queue's deserved share; lent: its unused share that others "
        "borrowed (estimate). Wait: creation to last task placed, jobs placed in the window. "
        "Preemptions are not reported: Volcano counts them for the cluster only "
        "(docs/reports.md).\n"
    )


def test_stack_prices_replace_the_recorded_ones(server: Server, tmp_path: Path) -> None:
    """3 USD/GPU-h reserved, 1 on a capacity block: vision 16 * 3 + 4 * 1, nlp 4 * 1."""
    doc = platform_doc()
    doc["monitoring"]["prices"] = [
        {"instanceType": "p5.48xlarge", "capacity": "reservation", "usdPerGpuHour": 3},
        {"instanceType": "p5.48xlarge", "capacity": "capacityBlock", "usdPerInstanceHour": 8},
    ]
    stack = tmp_path / "Pulumi.test.yaml"
    stack.write_text(yaml.safe_dump({"config": {"trainstack:platform": doc}}), encoding="utf-8")
    code, out, err = invoke(
        "--prometheus", server.url, "--from", FROM, "--to", TO, "--format", "csv",
        "--stack", str(stack),
    )  # fmt: skip
    assert (code, err) == (0, "")
    rows = [line.split(",") for line in out.splitlines()[1:]]
    assert [(r[2], r[5]) for r in rows] == [("nlp", "4.00"), ("vision", "52.00")]


def test_a_window_without_data_says_so(server: Server) -> None:
    code, out, _ = invoke(
        "--prometheus", server.url, "--from", "2025-06-01", "--to", "2025-06-02",
        "--format", "csv",
    )  # fmt: skip
    assert code == 0
    assert out == CSV.splitlines(keepends=True)[0]


def test_a_bad_query_is_a_clean_error(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "queries", lambda _w: {"gpu_hours_allocated": "sum(("})
    code, out, err = invoke("--prometheus", server.url, "--from", FROM, "--to", TO)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: Prometheus at {server.url} refused a query (bad_data: ")
    assert "Traceback" not in err


def test_every_recorded_series_the_report_reads_is_recorded_by_a_rule() -> None:
    recorded = {r["record"] for layer in layers(rule_groups(platform())) for r in layer}
    window = report.Window(T0, T0 + timedelta(hours=1))
    read = {
        name for q in report.queries(window).values() for name in NAME.findall(q) if ":" in name
    }
    assert read
    assert read <= recorded, sorted(read - recorded)
