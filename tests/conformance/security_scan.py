"""The security scan `make test` runs (issue 37): checkov over every Kubernetes object the
example stacks generate, with no finding left unexplained.

An accepted finding is an exception written on the object it concerns, in checkov's own
format, by the builder that makes the object (trainstack/builders/scanner.py):

    metadata:
      annotations:
        checkov.io/skip-CKV_K8S_16: CKV_K8S_16=<why, with its source>

What checkov 3.3.30 does, which this harness works around or holds it to:

- It reads an exception only from the object's own `metadata.annotations`: a key containing
  `checkov.io/skip` (or `bridgecrew.io/skip`, `cortex.io/skip`), the value split at `=`
  (checkov/kubernetes/kubernetes_utils.py `get_skipped_checks`). A second `=` crashes the
  whole run; one on a pod template is ignored, silently.
- It reports an excepted check as SKIPPED whether or not the check would fail, so a stale
  exception shows only in a second scan with the exceptions removed: both trees, `annotated`
  and `bare`, are scanned in one run (one start-up; `-d` given twice is broken in 3.3.30).
- It matches `kind` only, never `apiVersion`: a Volcano Job would be checked as a batch/v1
  Job (pod checks fail on the absent `spec.template`, the task templates' containers are never
  seen). Each Volcano Job is scanned as one Pod per task instead, carrying the Job's
  annotations, which is where its exceptions are written.
- Without `--skip-download` it calls Prisma Cloud's API; `--quiet` drops skipped results.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainstack.builders import scanner
from trainstack.preview.plan import Plan, Resource

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = Path(__file__).with_name("checkov-constraints.txt")
# checkov's own list (kubernetes_utils.SKIP_ANNOTATION_PREFIXES): what it reads as exceptions.
SKIP_MARKERS = ("checkov.io/skip", "bridgecrew.io/skip", "cortex.io/skip")
NO_REASON = "No comment provided"  # what checkov reports for `<ID>` without `=<reason>`
VOLCANO_GROUP = "batch.volcano.sh/"
# Kinds whose objects carry pods: each must come back from checkov with results.
POD_KINDS = frozenset(
    {"Pod", "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob"}
)
HOW_TO_EXCEPT = (
    "fix the object in its builder, or accept the finding where the builder makes it: "
    "scanner.annotate(metadata, {{{check!r}: '<why, and its source>'}}) on the object's own "
    "metadata.annotations (trainstack/builders/scanner.py)"
)


def pinned_version() -> str:
    """The checkov version the Makefile installs: the constraints file's `checkov==` line."""
    for line in CONSTRAINTS.read_text().splitlines():
        if line.startswith("checkov=="):
            return line.removeprefix("checkov==").strip()
    raise AssertionError(f"{CONSTRAINTS} pins no checkov version")


def checkov_home() -> Path:
    """Where `make scan-tools` installs it (the Makefile exports TRAINSTACK_CHECKOV_HOME)."""
    default = Path.home() / ".cache" / "trainstack" / f"checkov-{pinned_version()}"
    return Path(os.environ.get("TRAINSTACK_CHECKOV_HOME") or default)


# -- the objects ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Generated:
    """One generated object: its file under the plan root, what it is and who makes it."""

    path: str  # <stack>/kubernetes/<namespace>/<kind>-<name>.yaml, as `trainstack preview` writes
    doc: dict[str, Any]
    resource: str  # the Pulumi resource's name
    component: str  # the type of the component it belongs to

    @property
    def what(self) -> str:
        meta = self.doc.get("metadata", {})
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        return f"{self.doc['kind']} {where}{meta.get('name')}"

    @property
    def volcano(self) -> bool:
        return self.doc.get("kind") == "Job" and str(self.doc.get("apiVersion", "")).startswith(
            VOLCANO_GROUP
        )

    def describe(self) -> str:
        made_by = f"resource {self.resource} of {self.component}"
        if self.volcano:
            made_by += "; a Volcano Job's exceptions go on the Job, jobs/render.py job_metadata"
        return f"{self.path} ({self.what}; {made_by})"


def _component(resource: Resource, by_ref: Mapping[str, Resource]) -> str:
    owner = by_ref.get(resource.parent)
    while owner is not None and owner.custom:
        owner = by_ref.get(owner.parent)
    return owner.type if owner is not None else "(stack)"


