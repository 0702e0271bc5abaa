"""A repair pass against a fake KubeApi object: the exact evictions, Node patches and Events it
makes for each node state, what it does when the API server, the replacement or the hook
refuses, and the straggler follow-up. AWS is tested on moto (test_repair_aws.py), the HTTP
clients on local servers (test_repair_http.py)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from trainstack_health import contract
from trainstack_health.kube import ApiError
from trainstack_health.repair import decide
from trainstack_health.repair.controller import Deps, run_once
from trainstack_health.repair.http import HttpError
from trainstack_health.repair.metrics import ERRORS, REPAIRS, Metrics

from tests.health.test_repair_decide import NOW, node_obj, pod, settings

DRAINED_AT = decide.drained_at_text(NOW - 600)
STAMP = decide.drained_at_text(NOW)


def _selected(obj: Mapping[str, Any], selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    key, _, value = selector.partition("=")
    return key in labels and (not value or labels[key] == value)


class FakeKube:
    """The KubeApi protocol over dicts, recording each write. Patches apply as the API server
    applies a JSON merge patch (None removes a key)."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        self.pods = copy.deepcopy(pods)
        self.calls: list[tuple[Any, ...]] = []
        self.events: list[Mapping[str, Any]] = []
        self.evict_errors: dict[str, ApiError] = {}
        self.fail_list = False

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        if self.fail_list:
            raise ApiError("GET", "/api/v1/nodes", 0, "Unreachable", "connection refused")
        return [copy.deepcopy(n) for n in self.nodes.values() if _selected(n, label_selector)]

    def get_node(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.nodes[name])

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods if p["spec"]["nodeName"] == node]

    def evict(self, namespace: str, name: str) -> None:
        self.calls.append(("evict", namespace, name))
        err = self.evict_errors.get(f"{namespace}/{name}")
        if err is not None:
            raise err
        for p in self.pods:
            if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name):
                p["metadata"]["deletionTimestamp"] = decide.format_time(NOW)

    def patch_node_metadata(
        self, name: str, labels: Mapping[str, str | None], annotations: Mapping[str, str | None]
    ) -> None:
        self.calls.append(("patch", name, dict(labels), dict(annotations)))
        meta = self.nodes[name]["metadata"]
        for field, changes in (("labels", labels), ("annotations", annotations)):
            target = meta.setdefault(field, {})
            for key, value in changes.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.calls.append(("event", namespace, event["reason"], event["involvedObject"]["name"]))
        self.events.append(event)


class FakeReplacer:
    def __init__(self, refuse: Exception | None = None) -> None:
        self.replaced: list[str] = []
        self.refuse = refuse

    def replace(self, instance_id: str) -> str:
        if self.refuse is not None:
            raise self.refuse
        self.replaced.append(instance_id)
        return "eks-gpu-h100-1"


def deps(kube: FakeKube, **kw: Any) -> Deps:
    logged: list[tuple[str, dict[str, Any]]] = []
    d = Deps(kube=kube, settings=kw.pop("settings", settings()), metrics=Metrics(),
             log=lambda event, **fields: logged.append((event, fields)), **kw)  # fmt: skip
    d.logged = logged  # type: ignore[attr-defined]
    return d


def writes(kube: FakeKube) -> list[tuple[Any, ...]]:
    return kube.calls


# --- drain ------------------------------------------------------------------------------------


def test_failed_node_is_labelled_then_drained_of_training_pods_only() -> None:
    kube = FakeKube(
        [node_obj("gpu-1"), node_obj("gpu-2", state="passed")],
        [
            pod("trainer-0", node="gpu-1"),
            pod("trainer-1", namespace="team-b", node="gpu-1"),
            pod("done", phase="Succeeded", node="gpu-1"),
            pod("health-agent", namespace=contract.SYSTEM_NAMESPACE, daemonset=True,
                node="gpu-1"),
            pod("other-node", node="gpu-2"),
        ],
    )  # fmt: skip
    d = deps(kube, replacer=FakeReplacer())
    result = run_once(d, now=NOW)
    assert writes(kube) == [
        ("patch", "gpu-1", {contract.REPAIR_LABEL: "drained"},
         {contract.DRAINED_AT_ANNOTATION: STAMP}),
        ("evict", "team-a", "trainer-0"),
        ("evict", "team-b", "trainer-1"),
        ("event", "default", contract.EVENT_DRAINED, "gpu-1"),
    ]  # fmt: skip
    assert result.steps == {"gpu-1": "drain"}
    assert result.evicted == ["team-a/trainer-0", "team-b/trainer-1"]
    assert d.metrics.value(REPAIRS, pool="h100", action="drain") == 1
    event = kube.events[0]
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1",
                                       "uid": "uid-gpu-1"}  # fmt: skip
    assert event["message"] == (
        "health check failed (xid): evicted 2 training pod(s); repair (replace) 300s after the "
        "drain, once none is left"
    )
    assert event["metadata"] == {"generateName": "gpu-1.", "namespace": "default"}


