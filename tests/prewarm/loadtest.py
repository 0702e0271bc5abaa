"""A fleet of simulated nodes pre-warming one dataset through a throttling S3 proxy.

``ThrottlingProxy`` sits on loopback in front of a real S3 API (moto's server) and answers
``503 SlowDown`` (a real S3 error body) to any request beyond ``limit`` requests in the last
second; it forwards the rest and records, per node (``node/<i>`` in the User-Agent), every
request and the object bytes it served. ``run_fleet`` starts ``nodes`` fetchers (threads, each
with its own client, limiter and cache directory), kills some of them mid-fetch and restarts
them (a pod restart on the same node cache), and returns what the proxy saw.

Used by tests/prewarm/test_load.py (small and fast) and ``make bench-prewarm``
(``python -m tests.prewarm.bench``: 64 nodes, and peak RSS with a million-object listing),
each in two phases: the proxy's limit equal to the fleet's budget with each node's ceiling its
share (``trainstack.builders.cache.node_request_rate``, as the platform renders it), so the
nodes must keep what they send under the limit; then storage throttling below the budget, so
the nodes must adapt (AIMD).
"""

from __future__ import annotations

import bisect
import collections
import http.client
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from trainstack_prewarm import cache
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.limits import RateOptions, SourceLimiter
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.s3 import S3Source, make_s3_client
from trainstack_prewarm.sources import (
    ListPage,
    LocalCheck,
    RemoteFile,
    Sink,
)

_NODE = re.compile(r"node/(\d+)")
_SLOWDOWN = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def _max_in_window(times: list[float], window_s: float, since: float | None = None) -> int:
    """Most of ``times`` in any window of ``window_s`` seconds (starting at ``since`` or later)."""
    times = sorted(times)
    best = 0
    for i, t in enumerate(times):
        if since is None or t >= since:
            best = max(best, bisect.bisect_left(times, t + window_s) - i)
    return best


@dataclass
class ProxyStats:
    admitted: list[float] = field(default_factory=list)  # monotonic time of each admitted request
    # Every request the clients sent, admitted or answered SlowDown: what they attempt.
    attempted: list[float] = field(default_factory=list)
    throttled: int = 0
    bytes_by_node: dict[int, int] = field(default_factory=lambda: collections.defaultdict(int))
    requests_by_node: dict[int, int] = field(default_factory=lambda: collections.defaultdict(int))

    def max_rate(self, window_s: float = 1.0) -> int:
        """Most admitted requests in any window of ``window_s`` seconds. The proxy admits at
        most its limit per second by construction, so this checks the proxy, not the nodes."""
        return _max_in_window(self.admitted, window_s)

    def max_attempted_rate(self, window_s: float = 1.0, *, second_half: bool = False) -> int:
        """Most requests the clients sent in any window of ``window_s`` seconds; with
        ``second_half``, only windows starting in the second half of the run (from the first
        to the last request), once the nodes have had time to adapt."""
        if not self.attempted:
            return 0
        since = None
        if second_half:
            since = (min(self.attempted) + max(self.attempted)) / 2
        return _max_in_window(self.attempted, window_s, since)

    def throttled_fraction(self) -> float:
        """Share of the clients' requests answered SlowDown."""
        return self.throttled / len(self.attempted) if self.attempted else 0.0


