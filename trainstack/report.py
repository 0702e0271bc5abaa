"""`trainstack report`: per-team GPU-hours, cost, borrowing and wait times over a window, read
from Prometheus' HTTP API (issue 45; docs/reports.md).

Everything it reads is recorded by trainstack's own rules (builders/monitoring/rules.py and
fairness.py) except Volcano's per-job scheduling gauges. The query and format functions are
pure; `register` adds the command to a Typer app.
"""

from __future__ import annotations

import csv
import io
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Final

import typer

from trainstack.builders.monitoring import ACCOUNTING_INTERVAL_S
from trainstack.builders.monitoring import fairness as f
from trainstack.config import ConfigError
from trainstack.config.loader import load_stack_file
from trainstack.config.model import GpuPrice, PlatformConfig
from trainstack.config.project import Project
from trainstack.terminal import fail

PROMETHEUS_ENV: Final = "TRAINSTACK_PROMETHEUS_URL"
TIMEOUT_S: Final = 30.0
WAIT_QUANTILES: Final = (("wait_p50_s", "0.5"), ("wait_p90_s", "0.9"), ("wait_p99_s", "0.99"))


class ReportError(Exception):
    """A problem the user can fix (a date, the URL, the stack); printed as one line."""


class Format(StrEnum):
    md = "md"
    csv = "csv"


# -- the window ------------------------------------------------------------------------------


def parse_time(text: str, option: str) -> datetime:
    """An ISO 8601 / RFC 3339 time (`2026-01-01`, `2026-01-01T06:00:00Z`, `...+02:00`); one
    without an offset is UTC."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReportError(
            f"{option} {text!r} is not an ISO 8601 time; write e.g. 2026-01-31 or "
            "2026-01-31T18:00:00Z"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start >= self.end:
            raise ReportError(
                f"--from ({iso(self.start)}) must be before --to ({iso(self.end)}); the report "
                "covers the time between them"
            )

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def range(self) -> str:
        """A range selector evaluated at `end` that holds the samples in (start, end]: one
        millisecond short, because Prometheus 2 includes a sample exactly at the range's left
        edge (and Prometheus 3 does not); so each recorded interval counts once."""
        return f"[{round(self.seconds * 1000) - 1}ms]"


def iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the queries -----------------------------------------------------------------------------

SAMPLES_PER_HOUR: Final = 3600 // ACCOUNTING_INTERVAL_S  # the rules' evaluation interval


def queries(window: Window) -> dict[str, str]:
    """Name -> PromQL, each evaluated once at the window's end."""
    r = window.range

    def total(series: str, by: str = "team") -> str:
        return f"sum by ({by}) (sum_over_time({series}{r}))"

    def gauge_hours(series: str) -> str:
        # One sample per interval of a GPU count: their sum times the interval in hours.
        return f"{total(series)} / {SAMPLES_PER_HOUR}"

    keys = "job_namespace, job_name, queue"
    # Jobs whose (last) scheduling fell in the window, with their wait: Volcano's per-job gauges
    # (v1.15.1 pkg/scheduler/metrics/metrics.go), deduplicated across scrape targets.
    jobs = (
        f"max by ({keys}) (max_over_time(volcano_e2e_job_scheduling_duration{r})) and on ({keys}) "
        f"(max by ({keys}) (max_over_time(volcano_e2e_job_scheduling_last_time{r})) "
        f">= {window.start.timestamp():.0f})"
    )
    waits = (
        f"({jobs}) / 1000 * on (queue) group_left (team) "
        f"max by (team, queue) (max_over_time({f.TEAM_QUEUE}{r}))"
    )
    found: dict[str, str] = {
        "gpu_hours_allocated": total("team:trainstack_gpu_hours_allocated:increase1m"),
        "gpu_hours_used": total("team:trainstack_gpu_hours_used:increase1m"),
        "gpu_hours_by_instance": total(
            "team_instance:trainstack_gpu_hours_allocated:increase1m",
            "team, instance_type, capacity",
        ),
        "recorded_cost_usd": total("team:trainstack_cost_usd:increase1m"),
        "borrowed_gpu_hours": gauge_hours(f.BORROWED),
        "lent_gpu_hours": gauge_hours(f.LENT),
        "pending_gpu_hours": gauge_hours(f.PENDING),
        "jobs_started": f"count by (team) ({waits})",
    }
    for name, q in WAIT_QUANTILES:
        found[name] = f"quantile by (team) ({q}, {waits})"
    return found


# -- Prometheus' HTTP API --------------------------------------------------------------------

Sample = tuple[dict[str, str], float]


def check_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in {"http", "https"} or not parsed.netloc:
        raise ReportError(
            f"--prometheus {url!r} is not an http(s) URL; give Prometheus' base URL, e.g. "
            f"http://localhost:9090 (or set {PROMETHEUS_ENV})"
        )
    return url.rstrip("/")