def generated_objects(plans: Mapping[str, Plan]) -> list[Generated]:
    """Every Kubernetes object of the plans, named by the file `trainstack preview` writes it
    to (trainstack/preview/plan.py write_plan)."""
    found = []
    for stack, plan in sorted(plans.items()):
        by_ref = {r.ref: r for r in plan.resources}
        for resource, manifest in plan.kubernetes_objects():
            meta = manifest.get("metadata", {})
            folder = meta.get("namespace", "_cluster")
            path = f"{stack}/kubernetes/{folder}/{manifest['kind'].lower()}-{meta.get('name')}.yaml"
            # Through YAML, as the file holds it (and as a copy the harness may change).
            doc = yaml.safe_load(yaml.safe_dump(manifest))
            found.append(Generated(path, doc, resource.name, _component(resource, by_ref)))
    return found


# -- exceptions as written -------------------------------------------------------------------


def is_skip_key(key: object) -> bool:
    return isinstance(key, str) and any(marker in key for marker in SKIP_MARKERS)


@dataclass(frozen=True)
class Written:
    """One exception as the object carries it."""

    key: str
    check: str
    reason: str | None  # None: no `=`


def written_exceptions(doc: Mapping[str, Any]) -> list[Written]:
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    out = []
    for key, value in annotations.items():
        if is_skip_key(key):
            check, sep, reason = str(value).partition("=")
            out.append(Written(key, check, reason if sep else None))
    return out


