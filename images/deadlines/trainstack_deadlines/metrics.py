"""The enforcer's metrics (`contract.METRICS`) in the Prometheus text format, and the HTTP
server for /metrics and /healthz."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trainstack_deadlines.contract import METRIC_LABELS, METRICS

Labels = tuple[tuple[str, str], ...]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


class Metrics:
    """Counters only grow; gauges are replaced whole after each pass (`set_gauges`), so a job
    that is no longer overdue leaves no stale series behind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = {}
        self._gauges: dict[str, dict[Labels, float]] = {}

    @staticmethod
    def _labels(name: str, labels: Mapping[str, str]) -> Labels:
        if name not in METRICS:
            raise KeyError(f"{name} is not in contract.METRICS")
        if set(labels) != set(METRIC_LABELS.get(name, ())):
            raise KeyError(f"{name} takes labels {METRIC_LABELS.get(name, ())}, got {labels}")
        return tuple(sorted(labels.items()))

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = self._labels(name, labels)
        with self._lock:
            series = self._counters.setdefault(name, {})
            series[key] = series.get(key, 0.0) + amount

    def set_gauges(self, values: Mapping[str, Mapping[Labels, float]]) -> None:
        """Replace the given gauges' series (others keep theirs)."""
        for name, series in values.items():
            for key in series:
                self._labels(name, dict(key))
        with self._lock:
            for name, series in values.items():
                self._gauges[name] = dict(series)

    def value(self, name: str, **labels: str) -> float | None:
        key = self._labels(name, labels)
        with self._lock:
            for store in (self._counters, self._gauges):
                if key in store.get(name, {}):
                    return store[name][key]
        return None

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name, (kind, help_text) in METRICS.items():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                series = (self._counters if kind == "counter" else self._gauges).get(name, {})
                if not series and not METRIC_LABELS.get(name) and kind == "counter":
                    series = {(): 0.0}
                for key, value in sorted(series.items()):
                    text = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                    lines.append(
                        f"{name}{{{text}}} {_format(value)}" if text else f"{name} {_format(value)}"
                    )
        return "\n".join(lines) + "\n"


def serve(metrics: Metrics, port: int, healthy: Callable[[], bool]) -> ThreadingHTTPServer:
    """/metrics and /healthz (200 while passes complete, 503 otherwise) on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                status, body, kind = 200, metrics.render(), CONTENT_TYPE
            elif self.path == "/healthz":
                ok = healthy()
                status, body, kind = (
                    (200, "ok\n", "text/plain") if ok else (503, "stale\n", "text/plain")
                )
            else:
                status, body, kind = 404, "not found\n", "text/plain"
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:  # noqa: ARG002 - stdlib's signature
            return  # scrapes every 30 s are not news

    server = ThreadingHTTPServer(("", port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
