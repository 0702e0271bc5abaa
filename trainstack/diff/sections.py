"""The report's sections other than resources: teams and group queues, capacity (pools, totals
and checks), storage, jobs and policy, each from the base and head plans."""

from __future__ import annotations

from typing import Any

from trainstack.builders import prepull
from trainstack.builders.fabric import GPU_RESOURCE as GPU
from trainstack.diff.capacity import Check, Inputs, capacity_checks, plan_inputs
from trainstack.diff.model import Capacity, DataPath, Entry, Policy
from trainstack.diff.plans import ABSENT, VOLCANO_JOB, Change, changed_paths, get, limited, readable
from trainstack.diff.twins import kinds as count_kinds
from trainstack.jobs.elastic import gpus_label, job_gpus, job_slices
from trainstack.outputs import team_slices
from trainstack.policy.objects import Violation

QUEUE = "kubernetes:scheduling.volcano.sh/v1beta1:Queue"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
STORAGE_TYPES = (
    "aws:fsx/lustreFileSystem:LustreFileSystem",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
    "aws:s3/bucket:Bucket",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
    "kubernetes:core/v1:PersistentVolumeClaim",
    "kubernetes:core/v1:PersistentVolume",
)
# Scalar keys of `scheduling.capacity` (its pools, groups and dimensions are shown elsewhere or
# not at all); the last four are what plans recorded before firm and elastic capacity.
TOTALS = (
    *("firm", "elastic", "total", "guaranteed", "deserved", "capability"),
    *("reserved", "onDemand", "spot", "existing"),
)


def _queue_weights(plan: dict[str, Any]) -> dict[str, Any]:
    weights: dict[str, Any] = {}
    for resource in plan["resources"]:
        if resource.get("type") == QUEUE:
            labels = get(resource, "inputs", "metadata", "labels", default={})
            if labels.get("trainstack.io/role") == "team" and "trainstack.io/team" in labels:
                weights[labels["trainstack.io/team"]] = get(resource, "inputs", "spec", "weight")
    return weights


