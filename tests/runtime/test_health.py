"""Progress records, /healthz staleness, and /metrics as strict Prometheus text format."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from trainstack_runtime.contract import METRIC_PREFIX, METRICS
from trainstack_runtime.health import (
    HealthPolicy,
    ProgressReporter,
    healthz,
    probe,
    read_records,
    render_metrics,
    serve,
)
from trainstack_runtime.session import Session

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)?,?\}})? "
    r"(?P<value>\S+)(?: (?P<ts>-?\d+))?$"
)
_VALUE = re.compile(r"^(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|NaN|[+-]Inf)$")


def parse_prometheus(text: str) -> dict[str, dict[str, Any]]:
    """A strict parser for the 0.0.4 text format: returns family -> {type, help, samples}.

    Rejects: samples before their TYPE, a TYPE/HELP given twice, families split across the
    text, duplicate series, bad names, labels or values, a missing final newline.
    """
    assert text.endswith("\n"), "exposition must end with a newline"
    families: dict[str, dict[str, Any]] = {}
    current: str | None = None
    finished: set[str] = set()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                kind, name = parts[1], parts[2]
                assert re.fullmatch(_NAME, name), f"line {n}: bad name {name}"
                fam = families.setdefault(name, {"samples": []})
                assert kind.lower() not in fam, f"line {n}: second {kind} for {name}"
                assert name not in finished, f"line {n}: family {name} split"
                if kind == "TYPE":
                    assert not fam["samples"], f"line {n}: TYPE after samples"
                    assert parts[3] in ("counter", "gauge", "histogram", "summary", "untyped")
                fam[kind.lower()] = parts[3] if len(parts) > 3 else ""
                if current not in (None, name):
                    finished.add(current)
                current = name
            continue
        m = _SAMPLE.match(line)
        assert m, f"line {n}: not a sample: {line!r}"
        name = m["name"]
        assert name in families, f"line {n}: sample {name} without TYPE"
        assert name == current, f"line {n}: {name} outside its family block"
        assert _VALUE.match(m["value"]), f"line {n}: bad value {m['value']}"
        labels = tuple(
            sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m["labels"] or ""))
        )
        assert (name, labels) not in seen, f"line {n}: duplicate series"
        seen.add((name, labels))
        samples = families[name]["samples"]
        assert isinstance(samples, list)
        samples.append((dict(labels), float(m["value"].replace("Inf", "inf"))))
    return families


def test_parser_rejects_malformed_text() -> None:
    good = "# TYPE a gauge\na 1\n"
    assert parse_prometheus(good)["a"]["samples"] == [({}, 1.0)]
    for bad in (
        "a 1\n",  # no TYPE
        "# TYPE a gauge\na one\n",  # bad value
        "# TYPE a gauge\na{x=1} 1\n",  # unquoted label
        "# TYPE a gauge\na 1\na 2\n",  # duplicate series
        '# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na{r="1"} 2\n',  # split family
        "# TYPE a gauge\na 1",  # no final newline
        "# TYPE a gauge\n# TYPE a counter\na 1\n",
    ):
        with pytest.raises(AssertionError):
            parse_prometheus(bad)


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    for rank in (0, 1):
        rep = ProgressReporter(rank, directory=tmp_path, min_interval_s=0.0)
        rep.step(41, step_time_s=0.5, data_time_s=0.1, comm_time_s=0.05, samples=64)
        rep.step(42, step_time_s=0.25, data_time_s=0.02, comm_time_s=0.01, samples=64)
        rep.checkpoint_stall(0.003)
        rep.checkpoint_committed(40, 1_700_000_000.0)
    return read_records(tmp_path)


def test_metrics_are_valid_prometheus_and_cover_the_contract(tmp_path: Path) -> None:
    records = _records(tmp_path)
    families = parse_prometheus(render_metrics(records, healthy=True))
    assert set(families) == set(METRICS)
    for name, fam in families.items():
        assert name.startswith(METRIC_PREFIX)
        assert fam["type"] == METRICS[name][0]
        if fam["type"] == "counter":
            assert name.endswith("_total")
    by_rank = {s[0]["rank"]: s[1] for s in families["trainstack_step"]["samples"]}
    assert by_rank == {"0": 42.0, "1": 42.0}
    values = {name: fam["samples"][0][1] for name, fam in families.items()}
    assert values["trainstack_samples_per_second"] == 256.0
    assert values["trainstack_step_seconds_total"] == 0.75
    assert math.isclose(values["trainstack_data_wait_seconds_total"], 0.12)
    assert values["trainstack_last_checkpoint_step"] == 40
    assert values["trainstack_last_checkpoint_timestamp_seconds"] == 1_700_000_000.0
    assert values["trainstack_checkpoint_stall_seconds"] == 0.003
    assert values["trainstack_checkpoints_total"] == 1
    assert values["trainstack_ranks_reporting"] == 2


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_metrics_pass_promtool(tmp_path: Path) -> None:
    text = render_metrics(_records(tmp_path), healthy=True)
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_healthz_uses_the_oldest_rank(tmp_path: Path) -> None:
    records = _records(tmp_path)
    policy = HealthPolicy(stale_s=60, startup_s=600)
    now = max(float(r["last_step_time"]) for r in records)
    status, body = healthz(records, policy, since=now - 5, now=now + 1)
    assert status == 200
    assert body["ok"] is True
    assert body["min_step"] == 42
    records[1]["last_step_time"] = now - 100  # rank 1 hung: the pod is unhealthy
    records[1]["last_ckpt_time"] = 0.0
    status, body = healthz(records, policy, since=now - 500, now=now)
    assert status == 503
    assert "rank 1" in body["reason"]


def test_healthz_startup_grace(tmp_path: Path) -> None:
    policy = HealthPolicy(stale_s=10, startup_s=100)
    assert healthz([], policy, since=1000, now=1050)[0] == 200
    assert healthz([], policy, since=1000, now=1200)[0] == 503
    rep = ProgressReporter(0, directory=tmp_path)
    (rec,) = read_records(tmp_path)
    assert rec["state"] == "starting"
    start = float(rec["started_time"])
    assert healthz([rec], policy, since=start, now=start + 50)[0] == 200
    assert healthz([rec], policy, since=start, now=start + 150)[0] == 503
    rep.set_state("done")
    (rec,) = read_records(tmp_path)
    assert healthz([rec], policy, since=start, now=start + 10_000)[0] == 200


def test_http_server_and_probe(tmp_path: Path) -> None:
    _records(tmp_path)
    server = serve(0, tmp_path, HealthPolicy(stale_s=3600), host="127.0.0.1")
    port = server.server_address[1]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
            assert json.loads(r.read())["ranks"] == 2
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            parse_prometheus(r.read().decode())
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=5)
        assert probe(port) == 0
        for path in tmp_path.glob("rank-*.json"):  # every rank stale: probe must fail
            rec = json.loads(path.read_text())
            rec.update(last_step_time=1.0, last_ckpt_time=0.0)
            path.write_text(json.dumps(rec))
        assert probe(port) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert probe(port) == 1  # nothing listening


def test_a_declared_phase_stays_healthy_while_it_heartbeats_not_forever(tmp_path: Path) -> None:
    """A long evaluation used to fail /healthz after TRAINSTACK_HEALTH_STALE_S: the liveness
    probe killed the container and the kill surfaced as a clean preemption, every time."""
    policy = HealthPolicy(stale_s=60, startup_s=600, phase_s=3600)
    rep = ProgressReporter(0, directory=tmp_path)
    rep.step(10, step_time_s=0.5)
    rep.flush()
    (rec,) = read_records(tmp_path)
    t0 = float(rec["last_step_time"])
    assert healthz([rec], policy, since=t0, now=t0 + 120)[0] == 503  # no phase: stale
    rep.enter_phase("evaluating")
    (rec,) = read_records(tmp_path)
    start = float(rec["phase_started_time"])
    rec["last_alive_time"] = start + 1800  # heartbeats kept coming for 30 min
    status, body = healthz([rec], policy, since=t0, now=start + 1830)
    assert (status, body["ok"]) == (200, True)
    assert healthz([rec], policy, since=t0, now=start + 1900)[0] == 503  # heartbeat stopped
    rec["last_alive_time"] = start + 3650
    status, body = healthz([rec], policy, since=t0, now=start + 3660)  # past the phase limit
    assert status == 503
    assert "in phase 'evaluating'" in body["reason"]
    rep.leave_phase()
    (rec,) = read_records(tmp_path)
    assert rec["phase"] == ""
    assert healthz([rec], policy, since=t0, now=float(rec["last_alive_time"]) + 30)[0] == 200


def test_session_phase_heartbeats_from_a_thread(tmp_path: Path) -> None:
    session = Session.__new__(Session)
    session.progress = ProgressReporter(0, directory=tmp_path, min_interval_s=0.0)
    beats = threading.Event()
    original = session.progress.heartbeat

    def beat() -> None:
        original()
        beats.set()

    session.progress.heartbeat = beat  # type: ignore[method-assign]
    with session.phase("evaluating", heartbeat_s=0.01):
        assert beats.wait(10)  # the main thread is busy elsewhere; the thread keeps beating
        (rec,) = read_records(tmp_path)
        assert rec["phase"] == "evaluating"
    (rec,) = read_records(tmp_path)
    assert rec["phase"] == ""
