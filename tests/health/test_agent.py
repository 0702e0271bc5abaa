"""The node agent: the pure decision (`plan`), the exact patches it sends (the health taint and
its labels only, behind a resourceVersion test), the re-list after tainting an idle node,
ungated nodes, Events and the metrics text."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from trainstack_health import agent, contract
from trainstack_health.agent import Agent, Expectations, health_ops, plan
from trainstack_health.errors import SetupError
from trainstack_health.expectations import load
from trainstack_health.kube import ApiError
from trainstack_health.metrics import Metrics
from trainstack_health.probes import RecordedProbes

from tests.health.fakekube import FakeKube, node, pod

FIXTURES = Path(__file__).parent / "fixtures"
NOW = 1_800_000_000.0
NAME = "ip-10-1-23-45.ec2.internal"
OTHER_TAINTS = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
     "timeAdded": "2026-12-05T08:00:00Z"},
]  # fmt: skip


def taint(value: str) -> dict[str, str]:
    return {"key": contract.TAINT_KEY, "value": value, "effect": contract.TAINT_EFFECT}


PASSED = {contract.STATE_LABEL: contract.STATE_PASSED}


@pytest.fixture(scope="module")
def expectations() -> Expectations:
    return load(FIXTURES / "expectations.json")


class CountingProbes(RecordedProbes):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        object.__setattr__(self, "active_calls", [])

    def dcgm(self, level: int) -> str:
        self.active_calls.append("dcgm")  # type: ignore[attr-defined]
        return super().dcgm(level)

    def nccl(self, gpus: int) -> str:
        self.active_calls.append("nccl")  # type: ignore[attr-defined]
        return super().nccl(gpus)


def make(kube: FakeKube, expectations: Expectations, scenario: str = "healthy", **kw: Any) -> Agent:
    ticks = iter(float(i) for i in range(1000))
    return Agent(kube=kube, node_name=NAME, expectations=expectations,
                 probes=CountingProbes(FIXTURES / scenario), metrics=Metrics(),
                 clock=lambda: next(ticks), **kw)  # fmt: skip


def other_taints_kept(before: dict[str, Any], after: dict[str, Any]) -> bool:
    strip = [t for t in before["spec"].get("taints", []) if t["key"] != contract.TAINT_KEY]
    now = [t for t in after["spec"].get("taints", []) if t["key"] != contract.TAINT_KEY]
    return strip == now


def untouched_but_health(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Everything but the health taint, AGENT_LABELS and resourceVersion is as it was."""
    b, a = copy.deepcopy(before), copy.deepcopy(after)
    for n in (b, a):
        n["metadata"].pop("resourceVersion")
        for key in contract.AGENT_LABELS:
            n["metadata"]["labels"].pop(key, None)
        n["spec"]["taints"] = [t for t in n["spec"]["taints"] if t["key"] != contract.TAINT_KEY]
    assert a == b


# --- plan ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("taints", "labels", "pods", "last_full", "kind"),
    [
        ([taint("pending")], {}, [], None, "check"),
        ([taint("pending")], {}, [pod("p", NAME)], None, "check"),  # tainted: work is kept off
        ([taint("checking")], PASSED, [], NOW - 10, "check"),  # the agent restarted mid-check
        ([taint("failed")], {contract.STATE_LABEL: "failed"}, [], NOW - 10, "wait"),
        ([taint("failed")], {contract.STATE_LABEL: "failed"}, [], NOW - 3600, "check"),
        ([taint("failed")], {contract.STATE_LABEL: "failed"}, [], None, "check"),
        ([taint("failed")], {contract.RECHECK_LABEL: "straggler"}, [], NOW - 10, "check"),
        ([], {}, [], None, "gate"),  # registered without the startup taint
        ([], {contract.STATE_LABEL: "failed"}, [], None, "gate"),  # someone removed the taint
        ([], PASSED, [], NOW - 10, "passive"),
        ([], PASSED, [], NOW - 3600, "recheck"),
        ([], PASSED, [pod("p", NAME)], NOW - 3600, "passive"),
        ([], PASSED, [pod("p", NAME, phase="Succeeded")], NOW - 3600, "recheck"),
        ([], PASSED, [pod("agent", NAME, team=None)], NOW - 3600, "recheck"),
        ([], {**PASSED, contract.RECHECK_LABEL: "straggler"}, [], NOW - 10, "recheck"),
        ([], {**PASSED, contract.RECHECK_LABEL: "straggler"}, [pod("p", NAME)], NOW - 10,
         "passive"),
        (OTHER_TAINTS, PASSED, [], NOW - 10, "passive"),
    ],
)  # fmt: skip
def test_plan(
    expectations: Expectations,
    taints: list[dict[str, Any]],
    labels: dict[str, str],
    pods: list[dict[str, Any]],
    last_full: float | None,
    kind: str,
) -> None:
    action = plan(node(taints=taints, labels=labels), pods, expectations, last_full, NOW)
    assert action.kind == kind, action.why
    assert action.active is (kind in ("gate", "check", "recheck"))


