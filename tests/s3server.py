"""A real S3 API for tests: moto's server on loopback, on a port the OS picks.

Tests that talk to S3 (checkpoint tiering, the hand-off, `trainstack logs`, the prewarm agent's
fetcher, the log collector) use this one server recipe: test credentials in the environment
instead of whatever the machine has, never an AWS endpoint, and (``endpoint_env``) boto3's own
setting for an S3-compatible endpoint, ``AWS_ENDPOINT_URL_S3``, so that code under test built
with a plain ``boto3.client("s3")`` reaches it, as a job on an existing cluster would.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import pytest
import xxhash
from moto.server import ThreadedMotoServer

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


@contextmanager
def moto_s3(*, endpoint_env: bool = False) -> Iterator[str]:
    """Start the server with the test environment in place; its URL."""
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(key)
        for key, value in AWS_ENV.items():
            mp.setenv(key, value)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        if endpoint_env:
            mp.setenv("AWS_ENDPOINT_URL_S3", url)
        try:
            yield url
        finally:
            server.stop()


class PollingReader:
    """Reads an S3 location from a thread while a job writes it (a context manager):
    ``poll_once`` says what a reader would take for complete; ``check_files`` downloads what a
    manifest lists and records every file that is not the bytes the manifest says."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.poll_once()

    def poll_once(self) -> None:
        raise NotImplementedError

    def check_files(self, bucket: str, prefix: str, manifest: dict[str, Any], what: str) -> None:
        for name, meta in manifest["files"].items():
            data = self.client.get_object(Bucket=bucket, Key=prefix + name)["Body"].read()
            if len(data) != meta["size"] or xxhash.xxh3_128_hexdigest(data) != meta["xxh3_128"]:
                self.failures.append(f"{what}{name}: not the bytes its manifest lists")
