"""``make bench-prewarm``: the fleet load test at 64 nodes, and peak RSS with 1M objects.

Last line: one JSON object, ``{"nodes", "completed", "request_rate_max", "request_rate_limit",
"bytes_fetched_over_dataset_max", "peak_rss_mib_1m_objects"}`` plus what the nodes sent:
``attempted_rate_max`` (requests per second the clients sent, SlowDowns included),
``attempted_rate_max_second_half`` (the same, once they have adapted) and
``throttled_fraction``. ``request_rate_max`` is the rate the proxy served, which it caps at
the limit by construction. The lines before it say what ran (throttled responses, restarts,
per-phase times). Environment: ``BENCH_NODES`` (64),
``BENCH_OBJECTS`` (1,000,000) to scale it down.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from moto.server import ThreadedMotoServer
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.sources import make_s3_client

from tests.prewarm.loadtest import GeneratedSource, publish, run_fleet

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def rss_child(n: int, root: Path) -> None:
    """Fetch ``n`` objects into ``root``; print peak RSS in MiB (run in its own process)."""
    with open(os.devnull, "w") as devnull:
        Fetcher(
            GeneratedSource(n),
            root,
            "million",
            "v1",
            options=FetchOptions(concurrency=8, retry=RetryPolicy(3, 0.1, 1.0), start_jitter_s=0.0),
            log=JsonLog(devnull),
        ).run()
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent across
    # fork and exec, so a child of a large parent would report the parent's peak.
    status = Path("/proc/self/status").read_text()
    print(int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) / 1024)  # type: ignore[union-attr]


def peak_rss_mib(n: int) -> float:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        out = subprocess.run(
            [sys.executable, "-m", "tests.prewarm.bench", "--rss-child", str(n), tmp],
            check=True,
            capture_output=True,
            text=True,
        )
    return float(out.stdout.strip().splitlines()[-1])


def fleet(nodes: int) -> dict[str, float | int]:

    os.environ.update(AWS_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = make_s3_client(endpoint_url=endpoint, region="us-east-1")
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        total = publish(client, bucket, "ds/v1", files=24, size=32_000)
        limit, per_node = 100, 5.0
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            result = run_fleet(
                moto_endpoint=endpoint,
                bucket=bucket,
                prefix="ds/v1",
                dataset_bytes=total,
                workdir=Path(tmp),
                nodes=nodes,
                rate_limit=limit,
                node_max_rate=per_node,
                start_jitter_s=3.0,
                kill_every=8,
                kill_after=6,
            )
        print(
            f"fleet: {nodes} nodes x {per_node:g} req/s ceiling = {nodes * per_node:g} req/s "
            f"against a proxy limit of {limit} req/s; {result.restarted} pods killed and "
            f"restarted; {len(result.stats.attempted)} requests sent, "
            f"{result.stats.throttled} answered SlowDown "
            f"({result.stats.throttled_fraction():.1%}), "
            f"{len(result.stats.admitted)} served in {time.monotonic() - t0:.1f}s; "
            f"sent at most {result.stats.max_attempted_rate()}/s, "
            f"{result.stats.max_attempted_rate(second_half=True)}/s in the second half; "
            f"errors: {result.errors or 'none'}",
            flush=True,
        )
        return result.summary()
    finally:
        server.stop()


def main() -> None:
    if sys.argv[1:2] == ["--rss-child"]:
        rss_child(int(sys.argv[2]), Path(sys.argv[3]))
        return
    nodes = int(os.environ.get("BENCH_NODES", "64"))
    objects = int(os.environ.get("BENCH_OBJECTS", "1000000"))
    t0 = time.monotonic()
    small = peak_rss_mib(objects // 10)
    rss = peak_rss_mib(objects)
    summary = fleet(nodes)
    print(
        f"peak RSS: {small:.0f} MiB with {objects // 10} objects, {rss:.0f} MiB with "
        f"{objects} ({time.monotonic() - t0:.0f}s)",
        flush=True,
    )
    summary["peak_rss_mib_1m_objects"] = round(rss, 1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