# --- health_ops ----------------------------------------------------------------------------


def test_ops_start_with_a_resource_version_test_and_escape_label_keys() -> None:
    n = node(taints=[*OTHER_TAINTS, taint("pending")])
    ops = health_ops(n, None, {contract.STATE_LABEL: "passed", contract.REASON_LABEL: None})
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "100"},
        {"op": "replace", "path": "/spec/taints", "value": OTHER_TAINTS},
        {"op": "add", "path": "/metadata/labels/trainstack.io~1health", "value": "passed"},
    ]  # the reason label was absent: no remove (it would fail the whole patch)


def test_health_taint_changes_value_in_place_and_other_taints_stay_exactly() -> None:
    n = node(taints=[OTHER_TAINTS[0], taint("checking"), OTHER_TAINTS[1]])
    [_, replace] = health_ops(n, "failed", {})
    assert replace["value"] == [OTHER_TAINTS[0], taint("failed"), OTHER_TAINTS[1]]


def test_nothing_to_change_sends_nothing() -> None:
    n = node(taints=[taint("failed")], labels={contract.STATE_LABEL: "failed"})
    assert health_ops(n, "failed", {contract.STATE_LABEL: "failed", contract.RECHECK_LABEL: None}) \
        == []  # fmt: skip


def test_node_without_taints_field_gets_an_add() -> None:
    n = node()
    del n["spec"]["taints"]
    ops = health_ops(n, "pending", {})
    assert ops[1] == {"op": "add", "path": "/spec/taints", "value": [taint("pending")]}


# --- step ----------------------------------------------------------------------------------


def test_pending_node_that_passes_loses_only_the_health_taint(
    expectations: Expectations,
) -> None:
    kube = FakeKube(node(taints=[*OTHER_TAINTS, taint("pending")],
                         labels={contract.REASON_LABEL: "xid"}))  # fmt: skip
    before = copy.deepcopy(kube.node)
    worker = make(kube, expectations)
    assert worker.step(NOW).kind == "check"
    assert worker.probes.active_calls == ["dcgm", "nccl"]  # type: ignore[attr-defined]
    assert kube.node["spec"]["taints"] == OTHER_TAINTS
    labels = kube.node["metadata"]["labels"]
    assert labels[contract.STATE_LABEL] == "passed"
    assert contract.REASON_LABEL not in labels
    untouched_but_health(before, kube.node)
    [ops] = kube.patches
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "100"}
    [ev] = kube.events
    assert ev["reason"] == contract.EVENT_PASSED
    assert ev["type"] == "Normal"
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NAME,
                                    "uid": before["metadata"]["uid"]}  # fmt: skip
    assert ev["source"]["component"] == "trainstack-health-agent"
    assert ev["metadata"]["namespace"] == "default"
    assert ev["metadata"]["name"].startswith(NAME + ".")
    assert ev["message"] == "all 8 full checks passed"
    m = worker.metrics
    ids = {"node": NAME, "pool": "gpu-p5"}
    assert m.value("trainstack_node_health_passed", **ids) == 1
    assert m.value("trainstack_node_health_busbw_gbps", **ids) == 471.62
    assert m.value("trainstack_node_health_last_check_timestamp_seconds", **ids) == NOW


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [("xid-fatal", "xid"), ("dcgm-fail", "dcgm"), ("busbw-below-floor", "nccl"),
     ("efa-missing", "efa")],
)  # fmt: skip
def test_pending_node_that_fails_keeps_a_failed_taint_label_and_event(
    expectations: Expectations, scenario: str, reason: str
) -> None:
    kube = FakeKube(node(taints=[taint("pending"), *OTHER_TAINTS]))
    before = copy.deepcopy(kube.node)
    worker = make(kube, expectations, scenario)
    worker.step(NOW)
    assert kube.node["spec"]["taints"] == [taint("failed"), *OTHER_TAINTS]
    labels = kube.node["metadata"]["labels"]
    assert (labels[contract.STATE_LABEL], labels[contract.REASON_LABEL]) == ("failed", reason)
    untouched_but_health(before, kube.node)
    [ev] = kube.events
    assert (ev["reason"], ev["type"]) == (contract.EVENT_FAILED, "Warning")
    assert ev["message"].startswith(f"{reason}: ")
    ids = {"node": NAME, "pool": "gpu-p5"}
    assert worker.metrics.value("trainstack_node_health_passed", **ids) == 0
    assert worker.metrics.value("trainstack_node_health_check_failures_total", check=reason,
                                **ids) == 1  # fmt: skip


