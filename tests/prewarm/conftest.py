"""Fixtures for the pre-warm tests: a real S3-compatible server (moto) on loopback, fault hooks
on a real boto3 client, an instrumented source, and a recording sleep/clock."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError
from botocore.response import StreamingBody
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.limits import SourceLimiter
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.s3 import S3Source, make_s3_client
from trainstack_prewarm.sources import (
    ListPage,
    LocalCheck,
    RemoteFile,
    Sink,
    Source,
)

from tests.s3server import AWS_ENV, moto_s3


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def client(self) -> Any:
        return make_s3_client(endpoint_url=self.endpoint, region="us-east-1", max_connections=32)

    def env(self) -> dict[str, str]:
        """Environment for a CLI subprocess that talks to this server."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ENV)
        return env


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with moto_s3() as url:  # loopback only, on a free port the OS picks
        yield S3Server(url)


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    name = f"ds-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


def upload(client: Any, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)


def make_files(n: int, size: int = 3000, salt: str = "") -> dict[str, bytes]:
    """Distinct contents per file (sizes vary so a swapped file would be noticed)."""
    out: dict[str, bytes] = {}
    for i in range(n):
        seed = f"{salt}{i}".encode()
        body = (seed * (size // len(seed) + 2))[: size + i * 7]
        out[f"shard-{i:03d}/part.bin" if i % 2 else f"file-{i:03d}.bin"] = body
    return out


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    """Data files under a cache version dir, bookkeeping excluded."""
    out: dict[str, bytes] = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith((".prewarm/", ".complete")):
            out[rel] = path.read_bytes()
    return out


# ---- fault hooks on a real botocore client -----------------------------------------------------


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_kwargs: Any) -> Iterator[bytes]:
        yield self._body


@dataclass
class _Plan:
    op: str
    key: str | None
    times: int
    status: int = 503
    code: str = "SlowDown"
    connection_error: bool = False


@dataclass
class S3Faults:
    """botocore event handlers on one client: record requests, inject errors and corruption.

    Errors are returned from ``before-send`` as real HTTP responses (status + S3 XML error
    body), so botocore parses them exactly as it would a response from S3.
    """

    client: Any
    requests: list[tuple[str, str]] = field(default_factory=list)  # (operation, key)
    _plans: list[_Plan] = field(default_factory=list)
    _corrupt: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        events = self.client.meta.events
        for op in ("GetObject", "HeadObject", "ListObjectsV2"):
            events.register(f"before-send.s3.{op}", self._before_send)
        events.register("after-call.s3.GetObject", self._after_get)

    def throttle(self, times: int, *, key: str | None = None, op: str = "GetObject") -> None:
        self._plans.append(_Plan(op, key, times))

    def error(
        self,
        code: str,
        status: int,
        *,
        key: str | None = None,
        times: int = 1_000,
        op: str = "GetObject",
    ) -> None:
        self._plans.append(_Plan(op, key, times, status=status, code=code))

    def drop_connection(self, times: int, *, key: str | None = None) -> None:
        self._plans.append(_Plan("GetObject", key, times, connection_error=True))

    def corrupt(self, key: str, times: int) -> None:
        """Flip one byte of the next ``times`` GET bodies of ``key`` (same length)."""
        self._corrupt[key] = times

    def gets(self, key: str | None = None) -> list[str]:
        """GETs of ``key`` (default: all, except the probe for the producer's index)."""
        with self._lock:
            return [
                k
                for op, k in self.requests
                if op == "GetObject"
                and key in (None, k)
                and (key is not None or not k.endswith("/MANIFEST.jsonl"))
            ]

    @staticmethod
    def _key(url: str) -> str:
        path = unquote(urlsplit(url).path)
        return path.lstrip("/").partition("/")[2]

    def _before_send(self, request: Any, event_name: str, **_kwargs: Any) -> AWSResponse | None:
        op = event_name.rsplit(".", 1)[-1]
        key = self._key(request.url)
        with self._lock:
            self.requests.append((op, key))
            plan = next(
                (p for p in self._plans if p.op == op and p.times > 0 and p.key in (None, key)),
                None,
            )
            if plan is None:
                return None
            plan.times -= 1
        if plan.connection_error:
            raise EndpointConnectionError(endpoint_url=request.url)
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{plan.code}</Code>"
            f"<Message>injected {plan.code}</Message><Key>{key}</Key></Error>"
        ).encode()
        headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
        return AWSResponse(request.url, plan.status, headers, _Raw(body))

    def _after_get(self, http_response: Any, parsed: dict[str, Any], **_kwargs: Any) -> None:
        key = self._key(http_response.url)
        with self._lock:
            if self._corrupt.get(key, 0) <= 0 or "Body" not in parsed:
                return
            self._corrupt[key] -= 1
        data = bytearray(parsed["Body"].read())
        data[len(data) // 2] ^= 0xFF
        parsed["Body"] = StreamingBody(io.BytesIO(bytes(data)), len(data))


# ---- an instrumented source: how many transfers are really in flight ---------------------------


class InstrumentedSource:
    """Wraps a source; counts transfers in flight per source and records the peak.

    The first transfers wait (bounded) until ``gate_at`` are in flight together, so a working
    pool provably reaches the limit and a missing bound would show as a peak above it.
    """

    def __init__(self, inner: Source, gate_at: int, state: InFlight | None = None) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.limit_key = inner.limit_key
        self.state = state or InFlight(gate_at)

    def list_page(self, token: str | None) -> ListPage:
        return self.inner.list_page(token)

    def read_index(self) -> list[RemoteFile] | None:
        return self.inner.read_index()

    def transfer_range(self, f: RemoteFile, start: int, end: int, sink: Sink) -> None:
        self.state.enter()
        try:
            self.inner.transfer_range(f, start, end, sink)
        finally:
            self.state.leave()

    def local_check(self, f: RemoteFile) -> LocalCheck:
        return self.inner.local_check(f)

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        return self.inner.read_small(path, max_bytes)

    def transfer(self, f: RemoteFile, sink: Sink) -> str:
        self.state.enter()
        try:
            return self.inner.transfer(f, sink)
        finally:
            self.state.leave()


class InFlight:
    def __init__(self, gate_at: int, gate_timeout_s: float = 10.0) -> None:
        self._cv = threading.Condition()
        self._gate_at = gate_at
        self._timeout = gate_timeout_s
        self._gate_open = False
        self.gate_timed_out = False
        self.now = 0
        self.peak = 0
        self.total = 0

    def enter(self) -> None:
        with self._cv:
            self.now += 1
            self.total += 1
            self.peak = max(self.peak, self.now)
            if self.now >= self._gate_at:
                self._gate_open = True
                self._cv.notify_all()
            elif not self._gate_open and not self._cv.wait_for(
                lambda: self._gate_open, timeout=self._timeout
            ):
                self.gate_timed_out = True
                self._gate_open = True

    def leave(self) -> None:
        with self._cv:
            self.now -= 1


# ---- time and logs -----------------------------------------------------------------------------


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class LogCapture(JsonLog):
    def __init__(self) -> None:
        self.buffer = io.StringIO()
        super().__init__(self.buffer)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.buffer.getvalue().splitlines()]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["event"] == name]


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def logs() -> LogCapture:
    return LogCapture()