def misplaced(doc: Any, path: str = "") -> Iterator[str]:
    """Paths of exception keys anywhere but the object's own metadata.annotations (a pod or
    task template's, for one), which checkov never reads."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            here = f"{path}.{key}"
            if is_skip_key(key) and path != ".metadata.annotations":
                yield here.lstrip(".")
            yield from misplaced(value, here)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from misplaced(value, f"{path}[{i}]")


def written_problems(obj: Generated) -> list[str]:
    """What is wrong with the exceptions as written, before checkov runs: a reason with `=`
    would crash the scan of every object."""
    problems = [
        f"MISPLACED   {p} on {obj.describe()}: checkov reads exceptions only from the object's "
        "own metadata.annotations; move it there"
        for p in misplaced(obj.doc)
    ]
    for w in written_exceptions(obj.doc):
        expected_key = f"{scanner.ANNOTATION_PREFIX}{w.check}"
        if w.reason is None:
            problems.append(
                f"NO REASON   {w.key}: {w.check} on {obj.describe()}: write "
                f"'{w.check}=<why, and its source>' (scanner.exceptions)"
            )
            continue
        issue = scanner.reason_issue(w.check, w.reason)
        if issue is not None:
            problems.append(f"BAD REASON  {w.key} on {obj.describe()}: {issue}")
        elif w.key != expected_key:
            problems.append(
                f"MISTYPED    {w.key} on {obj.describe()}: its value excepts {w.check}, "
                f"whose key is {expected_key} (one check per key; scanner.exceptions)"
            )
    return problems


# -- staging ------------------------------------------------------------------------------


def strip_exceptions(doc: dict[str, Any]) -> dict[str, Any]:
    bare = copy.deepcopy(doc)
    meta = bare.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if not is_skip_key(k)}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return bare


def scanned_docs(obj: Generated) -> list[tuple[str, dict[str, Any]]]:
    """(suffix, document) as checkov is to see the object: itself, or for a Volcano Job one
    Pod per task (the task template's spec) with the Job's own annotations."""
    if not obj.volcano:
        return [("", obj.doc)]
    meta = obj.doc["metadata"]
    pods = []
    for task in obj.doc["spec"].get("tasks", []):
        template = task.get("template") or {}
        pod_meta: dict[str, Any] = {
            "name": f"{meta['name']}-{task['name']}",
            "namespace": meta.get("namespace"),
            "labels": dict((template.get("metadata") or {}).get("labels") or {}),
        }
        if meta.get("annotations"):
            pod_meta["annotations"] = dict(meta["annotations"])
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template["spec"]}
        pods.append((f".task-{task['name']}", pod))
    return pods


@dataclass
class Staged:
    """What was written for checkov: scanned file (relative to a tree) -> its object."""

    files: dict[str, Generated] = field(default_factory=dict)


def stage(objects: list[Generated], root: Path, group: str) -> Staged:
    """`root/group/annotated/…` as generated, `root/group/bare/…` without exceptions."""
    staged = Staged()
    for obj in objects:
        base = obj.path.removesuffix(".yaml")
        for suffix, doc in scanned_docs(obj):
            rel = f"{base}{suffix}.yaml"
            for tree, body in (("annotated", doc), ("bare", strip_exceptions(doc))):
                dst = root / group / tree / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(yaml.safe_dump(body, sort_keys=False))
            staged.files[rel] = obj
    return staged


# -- the scan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    status: str  # FAILED | SKIPPED | PASSED
    name: str
    resource: str
    reason: str | None


@dataclass
class Scan:
    returncode: int
    version: str
    parsing_errors: int
    # (group, tree, scanned file, check id) -> results
    results: dict[tuple[str, str, str, str], list[Result]]
    stderr: str


def run_checkov(checkov: Path, root: Path) -> Scan:
    """One run over `root` (every group, both trees): offline, JSON, every result kept."""
    command = [
        str(checkov), "-d", str(root), "--framework", "kubernetes", "--skip-download",
        "-o", "json", "--compact",
    ]  # fmt: skip
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    if done.returncode not in (0, 1):  # 0: nothing failed, 1: something did
        return Scan(done.returncode, "", 0, {}, done.stderr[-4000:])
    report = json.loads(done.stdout)
    if isinstance(report, list):  # one document per framework when several ran
        report = next(r for r in report if r.get("check_type") == "kubernetes")
    results: dict[tuple[str, str, str, str], list[Result]] = {}
    for status in ("failed_checks", "skipped_checks", "passed_checks"):
        for c in report.get("results", {}).get(status, []):
            group, tree, rel = c["file_path"].lstrip("/").split("/", 2)
            result = Result(
                c["check_result"]["result"],
                c["check_name"],
                c["resource"],
                c["check_result"].get("suppress_comment"),
            )
            results.setdefault((group, tree, rel, c["check_id"]), []).append(result)
    summary = report["summary"]
    return Scan(
        done.returncode,
        summary["checkov_version"],
        summary["parsing_errors"],
        results,
        done.stderr[-4000:],
    )


def _status(results: list[Result]) -> str:
    statuses = {r.status for r in results}
    return next((s for s in ("FAILED", "SKIPPED", "PASSED") if s in statuses), "ABSENT")


def scan_problems(scan: Scan, staged: Staged, group: str) -> list[str]:
    """Everything the scan of one group says is wrong, one actionable line each."""
    problems: list[str] = []
    by_file: dict[tuple[str, str], dict[str, list[Result]]] = {}
    for (g, tree, rel, check), results in scan.results.items():
        if g == group:
            by_file.setdefault((tree, rel), {})[check] = results
    for rel, obj in sorted(staged.files.items()):
        annotated = by_file.get(("annotated", rel), {})
        bare = by_file.get(("bare", rel), {})
        task = f" [{rel.rsplit('.task-', 1)[1].removesuffix('.yaml')} task]" if obj.volcano else ""
        if obj.doc.get("kind") in POD_KINDS and not annotated:
            problems.append(f"NOT SCANNED {obj.describe()}{task}: checkov reported nothing")
        for check, results in sorted(annotated.items()):
            status = _status(results)
            if status == "FAILED":
                problems.append(
                    f"UNEXPLAINED {check} {results[0].name!r} on {obj.describe()}{task}: "
                    + HOW_TO_EXCEPT.format(check=check)
                )
            elif status == "SKIPPED" and any(r.reason in (None, "", NO_REASON) for r in results):
                problems.append(f"NO REASON   {check} excepted on {obj.describe()}")
        for w in written_exceptions(obj.doc):
            if _status(annotated.get(w.check, [])) != "SKIPPED":
                problems.append(
                    f"NOT READ    {w.key}: {w.check} on {obj.describe()}{task}: checkov did not "
                    "apply it (a mistyped check id or key?)"
                )
            elif _status(bare.get(w.check, [])) != "FAILED":
                problems.append(
                    f"STALE       {w.key} on {obj.describe()}{task}: {w.check} passes without "
                    "the exception; remove it from the builder"
                )
    return sorted(set(problems))


def findings_table(scan: Scan, staged: Staged, group: str) -> list[str]:
    """What the scanner objects to without the exceptions, and each reason: for the log."""
    lines = []
    for (g, tree, rel, check), results in sorted(scan.results.items()):
        if g == group and tree == "bare" and _status(results) == "FAILED":
            obj = staged.files[rel]
            reason = next((w.reason for w in written_exceptions(obj.doc) if w.check == check), None)
            lines.append(f"{check:<11} {rel}: {reason or 'NO EXCEPTION'}")
    return lines
