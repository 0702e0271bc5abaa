"""The fleet load test, small: nodes through a throttling proxy in front of moto (issue 24).

The full run (64 nodes) is `make bench-prewarm`; this one checks the same properties with 8:

* the proxy's limit is the fleet's budget and each node's ceiling its share, computed as the
  platform computes it (`node_request_rate`): every node completes and what the nodes sent,
  counted in one-second windows on the proxy's clock, SlowDowns included, never exceeds the
  limit, so nothing is throttled;
* storage throttles below the budget (a proxy limit under the nodes' combined ceilings): the
  nodes adapt and every node still completes;

and in both, a node whose pod was killed mid-fetch and restarted fetched no byte twice. No
wall-clock time is asserted: the rates are counts of requests per window.
"""

from __future__ import annotations

from pathlib import Path

from tests.prewarm.conftest import S3Server
from tests.prewarm.loadtest import FleetResult, publish, run_fleet
from trainstack.builders.cache import node_request_rate

NODES, OBJECTS, SIZE = 8, 6, 4000


def _fleet(
    s3_server: S3Server, bucket: str, tmp_path: Path, limit: int, per_node: float
) -> FleetResult:
    client = s3_server.client()
    total = publish(client, bucket, "ds/v1", files=OBJECTS, size=SIZE)
    result = run_fleet(
        moto_endpoint=s3_server.endpoint,
        bucket=bucket,
        prefix="ds/v1",
        dataset_bytes=total,
        workdir=tmp_path,
        nodes=NODES,
        rate_limit=limit,
        node_max_rate=per_node,
        start_jitter_s=0.5,
        kill_every=4,
        kill_after=3,
    )
    _every_node_completed_once(result, total)
    return result


def _every_node_completed_once(result: FleetResult, total: int) -> None:
    assert result.errors == {}
    assert result.completed == NODES
    assert result.restarted == 2
    stats = result.stats
    # Every request the nodes sent was seen, those answered SlowDown included.
    assert len(stats.attempted) == len(stats.admitted) + stats.throttled
    assert result.summary()["served_rate_max"] <= result.rate_limit  # the proxy's own cap
    # Each node, the restarted ones included, fetched the dataset's bytes once; a kill may
    # cost the one object that was in flight with it.
    largest = SIZE + OBJECTS - 1
    for n in range(NODES):
        assert total <= stats.bytes_by_node[n] <= total + largest, n


def test_a_fleet_at_its_budget_never_sends_above_the_limit(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    budget = 20  # = the proxy's limit; each node's share is 2.5/s, 2 whole requests per window
    per_node = node_request_rate(budget, NODES)
    assert NODES * per_node <= budget

    result = _fleet(s3_server, bucket + "-budget", tmp_path, budget, per_node)

    summary = result.summary()
    assert summary["request_rate_max"] <= budget  # what the nodes sent, not what was served
    assert result.stats.throttled == 0


def test_a_fleet_adapts_when_storage_throttles_below_the_budget(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    per_node = node_request_rate(20, NODES)  # a budget of 20/s ...
    limit = 10  # ... but storage serves only 10/s: the nodes must halve their rates

    result = _fleet(s3_server, bucket + "-below", tmp_path, limit, per_node)

    assert result.stats.throttled > 0  # storage did throttle, and every node completed
    rates = result.summary()
    assert 0 < rates["throttled_fraction"] < 1