def test_ungated_node_is_tainted_first_then_checked(expectations: Expectations) -> None:
    kube = FakeKube(node(taints=OTHER_TAINTS[:1]))
    worker = make(kube, expectations)
    assert worker.step(NOW).kind == "gate"
    first, second = kube.patches
    assert first[1] == {"op": "replace", "path": "/spec/taints",
                        "value": [OTHER_TAINTS[0], taint("pending")]}  # fmt: skip
    assert len(first) == 2  # the taint only, no label yet
    assert kube.node["spec"]["taints"] == OTHER_TAINTS[:1]  # passed: the taint is gone again
    assert [e["reason"] for e in kube.events] == [contract.EVENT_UNGATED, contract.EVENT_PASSED]
    assert kube.events[0]["type"] == "Warning"
    assert worker.metrics.value("trainstack_node_health_ungated_total", node=NAME,
                                pool="gpu-p5") == 1  # fmt: skip
    assert second[0]["value"] == "101"  # re-read after the first write


def test_idle_passed_node_recheck_taints_checking_relists_then_untaints(
    expectations: Expectations,
) -> None:
    kube = FakeKube(node(labels={**PASSED, contract.RECHECK_LABEL: "straggler"}))
    worker = make(kube, expectations, last_full=NOW - 10)
    assert worker.step(NOW).kind == "recheck"
    assert kube.calls == ["get_node", "list_pods", "get_node", "patch", "list_pods",
                          "get_node", "patch", "event"]  # fmt: skip
    assert kube.patches[0][1]["value"] == [taint("checking")]
    assert kube.node["spec"]["taints"] == []
    assert contract.RECHECK_LABEL not in kube.node["metadata"]["labels"]  # answered
    assert worker.last_full == NOW


def test_pod_bound_while_tainting_cancels_the_recheck(expectations: Expectations) -> None:
    kube = FakeKube(node(taints=OTHER_TAINTS[:1], labels=PASSED))

    def bind(k: FakeKube, ops: list[dict[str, Any]]) -> None:
        del ops
        k.pods.append(pod("trainer-0", NAME))  # the scheduler was quicker than our taint

    kube.before_patch = bind
    worker = make(kube, expectations, last_full=NOW - 7200)
    action = worker.step(NOW)
    assert action.kind == "passive"
    assert "trainer-0" in action.why
    assert worker.probes.active_calls == []  # type: ignore[attr-defined]
    assert [p[1]["value"] for p in kube.patches] == [
        [OTHER_TAINTS[0], taint("checking")], [OTHER_TAINTS[0]]
    ]  # fmt: skip
    assert kube.node["spec"]["taints"] == OTHER_TAINTS[:1]
    assert kube.events == []
    assert worker.last_full == NOW - 7200  # still due: retried at the next idle moment


def test_busy_passed_node_runs_passive_checks_and_a_failure_taints_it(
    expectations: Expectations,
) -> None:
    kube = FakeKube(node(labels=PASSED), pods=[pod("trainer-0", NAME)])
    worker = make(kube, expectations, "xid-fatal", last_full=NOW - 7200)
    assert worker.step(NOW).kind == "passive"
    assert worker.probes.active_calls == []  # type: ignore[attr-defined]
    assert kube.node["spec"]["taints"] == [taint("failed")]
    assert kube.node["metadata"]["labels"][contract.REASON_LABEL] == "xid"
    assert worker.last_full == NOW - 7200  # a passive check is not a full one