def _teams(outputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each team's registry entry with its `scheduling`, from `team/<name>` outputs.

    Plans from before those outputs (a pull request's base, once) kept the same data in
    `registry.teams` and `scheduling.teams`; read them alike so that change alone shows no
    team as added or removed.
    """
    slices = team_slices(outputs)
    if slices:
        return {name: dict(team) for name, team in slices.items()}
    scheduling = get(outputs, "scheduling", "teams", default={}) or {}
    return {
        str(t["name"]): {**t, "scheduling": scheduling.get(t["name"], {})}
        for t in get(outputs, "registry", "teams", default=[]) or []
    }


def team_view(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per team: the numbers and lists a reviewer cares about, from the plan's outputs."""
    outputs = plan.get("outputs") or {}
    teams = _teams(outputs)
    weights = _queue_weights(plan)
    view: dict[str, dict[str, Any]] = {}
    for name, reg in sorted(teams.items()):
        sched = reg.get("scheduling") or {}
        gpus = sched.get("gpus", {})
        guarantee = gpus.get("guarantee", get(reg, "quota", "gpus"))
        deserved, capability = gpus.get("deserved"), gpus.get("capability")
        view[name] = {
            "group": reg.get("group"),
            "owners": reg.get("owners"),
            "quota (guaranteed GPUs)": guarantee,
            "deserved GPUs": deserved,
            "borrowLimit GPUs": (
                capability - deserved
                if isinstance(capability, int) and isinstance(deserved, int)
                else None
            ),
            "capability GPUs": capability,
            "weight": weights.get(name),
            "priorityClasses": sched.get("priorityClasses"),
            "pools": sched.get("pools"),
            "queue": sched.get("queue"),
        }
        if "storage" in reg:  # plans from before the team slices do not record it
            # Where the team's data lives and how long it is kept (builders/storage.py
            # team_storage): a shorter retention deletes logs and checkpoint copies sooner.
            view[name] |= {
                "checkpoint retention (days)": get(reg, "storage", "checkpointRetentionDays"),
                "log retention (days)": get(reg, "storage", "logRetentionDays"),
                "artifacts": get(reg, "storage", "artifactS3Uri"),
            }
    return view


def group_view(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per group queue: its guarantee and deserved share (`scheduling.capacity.groups`) and
    its capability (the group's Queue)."""
    groups = get(plan, "outputs", "scheduling", "capacity", "groups", default={}) or {}
    capability: dict[str, Any] = {}
    for resource in plan["resources"]:
        labels = get(resource, "inputs", "metadata", "labels", default={}) or {}
        if resource.get("type") == QUEUE and labels.get("trainstack.io/role") == "group":
            gpus = get(resource, "inputs", "spec", "capability", GPU)
            capability[str(labels.get("trainstack.io/group"))] = _as_int(gpus)
    view: dict[str, dict[str, Any]] = {}
    for name in sorted(set(groups) | set(capability)):
        group = groups.get(name) or {}
        view[name] = {
            "quota (guaranteed GPUs)": group.get("guarantee"),
            "deserved GPUs": group.get("deserved"),
            "capability GPUs": capability.get(name),
        }
    return view


def _as_int(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def entries(
    base: dict[str, dict[str, Any]],
    head: dict[str, dict[str, Any]],
    summary_keys: tuple[str, ...],
    *,
    recorded_only: bool = False,
) -> list[Entry]:
    """Added, removed and changed items. ``recorded_only``: a field one side does not record
    at all (a plan from before it existed) is not a change."""
    found: list[Entry] = []
    for key in sorted(set(base) | set(head)):
        if key not in base:
            summary = {k: head[key].get(k) for k in summary_keys}
            found.append(Entry(key, "added", summary=summary))
        elif key not in head:
            summary = {k: base[key].get(k) for k in summary_keys}
            found.append(Entry(key, "removed", summary=summary))
        else:
            fields = [*head[key], *(f for f in base[key] if f not in head[key])]
            if recorded_only:
                fields = [f for f in fields if f in base[key] and f in head[key]]
            changes = [
                change
                for f in fields
                for change in _field_changes(f, base[key].get(f, ABSENT), head[key].get(f, ABSENT))
            ]
            if changes:
                found.append(Entry(key, "changed", changes))
    return found


def _field_changes(name: str, before: Any, after: Any) -> list[Change]:
    """One field of a team, group or pool: a list by what it gained and lost (a team on every
    pool gains the new one: both lists whole were one long row, issue 41 #3)."""
    if before == after:
        return []
    if not (isinstance(before, list) and isinstance(after, list)) or sorted(
        map(str, before)
    ) == sorted(map(str, after)):
        return [Change(name, before, after)]
    gained = [v for v in after if v not in before]
    lost = [v for v in before if v not in after]
    return [
        *([Change(f"{name} added", ABSENT, gained)] if gained else []),
        *([Change(f"{name} removed", lost, ABSENT)] if lost else []),
    ]


def _pool_view(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per pool: GPUs at its maximum size, what it is, and (plans that record it) how many of
    them are firm, i.e. back guarantees."""
    supply = get(plan, "outputs", "scheduling", "capacity", "pools", default={}) or {}
    held = _pre_pulled(plan)
    pools: dict[str, dict[str, Any]] = {}
    for pool in get(plan, "outputs", "gpuPools", default=[]) or []:
        per_node, nodes = pool.get("gpusPerNode"), pool.get("maxNodes")
        name = str(pool.get("name"))
        pools[name] = {
            "GPUs": per_node * nodes
            if isinstance(per_node, int) and isinstance(nodes, int)
            else None,
            "firm GPUs": (supply.get(name) or {}).get("firm"),
            "maxNodes": nodes,
            "gpusPerNode": per_node,
            "instanceType": pool.get("instanceType"),
            "capacityType": pool.get("capacityType"),
            "fabric": pool.get("fabric"),
            # Each GPU cut into slices (docs/gpu-sharing.md): `7 x 1g.10gb` a GPU.
            "slices": ", ".join(
                f"{s.get('perGpu')} x {s.get('profile')}" for s in pool.get("slices") or []
            )
            or None,
        }
        if not pools[name]["slices"]:
            del pools[name]["slices"]
        if name not in supply:
            del pools[name]["firm GPUs"]
        if name in held:  # a team's new job: "pre-pulled images added" (docs/prepull.md)
            pools[name]["pre-pulled images"] = held[name]
    return pools


def _pre_pulled(plan: dict[str, Any]) -> dict[str, list[str]]:
    """Per pool, the images its pre-pull DaemonSet holds (builders/prepull.py)."""
    held: dict[str, list[str]] = {}
    for resource in plan["resources"]:
        meta = get(resource, "inputs", "metadata", default={}) or {}
        if resource.get("type") != DAEMONSET or not str(meta.get("name", "")).startswith(
            prepull.NAME_PREFIX
        ):
            continue
        pool = str((meta.get("labels") or {}).get(prepull.POOL_LABEL, ""))
        pod = get(resource, "inputs", "spec", "template", "spec", default={}) or {}
        held[pool] = sorted(
            str(c.get("image"))
            for c in pod.get("containers") or []
            if c.get("name") != prepull.HOLDER_ONLY
        )
    return held


def _capacity_inputs(plan: dict[str, Any]) -> Inputs | None:
    return plan_inputs(plan, _teams(plan.get("outputs") or {}), _pool_view(plan))


def capacity_section(base: dict[str, Any], head: dict[str, Any]) -> Capacity:
    base_pools, head_pools = _pool_view(base), _pool_view(head)
    pools = entries(base_pools, head_pools, ("GPUs", "firm GPUs", "instanceType", "capacityType"))
    totals: list[Change] = []
    base_cap = get(base, "outputs", "scheduling", "capacity", default={}) or {}
    head_cap = get(head, "outputs", "scheduling", "capacity", default={}) or {}
    for key in TOTALS:
        if key in base_cap or key in head_cap:
            totals.append(Change(key, base_cap.get(key, ABSENT), head_cap.get(key, ABSENT)))
    checks = capacity_checks(_capacity_inputs(base), _capacity_inputs(head))
    checks += _lowering_checks(base, head)
    return Capacity(pools, totals, checks)


def _queue_gpus(plan: dict[str, Any]) -> dict[str, tuple[str, dict[str, int]]]:
    """Queue name -> (parent, GPUs per level: guarantee, deserved) from a plan's Queues."""
    found: dict[str, tuple[str, dict[str, int]]] = {}
    for resource in plan["resources"]:
        if resource.get("type") != QUEUE:
            continue
        spec = get(resource, "inputs", "spec", default={}) or {}
        name = str(get(resource, "inputs", "metadata", "name", default=resource["name"]))
        levels = {
            "guarantee": get(spec, "guarantee", "resource", GPU, default="0"),
            "deserved": get(spec, "deserved", GPU, default="0"),
        }
        found[name] = (str(spec.get("parent") or ""), {k: int(v) for k, v in levels.items()})
    return found


def _lowering_checks(base: dict[str, Any], head: dict[str, Any]) -> list[Check]:
    """A parent queue lowered in this change must still cover its children as they are now.

    Children depend on their parent, so the engine updates the parent first, and Volcano's
    webhook checks a parent against its children's current guarantee and deserved
    (validate_queue.go validateChildrenConstraints): a parent lowered below them is refused
    until the children have been lowered in an earlier update (docs/scheduling.md).
    """
    old, new = _queue_gpus(base), _queue_gpus(head)
    checks: list[Check] = []
    for name, (_, levels) in sorted(new.items()):
        if name not in old:
            continue
        children = [c for c, (parent, _) in old.items() if parent == name]
        for level, value in levels.items():
            if not children or value >= old[name][1][level]:
                continue
            current = sum(old[c][1][level] for c in children)
            checks.append(
                Check(
                    f"queue {name}: lowered {level} covers its children's current "
                    f"{level} (the parent lands first; lower the teams in an earlier update)",
                    current,
                    value,
                    current <= value,
                    None,
                )
            )
    return checks


def storage_section(
    base: dict[str, Any],
    head: dict[str, Any],
    shown: set[str] | None = None,
    twins: dict[tuple[str, str], str] | None = None,
    replaced: dict[str, list[str]] | None = None,
) -> list[Entry]:
    """Storage resources added, removed, replaced or changed; those in `shown` (stateful ones
    replaced or deleted, listed first in the report) are left out, so each appears once.
    `replaced` names the others the change replaces, with the inputs that force it: the
    data repository association's replacement was in no storage row (issue 41 #3).
    Added ones that are another team's renamed (`twins`) are one entry per team."""

    def view(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {
            f"{r['type'].rsplit(':', 1)[-1]} {r['name']}": r
            for r in plan["resources"]
            if r.get("type") in STORAGE_TYPES
        }

    old, new = view(base), view(head)
    entries: list[Entry] = []
    renamed: dict[str, list[str]] = {}
    for key in sorted(set(old) | set(new)):
        if key in (shown or set()):
            continue
        twin = (twins or {}).get((new[key]["type"], new[key]["name"]), "") if key in new else ""
        if key not in old and twin:
            renamed.setdefault(twin, []).append(key.split(" ", 1)[0])
        elif key not in old:
            entries.append(Entry(key, "added", summary=_storage_summary(new[key])))
        elif key not in new:
            entries.append(Entry(key, "removed", summary=_storage_summary(old[key])))
        else:
            diffs = [
                d
                for d in changed_paths(old[key].get("inputs"), new[key].get("inputs"))
                if not d[0].startswith(("tags", "metadata.labels"))
            ]
            forcing = (replaced or {}).get(key)
            if forcing is not None:
                diffs = [
                    (f"{p} (forces replacement)" if p in forcing else p, b, a)
                    for p, b, a in sorted(diffs, key=lambda d: d[0] not in forcing)
                ]
            if diffs:
                kept, more = limited(readable(diffs))
                status = "replaced" if forcing is not None else "changed"
                entries.append(Entry(key, status, kept, more=more))
    twins_first = [
        Entry(twin, "added", summary={"each renamed": count_kinds(kinds)})
        for twin, kinds in renamed.items()
    ]
    return twins_first + entries


# Inputs that say which data a file system or a team's volume holds, per type.
DATA_PATHS = {
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": (
        "dataRepositoryPath",
        "fileSystemPath",
    ),
    "aws:fsx/lustreFileSystem:LustreFileSystem": ("importPath", "exportPath"),
    "kubernetes:core/v1:PersistentVolume": (
        "spec.csi.volumeAttributes.mountname",
        "spec.csi.volumeHandle",
        "spec.mountOptions",
    ),
}


def _inside(path: str, folder: str) -> bool:
    """`s3://b/data/x` is inside `s3://b/data/` and `s3://b/data`; `s3://b/database` is not."""
    return path.startswith(folder) and (
        folder.endswith(("/", ":")) or path[len(folder) : len(folder) + 1] in ("", "/", ":")
    )


def _path_note(field: str, before: Any, after: Any) -> str | None:
    """What a changed path means for whoever reads the data; None when it narrows access
    (mount options that stay or become read-only)."""
    if field == "spec.mountOptions":
        was_ro, is_ro = "ro" in (before or []), "ro" in (after or [])
        return "no longer read-only" if was_ro and not is_ro else None
    if isinstance(before, str) and isinstance(after, str) and _inside(before, after):
        return "wider: the new path holds the old one"
    if isinstance(before, str) and isinstance(after, str) and _inside(after, before):
        return "narrower: inside the old path"
    return "points elsewhere"


def data_paths(
    base: dict[str, Any], head: dict[str, Any], replaced: set[tuple[str, str]]
) -> list[DataPath]:
    """Paths between storage and data that changed: a dataset prefix set to "" let every
    team read the whole bucket, and the report flagged nothing (issue 41 #3)."""
    old = {(r["type"], r["name"]): r for r in base["resources"] if r.get("type") in DATA_PATHS}
    found: list[DataPath] = []
    for resource in head["resources"]:
        ref = (resource.get("type", ""), resource.get("name", ""))
        if ref not in old:
            continue
        for field in DATA_PATHS[ref[0]]:
            before = get(old[ref].get("inputs"), *field.split("."))
            after = get(resource.get("inputs"), *field.split("."))
            note = _path_note(field, before, after) if before != after else None
            if note is not None:
                found.append(
                    DataPath(
                        f"{ref[0].rsplit(':', 1)[-1]} {ref[1]}",
                        "replace" if ref in replaced else "update",
                        field,
                        ABSENT if before is None else before,
                        ABSENT if after is None else after,
                        note,
                    )
                )
    return found


def _storage_summary(resource: dict[str, Any]) -> dict[str, Any]:
    inputs = resource.get("inputs", {})
    keys = {
        "storageCapacity": inputs.get("storageCapacity"),
        "perUnitStorageThroughput": inputs.get("perUnitStorageThroughput"),
        "deploymentType": inputs.get("deploymentType"),
        "bucket": inputs.get("bucket"),
        "storage": get(inputs, "spec", "resources", "requests", "storage")
        or get(inputs, "spec", "capacity", "storage"),
        "namespace": get(inputs, "metadata", "namespace"),
    }
    return {k: v for k, v in keys.items() if v is not None}


def _job_gpus(spec: dict[str, Any]) -> int | str:
    """The GPUs a Job asks for; an elastic one's as `least..asked` (jobs/elastic.py)."""
    least, asked = job_gpus(spec)
    return asked if least == asked else gpus_label(least, asked)


def job_view(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}
    for resource in plan["resources"]:
        if resource.get("type") != VOLCANO_JOB:
            continue
        inputs = resource.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        name = meta.get("name") or resource["name"]
        jobs[f"{meta.get('namespace') or '-'}/{name}"] = inputs
    return jobs


def jobs_section(base: dict[str, Any], head: dict[str, Any]) -> list[Entry]:
    old, new = job_view(base), job_view(head)
    entries: list[Entry] = []
    for key in sorted(set(old) | set(new)):
        if key not in old or key not in new:
            spec = (new.get(key) or old.get(key) or {}).get("spec") or {}
            summary = {
                "queue": spec.get("queue"),
                "GPUs": _job_gpus(spec),
                "tasks": len(spec.get("tasks") or []),
                "priorityClassName": spec.get("priorityClassName"),
            }
            slices = job_slices(spec)
            if slices is not None:  # a job on GPU slices (docs/gpu-sharing.md)
                summary["slices"] = slices
            entries.append(Entry(key, "added" if key not in old else "removed", summary=summary))
            continue
        diffs = changed_paths(old[key], new[key])
        if diffs:
            kept, more = limited(readable(diffs))
            gpus_before, gpus_after = (
                _job_gpus(old[key].get("spec") or {}),
                _job_gpus(new[key].get("spec") or {}),
            )
            if gpus_before != gpus_after:
                # Before and after in their own columns, like every other change (issue 23 #6).
                kept.insert(0, Change("GPUs", gpus_before, gpus_after))
            slices_before = job_slices(old[key].get("spec") or {})
            slices_after = job_slices(new[key].get("spec") or {})
            if slices_before != slices_after:
                whole = "(whole GPUs)"
                kept.insert(0, Change("slices", slices_before or whole, slices_after or whole))
            entries.append(Entry(key, "changed", kept, more=more))
    return entries


def _violations(plan: dict[str, Any]) -> list[Violation] | None:
    report = plan.get("policy")
    if not isinstance(report, dict):
        return None
    return [
        Violation(
            str(v.get("rule", "")),
            str(v.get("resource", "")),
            str(v.get("message", "")),
            str(v.get("level", "")),
        )
        for v in report.get("violations") or []
        if isinstance(v, dict)
    ]


def policy_section(base: dict[str, Any], head: dict[str, Any]) -> Policy:
    old, new = _violations(base), _violations(head)
    if old is None and new is None:
        return Policy(False, note="no policy report in these plans")
    note = ""
    if old is None:
        note = "the base plan has no policy report: every violation in the head counts as new"
    elif new is None:
        note = "the head plan has no policy report: no violation can be counted as fixed"
        return Policy(True, note=note)

    def key(v: Violation) -> tuple[str, str, str]:
        return (v.rule, v.resource, v.message)

    old_keys = {key(v) for v in old or []}
    new_keys = {key(v) for v in new or []}
    added = sorted((v for v in new or [] if key(v) not in old_keys), key=key)
    fixed = sorted((v for v in old or [] if key(v) not in new_keys), key=key)
    return Policy(True, added, fixed, note)