class ThrottlingProxy:
    """HTTP proxy to ``upstream`` (host:port) that returns SlowDown above ``limit`` req/s."""

    def __init__(self, upstream: str, limit: int) -> None:
        self.upstream = upstream
        self.limit = limit
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self._window: collections.deque[float] = collections.deque()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy.handle(self)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._local = threading.local()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ThrottlingProxy:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _admit(self) -> bool:
        with self._lock:
            now = time.monotonic()
            while self._window and self._window[0] <= now - 1.0:
                self._window.popleft()
            if len(self._window) >= self.limit:
                self.stats.throttled += 1
                return False
            self._window.append(now)
            self.stats.admitted.append(now)
            return True

    def _upstream(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.upstream, timeout=60)
            self._local.conn = conn
        return conn

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else None
        match = _NODE.search(req.headers.get("User-Agent", ""))
        node = int(match.group(1)) if match else -1
        with self._lock:
            self.stats.requests_by_node[node] += 1
            self.stats.attempted.append(time.monotonic())
        if not self._admit():
            req.send_response(503)
            req.send_header("Content-Type", "application/xml")
            req.send_header("Content-Length", str(len(_SLOWDOWN)))
            req.end_headers()
            req.wfile.write(_SLOWDOWN)
            return
        headers = {k: v for k, v in req.headers.items() if k.lower() != "connection"}
        for attempt in range(2):
            conn = self._upstream()
            try:
                conn.request(req.command, req.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        if req.command == "GET" and resp.status in {200, 206} and "?" not in req.path:
            with self._lock:
                self.stats.bytes_by_node[node] += len(data)
        req.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in {"connection", "transfer-encoding", "content-length"}:
                req.send_header(key, value)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data)


class PodKilled(BaseException):
    """Raised by a killed node's source: the pod is gone, its node cache stays."""


