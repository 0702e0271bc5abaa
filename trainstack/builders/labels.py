"""Label and annotation keys: one prefix, one place. A documented contract."""

from __future__ import annotations

from typing import Any

PREFIX = "trainstack.io"

TEAM = f"{PREFIX}/team"
GROUP = f"{PREFIX}/group"
STACK = f"{PREFIX}/stack"
POOL = f"{PREFIX}/pool"
JOB = f"{PREFIX}/job"
FABRIC = f"{PREFIX}/fabric"
ROLE = f"{PREFIX}/role"
OWNERS = f"{PREFIX}/owners"  # annotation: comma-separated owner emails
# annotation on team namespaces: priority classes (short names) the team may use
TEAM_PRIORITY_ANNOTATION = f"{PREFIX}/priority-classes"
TEAM_MAX_JOB_HOURS_ANNOTATION = f"{PREFIX}/max-job-hours"  # annotation on team namespaces
# annotation on team namespaces: the GPU pools (names) the team's pods may pin
TEAM_POOLS_ANNOTATION = f"{PREFIX}/pools"

MANAGED_BY = "app.kubernetes.io/managed-by"
PART_OF = "app.kubernetes.io/part-of"
MANAGER = "trainstack"


def base_labels(stack: str) -> dict[str, str]:
    """Labels on every Kubernetes object trainstack creates."""
    return {MANAGED_BY: MANAGER, PART_OF: "trainstack", STACK: stack}


APP_NAME = "app.kubernetes.io/name"


def app_metadata(stack: str, app: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """Metadata of one of the platform's own workloads' objects: its name (and namespace),
    the stack's labels and `app.kubernetes.io/name: <app>`."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {**base_labels(stack), APP_NAME: app}
    return meta


def aws_tags(stack: str, extra: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Tags on every AWS resource (through the provider's default tags)."""
    tags = {"trainstack:stack": stack, "trainstack:managed-by": MANAGER}
    tags.update(dict(extra))
    return tags
