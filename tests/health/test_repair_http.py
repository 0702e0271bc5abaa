"""The repair controller's HTTP clients against local servers on 127.0.0.1: the repair hook
over real TLS (a test CA made here, passed as the client's trust: the production code path, no
plain-http exception), Prometheus's query API (a fake speaking its JSON), and /metrics."""

from __future__ import annotations

import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from trainstack_health.repair import decide, http
from trainstack_health.repair.metrics import ERRORS, REPAIRS, Metrics, serve

from trainstack.sandbox import pki

Handler = Callable[[BaseHTTPRequestHandler, bytes], tuple[int, dict[str, str], bytes]]


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it, from the sandbox's PKI (the
    one the control plane's certificates come from): (CA cert, cert, key)."""
    ca = pki.Authority(directory)
    serving = ca.issue("server", "127.0.0.1", server=True)
    return ca.cert, serving.cert, serving.key


@contextmanager
def server(handle: Handler, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """An HTTP(S) server on 127.0.0.1 answering every request with `handle`; its base URL."""

    class H(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            status, headers, body = handle(self, self.rfile.read(length))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = _any

        def log_message(self, *_args: object) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_tls(tmp_path_factory.mktemp("tls"))


def trust(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


# --- the hook ---------------------------------------------------------------------------------


def test_hook_posts_json_over_verified_tls(tls: tuple[Path, Path, Path]) -> None:
    got: list[tuple[str, str, dict[str, str], Any]] = []

    def handle(h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        got.append((h.command, h.path, dict(h.headers), json.loads(body)))
        return 202, {}, b""

    payload: dict[str, Any] = {"cluster": "prod", "node": "gpu-1", "providerID": None,
                               "pool": "h100", "reason": "xid", "labels": {}}  # fmt: skip
    with server(handle, (tls[1], tls[2])) as url:
        http.post_hook(f"{url}/repair", payload, context=trust(tls[0]))
    assert len(got) == 1
    method, path, headers, body = got[0]
    assert (method, path, body) == ("POST", "/repair", payload)
    assert headers["Content-Type"] == "application/json"


def test_hook_refuses_an_untrusted_certificate(tls: tuple[Path, Path, Path]) -> None:
    with (
        server(lambda _h, _b: (200, {}, b""), (tls[1], tls[2])) as url,
        pytest.raises(http.HttpError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        http.post_hook(url, {})  # the system's CAs: the test CA is not among them


@pytest.mark.parametrize(
    ("status", "headers", "message"),
    [
        (500, {}, "HTTP 500 boom"),
        (404, {}, "HTTP 404"),
        # a redirect is not followed (it could leave https, with the node list)
        (307, {"Location": "http://127.0.0.1:1/elsewhere"}, "HTTP 307"),
        (302, {"Location": "/elsewhere"}, "HTTP 302"),
    ],
)
def test_hook_non_2xx_is_an_error(
    tls: tuple[Path, Path, Path], status: int, headers: dict[str, str], message: str
) -> None:
    calls: list[str] = []

    def handle(h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        calls.append(h.path)
        return status, headers, b"boom"

    with server(handle, (tls[1], tls[2])) as url, pytest.raises(http.HttpError, match=message):
        http.post_hook(f"{url}/repair", {}, context=trust(tls[0]))
    assert calls == ["/repair"]


def test_hook_refuses_plain_http_whoever_calls_it() -> None:
    calls: list[str] = []

    def handle(h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        calls.append(h.path)
        return 200, {}, b""

    with (
        server(handle) as url,
        pytest.raises(http.HttpError, match="https only"),
    ):
        http.post_hook(url, {})
    assert calls == []


def test_hook_unreachable_is_an_error(tls: tuple[Path, Path, Path]) -> None:
    with server(lambda _h, _b: (200, {}, b""), (tls[1], tls[2])) as url:
        dead = url
    with pytest.raises(http.HttpError, match=r"POST https://127\.0\.0\.1"):
        http.post_hook(dead, {}, context=trust(tls[0]), timeout=2)


# --- Prometheus -------------------------------------------------------------------------------


def test_prometheus_instant_query() -> None:
    """The answer's shape as prometheus docs/querying/api.md "Instant queries" gives it."""
    asked: list[dict[str, list[str]]] = []
    answer = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"node": "gpu-1"}, "value": [1800000000.0, "4"]}]}}  # fmt: skip

    def handle(h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(h.path)
        assert parts.path == "/api/v1/query"
        asked.append(parse_qs(parts.query))
        return 200, {"Content-Type": "application/json"}, json.dumps(answer).encode()

    with server(handle) as url:
        got = http.query(url + "/", decide.straggler_query())
    assert asked == [{"query": [decide.straggler_query()]}]
    assert decide.parse_vector(got) == {"gpu-1": 4.0}


def test_prometheus_error_body_is_in_the_message() -> None:
    error = {"status": "error", "errorType": "bad_data", "error": "1:5: parse error"}

    def handle(h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        return 400, {"Content-Type": "application/json"}, json.dumps(error).encode()

    with server(handle) as url, pytest.raises(http.HttpError, match=r"HTTP 400.*parse error"):
        http.query(url, "sum(")


def test_prometheus_non_json_is_an_error() -> None:
    with (
        server(lambda _h, _b: (200, {}, b"<html>")) as url,
        pytest.raises(http.HttpError, match="not JSON"),
    ):
        http.query(url, "up")


# --- /metrics ---------------------------------------------------------------------------------


def test_metrics_exposition_and_health() -> None:
    metrics = Metrics()
    metrics.inc(REPAIRS, pool="h100", action="drain")
    metrics.inc(REPAIRS, pool="h100", action="drain")
    metrics.inc(ERRORS, operation='ho"ok')
    healthy = [True]
    httpd = serve(metrics, 0, lambda: healthy[0], host="127.0.0.1")
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            text = resp.read().decode()
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert text == (
            "# HELP trainstack_node_repairs_total Repairs of failed nodes, by action (drain, "
            "replace, hook, recheck)\n"
            "# TYPE trainstack_node_repairs_total counter\n"
            'trainstack_node_repairs_total{action="drain",pool="h100"} 2\n'
            "# HELP trainstack_node_repair_errors_total Failed repair operations, by operation\n"
            "# TYPE trainstack_node_repair_errors_total counter\n"
            'trainstack_node_repair_errors_total{operation="ho\\"ok"} 1\n'
        )
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
            assert resp.status == 200
        healthy[0] = False
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(f"{base}/healthz", timeout=5)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_metrics_refuse_unknown_names_and_labels() -> None:
    with pytest.raises(KeyError):
        Metrics().inc("trainstack_node_health_passed", node="n", pool="p")
    with pytest.raises(KeyError):
        Metrics().inc(REPAIRS, pool="h100")
