"""The semantic diff of two plans: what a change means for teams, capacity, storage and jobs."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from trainstack.builders.fabric import GPU_RESOURCE as GPU
from trainstack.diff.access import AccessChange, access_section
from trainstack.diff.capacity import Check, Inputs, capacity_checks, plan_inputs
from trainstack.diff.plans import ABSENT, VOLCANO_JOB, Change, changed_paths, get, readable, show
from trainstack.diff.replace import STATEFUL, replacing_paths, trigger_reasons
from trainstack.outputs import team_slices

QUEUE = "kubernetes:scheduling.volcano.sh/v1beta1:Queue"
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
MAX_FIELD_CHANGES = 25  # per job or storage resource; the rest is counted
NOT_PREVIEWED = "not-previewed"  # no head plan: not in the head's changed set


@dataclass
class Entry:
    """A team, pool, storage resource or job: added, removed or changed, with its changes."""

    key: str
    status: str  # added | removed | changed
    changes: list[Change] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    more: int = 0  # changes left out


@dataclass
class Capacity:
    pools: list[Entry] = field(default_factory=list)
    totals: list[Change] = field(default_factory=list)  # every capacity summary key
    checks: list[Check] = field(default_factory=list)

    @property
    def over(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


@dataclass(frozen=True)
class Violation:
    rule: str
    resource: str
    message: str
    level: str


@dataclass
class Policy:
    present: bool
    new: list[Violation] = field(default_factory=list)
    fixed: list[Violation] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class ResourceChange:
    action: str  # create | update | replace | delete
    type: str
    name: str
    stateful: str  # why losing it matters; "" for stateless resources
    reasons: tuple[str, ...] = ()
    # The changed inputs of an update, decoded; of a replacement, those that do not force it.
    changes: tuple[Change, ...] = ()
    more: int = 0  # changes left out


@dataclass
class StackDiff:
    stack: str
    kind: str
    status: str  # changed | added | removed | unchanged | not-previewed
    counts: dict[str, int]
    teams: list[Entry]
    capacity: Capacity
    storage: list[Entry]
    jobs: list[Entry]
    policy: Policy
    resources: list[ResourceChange]  # replaced and deleted (stateful first)
    outputs_changed: list[str]
    groups: list[Entry] = field(default_factory=list)  # group queues' quotas
    access: list[AccessChange] = field(default_factory=list)
    created_updated: list[ResourceChange] = field(default_factory=list)  # every other change

    @property
    def has_changes(self) -> bool:
        return (
            self.status in ("added", "removed")
            or any(self.counts[a] for a in ("create", "update", "replace", "delete"))
            or bool(self.outputs_changed)
            or bool(self.policy.new or self.policy.fixed)
        )

    @property
    def stateful_losses(self) -> list[ResourceChange]:
        return [r for r in self.resources if r.stateful]


@dataclass
class DiffReport:
    stacks: list[StackDiff]

    @property
    def has_changes(self) -> bool:
        return any(s.has_changes for s in self.stacks)

    def to_json(self) -> dict[str, Any]:
        return {
            "hasChanges": self.has_changes,
            "stacks": [
                {
                    **asdict(s),
                    "hasChanges": s.has_changes,
                    "capacity": {
                        **asdict(s.capacity),
                        "over": [asdict(c) for c in s.capacity.over],
                    },
                }
                for s in self.stacks
            ],
        }


# -- sections ---------------------------------------------------------------------------


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


def _entries(
    base: dict[str, dict[str, Any]], head: dict[str, dict[str, Any]], summary_keys: tuple[str, ...]
) -> list[Entry]:
    entries: list[Entry] = []
    for key in sorted(set(base) | set(head)):
        if key not in base:
            summary = {k: head[key].get(k) for k in summary_keys}
            entries.append(Entry(key, "added", summary=summary))
        elif key not in head:
            summary = {k: base[key].get(k) for k in summary_keys}
            entries.append(Entry(key, "removed", summary=summary))
        else:
            fields = [*head[key], *(f for f in base[key] if f not in head[key])]
            changes = [
                Change(f, base[key].get(f, ABSENT), head[key].get(f, ABSENT))
                for f in fields
                if base[key].get(f, ABSENT) != head[key].get(f, ABSENT)
            ]
            if changes:
                entries.append(Entry(key, "changed", changes))
    return entries


def _pool_view(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per pool: GPUs at its maximum size, what it is, and (plans that record it) how many of
    them are firm, i.e. back guarantees."""
    supply = get(plan, "outputs", "scheduling", "capacity", "pools", default={}) or {}
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
        }
        if name not in supply:
            del pools[name]["firm GPUs"]
    return pools