def test_drained_node_with_pods_left_is_evicted_again_and_not_repaired() -> None:
    kube = FakeKube(
        [node_obj(progress="drained", drained_at=DRAINED_AT)],
        [pod("stubborn"), pod("going", deleting=True)],
    )
    replacer = FakeReplacer()
    result = run_once(deps(kube, replacer=replacer), now=NOW)
    assert writes(kube) == [("evict", "team-a", "stubborn")]
    assert result.steps == {"gpu-1": "evict"}
    assert replacer.replaced == []


def test_budget_refusal_and_gone_pods_are_not_errors() -> None:
    kube = FakeKube([node_obj()], [pod("guarded"), pod("gone"), pod("broken")])
    kube.evict_errors = {
        "team-a/guarded": ApiError("POST", "/eviction", 429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption "
                                   "budget."),
        "team-a/gone": ApiError("POST", "/eviction", 404, "NotFound", "pods \"gone\" not found"),
        "team-a/broken": ApiError("POST", "/eviction", 500, "InternalError", "etcd"),
    }  # fmt: skip
    d = deps(kube)
    result = run_once(d, now=NOW)
    assert result.evicted == []
    assert result.errors == 1
    assert d.metrics.value(ERRORS, operation="evict") == 1
    assert ("eviction-refused", {"node": "gpu-1", "pod": "team-a/guarded",
            "why": "Cannot evict pod as it would violate the pod's disruption budget."}) in (
        d.logged  # type: ignore[attr-defined]
    )  # fmt: skip
    # the label says drained: the next pass evicts again, it does not drain again
    assert kube.nodes["gpu-1"]["metadata"]["labels"][contract.REPAIR_LABEL] == "drained"
    kube.calls.clear()
    kube.evict_errors.pop("team-a/guarded")
    run_once(d, now=NOW + 30)
    assert ("evict", "team-a", "guarded") in writes(kube)
    assert not [c for c in writes(kube) if c[0] == "event"]


def test_lost_drain_time_is_recorded_again() -> None:
    kube = FakeKube([node_obj(progress="drained")], [])
    run_once(deps(kube, replacer=FakeReplacer()), now=NOW)
    assert writes(kube) == [("patch", "gpu-1", {}, {contract.DRAINED_AT_ANNOTATION: STAMP})]


# --- repair -----------------------------------------------------------------------------------


def test_replace_after_the_delay_with_no_pod_left() -> None:
    kube = FakeKube([node_obj(progress="drained", drained_at=DRAINED_AT)], [pod("done",
                    phase="Succeeded")])  # fmt: skip
    replacer = FakeReplacer()
    d = deps(kube, replacer=replacer)
    result = run_once(d, now=NOW)
    assert replacer.replaced == ["i-0123456789abcdef0"]
    assert writes(kube) == [
        ("patch", "gpu-1", {contract.REPAIR_LABEL: "requested"}, {}),
        ("event", "default", contract.EVENT_REPAIR, "gpu-1"),
    ]
    assert result.steps == {"gpu-1": "repair"}
    assert d.metrics.value(REPAIRS, pool="h100", action="replace") == 1
    assert (
        "instance i-0123456789abcdef0 of Auto Scaling group eks-gpu-h100-1 marked Unhealthy"
        in (kube.events[0]["message"])
    )
    # idempotent: the next pass has nothing to do
    kube.calls.clear()
    assert run_once(d, now=NOW + 30).steps == {"gpu-1": "nothing"}
    assert writes(kube) == []
    assert replacer.replaced == ["i-0123456789abcdef0"]


def test_not_before_the_delay() -> None:
    kube = FakeKube([node_obj(progress="drained", drained_at=decide.drained_at_text(NOW - 10))], [])
    replacer = FakeReplacer()
    run_once(deps(kube, replacer=replacer), now=NOW)
    assert replacer.replaced == []
    assert writes(kube) == []


def test_node_passed_since_the_list_is_not_replaced() -> None:
    kube = FakeKube([node_obj(progress="drained", drained_at=DRAINED_AT)], [])
    replacer = FakeReplacer()
    original_get = kube.get_node

    def passed_meanwhile(name: str) -> dict[str, Any]:
        obj = original_get(name)
        obj["metadata"]["labels"][contract.STATE_LABEL] = contract.STATE_PASSED
        return obj

    kube.get_node = passed_meanwhile  # type: ignore[method-assign]
    run_once(deps(kube, replacer=replacer), now=NOW)
    assert replacer.replaced == []
    assert writes(kube) == []