def test_busy_passed_node_passing_passive_checks_writes_nothing(
    expectations: Expectations,
) -> None:
    kube = FakeKube(node(labels=PASSED), pods=[pod("trainer-0", NAME)])
    worker = make(kube, expectations, "dcgm-fail", last_full=NOW - 10)  # dcgm is active-only
    worker.step(NOW)
    assert kube.patches == []
    assert kube.events == []
    assert worker.metrics.value("trainstack_node_health_checks_total", node=NAME,
                                pool="gpu-p5") == 1  # fmt: skip


def test_restarted_agent_on_a_passed_node_does_not_recheck_at_once(
    expectations: Expectations,
) -> None:
    kube = FakeKube(node(labels=PASSED))
    worker = make(kube, expectations)
    assert worker.step(NOW).kind == "passive"
    assert worker.step(NOW + expectations.recheck_seconds).kind == "recheck"


def test_a_concurrent_change_is_reread_and_kept(expectations: Expectations) -> None:
    kube = FakeKube(node(taints=[taint("pending")]))
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}

    def concurrent(k: FakeKube, ops: list[dict[str, Any]]) -> None:
        del ops
        k.node["spec"]["taints"].append(cordon)  # kubectl cordon, between our read and write
        k.node["spec"]["unschedulable"] = True
        k.bump()

    kube.before_patch = concurrent
    make(kube, expectations).step(NOW)
    assert len(kube.patches) == 2  # refused (422), re-read, rebuilt
    assert kube.node["spec"]["taints"] == [cordon]
    assert kube.node["spec"]["unschedulable"] is True


def test_other_api_errors_are_raised(expectations: Expectations) -> None:
    kube = FakeKube(node(taints=[taint("pending")]))

    def forbid(k: FakeKube, ops: list[dict[str, Any]]) -> None:
        raise ApiError("PATCH", "/api/v1/nodes/x", 403, "Forbidden", "admission policy")

    kube.before_patch = forbid
    with pytest.raises(ApiError, match="403"):
        make(kube, expectations).step(NOW)


def test_event_failure_does_not_undo_the_verdict(expectations: Expectations) -> None:
    kube = FakeKube(node(taints=[taint("pending")]))

    def refuse(namespace: str, event: Any) -> None:
        raise ApiError("POST", "/api/v1/namespaces/default/events", 403, "Forbidden", "no")

    kube.create_event = refuse  # type: ignore[method-assign]
    logged: list[str] = []
    worker = make(kube, expectations, log=lambda event, **_: logged.append(event))
    worker.step(NOW)
    assert kube.node["spec"]["taints"] == []
    assert "event_error" in logged


def test_unknown_pool_is_a_setup_error(expectations: Expectations) -> None:
    from trainstack_health.errors import SetupError  # noqa: PLC0415

    kube = FakeKube(node(pool="cpu", taints=[taint("pending")]))
    with pytest.raises(SetupError, match="no pool 'cpu'"):
        make(kube, expectations).step(NOW)


def test_event_message_is_bounded() -> None:
    ev = agent.event(node(), "R", "x" * 5000, warning=True, now=NOW)
    assert len(ev["message"]) == agent.MESSAGE_LIMIT
    assert ev["firstTimestamp"] == "2027-01-15T08:00:00Z"


# --- metrics -------------------------------------------------------------------------------

LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
SAMPLE = re.compile(
    rf"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{{(?P<labels>{LABEL}(?:,{LABEL})*)\}} "
    r"(?P<value>-?[0-9.eE+-]+|NaN|\+Inf|-Inf)$"
)


def test_metrics_text_is_valid_exposition(expectations: Expectations) -> None:
    kube = FakeKube(node(taints=[taint("pending")]))
    worker = make(kube, expectations, "dcgm-fail")
    worker.step(NOW)
    text = worker.metrics.render()
    typed: dict[str, str] = {}
    samples: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            typed[name] = kind
        elif line.startswith("# HELP "):
            continue
        else:
            m = SAMPLE.match(line)
            assert m, line
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m["labels"]))
            samples.append((m["name"], labels, float(m["value"])))
    agent_metrics = {n for n in contract.METRICS if n.startswith("trainstack_node_health_")}
    assert set(typed) == agent_metrics
    for name, labels, _ in samples:
        assert set(labels) == set(contract.METRIC_LABELS[name]), name
    durations = {lab["check"] for n, lab, _ in samples
                 if n == "trainstack_node_health_check_duration_seconds"}  # fmt: skip
    assert durations == set(contract.CHECKS)
    failures = [(lab["check"], v) for n, lab, v in samples
                if n == "trainstack_node_health_check_failures_total"]  # fmt: skip
    assert failures == [("dcgm", 1.0)]
    assert ("trainstack_node_health_passed", {"node": NAME, "pool": "gpu-p5"}, 0.0) in samples


