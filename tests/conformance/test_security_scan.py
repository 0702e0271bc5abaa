"""A well-known security scanner over every generated object, no finding left unexplained
(issue 37): checkov, pinned in checkov-constraints.txt and installed by `make scan-tools`
(which `make test` runs) into its own venv. How the harness stages the objects and what it
holds checkov to: tests/conformance/security_scan.py.

One checkov run scans the example stacks' objects (as `trainstack preview` writes them), with
and without their exceptions, and a self-test group of copies with deliberate mistakes, which
shows that each kind of problem is caught by the scanner actually installed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conformance.security_scan import (
    Generated,
    Scan,
    Staged,
    checkov_home,
    findings_table,
    generated_objects,
    pinned_version,
    run_checkov,
    scan_problems,
    scanned_docs,
    stage,
    strip_exceptions,
    written_problems,
)
from trainstack.builders import scanner
from trainstack.preview.plan import Plan, write_plan

EXAMPLES, SELFTEST = "examples", "selftest"
DEADLINES = "kubernetes/trainstack-system/deployment-trainstack-deadlines.yaml"
CACHE_AGENT = "kubernetes/trainstack-system/daemonset-trainstack-cache-agent.yaml"
VISION_JOB = "vision/kubernetes/vision/job-demo-train.yaml"
REASON = "a reason long enough to pass, citing builders/scanner.py as its source"


@pytest.fixture(scope="module")
def checkov() -> Path:
    path = checkov_home() / "bin" / "checkov"
    if not path.is_file():
        pytest.skip(
            f"checkov {pinned_version()} is not installed at {path.parent.parent}: "
            "`make scan-tools` installs it (`make test` does it first)"
        )
    return path


@pytest.fixture(scope="module")
def objects(
    example_plans: dict[str, Plan], tmp_path_factory: pytest.TempPathFactory
) -> list[Generated]:
    """Every example stack's Kubernetes objects, read back from the files the preview writes."""
    out = tmp_path_factory.mktemp("plans")
    for stack, plan in example_plans.items():
        write_plan(plan, out / stack)
    found = generated_objects(example_plans)
    on_disk = sorted(str(p.relative_to(out)) for p in out.glob("*/kubernetes/**/*.yaml"))
    assert on_disk == sorted(o.path for o in found)
    return [replace(o, doc=yaml.safe_load((out / o.path).read_text())) for o in found]


def _edit(
    objects: list[Generated], path: str, change: Callable[[dict[str, Any]], None]
) -> Generated:
    obj = next(o for o in objects if o.path == path)
    doc = copy.deepcopy(obj.doc)
    change(doc)
    return replace(obj, doc=doc)


def selftest_objects(objects: list[Generated]) -> list[Generated]:
    """Copies with one deliberate mistake each (none with `=` in a reason: that would crash
    the run; written_problems catches it first, tested below)."""

    def stale(doc: dict[str, Any]) -> None:  # the prod enforcer is not privileged
        doc["metadata"]["annotations"].update(scanner.exceptions({"CKV_K8S_16": REASON}))

    def on_template(doc: dict[str, Any]) -> None:
        doc["spec"]["template"]["metadata"]["annotations"] = doc["metadata"].pop("annotations")

    def mistyped(doc: dict[str, Any]) -> None:  # digits swapped: CKV_K8S_83 passes here
        doc["metadata"]["annotations"]["checkov.io/skip-CKV_K8S_38"] = f"CKV_K8S_83={REASON}"

    def no_reason(doc: dict[str, Any]) -> None:
        doc["metadata"]["annotations"]["checkov.io/skip-CKV_K8S_9"] = "CKV_K8S_9"

    def dropped(doc: dict[str, Any]) -> None:
        del doc["metadata"]["annotations"]["checkov.io/skip-CKV_K8S_22"]

    return [
        _edit(objects, f"prod/{DEADLINES}", stale),
        _edit(objects, f"dev/{DEADLINES}", on_template),
        _edit(objects, f"onprem/{DEADLINES}", mistyped),
        _edit(objects, f"onprem/{CACHE_AGENT}", no_reason),
        _edit(objects, VISION_JOB, dropped),
    ]


