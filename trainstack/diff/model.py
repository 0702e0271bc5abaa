"""The diff report's data: per stack, what changed for teams, capacity, storage, jobs, policy
and resources. Pure data; built by report.py and sections.py, rendered by render.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainstack.diff.access import AccessChange
from trainstack.diff.capacity import Check
from trainstack.diff.plans import Change
from trainstack.policy.objects import Violation

NOT_PREVIEWED = "not-previewed"  # no head plan: not in the head's changed set


@dataclass
class Entry:
    """A team, pool, storage resource or job: added, removed or changed, with its changes."""

    key: str
    status: str  # added | removed | changed | replaced (storage)
    changes: list[Change] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    more: int = 0  # changes left out


@dataclass(frozen=True)
class DataPath:
    """A changed path between storage and data: what a file system imports from S3 or exports
    to it, where a team's volume points, whether it is still read-only."""

    resource: str  # kind and name
    action: str  # update | replace
    field: str
    before: Any
    after: Any
    note: str  # what it means: wider, elsewhere, writable


@dataclass
class Capacity:
    pools: list[Entry] = field(default_factory=list)
    totals: list[Change] = field(default_factory=list)  # every capacity summary key
    checks: list[Check] = field(default_factory=list)

    @property
    def over(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


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
    # A created resource that is another team's or pool's renamed: `team speech (as recsys's)`
    twin: str = ""
    forcing: tuple[str, ...] = ()  # a replacement's inputs that force it (raw paths)
    # An update of dependencies alone: the engine diffs inputs, so it updates nothing in the
    # cloud and only records the new order (pulumi step_generator.go: a "same" step).
    only_dependencies: bool = False


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
    data_paths: list[DataPath] = field(default_factory=list)

    @property
    def widened(self) -> list[AccessChange]:
        """Changed grants that now allow more (access.widened)."""
        return [a for a in self.access if a.widened]

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
