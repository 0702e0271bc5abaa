"""Progress records (per rank, a file) and the pod's ``/healthz`` + ``/metrics`` server.

Workers rewrite ``<run dir>/progress/rank-<r>.json`` atomically (tmp + rename). The supervisor,
which outlives worker restarts, serves both endpoints from those files on one port
(``TRAINSTACK_HEALTH_PORT``, default 8080). Health is judged from step timestamps, never from
the server being up: the HTTP thread keeps answering while training is stuck, and the oldest
rank decides, so a dead or hung rank marks the pod unhealthy whichever rank it is.

``python -m trainstack_runtime.health probe`` exits 0 if ``/healthz`` answers 200 (used by the
image HEALTHCHECK and usable as a Kubernetes exec probe).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .contract import (
    ENV_HEALTH_PHASE_S,
    ENV_HEALTH_PORT,
    ENV_HEALTH_STALE_S,
    ENV_HEALTH_STARTUP_S,
    ENV_RUN_DIR,
    HEALTH_PATH,
    HEALTH_PHASE_S_DEFAULT,
    HEALTH_PORT_DEFAULT,
    HEALTH_STALE_S_DEFAULT,
    HEALTH_STARTUP_S_DEFAULT,
    METRICS,
    METRICS_PATH,
    RUN_DIR_DEFAULT,
)
from .exitcodes import ConfigError

STATES = ("starting", "running", "checkpointing", "exiting", "done")


def progress_dir(run_dir: str | Path | None = None) -> Path:
    base = Path(run_dir or os.environ.get(ENV_RUN_DIR) or RUN_DIR_DEFAULT)
    return base / "progress"


class ProgressReporter:
    """Per-rank progress record. Writes are throttled: health needs seconds, not every step."""

    def __init__(
        self,
        rank: int,
        *,
        directory: Path | None = None,
        restart_count: int = 0,
        min_interval_s: float = 1.0,
    ) -> None:
        self.path = (directory or progress_dir()) / f"rank-{rank:05d}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.min_interval_s = min_interval_s
        now = time.time()
        self.record: dict[str, Any] = {
            "rank": rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "state": "starting",
            "started_time": now,
            "restart_count": restart_count,
            "step": 0,
            "last_step_time": 0.0,
            "last_ckpt_step": -1,
            "last_ckpt_time": 0.0,
            "step_time_s": 0.0,
            "data_time_s": 0.0,
            "comm_time_s": 0.0,
            "ckpt_block_s": 0.0,
            "samples_per_s": 0.0,
            "steps_total": 0,
            "step_seconds_total": 0.0,
            "data_wait_seconds_total": 0.0,
            "comm_seconds_total": 0.0,
            "ckpt_stall_seconds_total": 0.0,
            "checkpoints_total": 0,
            "phase": "",
            "phase_started_time": 0.0,
            "last_alive_time": 0.0,
        }
        self._lock = threading.Lock()
        self._last_write = 0.0
        self.flush()

    def step(
        self,
        step: int,
        *,
        step_time_s: float,
        data_time_s: float = 0.0,
        comm_time_s: float = 0.0,
        samples: int = 0,
    ) -> None:
        with self._lock:
            r = self.record
            r.update(
                state="running" if r["state"] == "starting" else r["state"],
                step=step,
                last_step_time=time.time(),
                step_time_s=step_time_s,
                data_time_s=data_time_s,
                comm_time_s=comm_time_s,
                samples_per_s=samples / step_time_s if step_time_s > 0 else 0.0,
            )
            r["steps_total"] += 1
            r["step_seconds_total"] += step_time_s
            r["data_wait_seconds_total"] += data_time_s
            r["comm_seconds_total"] += comm_time_s
        if time.monotonic() - self._last_write >= self.min_interval_s:
            self.flush()

    def checkpoint_stall(self, seconds: float) -> None:
        with self._lock:
            self.record["ckpt_block_s"] = seconds
            self.record["ckpt_stall_seconds_total"] += seconds

    def checkpoint_committed(self, step: int, when: float) -> None:
        with self._lock:  # called from the checkpoint thread
            self.record.update(last_ckpt_step=step, last_ckpt_time=when)
            self.record["checkpoints_total"] += 1
        self.flush()

    def enter_phase(self, name: str) -> None:
        now = time.time()
        with self._lock:
            self.record.update(phase=name, phase_started_time=now, last_alive_time=now)
        self.flush()

    def heartbeat(self) -> None:
        with self._lock:
            self.record["last_alive_time"] = time.time()
        self.flush()

    def leave_phase(self) -> None:
        now = time.time()
        with self._lock:  # the phase's end counts as progress: the next step may be far
            self.record.update(phase="", phase_started_time=0.0, last_alive_time=now)
        self.flush()

    def set_state(self, state: str) -> None:
        if state not in STATES:
            raise ValueError(state)
        with self._lock:
            self.record["state"] = state
        self.flush()

    def flush(self) -> None:
        with self._lock:
            data = json.dumps(self.record).encode()
            self._last_write = time.monotonic()
            tmp = self.path.with_name(f".{self.path.name}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)  # no fsync: a lost record after a host crash is harmless
            os.replace(tmp, self.path)


def read_records(directory: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(directory.glob("rank-*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # replaced mid-read is impossible (rename); anything else is not ours
    return records


@dataclass(frozen=True)
class HealthPolicy:
    stale_s: float = HEALTH_STALE_S_DEFAULT
    startup_s: float = HEALTH_STARTUP_S_DEFAULT
    phase_s: float = HEALTH_PHASE_S_DEFAULT

    @classmethod
    def from_env(cls) -> HealthPolicy:
        return cls(
            float(os.environ.get(ENV_HEALTH_STALE_S) or HEALTH_STALE_S_DEFAULT),
            float(os.environ.get(ENV_HEALTH_STARTUP_S) or HEALTH_STARTUP_S_DEFAULT),
            float(os.environ.get(ENV_HEALTH_PHASE_S) or HEALTH_PHASE_S_DEFAULT),
        )


def healthz(
    records: list[dict[str, Any]], policy: HealthPolicy, *, since: float, now: float | None = None
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body). ``since``: when the pod started (covers the no-record phase)."""
    now = time.time() if now is None else now
    if not records:
        ok = now - since < policy.startup_s
        return (200 if ok else 503), {"ok": ok, "ranks": 0, "reason": "no progress records yet"}
    worst_age, reason = 0.0, ""
    ok = True
    for r in records:
        if r["state"] in ("done", "exiting"):
            continue
        if r.get("phase"):  # a declared long phase: alive while it heartbeats, not forever
            in_phase = now - r["phase_started_time"]
            if in_phase >= policy.phase_s:
                ok = False
                reason = (
                    f"rank {r['rank']} has been in phase {r['phase']!r} for {in_phase:.0f}s "
                    f"(limit {policy.phase_s:.0f}s)"
                )
            age, limit = now - r["last_alive_time"], policy.stale_s
        elif r["state"] == "starting" or r["last_step_time"] <= 0:
            age, limit = now - r["started_time"], policy.startup_s
        else:
            last = max(
                r["last_step_time"], r.get("last_ckpt_time", 0.0), r.get("last_alive_time", 0.0)
            )
            age, limit = now - last, policy.stale_s
        if age >= limit:
            ok = False
            reason = f"rank {r['rank']} made no progress for {age:.0f}s (limit {limit:.0f}s)"
        worst_age = max(worst_age, age)
    body = {
        "ok": ok,
        "ranks": len(records),
        "min_step": min(r["step"] for r in records),
        "staleness_s": round(worst_age, 3),
    }
    if reason:
        body["reason"] = reason
    return (200 if ok else 503), body


