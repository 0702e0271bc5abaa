"""The fleet load test, small: nodes through a throttling proxy in front of moto (issue 24).

The full run (64 nodes) is `make bench-prewarm`; this one checks the same properties in a few
seconds: every node completes although the fleet's combined ceiling is above the proxy's limit
(so the nodes must back off), the rate S3 served stays under that limit, and a node whose pod
was killed mid-fetch and restarted fetched no byte twice.
"""

from __future__ import annotations

from pathlib import Path

from tests.prewarm.conftest import S3Server
from tests.prewarm.loadtest import publish, run_fleet


def test_fleet_behind_a_throttling_proxy_completes_once_per_node(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    client = s3_server.client()
    total = publish(client, bucket + "-fleet", "ds/v1", files=10, size=4000)
    nodes, limit, per_node = 8, 30, 10.0
    assert nodes * per_node > limit  # the proxy must throttle: the nodes have to adapt

    result = run_fleet(
        moto_endpoint=s3_server.endpoint,
        bucket=bucket + "-fleet",
        prefix="ds/v1",
        dataset_bytes=total,
        workdir=tmp_path,
        nodes=nodes,
        rate_limit=limit,
        node_max_rate=per_node,
        start_jitter_s=0.5,
        kill_every=4,
        kill_after=4,
    )

    assert result.errors == {}
    summary = result.summary()
    assert summary["completed"] == nodes
    assert result.restarted == 2
    assert summary["request_rate_max"] <= limit  # the proxy's own cap: checks the proxy
    # What the nodes sent: every request was seen, those answered SlowDown included.
    stats = result.stats
    assert len(stats.attempted) == len(stats.admitted) + stats.throttled
    assert summary["attempted_rate_max"] >= summary["request_rate_max"]
    assert 0 <= summary["throttled_fraction"] < 1
    # Each node, the restarted ones included, fetched the dataset's bytes once; a kill may
    # cost the one object that was in flight with it.
    largest = 4000 + 9
    for n in range(nodes):
        assert total <= result.stats.bytes_by_node[n] <= total + largest, n
