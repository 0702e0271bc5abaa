"""The repair controller's decisions as pure functions: its settings, which pods a drain
moves, the step for each node state, the hook's payload and the straggler follow-up."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from trainstack_health import contract
from trainstack_health.errors import SetupError
from trainstack_health.repair import decide
from trainstack_health.repair.decide import Settings, Step

from trainstack.builders.monitoring import health as monitoring_health

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z

REPAIR: dict[str, Any] = {
    "mode": "replace",
    "hookUrl": None,
    "delaySeconds": 300,
    "region": "us-west-2",
    "clusterName": "prod",
    "prometheusUrl": "http://prometheus.monitoring:9090",
    "stragglerAlerts": 3,
}


def expectations(**repair: Any) -> dict[str, Any]:
    return {"pools": {}, "recheckSeconds": 3600, "repair": {**REPAIR, **repair}}


def settings(**kw: Any) -> Settings:
    base: dict[str, Any] = {
        "mode": "replace",
        "hook_url": None,
        "delay_s": 300.0,
        "region": "us-west-2",
        "cluster_name": "prod",
    }
    return Settings(**{**base, **kw})


def node_obj(
    name: str = "gpu-1",
    *,
    state: str | None = contract.STATE_FAILED,
    progress: str | None = None,
    drained_at: str | None = None,
    reason: str | None = "xid",
    pool: str = "h100",
    provider_id: str | None = "aws:///us-west-2a/i-0123456789abcdef0",
    recheck: str | None = None,
) -> dict[str, Any]:
    labels = {contract.POOL_LABEL: pool, "kubernetes.io/hostname": name}
    for key, value in (
        (contract.STATE_LABEL, state),
        (contract.REPAIR_LABEL, progress),
        (contract.REASON_LABEL, reason),
        (contract.RECHECK_LABEL, recheck),
    ):
        if value is not None:
            labels[key] = value
    annotations = {}
    if drained_at is not None:
        annotations[contract.DRAINED_AT_ANNOTATION] = drained_at
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {},
    }
    if provider_id is not None:
        obj["spec"]["providerID"] = provider_id
    return obj


def pod(
    name: str,
    *,
    namespace: str = "team-a",
    team: bool = True,
    phase: str = "Running",
    daemonset: bool = False,
    mirror: bool = False,
    deleting: bool = False,
    node: str = "gpu-1",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {}, "annotations": {}}
    if team:
        meta["labels"][contract.TEAM_LABEL] = namespace
    if daemonset:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds", "apiVersion": "apps/v1"}]
    if mirror:
        meta["annotations"][decide.MIRROR_ANNOTATION] = "abc"
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T07:59:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


# --- settings ---------------------------------------------------------------------------------


def test_settings_read_every_field(tmp_path: Path) -> None:
    path = tmp_path / "expectations.json"
    path.write_text(json.dumps(expectations()))
    assert decide.read_settings(path) == Settings(
        mode="replace",
        hook_url=None,
        delay_s=300.0,
        region="us-west-2",
        cluster_name="prod",
        prometheus_url="http://prometheus.monitoring:9090",
        straggler_alerts=3,
    )


def test_settings_defaults_for_optional_fields() -> None:
    doc = expectations(mode="none", region=None)
    del doc["repair"]["delaySeconds"], doc["repair"]["stragglerAlerts"]
    doc["repair"]["prometheusUrl"] = None
    got = decide.parse_settings(doc)
    assert (got.delay_s, got.straggler_alerts, got.prometheus_url) == (0.0, 3, None)


def test_hook_mode_keeps_its_url() -> None:
    got = decide.parse_settings(expectations(mode="hook", hookUrl="https://repair.example/x"))
    assert got.hook_url == "https://repair.example/x"


@pytest.mark.parametrize(
    ("repair", "message"),
    [
        ({"mode": "reboot"}, "repair.mode must be one of replace, hook, none"),
        ({"mode": None}, "repair.mode must be one of"),
        ({"mode": "hook", "hookUrl": None}, "needs an https:// repair.hookUrl"),
        # plain http, even to loopback: no exception exists, for tests or anyone
        ({"mode": "hook", "hookUrl": "http://127.0.0.1:8080/"}, "needs an https://"),
        ({"mode": "hook", "hookUrl": "https:///path"}, "needs an https://"),
        ({"mode": "hook", "hookUrl": "https://u:p@repair.example/"}, "no credentials"),
        ({"mode": "hook", "hookUrl": 7}, "needs an https://"),
        ({"delaySeconds": -1}, "repair.delaySeconds must be a number >= 0"),
        ({"delaySeconds": True}, "repair.delaySeconds"),
        ({"delaySeconds": "300"}, "repair.delaySeconds"),
        ({"delaySeconds": float("inf")}, "repair.delaySeconds"),
        ({"region": None}, "repair.mode 'replace' needs repair.region"),
        ({"region": ""}, "needs repair.region"),
        ({"clusterName": ""}, "repair.clusterName is missing"),
        ({"clusterName": None}, "repair.clusterName is missing"),
        ({"prometheusUrl": "prometheus:9090"}, "repair.prometheusUrl must be an http(s)://"),
        ({"prometheusUrl": "ftp://p"}, "repair.prometheusUrl"),
        ({"stragglerAlerts": 0}, "repair.stragglerAlerts must be an integer >= 1"),
        ({"stragglerAlerts": 2.5}, "repair.stragglerAlerts"),
        ({"stragglerAlerts": True}, "repair.stragglerAlerts"),
    ],
)
def test_invalid_settings_are_named(repair: dict[str, Any], message: str) -> None:
    with pytest.raises(SetupError, match=None) as caught:
        decide.parse_settings(expectations(**repair), "e.json")
    assert message in caught.value.message
    assert caught.value.message.startswith("e.json: ")


@pytest.mark.parametrize("doc", [None, [], {"pools": {}}, {"repair": "replace"}])
def test_settings_without_a_repair_object(doc: object) -> None:
    with pytest.raises(SetupError, match="no 'repair' object"):
        decide.parse_settings(doc)


def test_unreadable_expectations(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="no expectations; mount"):
        decide.read_settings(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(SetupError, match="cannot read the expectations"):
        decide.read_settings(bad)


# --- nodes and pods ---------------------------------------------------------------------------


def test_parse_node_reads_labels_annotations_and_provider() -> None:
    obj = node_obj(progress=decide.DRAINED, drained_at="1799999700", recheck="straggler")
    node = decide.parse_node(obj)
    assert (node.name, node.pool, node.state, node.reason, node.progress) == (
        "gpu-1", "h100", "failed", "xid", "drained")  # fmt: skip
    assert node.drained_at == NOW - 300
    assert node.recheck == "straggler"
    assert node.uid == "uid-gpu-1"
    assert node.labels[contract.POOL_LABEL] == "h100"


@pytest.mark.parametrize(
    "text", [None, 1799999700, "", "yesterday", "2027-01-15T07:55:00Z", "-5", "1.8e9", "17e8"]
)
def test_unreadable_drain_times_are_none(text: object) -> None:
    assert decide.parse_drained_at(text) is None


def test_drain_time_is_whole_unix_seconds() -> None:
    assert decide.drained_at_text(NOW + 0.7) == "1800000000"
    assert decide.parse_drained_at("1800000000") == NOW
    assert decide.format_time(NOW) == "2027-01-15T08:00:00Z"


@pytest.mark.parametrize(
    ("provider_id", "instance"),
    [
        ("aws:///us-west-2a/i-0123456789abcdef0", "i-0123456789abcdef0"),
        ("aws://us-west-2a/i-0123456789abcdef0", "i-0123456789abcdef0"),
        ("aws:///us-west-2a/i-01234567", "i-01234567"),
        ("aws:///us-west-2a/i-0123456789", None),  # neither 8 nor 17 hex digits
        ("aws:///us-west-2a/i-0123456789ABCDEF0", None),
        ("aws:///us-west-2a/fargate-ip-10-0-0-1", None),
        ("gce://project/zone/instance", None),
        ("kind://docker/kind/kind-worker", None),
        ("", None),
        (None, None),
    ],
)
def test_instance_id(provider_id: str | None, instance: str | None) -> None:
    assert decide.instance_id(provider_id) == instance


@pytest.mark.parametrize(
    ("p", "training"),
    [
        (pod("a"), True),
        (pod("a", team=False), False),  # not a team's workload
        (pod("a", daemonset=True), False),  # the node's agents stay
        (pod("a", mirror=True), False),  # static pod: the kubelet owns it
        (pod("a", namespace="kube-system"), False),
        (pod("a", namespace=contract.SYSTEM_NAMESPACE), False),
    ],
)
def test_is_training_pod(p: dict[str, Any], training: bool) -> None:
    assert decide.is_training_pod(p) is training


def test_to_evict_and_remaining() -> None:
    pods = [
        pod("run-b"),
        pod("run-a"),
        pod("pending", phase="Pending"),
        pod("done", phase="Succeeded"),
        pod("crashed", phase="Failed"),
        pod("going", deleting=True),
        pod("agent", daemonset=True),
    ]
    assert [r.key for r in decide.to_evict(pods)] == ["team-a/pending", "team-a/run-a",
                                                      "team-a/run-b"]  # fmt: skip
    # a terminating pod is still writing its checkpoint: it holds the node
    assert [r.key for r in decide.remaining(pods)] == [
        "team-a/going", "team-a/pending", "team-a/run-a", "team-a/run-b"]  # fmt: skip


# --- the step table ---------------------------------------------------------------------------

DRAINED_5M = decide.drained_at_text(NOW - 300)
DRAINED_1M = decide.drained_at_text(NOW - 60)


@pytest.mark.parametrize(
    ("node", "mode", "left", "step"),
    [
        # passed: nothing, or clear what an earlier failure left
        (node_obj(state="passed"), "replace", 0, Step.NOTHING),
        (node_obj(state="passed", progress="requested"), "replace", 0, Step.CLEAR),
        (node_obj(state="passed", progress="drained", drained_at=DRAINED_5M), "hook", 0,
         Step.CLEAR),
        (node_obj(state="passed", drained_at=DRAINED_5M), "none", 0, Step.CLEAR),
        # checking, or no state yet: wait for the agent
        (node_obj(state="checking", progress="drained", drained_at=DRAINED_5M), "replace", 0,
         Step.NOTHING),
        (node_obj(state=None, progress="drained"), "replace", 0, Step.NOTHING),
        # failed, first seen: drain, whatever the mode and the pods
        (node_obj(), "replace", 2, Step.DRAIN),
        (node_obj(), "none", 0, Step.DRAIN),
        # drained with training pods left: evict again
        (node_obj(progress="drained", drained_at=DRAINED_5M), "replace", 1, Step.EVICT),
        (node_obj(progress="hook-failed", drained_at=DRAINED_5M), "hook", 1, Step.EVICT),
        # the drain time lost: record it again (the delay starts over, never shorter)
        (node_obj(progress="drained"), "replace", 0, Step.EVICT),
        # drained and empty: wait for the delay, then repair
        (node_obj(progress="drained", drained_at=DRAINED_1M), "replace", 0, Step.NOTHING),
        (node_obj(progress="drained", drained_at=DRAINED_5M), "replace", 0, Step.REPAIR),
        (node_obj(progress="drained", drained_at=DRAINED_5M), "hook", 0, Step.REPAIR),
        (node_obj(progress="hook-failed", drained_at=DRAINED_5M), "hook", 0, Step.REPAIR),
        # mode none: drain only
        (node_obj(progress="drained", drained_at=DRAINED_5M), "none", 0, Step.NOTHING),
        # requested: the group (or the hook's owner) has it
        (node_obj(progress="requested", drained_at=DRAINED_5M), "replace", 0, Step.NOTHING),
        (node_obj(progress="requested", drained_at=DRAINED_5M), "replace", 3, Step.NOTHING),
    ],
)  # fmt: skip
def test_plan(node: dict[str, Any], mode: str, left: int, step: Step) -> None:
    got = decide.plan(decide.parse_node(node), now=NOW, settings=settings(mode=mode), left=left)
    assert got.step is step, got.why


def test_delay_is_measured_from_the_drain() -> None:
    node = decide.parse_node(node_obj(progress="drained", drained_at=DRAINED_5M))
    just_before = decide.plan(node, now=NOW - 1, settings=settings(), left=0)
    assert just_before.step is Step.NOTHING
    assert "299s of 300s" in just_before.why
    assert decide.plan(node, now=NOW, settings=settings(), left=0).step is Step.REPAIR


def test_hook_payload() -> None:
    node = decide.parse_node(node_obj())
    assert decide.hook_payload(node, settings(mode="hook")) == {
        "cluster": "prod",
        "node": "gpu-1",
        "providerID": "aws:///us-west-2a/i-0123456789abcdef0",
        "pool": "h100",
        "reason": "xid",
        "labels": {
            contract.REASON_LABEL: "xid",
            contract.STATE_LABEL: "failed",
            contract.POOL_LABEL: "h100",
            "kubernetes.io/hostname": "gpu-1",
        },
    }


# --- stragglers -------------------------------------------------------------------------------


def test_straggler_query_counts_rising_edges_of_firing_since_the_last_check() -> None:
    """Its results on recorded series: tests/health/test_repair_promql.py (promtool)."""
    firing = 'ALERTS{alertname="TrainstackGpuRankStraggler",alertstate="firing"}'
    checked = "max by (node) (trainstack_node_health_last_check_timestamp_seconds @ end())"
    assert decide.straggler_query() == (
        f"sum by (node) (count_over_time((({firing} unless {firing} offset 1m) "
        f"and on (node) (time() > {checked}))[24h:1m]))"
    )
    assert decide.straggler_query(90).endswith("[90s:1m]))")
    assert decide.LAST_CHECK in contract.METRICS
    assert "node" in contract.METRIC_LABELS[decide.LAST_CHECK]


def vector(*pairs: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [NOW, v]} for m, v in pairs],
        },
    }


def test_parse_vector() -> None:
    doc = vector(({"node": "gpu-1"}, "3"), ({"node": "gpu-2"}, "1"), ({}, "9"),
                 ({"node": "gpu-3"}, "NaN?"))  # fmt: skip
    assert decide.parse_vector(doc) == {"gpu-1": 3.0, "gpu-2": 1.0}


@pytest.mark.parametrize(
    "doc",
    [
        {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        [],
        None,
    ],
)
def test_parse_vector_refuses_other_answers(doc: object) -> None:
    with pytest.raises(ValueError, match=r"query failed|expected a vector"):
        decide.parse_vector(doc)


def test_recheck_targets() -> None:
    nodes = [
        decide.parse_node(node_obj("hot", state="passed")),
        decide.parse_node(node_obj("checking", state="checking")),
        decide.parse_node(node_obj("cold", state="passed")),
        decide.parse_node(node_obj("labelled", state="passed", recheck="straggler")),
        decide.parse_node(node_obj("failed", state="failed")),
        decide.parse_node(node_obj("no-pool", state="passed", pool="")),
    ]
    counts = {n.name: 3.0 for n in nodes} | {"cold": 2.0, "not-a-node": 9.0}
    assert decide.recheck_targets(counts, nodes, threshold=3) == ["checking", "hot"]


def test_node_objects_are_not_mutated() -> None:
    obj = node_obj(progress="drained", drained_at=DRAINED_5M)
    before = copy.deepcopy(obj)
    decide.plan(decide.parse_node(obj), now=NOW, settings=settings(), left=0)
    assert obj == before


def test_straggler_alert_name_is_the_platforms() -> None:
    """The query names the alert the platform's rules define (one name in two packages: the
    image cannot import the platform)."""
    assert decide.STRAGGLER_ALERT == monitoring_health.STRAGGLER_ALERT
