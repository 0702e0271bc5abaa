"""``make bench-prewarm``: the fleet load test at 64 nodes, and peak RSS with 1M objects.

The fleet runs twice against one dataset (24 objects), every 8th node killed and restarted:

1. at its budget: the proxy's limit is the fleet's budget (100/s) and each node's ceiling its
   share, ``node_request_rate(100, 64)`` as the platform renders ``--max-request-rate``;
2. below it: storage throttles at 32/s, under the nodes' combined ceilings, so they adapt.

Last line: one JSON object. Phase 1: ``nodes``, ``completed``, ``request_rate_max`` (the most
requests the nodes **sent** in any one-second window on the proxy's clock, SlowDowns
included), ``request_rate_limit``, ``bytes_fetched_over_dataset_max``, ``node_rate_ceiling``,
``served_rate_max`` (what the proxy let through, capped at its limit by construction),
``throttled_fraction``; phase 2 under ``below_budget_*`` (limit, completed, attempted rate,
also over the second half of the run, throttled fraction, bytes); and
``peak_rss_mib_1m_objects``. The lines before it say what ran. Environment: ``BENCH_NODES``
(64), ``BENCH_OBJECTS`` (1,000,000) to scale it down.
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
from trainstack_prewarm.s3 import make_s3_client

from tests.prewarm.loadtest import FleetResult, GeneratedSource, publish, run_fleet
from trainstack.builders.cache import node_request_rate

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
BUDGET = 100  # the fleet's request-rate budget and, in the first phase, the proxy's limit
BELOW_BUDGET_LIMIT = 32  # the second phase: storage throttles at a third of the budget


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
    """Both phases on one moto server and one published dataset; their figures in one dict."""
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
        # The platform's computation: each node's ceiling is its share of the fleet's budget.
        per_node = node_request_rate(BUDGET, nodes)

        def phase(label: str, limit: int) -> FleetResult:
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
            print(f"{result.describe(label)} ({time.monotonic() - t0:.1f}s)", flush=True)
            return result

        at_budget = phase(f"fleet at its budget of {BUDGET}/s", BUDGET)
        below = phase("storage throttling below the budget", BELOW_BUDGET_LIMIT)
        summary = at_budget.summary()
        summary.update(
            {
                "below_budget_request_rate_limit": below.rate_limit,
                "below_budget_completed": below.completed,
                "below_budget_attempted_rate_max": below.stats.max_attempted_rate(),
                "below_budget_attempted_rate_max_second_half": below.stats.max_attempted_rate(
                    second_half=True
                ),
                "below_budget_throttled_fraction": round(below.stats.throttled_fraction(), 4),
                "below_budget_bytes_fetched_over_dataset_max": round(
                    below.bytes_over_dataset_max(), 4
                ),
            }
        )
        return summary
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