@dataclass(frozen=True)
class Scanned:
    scan: Scan
    staged: dict[str, Staged]


@pytest.fixture(scope="module")
def scanned(
    checkov: Path, objects: list[Generated], tmp_path_factory: pytest.TempPathFactory
) -> Scanned:
    written = [p for o in objects for p in written_problems(o)]
    if any("'='" in p for p in written):  # checkov would crash on every object: say why
        pytest.fail("\n".join(written))
    root = tmp_path_factory.mktemp("checkov")
    staged = {
        EXAMPLES: stage(objects, root, EXAMPLES),
        SELFTEST: stage(selftest_objects(objects), root, SELFTEST),
    }
    scan = run_checkov(checkov, root)
    assert scan.returncode in (0, 1), f"checkov failed (exit {scan.returncode}):\n{scan.stderr}"
    return Scanned(scan, staged)


def test_the_pinned_checkov_ran_and_parsed_everything(scanned: Scanned) -> None:
    assert scanned.scan.version == pinned_version(), (
        f"checkov {scanned.scan.version} ran, {pinned_version()} is pinned: `make scan-tools`"
    )
    assert scanned.scan.parsing_errors == 0, scanned.scan.stderr


def test_no_finding_is_left_unexplained(scanned: Scanned) -> None:
    problems = scan_problems(scanned.scan, scanned.staged[EXAMPLES], EXAMPLES)
    table = findings_table(scanned.scan, scanned.staged[EXAMPLES], EXAMPLES)
    assert not problems, "\n".join(
        [*problems, "", "every finding without exceptions, and its exception:", *table]
    )


def test_every_exception_is_written_as_checkov_reads_it(objects: list[Generated]) -> None:
    problems = [p for o in objects for p in written_problems(o)]
    assert not problems, "\n".join(problems)


def test_the_scan_catches_each_kind_of_mistake(scanned: Scanned, objects: list[Generated]) -> None:
    problems = scan_problems(scanned.scan, scanned.staged[SELFTEST], SELFTEST)
    problems += [p for o in selftest_objects(objects) for p in written_problems(o)]
    expected = [
        ("STALE       checkov.io/skip-CKV_K8S_16", f"prod/{DEADLINES}"),
        ("MISPLACED   spec.template.metadata.annotations.checkov.io/skip-", f"dev/{DEADLINES}"),
        ("UNEXPLAINED CKV_K8S_38", f"dev/{DEADLINES}"),
        ("MISTYPED    checkov.io/skip-CKV_K8S_38", f"onprem/{DEADLINES}"),
        ("UNEXPLAINED CKV_K8S_38", f"onprem/{DEADLINES}"),
        ("STALE       checkov.io/skip-CKV_K8S_38", f"onprem/{DEADLINES}"),
        ("NO REASON   checkov.io/skip-CKV_K8S_9", f"onprem/{CACHE_AGENT}"),
        ("NO REASON   CKV_K8S_9", f"onprem/{CACHE_AGENT}"),
        ("UNEXPLAINED CKV_K8S_22", f"{VISION_JOB} (Job vision/demo-train; "),
    ]
    missing = [e for e in expected if not any(p.startswith(e[0]) and e[1] in p for p in problems)]
    assert not missing, "\n".join(
        [*(f"not reported: {m}" for m in missing), "reported:", *problems]
    )
    # A Volcano Job is scanned through its tasks: both are named.
    assert any("[master task]" in p for p in problems)
    assert any("[worker task]" in p for p in problems)


# -- the harness without checkov -----------------------------------------------------------


def _obj(doc: dict[str, Any]) -> Generated:
    return Generated("s/kubernetes/ns/x.yaml", doc, "r", "trainstack:test:Component")


