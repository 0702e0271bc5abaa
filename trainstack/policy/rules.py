"""The platform's rules, each a small named function over a resource's properties.

Per-resource rules over Volcano Jobs and AWS inputs live here; Pod Security's in
pod_security.py, the stack-wide ones in stack_rules.py, and what they all read in objects.py.
`policy/admission.py` renders the Kubernetes rules as CEL for in-cluster admission; tests check
the two agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainstack.policy.objects import (
    ADDON,
    VOLCANO_JOB,
    Config,
    Level,
    as_map,
    as_seq,
    containers,
    is_device,
    pods,
    quantity,
)
from trainstack.policy.pod_security import hardened_pods, no_privileged

CHECKPOINT_PATH = "/checkpoints"
CHECKPOINT_ENV = ("TRAINSTACK_CHECKPOINT_INTERVAL_S", "TRAINSTACK_CHECKPOINT_EVERY")
MAX_DURATION_ANNOTATION = "trainstack.io/max-duration-seconds"
GPU_TAINT_KEY = "nvidia.com/gpu"
POOL_LABEL = "trainstack.io/pool"  # builders/labels.POOL (config never imports builders)
# A tag (never :latest, checked apart) or a full sha256 digest. The name part has no `@`, so
# `name@sha256:abc` is not read as the tag `abc`. Shared by the job spec, this rule and its
# CEL admission policy (RE2 accepts it as is).
PINNED_IMAGE = re.compile(r"^[^@\s]+(@sha256:[a-f0-9]{64}|:[^/:@\s]+)$")
DIGEST = re.compile(r"^[^@\s]+@sha256:[a-f0-9]{64}$")
# Tags that name a branch or a channel, not a build: they move under a running job (a restart
# pulls other code). Any tag can be re-pushed; production therefore takes digests only.
MOVING_TAGS = ("latest", "main", "master", "head", "trunk", "dev", "develop", "nightly", "edge",
               "stable", "canary")  # fmt: skip
MOVING_TAG = re.compile(r"^[^@]*:(" + "|".join(MOVING_TAGS) + r")$")


def pin_required(production: bool) -> str:
    """What `is_pinned` asks of an image, in words, for messages."""
    return "a digest (production)" if production else "a build tag or a digest"


def is_pinned(image: str, *, production: bool = False) -> bool:
    """Pinned: by a digest; outside production also by a tag that names a build (not one of
    MOVING_TAGS). One definition for the job spec, the rule and its CEL twin."""
    # fullmatch: `$` alone would also match before a final newline, where RE2 (CEL) does not.
    if DIGEST.fullmatch(image):
        return True
    return (
        not production and bool(PINNED_IMAGE.fullmatch(image)) and not MOVING_TAG.fullmatch(image)
    )


# -- the rules ------------------------------------------------------------------------------

Check = Callable[[Mapping[str, Any], Config], list[str]]


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    remediation: str
    resource_types: tuple[str, ...]
    check: Check
    level: Level = "mandatory"


def request_limit_ratio(job: Mapping[str, Any], cfg: Config) -> list[str]:
    found = []
    for task, pod in pods(job):
        for c in containers(pod):
            res = as_map(c.get("resources"))
            requests, limits = as_map(res.get("requests")), as_map(res.get("limits"))
            for name, bound in (
                ("cpu", cfg.max_cpu_limit_request_ratio),
                ("memory", cfg.max_memory_limit_request_ratio),
            ):
                if name in requests and name in limits:
                    ratio = quantity(limits[name]) / quantity(requests[name])
                    if ratio > bound + 1e-9:
                        found.append(
                            f"task {task}, container {c.get('name')}: {name} limit/request "
                            f"{ratio:g} exceeds {bound:g}"
                        )
    return found


def devices_requests_equal_limits(job: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    found = []
    for task, pod in pods(job):
        for c in containers(pod):
            res = as_map(c.get("resources"))
            requests, limits = as_map(res.get("requests")), as_map(res.get("limits"))
            for name in sorted({*requests, *limits}):
                if not is_device(name):
                    continue
                if (
                    name not in requests
                    or name not in limits
                    or quantity(requests[name]) != quantity(limits[name])
                ):
                    found.append(
                        f"task {task}, container {c.get('name')}: {name} request "
                        f"{requests.get(name)} != limit {limits.get(name)}"
                    )
    return found


def max_duration(job: Mapping[str, Any], cfg: Config) -> list[str]:
    meta = as_map(job.get("metadata"))
    raw = as_map(meta.get("annotations")).get(MAX_DURATION_ANNOTATION)
    team = str(meta.get("namespace", ""))
    limit_h = cfg.team_max_duration_hours.get(team, cfg.max_duration_hours)
    if raw is None:
        return [
            f"no {MAX_DURATION_ANNOTATION} annotation: every training job needs a maximum duration"
        ]
    try:
        seconds = float(raw)
    except ValueError:
        return [f"{MAX_DURATION_ANNOTATION}={raw!r} is not a number of seconds"]
    if seconds <= 0 or seconds > limit_h * 3600:
        return [
            f"maximum duration {seconds / 3600:g}h is outside (0, {limit_h:g}h] "
            f"for team {team or '?'}"
        ]
    return []


def checkpoint_volume(job: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    found = []
    for task, pod in pods(job):
        volumes = {str(as_map(v).get("name")): as_map(v) for v in as_seq(pod.get("volumes"))}
        main = as_map(next(iter(as_seq(pod.get("containers"))), None))
        mounts = [as_map(m) for m in as_seq(main.get("volumeMounts"))]
        mount = next((m for m in mounts if m.get("mountPath") == CHECKPOINT_PATH), None)
        if mount is None:
            found.append(f"task {task}: nothing is mounted at {CHECKPOINT_PATH}")
        elif "persistentVolumeClaim" not in volumes.get(str(mount.get("name")), {}):
            found.append(f"task {task}: {CHECKPOINT_PATH} is not a persistent volume claim")
        env = {str(as_map(e).get("name")): as_map(e).get("value") for e in as_seq(main.get("env"))}
        intervals = [env[k] for k in CHECKPOINT_ENV if k in env]
        if not any(str(v).isdigit() and int(str(v)) > 0 for v in intervals):
            found.append(f"task {task}: no checkpoint interval ({' or '.join(CHECKPOINT_ENV)})")
    return found


def pinned_images(job: Mapping[str, Any], cfg: Config) -> list[str]:
    found = []
    for task, pod in pods(job):
        for c in containers(pod):
            image = str(c.get("image", ""))
            if not is_pinned(image, production=cfg.production):
                pin = pin_required(cfg.production)
                found.append(f"task {task}: image {image!r} is not pinned by {pin}")
            elif cfg.allowed_registries and not any(
                image.startswith(r) for r in cfg.allowed_registries
            ):
                allowed = ", ".join(cfg.allowed_registries)
                found.append(
                    f"task {task}: image {image!r} is not from an allowed registry "
                    f"(allowed: {allowed})"
                )
    return found


def wants_gpu(pod: Mapping[str, Any]) -> bool:
    return any(
        GPU_TAINT_KEY in as_map(as_map(c.get("resources")).get("limits")) for c in containers(pod)
    )


def tolerates_gpu(pod: Mapping[str, Any]) -> bool:
    """The pod tolerates the GPU pools' NoSchedule taint: by its key, or by a toleration
    without a key and operator Exists, which tolerates every taint (core/v1 Toleration)."""
    for t in (as_map(x) for x in as_seq(pod.get("tolerations"))):
        if t.get("effect") not in (None, "", "NoSchedule"):
            continue
        key = t.get("key")
        if key == GPU_TAINT_KEY or (key in (None, "") and t.get("operator") == "Exists"):
            return True
    return False


def _selects_pool(
    labels_of: Callable[[str], Sequence[str] | None], selectors: Sequence[Mapping[str, str]]
) -> bool:
    """`labels_of(key)` gives the values a placement allows for a label key (None: any)."""
    if not selectors:
        values = labels_of(POOL_LABEL)
        return values is not None and len(values) > 0
    return any(all(labels_of(k) == [v] for k, v in selector.items()) for selector in selectors)


def targets_pool(pod: Mapping[str, Any], selectors: Sequence[Mapping[str, str]]) -> bool:
    """The pod's nodeSelector, or every term of its required node affinity, pins one of the
    pools by the pool's own labels (`In` with exactly that value)."""
    selector = as_map(pod.get("nodeSelector"))
    if _selects_pool(lambda k: [str(selector[k])] if k in selector else None, selectors):
        return True
    required = as_map(as_map(as_map(pod.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ))  # fmt: skip
    terms = [as_map(t) for t in as_seq(required.get("nodeSelectorTerms"))]

    def term_selects(term: Mapping[str, Any]) -> bool:
        def values(key: str) -> list[str] | None:
            for e in (as_map(x) for x in as_seq(term.get("matchExpressions"))):
                if e.get("key") == key and e.get("operator") == "In":
                    return [str(v) for v in as_seq(e.get("values"))]
            return None

        return _selects_pool(values, selectors)

    return bool(terms) and all(term_selects(t) for t in terms)


def gpu_placement(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """GPU pods tolerate the GPU taint and pin one of their team's pools by its labels (issue
    19 #5: any node selector passed; issue 37: any pool of the platform did, while a team may
    be confined to some); a pod without GPUs tolerates the taint only as part of a job that
    has GPU pods (its parameter servers run beside the workers, on the same fabric)."""
    found = []
    all_pods = list(pods(job))
    gpu_job = any(wants_gpu(p) for _, p in all_pods)
    selectors = cfg.team_pool_selectors(str(as_map(job.get("metadata")).get("namespace", "")))
    for task, pod in all_pods:
        if not wants_gpu(pod):
            if tolerates_gpu(pod) and not gpu_job:
                found.append(
                    f"task {task}: requests no GPUs but tolerates the {GPU_TAINT_KEY} taint, in "
                    "a job without GPU tasks (a CPU job would hold GPU nodes)"
                )
            continue
        if not tolerates_gpu(pod):
            found.append(
                f"task {task}: requests GPUs but does not tolerate the {GPU_TAINT_KEY} taint"
            )
        if not targets_pool(pod, selectors):
            pools = (
                "; ".join(", ".join(f"{k}={v}" for k, v in sorted(s.items())) for s in selectors)
                or f"{POOL_LABEL}=<pool>"
            )
            found.append(
                f"task {task}: requests GPUs but does not pin one of its team's GPU pools by "
                f"its labels (nodeSelector or every required node affinity term; pools: {pools})"
            )
    return found


def own_queue(job: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    queue = as_map(job.get("spec")).get("queue")
    namespace = as_map(job.get("metadata")).get("namespace")
    if queue != namespace:
        return [f"queue {queue!r} is not the team's own queue {namespace!r}"]
    return []


# The team's claims on the shared file system (builders/storage): since issue 37 each is a
# volume of its own, rooted at the team's directory (checkpoints) or at the datasets, so no
# sub-path, symlink or `..` a member can name reaches another team: the kubelet resolves a
# sub-path on the host and refuses a result outside the volume (k8s.io/kubernetes v1.37.2
# pkg/volume/util/subpath/subpath_linux.go doBindSubPath, safeOpenSubPath). What a rule
# still says: datasets are mounted read-only (the datasets PV's mountOptions make the Lustre
# mount `ro` whatever a pod says; this keeps the pod honest about it).
DATASETS_CLAIM = "datasets"  # builders/storage.DATASETS_CLAIM
# The node cache agent's CSI driver (builders/storage.CACHE_DRIVER): the only driver whose
# inline volumes a team pod may name. An inline volume of a Lustre or EFS driver would mount
# whatever its attributes say (fsx.csi.aws.com v1.9.0 pkg/driver/node.go NodePublishVolume
# builds the source from volume_context alone); their CSIDriver objects allow only Persistent
# volumes today (the API server's default, k8s v1.37.2 pkg/apis/storage/v1/defaults.go), and
# this rule does not rest on that staying so.
CACHE_DRIVER = "cache.trainstack.io"


def pod_volumes(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 37: a pod mounts only what the platform gives its team. Inline CSI volumes of the
    cache driver alone, read-only (the agent refuses a writable publish too); no generic
    ephemeral volumes, whose claim the ephemeral-volume controller creates from the pod's
    template verbatim, any storage class, `volumeName` or `dataSource` (k8s v1.37.2
    pkg/controller/volume/ephemeral/controller.go handleVolume); the datasets claim
    read-only, in the volume and in every mount of it."""
    del cfg
    found = []
    for task, pod in pods(job):
        datasets = set()
        for v in (as_map(x) for x in as_seq(pod.get("volumes"))):
            name = v.get("name")
            if "ephemeral" in v:
                found.append(
                    f"task {task}: volume {name} is a generic ephemeral volume (it creates a "
                    "claim from any spec)"
                )
            if "csi" in v:
                csi = as_map(v.get("csi"))
                if csi.get("driver") != CACHE_DRIVER:
                    found.append(
                        f"task {task}: volume {name} is an inline volume of driver "
                        f"{csi.get('driver')!r}; only {CACHE_DRIVER} is allowed"
                    )
                elif csi.get("readOnly") is not True:
                    found.append(f"task {task}: cache volume {name} is not readOnly: true")
            claim = as_map(v.get("persistentVolumeClaim"))
            if claim.get("claimName") == DATASETS_CLAIM:
                datasets.add(str(name))
                if claim.get("readOnly") is not True:
                    found.append(
                        f"task {task}: volume {name} mounts the {DATASETS_CLAIM} claim "
                        "without readOnly: true"
                    )
        for c in containers(pod):
            for m in (as_map(x) for x in as_seq(c.get("volumeMounts"))):
                if str(m.get("name")) in datasets and m.get("readOnly") is not True:
                    found.append(
                        f"task {task}: {c.get('name')} mounts the {DATASETS_CLAIM} claim at "
                        f"{m.get('mountPath')} without readOnly: true"
                    )
    return found


def job_volumes(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 37 #2: Volcano mounts every entry of a Job's `spec.volumes` read-write into every
    container, without a sub-path, and creates a claim from a `volumeClaim` entry's spec as
    it stands (v1.15.1 pkg/controllers/job/job_controller_util.go createJobPod;
    job_controller_actions.go createJobIOIfNotExist, createPVC): a member could create
    claims with any class, `volumeName` or `dataSource`. The job layer never uses them."""
    del cfg
    volumes = as_seq(as_map(job.get("spec")).get("volumes"))
    if volumes:
        names = [str(as_map(v).get("volumeClaimName") or "a new claim") for v in volumes]
        return [f"spec.volumes mounts {', '.join(names)} into every container; not allowed"]
    return []


# Keys Volcano's controller and scheduler read from a Job's, its PodGroup's and its pods'
# labels and annotations (v1.15.1: pkg/scheduler/api/pod_info.go GetPodPreemptable,
# job_info.go SetPodGroup and NewTaskInfo; pkg/controllers/job/job_controller_util.go
# createJobPod, which copies the Job's preemptable, cooldown-time, revocable-zone and jdb-*
# annotations onto every pod it creates, at each creation; job_controller_actions.go
# createOrUpdatePodGroup, which gives the PodGroup all of the Job's labels and annotations).
# `volcano.sh/preemptable: "false"` (or any value that does not parse) takes a job's pods off
# every preempt and reclaim victim list, so borrowed GPUs are never returned. A team sets
# none of them: the platform schedules through queues and priority classes. By prefix, so
# that a key a later Volcano reads is refused too; `sla-waiting-time` is also read bare
# (api/job_info.go).
SCHEDULING_KEY_PREFIXES = ("volcano.sh/", "scheduling.volcano.sh/", "scheduling.k8s.io/")
SCHEDULING_KEYS = ("sla-waiting-time",)


def reserved_key(key: str) -> bool:
    return key.startswith(SCHEDULING_KEY_PREFIXES) or key in SCHEDULING_KEYS


def _metadata_keys(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        (kind, str(key))
        for kind in ("labels", "annotations")
        for key in as_map(meta.get(kind))
        if reserved_key(str(key))
    ]


def scheduling_keys(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 37 #3: no Volcano scheduling key on the Job or its task templates."""
    del cfg
    found = [
        f"the job's {kind} carry {key}, which Volcano reads to schedule or preempt"
        for kind, key in _metadata_keys(as_map(job.get("metadata")))
    ]
    for task in (as_map(t) for t in as_seq(as_map(job.get("spec")).get("tasks"))):
        meta = as_map(as_map(task.get("template")).get("metadata"))
        found += [
            f"task {task.get('name', '?')}: template {kind} carry {key}, which Volcano reads "
            "to schedule or preempt"
            for kind, key in _metadata_keys(meta)
        ]
    return found


# The job plugins and arguments the job layer renders (jobs/render.py job_spec), nothing
# else. Volcano validates plugin names, never their arguments (v1.15.1 pkg/webhooks/
# admission/jobs/validate/admit_job.go validateJobCreate). What the others would open:
# `ssh` rewrites any Secret `<job>-ssh` of the namespace and mounts member-chosen keys;
# `svc` without --disable-network-policy adopts a NetworkPolicy named like the job and
# deletes it when the job ends, whoever made it (pkg/controllers/job/plugins/svc/svc.go
# OnJobAdd, OnJobDelete), so two jobs named like the team's policies would lift them;
# pytorch's --wait-master-image adds an init container of any image (plugins/pytorch);
# mpi brings ssh with it (the mutating webhook adds it, mutate_job.go).
VOLCANO_SCHEDULER = "volcano"
SVC_PLUGIN_ARGS = ("--disable-network-policy=true",)  # builders/scheduling.SVC_PLUGIN_ARGS
PYTORCH_ARG = re.compile(r"--(master|worker|port)=.+")  # each at most once
PLUGINS = ("env", "pytorch", "svc")


def plugin_args_ok(name: str, args: Sequence[object]) -> bool:
    if name == "env":
        return len(args) == 0
    if name == "svc":
        return list(args) == list(SVC_PLUGIN_ARGS)
    if name == "pytorch":
        keys = [str(a).split("=", 1)[0] for a in args]
        return all(isinstance(a, str) and PYTORCH_ARG.fullmatch(a) for a in args) and len(
            keys
        ) == len(set(keys))
    return False


def job_plugins(job: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    found = []
    plugins = as_map(as_map(job.get("spec")).get("plugins"))
    for name, raw in plugins.items():
        args = list(as_seq(raw))
        if name not in PLUGINS:
            found.append(f"plugin {name!r} is not allowed (allowed: {', '.join(PLUGINS)})")
        elif not plugin_args_ok(str(name), args):
            allowed = {
                "env": "none",
                "svc": " ".join(SVC_PLUGIN_ARGS),
                "pytorch": "--master=, --worker=, --port=, each once",
            }[str(name)]
            found.append(f"plugin {name} has arguments {args!r}; allowed: {allowed}")
    return found


def volcano_scheduled(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """The job's pods are scheduled by Volcano, in the job's queue, at the job's priority.

    Volcano's job controller gives a pod the template's schedulerName and priorityClassName
    when set, the job's otherwise (v1.15.1 pkg/controllers/job/job_controller_util.go
    createJobPod); its mutating webhook sets an empty job schedulerName to `volcano`
    (mutate_job.go). A template naming another scheduler would run pods outside the team's
    queue, which is the only GPU quota a team namespace has (builders/teams.resource_quota).
    A template `nodeName` skips scheduling altogether (issue 37 #3): the pod lands on that
    node, past the queue, the gang and the GPU taint, and still counts in the queue
    (api/job_info.go NewTaskInfo takes it as bound). The job's priority class sets its
    PodGroup's priority (job_controller_actions.go createOrUpdatePodGroup, also on UPDATE;
    cache.go Snapshot): only the team's classes (its registry entry).
    """
    found = []
    spec = as_map(job.get("spec"))
    name = spec.get("schedulerName", "")
    if name not in ("", VOLCANO_SCHEDULER):
        found.append(f"schedulerName {name!r} bypasses the team's queue")
    team = str(as_map(job.get("metadata")).get("namespace", ""))
    allowed = cfg.team_priority_classes.get(team)
    priority = spec.get("priorityClassName", "")
    if priority not in ("", None) and allowed is not None and priority not in allowed:
        found.append(
            f"priorityClassName {priority!r} is not one of team {team}'s classes "
            f"({', '.join(allowed) or 'none'})"
        )
    for task, pod in pods(job):
        name = pod.get("schedulerName", "")
        if name not in ("", VOLCANO_SCHEDULER):
            found.append(f"task {task}: schedulerName {name!r} bypasses the team's queue")
        if pod.get("priorityClassName", "") != "":
            found.append(f"task {task}: priorityClassName overrides the job's priority class")
        if pod.get("nodeName", "") != "":
            found.append(f"task {task}: nodeName {pod.get('nodeName')!r} bypasses the scheduler")
    return found


def shm_sized(job: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    found = []
    for task, pod in pods(job):
        volumes = {str(as_map(v).get("name")): as_map(v) for v in as_seq(pod.get("volumes"))}
        main = as_map(next(iter(as_seq(pod.get("containers"))), {}))
        mount = next(
            (
                as_map(m)
                for m in as_seq(main.get("volumeMounts"))
                if as_map(m).get("mountPath") == "/dev/shm"
            ),
            None,
        )
        shm = as_map(volumes.get(str(mount.get("name")), {}).get("emptyDir")) if mount else {}
        if shm.get("medium") != "Memory" or "sizeLimit" not in shm:
            found.append(f"task {task}: /dev/shm is not a sized, memory-backed emptyDir")
    return found


def limits_set(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 19 #3: without limits the namespace's LimitRange defaults them (builders/teams.
    limit_range), and a request above that default makes the pod invalid, after admission."""
    del cfg
    found = []
    for task, pod in pods(job):
        for c in containers(pod):
            limits = as_map(as_map(c.get("resources")).get("limits"))
            missing = [r for r in ("cpu", "memory") if r not in limits]
            if missing:
                found.append(
                    f"task {task}, container {c.get('name')}: no {' or '.join(missing)} limit"
                )
    return found


# -- updates ----------------------------------------------------------------------------------

# Issue 19 #8: what an UPDATE of a Volcano Job must satisfy. A rule is judged again only when
# what it reads changed. Volcano lets an update change little (replicas, minAvailable,
# priorityClassName and metadata: v1.15.1 pkg/webhooks/admission/jobs/validate/admit_job.go
# validateJobUpdate), and its controller writes jobs too (pkg/controllers/job/
# job_controller_actions.go syncJob, createOrUpdatePVC). Re-judging unchanged fields would
# freeze every older job once a rule tightens (a team's maximum hours lowered): no label,
# no scale, no controller write. CrossGuard and `trainstack preview` judge a stack's declared
# jobs as a whole on every run, and a changed job is replaced, a CREATE (docs/policies.md).
UPDATE_READS = {
    "max-duration": "annotation",
    "own-queue": "queue",
    "volcano-scheduled": "scheduler",
    # No setting of its own tightens it, and a member may patch a Job's metadata at any time
    # (Volcano's update webhook never looks at it, admit_job.go validateJobUpdate): every
    # UPDATE is judged.
    "scheduling-keys": "always",
    "job-volumes": "volumes",
    "job-plugins": "plugins",
}  # the others read only the task templates


def update_inputs(rule: str, job: Mapping[str, Any]) -> object:
    """What `rule` reads of `job`, compared between the old and new object of an UPDATE."""
    meta, spec = as_map(job.get("metadata")), as_map(job.get("spec"))
    templates = [as_map(t).get("template") for t in as_seq(spec.get("tasks"))]
    reads = UPDATE_READS.get(rule, "templates")
    if reads == "annotation":
        return as_map(meta.get("annotations")).get(MAX_DURATION_ANNOTATION, "")
    if reads == "queue":
        return spec.get("queue", "")
    if reads == "scheduler":
        return (spec.get("schedulerName", ""), spec.get("priorityClassName", ""), templates)
    if reads == "volumes":
        return spec.get("volumes", [])
    if reads == "plugins":
        return spec.get("plugins", {})
    return templates


def judged_on_update(rule: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    if UPDATE_READS.get(rule) == "always":
        return True
    return update_inputs(rule, old) != update_inputs(rule, new)


# -- AWS --------------------------------------------------------------------------------------


def imdsv2_required(props: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    if as_map(props.get("metadataOptions")).get("httpTokens") != "required":
        return ["metadataOptions.httpTokens must be 'required' (IMDSv2)"]
    return []


def ebs_encrypted(props: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    return [
        f"block device {as_map(d).get('deviceName')} is not encrypted"
        for d in as_seq(props.get("blockDeviceMappings"))
        if str(as_map(as_map(d).get("ebs")).get("encrypted")).lower() != "true"
    ]


def fsx_encrypted(props: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    # Scratch file systems are encrypted with an AWS-owned key; persistent ones need ours.
    if str(props.get("deploymentType", "")).startswith("PERSISTENT") and not props.get("kmsKeyId"):
        return ["a persistent FSx file system needs kmsKeyId (customer-managed encryption at rest)"]
    return []


def eks_endpoint_not_open(props: Mapping[str, Any], cfg: Config) -> list[str]:
    if not cfg.production:
        return []
    vpc = as_map(props.get("vpcConfig"))
    if vpc.get("endpointPublicAccess") is False:
        return []
    cidrs = [str(c) for c in as_seq(vpc.get("publicAccessCidrs"))]
    if not cidrs or "0.0.0.0/0" in cidrs:
        return ["production cluster: the public API endpoint is open to 0.0.0.0/0"]
    return []


def vpc_cni_network_policy(props: Mapping[str, Any], cfg: Config) -> list[str]:
    """The managed vpc-cni add-on enforces NetworkPolicy only with `enableNetworkPolicy`
    (a string in the add-on's configuration schema; see builders/eks.py)."""
    del cfg
    if props.get("addonName") != "vpc-cni":
        return []
    raw = props.get("configurationValues")
    try:
        values = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return ["the vpc-cni add-on's configurationValues are not JSON"]
    if as_map(values).get("enableNetworkPolicy") != "true":
        return [
            'the vpc-cni add-on does not set enableNetworkPolicy: "true", so NetworkPolicies '
            "are accepted but not enforced"
        ]
    return []


K8S_RULES: tuple[Rule, ...] = (
    Rule("request-limit-ratio", "CPU and memory limits stay within a ratio of requests",
         "set limits at most maxCpuLimitRequestRatio (cpu) and maxMemoryLimitRequestRatio "
         "(memory) times the requests", (VOLCANO_JOB,), request_limit_ratio),
    Rule("devices-requests-equal-limits", "GPU, EFA/RDMA and hugepages requests equal limits",
         "request exactly what you limit for devices", (VOLCANO_JOB,),
         devices_requests_equal_limits),
    Rule("max-duration", "every training job has a maximum duration within its team's",
         "set maxDurationHours in the job spec, at most the team's maximum", (VOLCANO_JOB,),
         max_duration),
    Rule("checkpoint-volume", "every training job checkpoints to a persistent volume",
         "add checkpoint: {intervalSeconds: …} to the job spec; the platform mounts the team's "
         "checkpoint claim at /checkpoints", (VOLCANO_JOB,), checkpoint_volume),
    Rule("pinned-images",
         "images are pinned by digest (production) or by a build tag (not latest, main, …), "
         "from allowed registries",
         "use image@sha256:… (production), otherwise image:<build tag> or a digest, from an "
         "allowed registry", (VOLCANO_JOB,), pinned_images),
    Rule("gpu-placement",
         "GPU pods tolerate the GPU taint and pin a GPU pool by its labels; only GPU jobs "
         "tolerate the taint",
         "set spec.pool in the job spec; keep the GPU toleration off jobs without GPUs",
         (VOLCANO_JOB,), gpu_placement),
    Rule("own-queue", "a job uses its own team's queue",
         "submit to the queue named like your team namespace", (VOLCANO_JOB,), own_queue),
    Rule("volcano-scheduled", "a job's pods are scheduled by Volcano in its queue",
         "leave schedulerName, nodeName and the pod templates' priorityClassName unset (or "
         "schedulerName: volcano), and use one of the team's priority classes",
         (VOLCANO_JOB,), volcano_scheduled),
    Rule("pod-volumes",
         "pods mount only the platform's volumes: the node cache read-only, datasets "
         "read-only, no generic ephemeral volumes",
         "mount the cache driver's inline volume with readOnly: true and the datasets claim "
         "read-only, or render the job from a job spec (the job layer does)",
         (VOLCANO_JOB,), pod_volumes),
    Rule("job-volumes", "a job has no Job-level volumes",
         "remove spec.volumes; the job layer mounts the team's claims in the task templates",
         (VOLCANO_JOB,), job_volumes),
    Rule("scheduling-keys",
         "no Volcano scheduling keys (volcano.sh/, scheduling.volcano.sh/, "
         "scheduling.k8s.io/) on the job or its task templates",
         "remove them; priority and preemptibility come from the job spec's priority class",
         (VOLCANO_JOB,), scheduling_keys),
    Rule("job-plugins", "only the platform's job plugins, with its arguments",
         "use the plugins env, svc (--disable-network-policy=true) and pytorch (--master, "
         "--worker, --port) as the job layer renders them", (VOLCANO_JOB,), job_plugins),
    Rule("shm-sized", "/dev/shm is a sized, memory-backed volume",
         "set sharedMemory in the job spec", (VOLCANO_JOB,), shm_sized),
    Rule("no-privileged",
         "the pods meet Pod Security baseline, which team namespaces enforce: no privileged "
         "containers, host namespaces, hostPath or hostPort",
         "remove privileged/hostNetwork/hostPID/hostIPC, hostPath volumes, hostPort, added "
         "capabilities other than baseline's, and unconfined seccomp, AppArmor or SELinux "
         "settings", (VOLCANO_JOB,), no_privileged),
    Rule("hardened-pods",
         "the pods meet Pod Security restricted, init containers included, and do not mount "
         "the service-account token",
         "render the job from a job spec (the job layer does this), or set "
         "automountServiceAccountToken: false, runAsNonRoot: true, a RuntimeDefault seccomp "
         "profile, allowPrivilegeEscalation: false and capabilities.drop: [ALL]",
         (VOLCANO_JOB,), hardened_pods),
    Rule("limits-set", "every container sets cpu and memory limits",
         "set cpu and memory limits on every container (the namespace's LimitRange default "
         "would otherwise sit below a larger request)", (VOLCANO_JOB,), limits_set),
)  # fmt: skip
AWS_RULES: tuple[Rule, ...] = (
    Rule("imdsv2-required", "launch templates require IMDSv2",
         "set metadataOptions.httpTokens: required", ("aws:ec2/launchTemplate:LaunchTemplate",),
         imdsv2_required),
    Rule("ebs-encrypted", "EBS volumes are encrypted at rest",
         "set ebs.encrypted: 'true' on every block device",
         ("aws:ec2/launchTemplate:LaunchTemplate",),
         ebs_encrypted),
    Rule("fsx-encrypted", "persistent FSx file systems use a KMS key",
         "set kmsKeyId", ("aws:fsx/lustreFileSystem:LustreFileSystem",), fsx_encrypted),
    Rule("eks-endpoint-not-open", "production EKS endpoints are not open to the internet",
         "set publicAccessCidrs to your networks, or publicAccess: false",
         ("aws:eks/cluster:Cluster",), eks_endpoint_not_open),
    Rule("vpc-cni-network-policy", "the vpc-cni add-on enforces NetworkPolicies",
         'set configurationValues {"enableNetworkPolicy": "true"} (builders/eks.py)',
         (ADDON,), vpc_cni_network_policy),
)  # fmt: skip
RULES: tuple[Rule, ...] = K8S_RULES + AWS_RULES