class _KillAfter:
    """A source that kills its pod when the ``after``-th transfer is about to start."""

    def __init__(self, inner: S3Source, after: int) -> None:
        self.inner = inner
        self.uri, self.limit_key = inner.uri, inner.limit_key
        self._left = after
        self._lock = threading.Lock()
        self.list_page, self.read_index = inner.list_page, inner.read_index
        self.read_small, self.local_check = inner.read_small, inner.local_check

    def _tick(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left < 0:
                raise PodKilled

    def transfer(self, f: RemoteFile, sink: Sink) -> str:
        self._tick()
        return self.inner.transfer(f, sink)

    def transfer_range(self, f: RemoteFile, start: int, end: int, sink: Sink) -> None:
        self._tick()
        self.inner.transfer_range(f, start, end, sink)


@dataclass
class FleetResult:
    nodes: int
    completed: int
    restarted: int
    dataset_bytes: int
    rate_limit: int  # the proxy's: storage's limit
    node_max_rate: float  # each node's ceiling
    stats: ProxyStats
    errors: dict[int, str]

    def bytes_over_dataset_max(self) -> float:
        """The largest per-node bytes served over the dataset's."""
        return max(
            (self.stats.bytes_by_node.get(n, 0) / self.dataset_bytes for n in range(self.nodes)),
            default=0.0,
        )

    def summary(self) -> dict[str, float | int]:
        """The fleet's figures. ``request_rate_max`` is what the nodes **sent** in any one-second
        window (SlowDowns included), counted on the proxy's clock; ``served_rate_max`` what
        the proxy let through, which it caps at its limit by construction."""
        return {
            "nodes": self.nodes,
            "completed": self.completed,
            "request_rate_max": self.stats.max_attempted_rate(),
            "request_rate_limit": self.rate_limit,
            "bytes_fetched_over_dataset_max": round(self.bytes_over_dataset_max(), 4),
            "node_rate_ceiling": self.node_max_rate,
            "served_rate_max": self.stats.max_rate(),
            "throttled_fraction": round(self.stats.throttled_fraction(), 4),
        }

    def describe(self, label: str) -> str:
        """One line for the bench's log: what ran and what the proxy saw."""
        return (
            f"{label}: {self.nodes} nodes x {self.node_max_rate:g} req/s ceiling against a proxy "
            f"limit of {self.rate_limit} req/s; {self.completed} completed, {self.restarted} "
            f"pods killed and restarted; {len(self.stats.attempted)} requests sent, "
            f"{self.stats.throttled} answered SlowDown ({self.stats.throttled_fraction():.1%}); "
            f"sent at most {self.stats.max_attempted_rate()}/s, "
            f"{self.stats.max_attempted_rate(second_half=True)}/s in the second half; "
            f"at most {self.bytes_over_dataset_max():.3f}x the dataset per node; "
            f"errors: {self.errors or 'none'}"
        )


def run_fleet(
    *,
    moto_endpoint: str,
    bucket: str,
    prefix: str,
    dataset_bytes: int,
    workdir: Path,
    nodes: int,
    rate_limit: int,
    node_max_rate: float,
    concurrency: int = 2,
    start_jitter_s: float = 1.0,
    kill_every: int = 8,
    kill_after: int = 3,
    seed: int = 0,
) -> FleetResult:
    """``nodes`` fetchers of ``s3://bucket/prefix`` through a proxy throttling at ``rate_limit``,
    each with its own limiter whose ceiling is ``node_max_rate``.

    Every ``kill_every``-th node is killed when its ``kill_after``-th transfer starts and is
    restarted on the same cache directory (a pod restart on a node that keeps its cache).
    """
    upstream = moto_endpoint.removeprefix("http://")
    completed = 0
    restarted = 0
    errors: dict[int, str] = {}
    lock = threading.Lock()
    with ThrottlingProxy(upstream, rate_limit) as proxy, open(os.devnull, "w") as devnull:

        def node(i: int) -> None:
            nonlocal completed, restarted
            client = make_s3_client(
                endpoint_url=proxy.endpoint,
                region="us-east-1",
                max_connections=concurrency + 2,
                user_agent_extra=f"node/{i}",
            )
            limiter = SourceLimiter(
                concurrency, rate=RateOptions(max_rate=node_max_rate, retry_budget=50)
            )
            options = FetchOptions(
                concurrency=concurrency,
                retry=RetryPolicy(8, 0.2, 2.0),
                start_jitter_s=start_jitter_s,
                lock_timeout_s=60,
                progress_interval_s=3600,
            )
            root = workdir / f"node-{i}"
            source = S3Source(client, bucket, prefix)
            log = JsonLog(devnull)
            rng = random.Random(seed * 1000 + i)
            try:
                if kill_every and i % kill_every == 0:
                    try:
                        victim = _KillAfter(source, kill_after)
                        Fetcher(
                            victim, root, "ds", "v1", options=options, limiter=limiter,
                            log=log, rng=rng,
                        ).run()  # fmt: skip
                    except PodKilled:
                        with lock:
                            restarted += 1
                Fetcher(
                    source, root, "ds", "v1", options=options, limiter=limiter, log=log, rng=rng
                ).run()
                cache.verify(root / "ds" / "v1", deep=True)
                with lock:
                    completed += 1
            except Exception as exc:  # reported in the result, counted as not completed
                with lock:
                    errors[i] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(nodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
    return FleetResult(
        nodes, completed, restarted, dataset_bytes, rate_limit, node_max_rate, proxy.stats, errors
    )


def publish(client: Any, bucket: str, prefix: str, files: int, size: int) -> int:
    """Upload ``files`` objects of about ``size`` bytes; returns the dataset's total bytes."""
    client.create_bucket(Bucket=bucket)
    total = 0
    rng = random.Random(7)
    for n in range(files):
        body = rng.randbytes(size + n)
        client.put_object(Bucket=bucket, Key=f"{prefix}/shard-{n:05d}.bin", Body=body)
        total += len(body)
    return total


class GeneratedSource:
    """``n`` small objects listed in pages of ``page`` (generated, like S3's 1,000) and served
    from memory: the fetcher's own cost without a server (memory, submission window)."""

    uri, limit_key = "mem://generated/", "mem://generated"

    def __init__(self, n: int, *, page: int = 1000, body: bytes = b"x") -> None:
        self.n, self.page, self.body = n, page, body

    def list_page(self, token: str | None) -> ListPage:
        start = int(token or 0)
        end = min(self.n, start + self.page)
        files = [
            RemoteFile(f"d{i // 1000:04d}/f{i:07d}", len(self.body), f"etag:{i:032x}")
            for i in range(start, end)
        ]
        return ListPage(files, str(end) if end < self.n else None)

    def read_index(self) -> list[RemoteFile] | None:
        return None

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        del path, max_bytes
        return None

    def transfer(self, f: RemoteFile, sink: Sink) -> str:
        del f
        sink(self.body)
        return "size"

    def transfer_range(self, f: RemoteFile, start: int, end: int, sink: Sink) -> None:
        raise AssertionError(f"{f.path} {start}-{end} {sink}: small objects are not ranged")

    def local_check(self, f: RemoteFile) -> LocalCheck:
        raise AssertionError(f"{f.path}: small objects are not ranged")