def instant_query(base: str, query: str, at: datetime) -> list[Sample]:
    """`/api/v1/query` at one time: the vector's samples (labels, value); NaN samples (an
    empty ratio) are left out."""
    body = urllib.parse.urlencode({"query": query, "time": f"{at.timestamp():.3f}"}).encode()
    request = urllib.request.Request(
        f"{base}/api/v1/query",
        data=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            text = answer.read()
    except urllib.error.HTTPError as err:
        text = err.read()
        reason = _api_error(text) or f"HTTP {err.code} {err.reason}"
        raise ReportError(
            f"Prometheus at {base} refused a query ({reason}); is it Prometheus' base URL "
            "(no /api/v1 or /graph after it)?"
        ) from None
    except (urllib.error.URLError, OSError) as err:
        cause = str(getattr(err, "reason", None) or err)
        raise ReportError(
            f"cannot reach Prometheus at {base} ({cause}); check --prometheus "
            f"(or {PROMETHEUS_ENV}) and that it is reachable from here (kubectl port-forward)"
        ) from None
    try:
        doc = json.loads(text)
        result = doc["data"]["result"]
        kind = doc["data"]["resultType"]
    except (ValueError, KeyError, TypeError):
        raise ReportError(
            f"{base}/api/v1/query did not answer as Prometheus' HTTP API does; is --prometheus "
            "Prometheus' base URL?"
        ) from None
    if kind != "vector":
        raise ReportError(f"Prometheus answered a {kind}, not a vector, for {query}")
    samples = [(dict(s["metric"]), float(s["value"][1])) for s in result]
    return [(labels, value) for labels, value in samples if not math.isnan(value)]


def _api_error(text: bytes) -> str | None:
    try:
        doc = json.loads(text)
        return f"{doc['errorType']}: {doc['error']}"
    except (ValueError, KeyError, TypeError):
        return None


# -- the report ------------------------------------------------------------------------------

COLUMNS: Final = (
    ("team", "team"),
    ("gpu_hours_allocated", "GPU-hours allocated"),
    ("gpu_hours_used", "GPU-hours used"),
    ("cost_usd", "cost (USD)"),
    ("borrowed_gpu_hours", "GPU-hours borrowed"),
    ("lent_gpu_hours", "GPU-hours lent"),
    ("pending_gpu_hours", "GPU-hours pending"),
    ("jobs_started", "jobs started"),
    ("wait_p50_s", "wait p50 (s)"),
    ("wait_p90_s", "wait p90 (s)"),
    ("wait_p99_s", "wait p99 (s)"),
)
DECIMALS: Final = {"jobs_started": 0, "wait_p50_s": 1, "wait_p90_s": 1, "wait_p99_s": 1}


@dataclass(frozen=True)
class Report:
    window: Window
    rows: list[dict[str, float | None]]  # one per team, sorted; None: no data
    teams: list[str]
    cost_source: str
    notes: list[str] = field(default_factory=list)


def price_table(prices: tuple[GpuPrice, ...]) -> dict[tuple[str, str], float]:
    return {(p.instance_type, p.capacity): p.usd_per_gpu_hour for p in prices}


def priced(
    by_instance: list[Sample], prices: dict[tuple[str, str], float]
) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Cost per team from GPU-hours per (instance type, capacity) and USD per GPU-hour; and,
    per team, the GPU-hours no price covers (that team's cost is then unknown)."""
    cost: dict[str, float] = {}
    unpriced: dict[str, list[str]] = {}
    for labels, hours in sorted(by_instance, key=lambda s: sorted(s[0].items())):
        team = labels.get("team", "")
        key = (labels.get("instance_type", ""), labels.get("capacity", ""))
        if key in prices:
            cost[team] = cost.get(team, 0.0) + hours * prices[key]
        elif hours > 0:
            unpriced.setdefault(team, []).append(f"{hours:.2f} on {key[0]} {key[1]}")
    return cost, unpriced


def build(
    window: Window,
    results: dict[str, list[Sample]],
    prices: dict[tuple[str, str], float] | None,
) -> Report:
    """The report from the queries' answers; `prices` from a stack (None: the cost the rules
    recorded with the price table they were deployed with)."""
    by_team: dict[str, dict[str, float]] = {}
    for name, samples in results.items():
        if name in {"gpu_hours_by_instance", "recorded_cost_usd"}:
            continue
        for labels, value in samples:
            by_team.setdefault(labels.get("team", ""), {})[name] = value
    notes: list[str] = []
    if prices is None:
        cost = {s[0].get("team", ""): s[1] for s in results.get("recorded_cost_usd", [])}
        source = "the price table the accounting rules were deployed with"
    else:
        cost, unpriced = priced(results.get("gpu_hours_by_instance", []), prices)
        for team, parts in sorted(unpriced.items()):
            cost.pop(team, None)
            notes.append(f"{team}: no price for {', '.join(parts)} GPU-hours, so no cost")
        source = "the stack's monitoring.prices"
    for team, value in cost.items():
        by_team.setdefault(team, {})["cost_usd"] = value
    teams = sorted(t for t in by_team if t)
    rows: list[dict[str, float | None]] = [
        {key: by_team[t].get(key) for key, _ in COLUMNS[1:]} for t in teams
    ]
    return Report(window, rows, teams, source, notes)


def _cell(key: str, value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.{DECIMALS.get(key, 2)}f}"


def to_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["from", "to", *(key for key, _ in COLUMNS)])
    window = [iso(report.window.start), iso(report.window.end)]
    for team, row in zip(report.teams, report.rows, strict=True):
        writer.writerow([*window, team, *(_cell(k, row[k]) for k, _ in COLUMNS[1:])])
    return out.getvalue()


def to_markdown(report: Report) -> str:
    lines = [
        f"# GPU usage by team, {iso(report.window.start)} to {iso(report.window.end)}",
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---" + "|---:" * (len(COLUMNS) - 1) + "|",
    ]
    for team, row in zip(report.teams, report.rows, strict=True):
        cells = [_cell(k, row[k]) or "-" for k, _ in COLUMNS[1:]]
        lines.append("| " + " | ".join([team, *cells]) + " |")
    if not report.teams:
        lines.append("| (no team had recorded data in this window) |" + " |" * (len(COLUMNS) - 1))
    lines += [
        "",
        f"Cost: GPU-hours allocated times USD per GPU-hour from {report.cost_source} "
        "(an estimate; the AWS Cost and Usage Report is the bill). Borrowed: above the "
        "queue's deserved share; lent: its unused share that others borrowed (estimate). "
        "Wait: creation to last task placed, jobs placed in the window. Preemptions are not "
        "reported: Volcano counts them for the cluster only (docs/reports.md).",
    ]
    lines += [f"- {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def run(base: str, window: Window, prices: dict[tuple[str, str], float] | None) -> Report:
    results = {name: instant_query(base, q, window.end) for name, q in queries(window).items()}
    return build(window, results, prices)


def load_prices(stack: str, project_dir: Path) -> dict[tuple[str, str], float]:
    """The price table of a platform stack, given as its name or its stack file."""
    path = Path(stack)
    if not (path.suffix in {".yaml", ".yml"} or path.is_file()):
        path = Project.find(project_dir.resolve()).stack_file(stack)
    if not path.is_file():
        raise ReportError(f"--stack {stack!r}: no stack file {path}")
    cfg = load_stack_file(path)
    if not isinstance(cfg, PlatformConfig):
        raise ReportError(
            f"--stack {stack!r} is a team stack; give the platform stack, whose "
            "monitoring.prices price the GPUs"
        )
    if not cfg.monitoring.prices:
        raise ReportError(
            f"--stack {stack!r} has no monitoring.prices; add them (docs/monitoring.md) or "
            "leave --stack out to use the cost the rules recorded"
        )
    return price_table(cfg.monitoring.prices)


# -- the command -----------------------------------------------------------------------------


def report_command(
    *,
    prometheus: Annotated[
        str,
        typer.Option(
            envvar=PROMETHEUS_ENV,
            help="Prometheus' base URL (e.g. http://localhost:9090 through kubectl port-forward).",
        ),
    ],
    start: Annotated[
        str, typer.Option("--from", help="Start, ISO 8601 (UTC unless an offset is given).")
    ],
    end: Annotated[str, typer.Option("--to", help="End, ISO 8601; after --from.")],
    output: Annotated[Format, typer.Option("--format", help="Markdown or CSV.")] = Format.md,
    stack: Annotated[
        str | None,
        typer.Option(
            help="A platform stack (name or file) whose monitoring.prices price the GPU-hours; "
            "default: the cost the accounting rules recorded."
        ),
    ] = None,
    project_dir: Annotated[
        Path, typer.Option(help="Folder with Pulumi.yaml, or a folder below it.")
    ] = Path("."),
) -> None:
    """Per team over a window: GPU-hours allocated and used, cost, GPU-hours borrowed, lent
    and pending, and the wait of jobs to start, from Prometheus (docs/reports.md)."""
    try:
        base = check_url(prometheus)
        window = Window(parse_time(start, "--from"), parse_time(end, "--to"))
        prices = load_prices(stack, project_dir) if stack is not None else None
        report = run(base, window, prices)
    except (ReportError, ConfigError) as err:
        raise fail(str(err)) from None
    typer.echo(to_csv(report) if output is Format.csv else to_markdown(report), nl=False)


def register(app: typer.Typer) -> None:
    """Add `trainstack report` to the command line."""
    app.command("report")(report_command)