def _deployment(
    annotations: dict[str, str], template: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns", "annotations": annotations},
        "spec": {"template": {"metadata": {"annotations": template or {}}, "spec": {}}},
    }


def test_written_problems_name_each_mistake() -> None:
    doc = _deployment(
        {
            "checkov.io/skip-CKV_K8S_9": "CKV_K8S_9",
            "checkov.io/skip-CKV_K8S_8": "CKV_K8S_8=a=b " + REASON,
            "checkov.io/skip-CKV_K8S_10": "CKV_K8S_10=short",
            "checkov.io/skip1": f"CKV_K8S_11={REASON}",
            "bridgecrew.io/skip-CKV_K8S_12": f"CKV_K8S_12={REASON}",
        },
        template={"checkov.io/skip-CKV_K8S_13": f"CKV_K8S_13={REASON}"},
    )
    found = written_problems(_obj(doc))
    heads = sorted(p.split(" on ")[0] for p in found)
    assert heads == [
        "BAD REASON  checkov.io/skip-CKV_K8S_10",
        "BAD REASON  checkov.io/skip-CKV_K8S_8",
        "MISPLACED   spec.template.metadata.annotations.checkov.io/skip-CKV_K8S_13",
        "MISTYPED    bridgecrew.io/skip-CKV_K8S_12",
        "MISTYPED    checkov.io/skip1",
        "NO REASON   checkov.io/skip-CKV_K8S_9: CKV_K8S_9",
    ], found
    assert all("s/kubernetes/ns/x.yaml (Deployment ns/d; resource r of" in p for p in found)
    assert any("contains '='" in p for p in found)


def test_a_volcano_job_is_scanned_as_one_pod_per_task_with_the_jobs_annotations() -> None:
    ann = dict(scanner.exceptions({"CKV_K8S_9": REASON}))
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "team", "annotations": ann},
        "spec": {
            "tasks": [
                {
                    "name": t,
                    "template": {"metadata": {"labels": {"role": t}}, "spec": {"containers": []}},
                }
                for t in ("master", "worker")
            ]
        },
    }
    pods = scanned_docs(_obj(job))
    assert [s for s, _ in pods] == [".task-master", ".task-worker"]
    assert all(p["kind"] == "Pod" and p["metadata"]["annotations"] == ann for _, p in pods)
    assert pods[1][1]["metadata"]["labels"] == {"role": "worker"}
    bare = strip_exceptions(pods[0][1])
    assert "annotations" not in bare["metadata"]
    assert pods[0][1]["metadata"]["annotations"] == ann  # the staged copy, not the original


def test_scanner_exceptions_refuse_what_checkov_would_misread() -> None:
    key, value = scanner.exception("CKV_K8S_16", REASON)
    assert (key, value) == ("checkov.io/skip-CKV_K8S_16", f"CKV_K8S_16={REASON}")
    for check, reason, why in (
        ("CKV_K8S_16", REASON + " with a=b", "contains '='"),
        ("CKV_K8S_16", "needed", "too short"),
        ("CKV_K8S_16", REASON + "\nsecond line", "one line"),
        ("CKV_AWS_1", REASON, "not a checkov Kubernetes check id"),
    ):
        with pytest.raises(ValueError, match=why):
            scanner.exception(check, reason)
    ordered = list(
        scanner.exceptions({"CKV_K8S_16": REASON, "CKV_K8S_9": REASON, "CKV2_K8S_6": REASON})
    )
    assert ordered == [
        "checkov.io/skip-CKV2_K8S_6",
        "checkov.io/skip-CKV_K8S_9",
        "checkov.io/skip-CKV_K8S_16",
    ]


def test_digest_exceptions_only_for_an_image_without_a_digest() -> None:
    digest = "registry.example.com/x@sha256:" + "0" * 64
    assert scanner.unpinned_image_reasons([digest, digest]) == {}
    assert set(scanner.unpinned_image_reasons([digest, "registry.example.com/x:1.2.3"])) == {
        "CKV_K8S_43",
        "CKV_K8S_15",
    }