_SERIES = {
    "trainstack_step": "step",
    "trainstack_last_step_timestamp_seconds": "last_step_time",
    "trainstack_step_time_seconds": "step_time_s",
    "trainstack_data_wait_seconds": "data_time_s",
    "trainstack_comm_time_seconds": "comm_time_s",
    "trainstack_samples_per_second": "samples_per_s",
    "trainstack_checkpoint_stall_seconds": "ckpt_block_s",
    "trainstack_last_checkpoint_step": "last_ckpt_step",
    "trainstack_last_checkpoint_timestamp_seconds": "last_ckpt_time",
    "trainstack_worker_restarts": "restart_count",
    "trainstack_steps_total": "steps_total",
    "trainstack_step_seconds_total": "step_seconds_total",
    "trainstack_data_wait_seconds_total": "data_wait_seconds_total",
    "trainstack_comm_seconds_total": "comm_seconds_total",
    "trainstack_checkpoint_stall_seconds_total": "ckpt_stall_seconds_total",
    "trainstack_checkpoints_total": "checkpoints_total",
}


def _fmt(value: float) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


def render_metrics(records: list[dict[str, Any]], healthy: bool) -> str:
    """Prometheus text exposition format 0.0.4."""
    lines: list[str] = []

    def family(name: str) -> None:
        kind, help_text = METRICS[name]
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    for name, value in (
        ("trainstack_up", 1),
        ("trainstack_healthy", int(healthy)),
        ("trainstack_ranks_reporting", len(records)),
    ):
        family(name)
        lines.append(f"{name} {value}")
    for name, key in _SERIES.items():
        family(name)
        for r in sorted(records, key=lambda rec: int(rec["rank"])):
            lines.append(f'{name}{{rank="{int(r["rank"])}"}} {_fmt(r.get(key, 0))}')
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server: HealthServer

    def do_GET(self) -> None:
        records = read_records(self.server.progress)
        status, body = healthz(records, self.server.policy, since=self.server.since)
        if self.path.split("?")[0] == HEALTH_PATH:
            self.server.last_health = (status, str(body.get("reason", "")))
            self._send(status, json.dumps(body).encode(), "application/json")
        elif self.path.split("?")[0] == METRICS_PATH:
            text = render_metrics(records, status == 200)
            self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain")

    def _send(self, status: int, payload: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_: Any) -> None:
        return  # probes every few seconds would flood the job log