# --- image pre-pull (issue 48): a pending node's check waits for its images -----------------


def _gated(expectations: Expectations, seconds: int | None) -> Expectations:
    pools = {
        name: dataclasses.replace(p, prepull_gate_seconds=seconds)
        for name, p in expectations.pools.items()
    }
    return dataclasses.replace(expectations, pools=pools)


def prepull_pod(ready: bool | None, *, deleting: bool = False) -> dict[str, Any]:
    """The pool's pre-pull pod on the node: Ready (True/False), or without status (None)."""
    meta: dict[str, Any] = {
        "name": "trainstack-prepull-gpu-p5-x1",
        "namespace": "trainstack-system",
        "labels": {contract.APP_LABEL: contract.PREPULL_APP},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    status: dict[str, Any] = {"phase": "Running" if ready else "Pending"}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": meta, "spec": {"nodeName": NAME}, "status": status}


@pytest.mark.parametrize(
    ("pods", "waits"),
    [
        ([], True),  # the DaemonSet's pod is not there yet
        ([prepull_pod(None)], True),
        ([prepull_pod(False)], True),
        ([prepull_pod(True, deleting=True), prepull_pod(False)], True),  # a rollout's old pod
        ([prepull_pod(True)], False),
    ],
)
def test_a_pending_node_waits_for_its_images(
    expectations: Expectations, pods: list[dict[str, Any]], waits: bool
) -> None:
    kube = FakeKube(node(taints=[*OTHER_TAINTS, taint("pending")]), pods=pods)
    worker = make(kube, _gated(expectations, 600))
    action = worker.step(NOW)
    if waits:
        assert action.kind == "wait"
        assert "images not on the node" in action.why
        assert worker.probes.active_calls == []  # type: ignore[attr-defined]
        assert kube.patches == []  # still pending: the taint stays
    else:
        assert action.kind == "check"
        assert kube.node["metadata"]["labels"][contract.STATE_LABEL] == "passed"


def test_the_images_gate_gives_up_after_its_time(expectations: Expectations) -> None:
    """A broken image must not keep a pool's new nodes out: after the gate's seconds the check
    runs without the images (the alert names the image)."""
    kube = FakeKube(node(taints=[*OTHER_TAINTS, taint("pending")]), pods=[prepull_pod(False)])
    worker = make(kube, _gated(expectations, 600))
    assert worker.step(NOW).kind == "wait"
    assert worker.step(NOW + 599).kind == "wait"
    assert worker.step(NOW + 600).kind == "check"
    assert kube.node["metadata"]["labels"][contract.STATE_LABEL] == "passed"


@pytest.mark.parametrize("seconds", [None, 0])
def test_without_a_gate_the_check_does_not_wait(
    expectations: Expectations, seconds: int | None
) -> None:
    kube = FakeKube(node(taints=[*OTHER_TAINTS, taint("pending")]), pods=[prepull_pod(False)])
    assert make(kube, _gated(expectations, seconds)).step(NOW).kind == "check"


def test_a_failed_node_recheck_never_waits_for_images(expectations: Expectations) -> None:
    kube = FakeKube(node(taints=[taint("failed")]), pods=[prepull_pod(False)])
    assert make(kube, _gated(expectations, 600)).step(NOW).kind == "check"


def test_the_gate_is_read_from_the_expectations_file(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "expectations.json").read_text())
    for entry in doc["pools"].values():
        entry["prePullGateSeconds"] = 1200
    path = tmp_path / "expectations.json"
    path.write_text(json.dumps(doc))
    assert {p.prepull_gate_seconds for p in load(path).pools.values()} == {1200}
    for entry in doc["pools"].values():
        entry["prePullGateSeconds"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(SetupError, match="'prePullGateSeconds' must be >= 0 or null, got -1"):
        load(path)