def _capacity_inputs(plan: dict[str, Any]) -> Inputs | None:
    return plan_inputs(plan, _teams(plan.get("outputs") or {}), _pool_view(plan))


def capacity_section(base: dict[str, Any], head: dict[str, Any]) -> Capacity:
    base_pools, head_pools = _pool_view(base), _pool_view(head)
    pools = _entries(base_pools, head_pools, ("GPUs", "firm GPUs", "instanceType", "capacityType"))
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


def _resource_index(plan: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["type"], r["name"]): r for r in plan["resources"] if r.get("custom", True)}


def _limited(changes: list[tuple[str, Any, Any]]) -> tuple[list[Change], int]:
    kept = [Change(p, b, a) for p, b, a in changes[:MAX_FIELD_CHANGES]]
    return kept, max(0, len(changes) - MAX_FIELD_CHANGES)


def storage_section(
    base: dict[str, Any], head: dict[str, Any], shown: set[str] | None = None
) -> list[Entry]:
    """Storage resources added, removed or changed; those in `shown` (replaced or deleted,
    listed with their changes and reasons elsewhere) are left out, so each appears once."""

    def view(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {
            f"{r['type'].rsplit(':', 1)[-1]} {r['name']}": r
            for r in plan["resources"]
            if r.get("type") in STORAGE_TYPES
        }

    old, new = view(base), view(head)
    entries: list[Entry] = []
    for key in sorted(set(old) | set(new)):
        if key in (shown or set()):
            continue
        if key not in old:
            entries.append(Entry(key, "added", summary=_storage_summary(new[key])))
        elif key not in new:
            entries.append(Entry(key, "removed", summary=_storage_summary(old[key])))
        else:
            diffs = [
                d
                for d in changed_paths(old[key].get("inputs"), new[key].get("inputs"))
                if not d[0].startswith(("tags", "metadata.labels"))
            ]
            if diffs:
                kept, more = _limited(readable(diffs))
                entries.append(Entry(key, "changed", kept, more=more))
    return entries


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


def _job_gpus(spec: dict[str, Any]) -> int:
    total = 0
    for task in spec.get("tasks") or []:
        replicas = int(task.get("replicas") or 0)
        for container in get(task, "template", "spec", "containers", default=[]) or []:
            resources = container.get("resources") or {}
            amount = get(resources, "limits", "nvidia.com/gpu") or get(
                resources, "requests", "nvidia.com/gpu"
            )
            try:
                total += replicas * int(amount or 0)
            except (TypeError, ValueError):
                continue
    return total


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
            entries.append(Entry(key, "added" if key not in old else "removed", summary=summary))
            continue
        diffs = changed_paths(old[key], new[key])
        if diffs:
            kept, more = _limited(readable(diffs))
            gpus_before, gpus_after = (
                _job_gpus(old[key].get("spec") or {}),
                _job_gpus(new[key].get("spec") or {}),
            )
            if gpus_before != gpus_after:
                # Before and after in their own columns, like every other change (issue 23 #6).
                kept.insert(0, Change("GPUs", gpus_before, gpus_after))
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


def _reasons(rtype: str, diffs: list[tuple[str, Any, Any]]) -> list[str]:
    """Why the changed inputs force replacement: one line per rule, naming each changed path
    with its values (a claim whose spec changed in three places is one reason, not three)."""
    by_rule: dict[str, list[str]] = {}
    values = {path: (before, after) for path, before, after in diffs}
    for path, why in replacing_paths(rtype, diffs):
        before, after = values[path]
        by_rule.setdefault(why, []).append(f"{path} {show(before)} → {show(after)}")
    return [f"{', '.join(paths)}: {why}" for why, paths in by_rule.items()]


def _update(rtype: str, name: str, before: dict[str, Any], after: dict[str, Any]) -> ResourceChange:
    diffs = readable(changed_paths(before.get("inputs") or {}, after.get("inputs") or {}))
    if not diffs:
        diffs = [
            (key, before.get(key, ABSENT), after.get(key, ABSENT))
            for key in ("dependencies", "options")
            if before.get(key) != after.get(key)
        ]
    kept, more = _limited(diffs)
    return ResourceChange("update", rtype, name, "", (), tuple(kept), more)


def resource_changes(
    base: dict[str, Any], head: dict[str, Any]
) -> tuple[dict[str, int], list[ResourceChange], list[ResourceChange]]:
    """Counts per action; replaced and deleted resources (stateful first); created and updated
    ones, each update with its changed inputs: every counted change is listed (issue 23 #6)."""
    old, new = _resource_index(base), _resource_index(head)
    counts: Counter[str] = Counter({"create": 0, "update": 0, "replace": 0, "delete": 0, "same": 0})
    listed: list[ResourceChange] = []
    others: list[ResourceChange] = []
    for ref in sorted(set(old) | set(new)):
        rtype, name = ref
        stateful = STATEFUL.get(rtype, "")
        if ref not in old:
            counts["create"] += 1
            others.append(ResourceChange("create", rtype, name, ""))
            continue
        if ref not in new:
            counts["delete"] += 1
            listed.append(ResourceChange("delete", rtype, name, stateful))
            continue
        before, after = old[ref], new[ref]
        reasons: list[str] = []
        if (before.get("parent") or "") != (after.get("parent") or ""):
            reasons.append(
                f"parent changed ({before.get('parent')} → {after.get('parent')}): the URN "
                "changes; add an alias to keep the resource"
            )
        if (before.get("provider") or "") != (after.get("provider") or ""):
            reasons.append(f"provider changed ({before.get('provider')} → {after.get('provider')})")
        diffs = changed_paths(before.get("inputs") or {}, after.get("inputs") or {})
        reasons.extend(_reasons(rtype, diffs))
        options = (before.get("options") or {}, after.get("options") or {})
        reasons.extend(f"{path}: {why}" for path, why in trigger_reasons(rtype, *options))
        if reasons:
            counts["replace"] += 1
            forcing = {path for path, _ in replacing_paths(rtype, diffs)}
            also, more = _limited(readable([d for d in diffs if d[0] not in forcing]))
            listed.append(
                ResourceChange("replace", rtype, name, stateful, tuple(reasons), tuple(also), more)
            )
        elif diffs or any(before.get(k) != after.get(k) for k in ("dependencies", "options")):
            counts["update"] += 1
            others.append(_update(rtype, name, before, after))
        else:
            counts["same"] += 1
    listed.sort(key=lambda r: (not r.stateful, r.action, r.type, r.name))
    others.sort(key=lambda r: (r.action, r.type, r.name))
    return dict(counts), listed, others


def not_previewed(base: dict[str, Any]) -> StackDiff:
    """A stack with a base plan and none in the head because the head previewed only the
    stacks a change touches (`--changed-since`): unchanged, not removed (issue 23 #6)."""
    counts = {"create": 0, "update": 0, "replace": 0, "delete": 0, "same": 0}
    return StackDiff(
        stack=str(base.get("stack") or ""),
        kind=str(base.get("kind") or ""),
        status=NOT_PREVIEWED,
        counts=counts,
        teams=[],
        capacity=Capacity(),
        storage=[],
        jobs=[],
        policy=Policy(False, note="not previewed"),
        resources=[],
        outputs_changed=[],
    )


def diff_plans(base: dict[str, Any], head: dict[str, Any]) -> StackDiff:
    """The semantic diff of one stack's base and head plans."""
    stack = str(head.get("stack") or base.get("stack") or "")
    kind = str(head.get("kind") or base.get("kind") or "")
    counts, resources, created_updated = resource_changes(base, head)
    outputs_before, outputs_after = base.get("outputs") or {}, head.get("outputs") or {}
    outputs_changed = sorted(
        k
        for k in set(outputs_before) | set(outputs_after)
        if outputs_before.get(k, ABSENT) != outputs_after.get(k, ABSENT)
    )
    status = "changed"
    if not base["resources"] and head["resources"]:
        status = "added"
    elif base["resources"] and not head["resources"]:
        status = "removed"
    diff = StackDiff(
        stack=stack,
        kind=kind,
        status=status,
        counts=counts,
        teams=_entries(
            team_view(base), team_view(head), ("group", "quota (guaranteed GPUs)", "pools")
        ),
        capacity=capacity_section(base, head),
        storage=storage_section(
            base, head, {f"{r.type.rsplit(':', 1)[-1]} {r.name}" for r in resources}
        ),
        jobs=jobs_section(base, head),
        policy=policy_section(base, head),
        resources=resources,
        outputs_changed=outputs_changed,
        groups=_entries(group_view(base), group_view(head), ("quota (guaranteed GPUs)",)),
        access=access_section(base, head),
        created_updated=created_updated,
    )
    if status == "changed" and not diff.has_changes:
        diff.status = "unchanged"
    return diff
