"""Volcano's and the API server's own wording, split into what `explain` uses."""

from __future__ import annotations

from tests.explain import objects as o
from trainstack.explain import volcano
from trainstack.explain.status import job_rows


def test_the_node_histogram_of_a_gang_message() -> None:
    fits = volcano.fit_errors(o.GANG_INSUFFICIENT)
    assert fits is not None
    assert fits.nodes == 16
    assert fits.reasons == {
        "node(s) didn't match Pod's node affinity/selector": 8,
        "Insufficient nvidia.com/gpu": 8,
    }
    assert fits.insufficient() == {"nvidia.com/gpu": 8}


def test_a_hypernode_prefix_and_the_older_taint_wording() -> None:
    text = (
        "x. Origin reason is a-0: In hyperNode pool-h100: 0/4 nodes are unavailable: "
        "4 node(s) had untolerated taint {trainstack.io/health: pending}."
    )
    fits = volcano.fit_errors(text)
    assert fits is not None
    assert fits.count(volcano.TAINT) == 4


def test_no_origin_reason_means_no_histogram() -> None:
    assert volcano.fit_errors(o.GANG_NO_ORIGIN) is None


def test_the_condition_is_read_before_events() -> None:
    group = o.podgroup("from the condition")
    event = o.event("Unschedulable", "from the event", kind="PodGroup")
    assert volcano.unschedulable_message(group, [event]) == "from the condition"
    assert volcano.unschedulable_message(o.podgroup(), [event]) == "from the event"


def test_an_admission_policy_refusal_inside_a_failed_create() -> None:
    (denial,) = volcano.denials(o.DENIED_POD)
    assert denial == volcano.Denial(
        "trainstack-rule-pod-example", "pods may not do that. Fix: do the other thing"
    )


def test_an_admission_policy_refusal_as_the_api_server_words_it() -> None:
    message = 'admission webhook "validatejob.volcano.sh" denied the request: spec.queue: bad'
    assert volcano.denials(message) == [volcano.Denial("validatejob.volcano.sh", "spec.queue: bad")]


def test_status_rows() -> None:
    job = o.job(phase="Running", replicas=3, gpus=8, retries=1)
    (row,) = job_rows([job], now=1_796_529_600.0)  # 2026-12-06T04:00:00Z
    assert (row.name, row.state, row.age, row.gpus, row.attempts) == (
        "train",
        "Running",
        "4h",
        24,
        2,
    )
