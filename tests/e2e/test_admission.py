"""The third column of the rule/CEL equivalence table: the real API server's verdict.

tests/policy/test_equivalence.py holds, for every Kubernetes rule, objects that the Python rule
and its CEL (evaluated with cel-python) must admit or reject. Here the same objects go to
kube-apiserver as a member of the team (impersonated, never as an admin), with the platform's
admission policies generated from the same settings (`CONFIG`) and bound the way a platform
stack binds them, so all three enforcers are held to one verdict per row: admitted exactly
when no Kubernetes rule rejects the object. A refusal must come from a policy whose rule
rejects the object too (the server names one denying policy).

Then the same rows with the prod stack's own policies and settings, as its plan installs
them, against what `trainstack preview` and the CrossGuard pack decide for prod (the stack
tables of tests/policy/test_agreement.py, whose Python and CEL columns agree with these): a
job is admitted exactly when no Kubernetes rule finds a mandatory violation with prod's
settings. dev-advisory's table, with Warn bindings, stays offline: the API server answers a
Warn with a warning on an admitted request, which the test client does not surface.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.conftest import Deployed
from tests.policy.test_equivalence import CASES, CONFIG, RULES, Mutation, demo_job, trainer
from trainstack.builders.admission import QUEUE_POLICY
from trainstack.kube import ApiError, wait_for
from trainstack.policy.admission import POLICY_PREFIX, admission_policies
from trainstack.policy.isolation import POOL_LABEL
from trainstack.policy.objects import VOLCANO_JOB
from trainstack.policy.pack import evaluate
from trainstack.policy.settings import levels, pack_config
from trainstack.preview.engine import Previewer


@pytest.fixture(scope="module")
def demo(previewer: Previewer) -> dict[str, Any]:
    return demo_job(previewer.preview("vision"))


def _probes(demo: dict[str, Any]) -> list[dict[str, Any]]:
    """Jobs that the table's settings (`CONFIG`) and prod's own judge differently, one per
    policy whose settings differ: a digest from a registry prod allows and CONFIG does not
    (CONFIG allows registry.example.com/ only; prod also its ECR registry, issue 41 #5), a
    build tag (prod takes digests only) and a pool picked by a label value no
    pool has (prod pins its pools' own selectors)."""

    def image(job: dict[str, Any], value: str) -> dict[str, Any]:
        trainer(job)["image"] = value
        for c in job["spec"]["tasks"][0]["template"]["spec"].get("initContainers", []):
            c["image"] = value
        return job

    elsewhere = image(
        copy.deepcopy(demo), "111122223333.dkr.ecr.us-east-1.amazonaws.com/a@sha256:" + "c" * 64
    )
    build_tag = image(copy.deepcopy(demo), "registry.example.com/a:2025.06.1")
    any_pool = copy.deepcopy(demo)
    any_pool["spec"]["tasks"][0]["template"]["spec"].pop("affinity")
    any_pool["spec"]["tasks"][0]["template"]["spec"]["nodeSelector"] = {POOL_LABEL: "x"}
    return [elsewhere, build_tag, any_pool]


def _settle(platform: Deployed, demo: dict[str, Any], rejects: Callable[..., set[str]]) -> None:
    """The API server compiles policies from an informer: wait until it judges every probe
    as the settings just applied do (each probe is judged differently by the others)."""
    probes = _probes(demo)
    for probe in probes:
        assert rejects(probe) != _config_rejects(probe) or rejects is _config_rejects
    wait_for(
        "the applied policies enforced",
        lambda: all(_verdict(platform, p)[0] is (not rejects(p)) for p in probes),
    )


def _config_rejects(job: dict[str, Any]) -> set[str]:
    return {name for name, r in RULES.items() if r.check(job, CONFIG)}


@pytest.fixture(scope="module")
def platform(prod: Deployed, demo: dict[str, Any]) -> Deployed:
    # The equivalence table's settings, so the server judges by the same rules the other two
    # columns do; bindings and namespaces are the platform stack's own.
    for manifest in admission_policies(CONFIG, prod.stack):
        prod.kube.apply(manifest)
    _settle(prod, demo, _config_rejects)
    return prod


def _judged(platform: Deployed, job: dict[str, Any], rejecting: set[str]) -> None:
    """The API server admits `job` exactly when no rule rejects it, and a refusal names the
    policy of a rule that rejects it. The server names the first denying policy it evaluated,
    in no fixed order, so any rejecting rule's policy may be named (a hostPath checkpoint
    volume breaks `checkpoint-volume` and `no-privileged`); the Volcano component's
    queue-ownership policy (builders/admission.queue_ownership_policy) checks the queue like
    `own-queue`, and the job's priority class like `volcano-scheduled` (issue 37)."""
    ok, message = _verdict(platform, job)
    assert ok is (not rejecting), message or f"admitted, but {sorted(rejecting)} reject it"
    if not ok:
        names = {f"{POLICY_PREFIX}{name}" for name in rejecting}
        names |= {QUEUE_POLICY} if {"own-queue", "volcano-scheduled"} & rejecting else set()
        assert any(f"'{name}'" in message for name in names), message


def _verdict(platform: Deployed, job: dict[str, Any]) -> tuple[bool, str]:
    try:
        platform.kube.create(job, as_=platform.member("vision"), dry_run=True)
    except ApiError as error:
        return False, error.message
    return True, ""


@pytest.mark.parametrize(
    ("rule", "case", "mutate", "admitted"), CASES, ids=[f"{r}: {c}" for r, c, _, _ in CASES]
)
def test_api_server_agrees(
    rule: str,
    case: str,
    mutate: Mutation | None,
    admitted: bool,
    platform: Deployed,
    demo: dict[str, Any],
) -> None:
    del case
    job = copy.deepcopy(demo)
    if mutate is not None:
        mutate(job)
    # A row is built for one rule but may break another too (a `no-privileged` row that
    # replaces the pod's securityContext drops what `hardened-pods` requires): the server
    # judges by all of them.
    rejecting = _config_rejects(job)
    assert (rule not in rejecting) is admitted, f"the table's verdict for {rule}"
    _judged(platform, job, rejecting)


def test_a_member_may_submit_the_valid_job_for_real(
    platform: Deployed, demo: dict[str, Any]
) -> None:
    """Not only a dry run: the object is stored, and the queue-ownership policy lets it in."""
    job = copy.deepcopy(demo)
    job["metadata"]["name"] = "admission-real"
    created = platform.kube.create(job, as_=platform.member("vision"))
    assert created["metadata"]["uid"]
    platform.kube.delete("batch.volcano.sh/v1alpha1", "Job", "admission-real", "vision")


# -- prod's own table ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_policies(prod: Deployed, demo: dict[str, Any]) -> Deployed:
    """prod's admission policies as its plan has them (the `platform` fixture, if it ran,
    replaced them with the equivalence table's)."""
    for _, obj in prod.plan.kubernetes_objects():
        if obj["kind"].startswith("ValidatingAdmissionPolicy") and obj["metadata"][
            "name"
        ].startswith(POLICY_PREFIX):
            prod.kube.apply(obj)
    _settle(prod, demo, lambda job: _mandatory(prod, job))
    return prod


def _mandatory(platform: Deployed, job: dict[str, Any]) -> set[str]:
    """The Kubernetes rules that reject `job` with the platform's settings, as the preview
    and the CrossGuard pack (with policies/config/<stack>.json) decide."""
    found = evaluate([(VOLCANO_JOB, "job", job)], pack_config(platform.cfg), levels(platform.cfg))
    return {v.rule for v in found if v.level == "mandatory" and v.rule in RULES}


@pytest.mark.parametrize(
    ("rule", "case", "mutate", "admitted"), CASES, ids=[f"{r}: {c}" for r, c, _, _ in CASES]
)
def test_api_server_agrees_on_prods_own_table(
    rule: str,
    case: str,
    mutate: Mutation | None,
    admitted: bool,
    own_policies: Deployed,
    demo: dict[str, Any],
) -> None:
    del rule, case, admitted  # prod's verdict, whatever it is
    job = copy.deepcopy(demo)
    if mutate is not None:
        mutate(job)
    _judged(own_policies, job, _mandatory(own_policies, job))