class HealthServer(ThreadingHTTPServer):
    daemon_threads = True
    progress: Path
    policy: HealthPolicy
    since: float
    last_health: tuple[int, str] | None = None  # the last /healthz answer: status, reason

    def failing(self) -> str | None:
        """Why the last /healthz answer was unhealthy, or None. The kubelet's liveness probe
        kills the container (SIGTERM) only after failed answers, so a SIGTERM that follows
        one is the probe's kill of a stuck pod, not a preemption."""
        last = self.last_health
        return last[1] or "unhealthy" if last is not None and last[0] != 200 else None


def serve(
    port: int, progress: Path, policy: HealthPolicy | None = None, host: str = "0.0.0.0"
) -> HealthServer:
    """Start the health server in a daemon thread; ``server.server_address[1]`` is the port."""
    server = HealthServer((host, port), _Handler)
    server.progress, server.policy, server.since = progress, policy or HealthPolicy(), time.time()
    threading.Thread(target=server.serve_forever, name="health-http", daemon=True).start()
    return server


def configured_port() -> int:
    """The health port the job layer set (-1: none), or ConfigError naming the bad value."""
    raw = os.environ.get(ENV_HEALTH_PORT)
    try:
        return int(raw) if raw else HEALTH_PORT_DEFAULT
    except ValueError:
        raise ConfigError(f"{ENV_HEALTH_PORT}={raw!r} is not a port number") from None


def probe(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{HEALTH_PATH}", timeout=timeout) as r:
            return 0 if r.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainstack_runtime.health")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="exit 0 if /healthz answers 200")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    return probe(args.port if args.port is not None else configured_port(), args.host)


if __name__ == "__main__":
    sys.exit(main())
