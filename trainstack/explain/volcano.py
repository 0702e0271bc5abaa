"""Reading what Volcano and the API server write, in their own words (no guessing at strings).

Sources, at the versions the platform pins (Volcano v1.15.1, which builds its predicates from
k8s.io/kubernetes v1.35.3; the API server v1.37.2):

- The gang plugin sets the PodGroup condition `Unschedulable` (reason `NotEnoughResources`)
  with the message ``"%v/%v tasks in gang unschedulable: %v"`` (pkg/scheduler/plugins/gang/
  gang.go OnSessionClose), and the scheduler cache records the same text as a Warning event
  `Unschedulable` on the PodGroup (pkg/scheduler/cache/cache.go RecordJobStatusEvent). The
  tail is `JobInfo.FitError` (pkg/scheduler/api/job_info.go): ``pod group is not ready, 2
  Pending, 2 minAvailable; Pending: 2 Unschedulable. Origin reason is <task>: <FitErrors>``.
- `FitErrors.Error` (pkg/scheduler/api/unschedule_info.go) is ``0/N nodes are unavailable:
  <count> <reason>, ….`` (sorted), optionally prefixed ``In hyperNode <name>: ``. The reasons
  come first from allocate's own resource check, ``Insufficient <first short resource>``
  (actions/allocate/allocate.go predicate, api WrapInsufficientResourceReason), then from
  kube-scheduler's filters: ``Insufficient <resource>`` (noderesources/fit.go),
  ``node(s) didn't match Pod's node affinity/selector`` (nodeaffinity), ``node(s) had
  untolerated taint(s)`` (tainttoleration, v1.35.3: no key; older releases named it),
  ``node(s) were unschedulable`` (nodeunschedulable).
- When a queue has no room, allocate skips the task without a fit error (actions/allocate/
  allocate.go, ``Queue <%s> is overused``): the condition then has no origin reason, so the
  queue arithmetic here does the explaining. With the `enqueue` action, the capacity and
  proportion plugins record an event ``queue resource quota insufficient: insufficient <r>``
  (plugins/capacity/capacity.go, plugins/proportion/proportion.go; util FormatResourceNames).
- The job controller records `FailedCreate` on the Job, ``Error creating pods: [failed to create
  pod <name>, err: <the API error>]`` (pkg/controllers/job/job_controller_actions.go), and the
  API server words a refusal by a ValidatingAdmissionPolicy ``ValidatingAdmissionPolicy '<p>'
  with binding '<b>' denied request: <message>`` (k8s.io/apiserver v0.37.2
  pkg/admission/plugin/policy/validating/dispatcher.go).
- The scheduler writes each queue's `status.allocated` (pkg/scheduler/framework/session.go).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from trainstack.explain.model import Obj

GANG = re.compile(r"(?P<short>\d+)/(?P<total>\d+) tasks in gang unschedulable: (?P<rest>.*)", re.S)
FIT = re.compile(
    r"(?:In hyperNode (?P<hypernode>\S+): )?0/(?P<nodes>\d+) nodes are unavailable: (?P<reasons>.*)"
)
REASON_ITEM = re.compile(r"(?P<count>\d+) (?P<what>.+)")
DENIED = re.compile(
    r"ValidatingAdmissionPolicy '(?P<policy>[^']+)' with binding '[^']*' denied request: "
    r"(?P<message>.*?)(?:\\+\"|\"|$)",
    re.S,
)
WEBHOOK_DENIED = re.compile(
    r"admission webhook \\*\"(?P<webhook>[^\"\\]+)\\*\" denied the request: "
    r"(?P<message>.*?)(?:\\+\"|\"|$)",
    re.S,
)

INSUFFICIENT = "Insufficient "
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
TAINT = "node(s) had untolerated taint"
UNSCHEDULABLE_NODE = "node(s) were unschedulable"


@dataclass(frozen=True)
class FitErrors:
    """One `FitErrors.Error` text, split: nodes considered and the count of each reason."""

    nodes: int
    reasons: dict[str, int]
    text: str

    def insufficient(self) -> dict[str, int]:
        """resource -> how many nodes lack it."""
        return {
            k.removeprefix(INSUFFICIENT): v
            for k, v in self.reasons.items()
            if k.startswith(INSUFFICIENT)
        }

    def count(self, prefix: str) -> int:
        return sum(v for k, v in self.reasons.items() if k.startswith(prefix))


def fit_errors(message: str) -> FitErrors | None:
    """The node histogram in a gang message or event, if the scheduler recorded one."""
    match = FIT.search(message)
    if match is None:
        return None
    reasons: dict[str, int] = {}
    for item in match["reasons"].rstrip().rstrip(".").split(", "):
        found = REASON_ITEM.fullmatch(item.strip())
        if found:
            reasons[found["what"]] = reasons.get(found["what"], 0) + int(found["count"])
    return FitErrors(int(match["nodes"]), reasons, match.group(0).strip())


def unschedulable_message(podgroup: Obj | None, events: Iterable[Obj]) -> str:
    """The newest gang message: the PodGroup's `Unschedulable` condition, else its event."""
    if podgroup is not None:
        for condition in podgroup.get("status", {}).get("conditions") or []:
            if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
                return str(condition.get("message", ""))
    newest = ""
    stamp = ""
    for event in events:
        if event.get("reason") == "Unschedulable" and _about(event, "PodGroup"):
            when = str(event.get("lastTimestamp") or event.get("eventTime") or "")
            if when >= stamp:
                newest, stamp = str(event.get("message", "")), when
    return newest


def _about(event: Obj, kind: str) -> bool:
    return str(event.get("involvedObject", {}).get("kind", "")) == kind


@dataclass(frozen=True)
class Denial:
    policy: str
    message: str


def denials(text: str) -> list[Denial]:
    """Admission refusals named in an API error or a `FailedCreate` event's message."""
    found = [Denial(m["policy"], _unescape(m["message"])) for m in DENIED.finditer(text)]
    found += [Denial(m["webhook"], _unescape(m["message"])) for m in WEBHOOK_DENIED.finditer(text)]
    return found


def _unescape(text: str) -> str:
    return text.replace('\\"', '"').replace("\\'", "'").strip()


def failed_creates(events: Iterable[Obj]) -> list[str]:
    """Messages of the job controller's `FailedCreate` events on the Job, newest last."""
    chosen = [e for e in events if e.get("reason") == "FailedCreate" and _about(e, "Job")]
    chosen.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return [str(e.get("message", "")) for e in chosen]