@pytest.mark.parametrize(
    ("provider_id", "refuse"),
    [
        ("kind://docker/kind/kind-worker", None),
        ("aws:///us-west-2a/i-0123456789abcdef0", RuntimeError("not this cluster's group")),
    ],
)
def test_replacement_refused_is_counted_and_retried(
    provider_id: str, refuse: Exception | None
) -> None:
    kube = FakeKube([node_obj(progress="drained", drained_at=DRAINED_AT,
                              provider_id=provider_id)], [])  # fmt: skip
    d = deps(kube, replacer=FakeReplacer(refuse))
    result = run_once(d, now=NOW)
    assert result.errors == 1
    assert d.metrics.value(ERRORS, operation="replace") == 1
    assert writes(kube) == []  # still drained: the next pass tries again
    assert run_once(d, now=NOW + 30).steps == {"gpu-1": "repair"}


def test_hook_accepted() -> None:
    kube = FakeKube([node_obj(progress="drained", drained_at=DRAINED_AT)], [])
    sent: list[tuple[str, Mapping[str, Any]]] = []
    s = settings(mode="hook", hook_url="https://repair.example/nodes", region=None)
    d = deps(kube, settings=s, post_hook=lambda url, body: sent.append((url, body)))
    run_once(d, now=NOW)
    assert [url for url, _ in sent] == ["https://repair.example/nodes"]
    assert sent[0][1]["node"] == "gpu-1"
    assert sent[0][1]["cluster"] == "prod"
    assert writes(kube) == [
        ("patch", "gpu-1", {contract.REPAIR_LABEL: "requested"}, {}),
        ("event", "default", contract.EVENT_REPAIR, "gpu-1"),
    ]
    assert d.metrics.value(REPAIRS, pool="h100", action="hook") == 1


def test_hook_failure_labels_the_node_and_retries() -> None:
    kube = FakeKube([node_obj(progress="drained", drained_at=DRAINED_AT)], [])
    answers: list[Exception | None] = [HttpError("POST https://r/: HTTP 503"), HttpError("x"),
                                       None]  # fmt: skip
    sent: list[str] = []

    def post(url: str, body: Mapping[str, Any]) -> None:
        sent.append(str(body["node"]))
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    s = settings(mode="hook", hook_url="https://r/", region=None)
    d = deps(kube, settings=s, post_hook=post)
    run_once(d, now=NOW)
    assert writes(kube) == [("patch", "gpu-1", {contract.REPAIR_LABEL: "hook-failed"}, {})]
    kube.calls.clear()
    run_once(d, now=NOW + 30)  # fails again: already labelled, nothing written
    assert writes(kube) == []
    run_once(d, now=NOW + 60)
    assert writes(kube) == [
        ("patch", "gpu-1", {contract.REPAIR_LABEL: "requested"}, {}),
        ("event", "default", contract.EVENT_REPAIR, "gpu-1"),
    ]
    assert sent == ["gpu-1"] * 3
    assert d.metrics.value(ERRORS, operation="hook") == 2


def test_mode_none_drains_only() -> None:
    kube = FakeKube([node_obj()], [pod("trainer-0")])
    d = deps(kube, settings=settings(mode="none", region=None))
    run_once(d, now=NOW)
    assert kube.events[0]["message"].endswith(
        "repair.mode is none: the node stays drained for its owner"
    )
    kube.calls.clear()
    kube.pods.clear()  # the pod went away
    for later in (NOW + 600, NOW + 86400):
        assert run_once(d, now=later).steps == {"gpu-1": "nothing"}
    assert writes(kube) == []
    assert kube.nodes["gpu-1"]["metadata"]["labels"][contract.REPAIR_LABEL] == "drained"


# --- recovery and errors ----------------------------------------------------------------------


def test_passed_node_loses_repair_label_and_annotation() -> None:
    kube = FakeKube([node_obj(state="passed", progress="requested", drained_at=DRAINED_AT)], [])
    run_once(deps(kube), now=NOW)
    assert writes(kube) == [
        ("patch", "gpu-1", {contract.REPAIR_LABEL: None}, {contract.DRAINED_AT_ANNOTATION: None})
    ]
    labels = kube.nodes["gpu-1"]["metadata"]["labels"]
    assert contract.REPAIR_LABEL not in labels
    assert kube.nodes["gpu-1"]["metadata"]["annotations"] == {}


def test_checking_node_is_left_alone() -> None:
    kube = FakeKube([node_obj(state="checking", progress="drained", drained_at=DRAINED_AT)],
                    [pod("trainer-0")])  # fmt: skip
    assert run_once(deps(kube, replacer=FakeReplacer()), now=NOW).steps == {"gpu-1": "nothing"}
    assert writes(kube) == []


