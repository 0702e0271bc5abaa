"""The agent's metrics (contract.METRICS, the trainstack_node_health_* names) in the
Prometheus text exposition format 0.0.4, and the HTTP server for /metrics and /healthz.

Standard library only: a handful of series per node does not need a client library. The
format: `# HELP`, `# TYPE`, then `name{label="value",...} number` lines, label values escaped
(backslash, double quote, newline) as the exposition format specifies
(https://prometheus.io/docs/instrumenting/exposition_formats/#text-format-details).
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trainstack_health.contract import METRIC_LABELS, METRICS

Labels = tuple[tuple[str, str], ...]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The repair controller's metrics are its own (repair/metrics.py); the agent exposes these.
AGENT_METRICS = tuple(name for name in METRICS if name.startswith("trainstack_node_health_"))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


class Metrics:
    """Counters only grow; a gauge's series are replaced whole (`set_gauge(..., replace=True)`)
    when a check stops reporting one, so no stale per-check duration lingers."""

    def __init__(self, names: tuple[str, ...] = AGENT_METRICS) -> None:
        self._names = names
        self._lock = threading.Lock()
        self._series: dict[str, dict[Labels, float]] = {name: {} for name in names}

    def _key(self, name: str, labels: Mapping[str, str]) -> Labels:
        if name not in self._names:
            raise KeyError(f"{name} is not one of this program's metrics")
        if set(labels) != set(METRIC_LABELS.get(name, ())):
            raise KeyError(f"{name} takes labels {METRIC_LABELS.get(name, ())}, got {labels}")
        return tuple(sorted(labels.items()))

    def inc(self, name: str, amount: float = 1.0, /, **labels: str) -> None:
        if METRICS[name][0] != "counter":
            raise KeyError(f"{name} is not a counter")
        key = self._key(name, labels)
        with self._lock:
            series = self._series[name]
            series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, /, **labels: str) -> None:
        if METRICS[name][0] != "gauge":
            raise KeyError(f"{name} is not a gauge")
        key = self._key(name, labels)
        with self._lock:
            self._series[name][key] = value

    def replace(self, name: str, values: Mapping[Labels, float]) -> None:
        """All of a gauge's series at once (the per-check durations of the last report)."""
        keys = {self._key(name, dict(k)): v for k, v in values.items()}
        with self._lock:
            self._series[name] = keys

    def value(self, name: str, /, **labels: str) -> float | None:
        key = self._key(name, labels)
        with self._lock:
            return self._series[name].get(key)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name in self._names:
                kind, help_text = METRICS[name]
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                for key, value in sorted(self._series[name].items()):
                    text = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                    lines.append(f"{name}{{{text}}} {_format(value)}")
        return "\n".join(lines) + "\n"


def port_arg(text: str) -> int:
    """argparse type of --metrics-port, for both commands (agent and repair)."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def serve(
    metrics: Metrics, port: int, healthy: Callable[[], bool], host: str = ""
) -> ThreadingHTTPServer:
    """/metrics, and /healthz (200 while the program's loop makes progress, 503 otherwise) on
    a daemon thread. Port 0 picks a free port (tests): `server.server_address[1]`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                status, body, kind = 200, metrics.render(), CONTENT_TYPE
            elif self.path == "/healthz":
                ok = healthy()
                status, body = (200, "ok\n") if ok else (503, "stale\n")
                kind = "text/plain"
            else:
                status, body, kind = 404, "not found\n", "text/plain"
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:  # noqa: ARG002 - stdlib's signature
            return  # a scrape every 30 s is not news

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