def s3_source(server: S3Server, bucket: str, prefix: str) -> tuple[S3Source, S3Faults]:
    client = server.client()
    return S3Source(client, bucket, prefix), S3Faults(client)


def seeded_source(
    server: S3Server, bucket: str, prefix: str, files: dict[str, bytes]
) -> tuple[S3Source, S3Faults]:
    """Upload ``files`` under ``prefix`` and return a source on them with its fault hooks."""
    upload(server.client(), bucket, prefix, files)
    return s3_source(server, bucket, prefix)


def make_fetcher(
    source: Source,
    tmp_path: Path,
    fake_time: FakeTime,
    logs: LogCapture,
    *,
    dataset: str,
    version: str,
    concurrency: int,
    retry: RetryPolicy,
    seed: int,
    limiter: SourceLimiter | None = None,
    lock_timeout: float = FetchOptions.lock_timeout_s,
    deep_check: bool = False,
    file_rounds: int = 0,
    part_size: int = FetchOptions.part_size,
    ranged_threshold: int = FetchOptions.ranged_threshold,
) -> Fetcher:
    """A Fetcher into `tmp_path/cache` on the fake clock, logging to `logs`."""
    return Fetcher(
        source,
        tmp_path / "cache",
        dataset,
        version,
        # No start jitter and no later rounds unless a test asks: sleeps stay exact.
        options=FetchOptions(
            concurrency=concurrency,
            retry=retry,
            lock_timeout_s=lock_timeout,
            start_jitter_s=0.0,
            deep_check=deep_check,
            file_rounds=file_rounds,
            part_size=part_size,
            ranged_threshold=ranged_threshold,
        ),
        limiter=limiter,
        log=logs,
        sleep=fake_time.sleep,
        clock=fake_time.clock,
        rng=random.Random(seed),
    )


def unshare_works() -> bool:
    """A user and mount namespace can be made here (`unshare -rm`): the real mounter's tests
    run in one, and skip, saying so, where the machine does not allow it."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.fixture(autouse=True)
def _no_cache_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI keeps 20 % of the cache's volume free by default (issue 39 #1), measured on
    the real disk: these tests must not pass or fail with how full the machine's disk is.
    The reserve's own tests (test_evict.py) give a fake volume and --reserve explicitly."""
    monkeypatch.setenv("TRAINSTACK_CACHE_RESERVE", "0")
