"""`trainstack report` without Prometheus: the window, the arithmetic, the formats, and each
user error as one clean line (exit 1, no traceback)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tests.monitoring.conftest import platform_doc
from trainstack import report
from trainstack.report import ReportError, Window, parse_time

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    report.register(app)

    @app.callback()
    def _root() -> None:
        """A root, so `report` stays a subcommand."""

    result = CliRunner().invoke(app, ["report", *args], env={report.PROMETHEUS_ENV: ""})
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01", T0),
        ("2026-01-01T06:30:00Z", T0 + timedelta(hours=6, minutes=30)),
        ("2026-01-01T08:30:00+02:00", T0 + timedelta(hours=6, minutes=30)),
        ("2026-01-01T06:30:00", T0 + timedelta(hours=6, minutes=30)),  # no offset: UTC
    ],
)
def test_times(text: str, expected: datetime) -> None:
    assert parse_time(text, "--from") == expected


def test_the_range_holds_each_interval_once() -> None:
    window = Window(T0, T0 + timedelta(hours=2))
    assert window.seconds == 7200
    assert window.range == "[7199999ms]"


def test_gpu_counts_become_gpu_hours_per_sample() -> None:
    q = report.queries(Window(T0, T0 + timedelta(hours=1)))
    assert q["borrowed_gpu_hours"] == (
        "sum by (team) (sum_over_time(queue:trainstack_gpus_borrowed:max[3599999ms])) / 60"
    )
    assert f">= {T0.timestamp():.0f})" in q["jobs_started"]  # jobs placed since --from


def test_pricing_per_instance_type_and_capacity() -> None:
    hours = [
        ({"team": "a", "instance_type": "p5.48xlarge", "capacity": "reservation"}, 16.0),
        ({"team": "a", "instance_type": "p5.48xlarge", "capacity": "spot"}, 2.0),
        ({"team": "b", "instance_type": "p5.48xlarge", "capacity": "spot"}, 0.0),
        ({"team": "b", "instance_type": "p5.48xlarge", "capacity": "reservation"}, 1.5),
    ]
    cost, unpriced = report.priced(hours, {("p5.48xlarge", "reservation"): 10.0})
    assert cost == {"a": 160.0, "b": 15.0}
    # b's spot hours are zero: nothing is unpriced there.
    assert unpriced == {"a": ["2.00 on p5.48xlarge spot"]}


def test_a_team_with_unpriced_hours_has_no_cost_and_a_note() -> None:
    window = Window(T0, T0 + timedelta(hours=1))
    results = {
        "gpu_hours_allocated": [({"team": "a"}, 18.0), ({"team": "b"}, 1.5)],
        "gpu_hours_by_instance": [
            ({"team": "a", "instance_type": "p5.48xlarge", "capacity": "reservation"}, 16.0),
            ({"team": "a", "instance_type": "p5.48xlarge", "capacity": "spot"}, 2.0),
            ({"team": "b", "instance_type": "p5.48xlarge", "capacity": "reservation"}, 1.5),
        ],
    }
    built = report.build(window, results, {("p5.48xlarge", "reservation"): 10.0})
    assert built.teams == ["a", "b"]
    assert [r["cost_usd"] for r in built.rows] == [None, 15.0]
    assert built.notes == ["a: no price for 2.00 on p5.48xlarge spot GPU-hours, so no cost"]
    csv = report.to_csv(built).splitlines()
    assert csv[1] == "2026-01-01T00:00:00Z,2026-01-01T01:00:00Z,a,18.00,,,,,,,,,"
    assert csv[2] == "2026-01-01T00:00:00Z,2026-01-01T01:00:00Z,b,1.50,,15.00,,,,,,,"
    md = report.to_markdown(built)
    assert "| a | 18.00 | - | - | - |" in md
    assert md.endswith("- a: no price for 2.00 on p5.48xlarge spot GPU-hours, so no cost\n")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _NotPrometheus(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>Grafana</html>")

    def log_message(self, *args: object) -> None:
        del args


@pytest.fixture
def not_prometheus() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotPrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def team_stack() -> Path:
    return Path(__file__).resolve().parents[2] / "stacks" / "Pulumi.vision.yaml"


@pytest.fixture
def unpriced_stack(tmp_path: Path) -> Path:
    doc = platform_doc()
    doc["monitoring"]["prices"] = []
    path = tmp_path / "Pulumi.noprices.yaml"
    path.write_text(yaml.safe_dump({"config": {"trainstack:platform": doc}}), encoding="utf-8")
    return path


WINDOW = ("--from", "2026-01-01", "--to", "2026-01-02")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--prometheus", "http://x", "--from", "yesterday", "--to", "2026-01-02"],
            "--from 'yesterday' is not an ISO 8601 time; write e.g. 2026-01-31 or "
            "2026-01-31T18:00:00Z",
        ),
        (
            ["--prometheus", "http://x", "--from", "2026-01-01", "--to", "2026-13-01"],
            "--to '2026-13-01' is not an ISO 8601 time",
        ),
        (
            ["--prometheus", "http://x", "--from", "2026-01-02", "--to", "2026-01-01T12:00:00Z"],
            "--from (2026-01-02T00:00:00Z) must be before --to (2026-01-01T12:00:00Z)",
        ),
        (
            ["--prometheus", "http://x", "--from", "2026-01-01", "--to", "2026-01-01"],
            "--from (2026-01-01T00:00:00Z) must be before --to (2026-01-01T00:00:00Z)",
        ),
        (
            ["--prometheus", "localhost:9090", *WINDOW],
            "--prometheus 'localhost:9090' is not an http(s) URL; give Prometheus' base URL",
        ),
        (
            ["--prometheus", "http://127.0.0.1:{closed}", *WINDOW],
            "cannot reach Prometheus at http://127.0.0.1:{closed} (",
        ),
        (
            ["--prometheus", "{not_prometheus}/", *WINDOW],
            "{not_prometheus}/api/v1/query did not answer as Prometheus' HTTP API does; is "
            "--prometheus Prometheus' base URL?",
        ),
        (
            ["--prometheus", "http://x", *WINDOW, "--stack", "{team_stack}"],
            "--stack '{team_stack}' is a team stack; give the platform stack, whose "
            "monitoring.prices price the GPUs",
        ),
        (
            ["--prometheus", "http://x", *WINDOW, "--stack", "{unpriced_stack}"],
            "--stack '{unpriced_stack}' has no monitoring.prices",
        ),
        (
            ["--prometheus", "http://x", *WINDOW, "--stack", "{missing}"],
            "--stack '{missing}': no stack file {missing}",
        ),
    ],
)
def test_user_errors_are_one_clean_line(
    args: list[str],
    message: str,
    not_prometheus: str,
    team_stack: Path,
    unpriced_stack: Path,
    tmp_path: Path,
) -> None:
    values = {
        "closed": str(_free_port()),
        "not_prometheus": not_prometheus,
        "team_stack": str(team_stack),
        "unpriced_stack": str(unpriced_stack),
        "missing": str(tmp_path / "Pulumi.nope.yaml"),
    }
    code, out, err = invoke(*(a.format(**values) for a in args))
    assert (code, out) == (1, "")
    assert err.startswith("error: " + message.format(**values)), err
    assert err.count("\n") == 1, err  # one line, no traceback


def test_a_stack_name_is_looked_up_in_the_project(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: t\nstackConfigDir: stacks\n", encoding="utf-8")
    code, _, err = invoke(
        "--prometheus", "http://x", *WINDOW, "--stack", "prod", "--project-dir", str(tmp_path)
    )
    assert code == 1
    assert err == f"error: --stack 'prod': no stack file {tmp_path / 'stacks/Pulumi.prod.yaml'}\n"


def test_bad_usage_is_clicks_exit_2() -> None:
    code, _, err = invoke("--prometheus", "http://x", *WINDOW, "--format", "xlsx")
    assert code == 2
    assert "xlsx" in err
    code, _, err = invoke(*WINDOW)  # no --prometheus and no TRAINSTACK_PROMETHEUS_URL
    assert code == 2
    assert "--prometheus" in err


def test_errors_are_report_errors() -> None:
    with pytest.raises(ReportError):
        Window(T0, T0)