def test_an_api_error_on_one_node_does_not_stop_the_pass() -> None:
    kube = FakeKube([node_obj("gpu-1"), node_obj("gpu-2")], [pod("a", node="gpu-2")])
    original = kube.patch_node_metadata

    def refuse_gpu_1(name: str, labels: Any, annotations: Any) -> None:
        if name == "gpu-1":
            raise ApiError("PATCH", "/api/v1/nodes/gpu-1", 403, "Forbidden", "no")
        original(name, labels, annotations)

    kube.patch_node_metadata = refuse_gpu_1  # type: ignore[method-assign]
    d = deps(kube)
    result = run_once(d, now=NOW)
    assert result.errors == 1
    assert d.metrics.value(ERRORS, operation="kube") == 1
    assert ("evict", "team-a", "a") in writes(kube)


def test_listing_failure_raises_for_the_caller() -> None:
    kube = FakeKube([], [])
    kube.fail_list = True
    with pytest.raises(ApiError, match="Unreachable"):
        run_once(deps(kube), now=NOW)


def test_event_failure_is_counted_but_the_state_is_kept() -> None:
    kube = FakeKube([node_obj()], [])

    def no_events(namespace: str, event: Mapping[str, Any]) -> None:
        raise ApiError("POST", "/events", 403, "Forbidden", "no")

    kube.create_event = no_events  # type: ignore[method-assign]
    d = deps(kube)
    run_once(d, now=NOW)
    assert d.metrics.value(ERRORS, operation="event") == 1
    assert kube.nodes["gpu-1"]["metadata"]["labels"][contract.REPAIR_LABEL] == "drained"


# --- stragglers -------------------------------------------------------------------------------


def straggler_deps(kube: FakeKube, answer: Any) -> tuple[Deps, list[tuple[str, str]]]:
    """Deps whose Prometheus answers `answer` (a list: its first item, which a test may
    replace between passes; an exception: raised)."""
    asked: list[tuple[str, str]] = []

    def query(url: str, promql: str) -> Any:
        asked.append((url, promql))
        now = answer[0] if isinstance(answer, list) else answer
        if isinstance(now, Exception):
            raise now
        return now

    s = settings(prometheus_url="http://prom:9090", straggler_alerts=3)
    return deps(kube, settings=s, query=query), asked


def firings(**by_node: int) -> dict[str, Any]:
    result = [{"metric": {"node": n}, "value": [NOW, str(c)]} for n, c in by_node.items()]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_repeat_stragglers_get_the_recheck_label() -> None:
    kube = FakeKube(
        [node_obj("slow", state="passed"), node_obj("fine", state="passed"),
         node_obj("broken", state="failed", progress="requested")],
        [],
    )  # fmt: skip
    answer = [firings(slow=4, fine=2, broken=7)]
    d, asked = straggler_deps(kube, answer)
    result = run_once(d, now=NOW)
    assert asked == [("http://prom:9090", decide.straggler_query())]
    assert result.rechecks == ["slow"]
    assert writes(kube) == [
        ("patch", "slow", {contract.RECHECK_LABEL: contract.RECHECK_STRAGGLER}, {}),
    ]
    assert d.metrics.value(REPAIRS, pool="h100", action="recheck") == 1
    # not re-checked yet (the node is busy): the label stays, nothing is written again
    kube.calls.clear()
    assert run_once(d, now=NOW + 300).rechecks == []
    assert writes(kube) == []
    # the agent re-checked it and removed the label: its last check is newer than those
    # firings, which no longer count; new ones do
    del kube.nodes["slow"]["metadata"]["labels"][contract.RECHECK_LABEL]
    answer[0] = firings(slow=0)
    assert run_once(d, now=NOW + 600).rechecks == []
    answer[0] = firings(slow=3)
    assert run_once(d, now=NOW + 900).rechecks == ["slow"]


def test_prometheus_is_asked_every_five_minutes_not_every_pass() -> None:
    kube = FakeKube([node_obj("n", state="passed")], [])
    answer = {"status": "success", "data": {"resultType": "vector", "result": []}}
    d, asked = straggler_deps(kube, answer)
    for t in (0, 30, 299, 300, 330, 600):
        run_once(d, now=NOW + t)
    assert len(asked) == 3  # at 0, 300 and 600


def test_prometheus_failure_is_counted_and_the_pass_goes_on() -> None:
    kube = FakeKube([node_obj()], [])
    d, _ = straggler_deps(kube, HttpError("GET http://prom:9090/api/v1/query: timed out"))
    result = run_once(d, now=NOW)
    assert result.steps == {"gpu-1": "drain"}
    assert d.metrics.value(ERRORS, operation="prometheus") == 1


def test_no_prometheus_no_query() -> None:
    kube = FakeKube([node_obj("n", state="passed")], [])
    d, asked = straggler_deps(kube, {})
    d.settings = settings()  # prometheusUrl null
    run_once(d, now=NOW)
    assert asked == []
