"""Reading the live objects `diagnose` needs, as the caller (a team member or an admin).

A team member's Role (builders/teams.py `member_role`) reads Volcano Jobs, PodGroups, pods and
events of the team's namespace and nothing cluster-scoped: nodes and queues are then `None`
in `Live`, named in `unreadable`, and the diagnosis says what it could not check. Anything else
forbidden is an error with one message naming what is missing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from trainstack import outputs as out
from trainstack.explain.diagnose import events_about
from trainstack.explain.model import Live, Obj, Platform, Pool
from trainstack.kube import ApiError, Identity, Kube

JOB = ("batch.volcano.sh/v1alpha1", "Job")
PODGROUP = ("scheduling.volcano.sh/v1beta1", "PodGroup")
QUEUE = ("scheduling.volcano.sh/v1beta1", "Queue")
JOB_NAME_LABEL = "volcano.sh/job-name"  # Volcano's label on a job's pods


class ExplainError(Exception):
    """A user error: one message naming what to fix."""


class JobNotFound(ExplainError):
    """No such Volcano Job (it may have been refused at admission, or deleted)."""


class Reader:
    """GETs as one identity (impersonated when `as_` is given, as `kubectl --as`)."""

    def __init__(self, kube: Kube, as_: Identity | None = None) -> None:
        self.kube = kube
        self.as_ = as_

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
    ) -> list[dict[str, Any]]:
        return self.kube.list(
            api_version, kind, namespace, labels=labels, fields=fields, as_=self.as_
        )

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.kube.get(api_version, kind, name, namespace, as_=self.as_)
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found


def _forbidden(what: str, namespace: str | None, error: ApiError) -> ExplainError:
    where = f" in namespace {namespace}" if namespace else ""
    return ExplainError(
        f"not allowed to read {what}{where} ({error.status} {error.reason}): use a kubeconfig "
        "of a member of the job's team (group trainstack:team:<team>) or pass the team's "
        "--namespace"
    )


def read_job(reader: Reader, namespace: str, name: str) -> dict[str, Any]:
    try:
        job = reader.get(*JOB, name, namespace)
    except ApiError as error:
        if error.status in (401, 403):
            raise _forbidden("Volcano Jobs", namespace, error) from None
        raise
    if job is None:
        raise JobNotFound(
            f"no Volcano Job {name} in namespace {namespace}: check the name and --namespace "
            "(`trainstack status` lists the team's jobs); a job refused at admission was never "
            "created: pass its manifest with --file to see the rule"
        )
    return job


def _optional(reader: Reader, what: str, unreadable: list[str], **kw: Any) -> list[Obj] | None:
    api_version, kind = {"nodes": ("v1", "Node"), "queues": QUEUE, "pods": ("v1", "Pod")}[what]
    try:
        return list(reader.list(api_version, kind, **kw))
    except ApiError as error:
        if error.status in (401, 403):
            unreadable.append(f"{'all ' if what == 'pods' else ''}{what} (forbidden)")
            return None
        raise


def read_live(reader: Reader, namespace: str, name: str, now: float | None = None) -> Live:
    """The job and what surrounds it; cluster-scoped reads degrade to `None` when forbidden."""
    job = read_job(reader, namespace, name)
    uid = job["metadata"].get("uid")
    try:
        groups = reader.list(*PODGROUP, namespace)
        pods = reader.list("v1", "Pod", namespace, labels=f"{JOB_NAME_LABEL}={name}")
        events = reader.list("v1", "Event", namespace)
    except ApiError as error:
        if error.status in (401, 403):
            raise _forbidden("PodGroups, pods and events", namespace, error) from None
        raise
    podgroup = next(
        (
            g
            for g in groups
            if any(r.get("uid") == uid for r in g["metadata"].get("ownerReferences") or [])
        ),
        None,
    )
    names = {name, *(p["metadata"]["name"] for p in pods)}
    if podgroup is not None:
        names.add(podgroup["metadata"]["name"])
    unreadable: list[str] = []
    queues = _optional(reader, "queues", unreadable)
    nodes = _optional(reader, "nodes", unreadable)
    node_pods = (
        _optional(reader, "pods", unreadable, fields="spec.nodeName!=")
        if nodes is not None
        else None
    )
    return Live(
        job=job,
        podgroup=podgroup,
        pods=tuple(pods),
        events=events_about(events, names),
        queues=tuple(queues) if queues is not None else None,
        nodes=tuple(nodes) if nodes is not None else None,
        node_pods=tuple(node_pods) if node_pods is not None else None,
        now=time.time() if now is None else now,
        unreadable=tuple(unreadable),
    )


def platform_facts(outputs: Mapping[str, Any], team: str) -> Platform:
    """What the platform's stack outputs say about `team` and the pools (outputs.py)."""
    pools = tuple(
        Pool(
            name=str(p["name"]),
            node_selector=dict(p.get("nodeSelector") or {}),
            max_nodes=int(p.get("maxNodes", 0)),
            gpus_per_node=int(p.get("gpusPerNode", 0)),
        )
        for p in outputs.get(out.GPU_POOLS) or []
    )
    slice_ = out.team_slice(outputs, team) or {}
    hours = slice_.get("maxJobHours")
    return Platform(
        team=team,
        queue=str((slice_.get("scheduling") or {}).get("queue") or ""),
        max_job_hours=float(hours) if hours else None,
        pools=pools,
    )


def team_namespace(outputs: Mapping[str, Any], team: str) -> str:
    namespaces = outputs.get(out.TEAM_NAMESPACES) or {}
    if namespaces and team not in namespaces:
        known = ", ".join(sorted(namespaces))
        raise ExplainError(f"the platform has no team {team}; its teams: {known}")
    return str(namespaces.get(team, team))
