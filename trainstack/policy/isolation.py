"""What a job may ask of Volcano, the nodes and the storage: its queue, scheduler, priority,
pools, volumes, scheduling keys and job plugins.

These are the rules that keep teams apart (issue 37, docs/security.md): each reads what Volcano's
controller and scheduler or the kubelet read (pkg/controllers/job/job_controller_util.go
createJobPod, pkg/scheduler/api/pod_info.go, the CSI and ephemeral-volume paths), not a string
a well-behaved team would write. The resource and shape rules are in rules.py, which lists
them all; their CEL twins in admission.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainstack.contracts import health
from trainstack.policy.objects import Config, as_map, as_seq, containers, pods, quantity
from trainstack.slices import SHARED_RESOURCE, is_gpu_resource

GPU_TAINT_KEY = "nvidia.com/gpu"
HEALTH_TAINT_KEY = health.TAINT_KEY
POOL_LABEL = "trainstack.io/pool"  # builders/labels.POOL (config never imports builders)


def wants_gpu(pod: Mapping[str, Any]) -> bool:
    """A container asks for a GPU: a whole one, a MIG instance or a time-shared one (each
    lands on a GPU node; Kubernetes requires an extended resource's limit, and requests
    default to it: core/v1 validation, "must be specified in limits")."""
    return any(
        is_gpu_resource(str(name))
        for c in containers(pod)
        for name in as_map(as_map(c.get("resources")).get("limits"))
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


def _tolerates_no_schedule(t: Mapping[str, Any], key: str) -> bool:
    """The toleration matches a NoSchedule taint with `key` (any value): its effect is empty
    (all effects) or NoSchedule, and it names the key or, keyless with operator Exists,
    matches every key (core/v1 Toleration; k8s.io/api v0.37 core/v1 toleration.go
    `ToleratesTaint`)."""
    if t.get("effect") not in (None, "", "NoSchedule"):
        return False
    return t.get("key") == key or (t.get("key") in (None, "") and t.get("operator") == "Exists")


def health_gate(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """No pod of a team's job tolerates the node health gate's taint (docs/health.md): a node
    that has not passed its checks, or failed them, takes no training work, whoever asks. A
    keyless `operator: Exists` toleration matches every taint, the gate's too, so it is
    refused as well; a job tolerates the GPU taint by its key."""
    del cfg
    return [
        f"task {task}: tolerates the {HEALTH_TAINT_KEY} taint (a keyless Exists toleration "
        "matches every taint): nodes that have not passed their health checks take no jobs"
        for task, pod in pods(job)
        if any(
            _tolerates_no_schedule(as_map(t), HEALTH_TAINT_KEY)
            for t in as_seq(pod.get("tolerations"))
        )
    ]


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


# Issue 43: the one exception, for an elastic job's rendezvous pod (jobs/render.py), which
# hosts the c10d store every worker depends on. Volcano v1.15.1 offers a single per-pod way
# off the victim lists: GetPodPreemptable (pkg/scheduler/api/pod_info.go lines 124-150) reads
# the pod's `volcano.sh/preemptable` annotation, then its label (strconv.ParseBool; a value
# that does not parse counts as false), and NewTaskInfo (api/job_info.go line 195) keeps it
# as TaskInfo.Preemptable; the preempt action's victim filters (actions/preempt/preempt.go
# lines 207 and 268, which both its node-walking and its topology-aware paths apply, lines
# 357 and 749) and the reclaim action (actions/reclaim/reclaim.go line 189) drop a task
# whose Preemptable is false before any plugin is asked. Without it the gang plugin, which
# counts a job's ready pods and not their roles (plugins/gang/gang.go lines 97-129, its
# preemptable and reclaimable function), may take the store as readily as a surplus worker,
# and losing it restarts every worker. The controller builds each pod from its template's
# labels and annotations (pkg/controllers/job/job_controller_util.go createJobPod, lines
# 46-59) and the PodGroup from the Job's alone (job_controller_actions.go
# createOrUpdatePodGroup, line 811), so the job-level JobInfo.Preemptable (job_info.go
# extractPreemptable, read by the tdm plugin and the gangpreempt and gangreclaim actions
# only, none of which the platform enables: builders/scheduling.scheduler_config) does not
# change; the PodGroup controller, which copies a pod's key onto a PodGroup it creates
# (pkg/controllers/podgroup/pg_controller_handler.go line 404), skips pods that already
# name theirs, as a Job's do (pg_controller.go lines 167-170).
#
# Why this is safe, from what it gives a hostile member at most. The key is allowed in a
# task template's annotations only (never a label, never on the Job, whose keys reach every
# pod and the PodGroup), with exactly "false", on one task per job, of one replica (every
# UPDATE is judged: scaling that task up is refused), whose pod has one container, no
# sidecar, no DRA claim, no pod-level resources, no resource but cpu and memory, and limits
# of at most PINNED_CPU_LIMIT CPU and PINNED_MEMORY_LIMIT memory in every container (init
# containers run one at a time before the container, so the pod's effective request and
# limit stay within them; requests <= limits is the API server's own validation). So: one
# pod per job that preempt and reclaim never take, of at most 1 CPU and 1 GiB; how many the
# team runs is bounded by its queue's capability in cpu and memory and its namespace's
# ResourceQuota. Never a GPU, EFA, RDMA device or hugepage: GPUs are given back as before.
# What it does not bound: where the pod runs. Like any CPU task of a GPU job it may
# tolerate the GPU taint (gpu_placement), so a job's one unreclaimable small pod may sit on
# a GPU node until the job ends (max-duration), holding that CPU and memory there.
PINNED_KEY = "volcano.sh/preemptable"
PINNED_VALUE = "false"
PINNED_RESOURCES = ("cpu", "memory")
PINNED_CPU_LIMIT = "1"
PINNED_MEMORY_LIMIT = "1Gi"
PINNED_BOUNDS = {"cpu": PINNED_CPU_LIMIT, "memory": PINNED_MEMORY_LIMIT}
PINNED_ONLY = (
    "only a one-replica CPU pod (one container, cpu <= "
    f"{PINNED_CPU_LIMIT}, memory <= {PINNED_MEMORY_LIMIT}, no devices) may opt out of "
    "preemption"
)


def _beyond(value: object, bound: str) -> str | None:
    """Why the quantity `value` is not at most `bound`; None when it is. `quantity` is the
    rules' parser (objects.py), the one the CEL twin's tests evaluate `quantity()` with."""
    try:
        if quantity(value) <= quantity(bound):
            return None
    except ValueError:
        return "not a quantity"
    return f"more than {bound}"


def _pinned_pod(task: Mapping[str, Any]) -> list[str]:
    """What keeps a task from opting out of preemption: why its pod is no small CPU pod."""
    found = []
    replicas = task.get("replicas")
    number = isinstance(replicas, int | float) and not isinstance(replicas, bool)
    if not number or replicas != 1:
        # A number as the API server writes it: CrossGuard hands a policy floats (objects.py).
        shown = f"{replicas:g}" if number else "unset" if replicas is None else repr(replicas)
        found.append(f"a task of {shown} replicas")
    pod = as_map(as_map(task.get("template")).get("spec"))
    if "resourceClaims" in pod:
        found.append("a pod with resourceClaims")
    if "resources" in pod:
        found.append("a pod with pod-level resources")
    main = as_seq(pod.get("containers"))
    if len(main) != 1:
        found.append(f"a pod of {len(main)} containers")
    for c in (as_map(x) for x in as_seq(pod.get("initContainers"))):
        if "restartPolicy" in c:
            found.append(
                f"a pod with sidecar {c.get('name')} (an init container that keeps running)"
            )
    for c in containers(pod):
        name = c.get("name")
        res = as_map(c.get("resources"))
        if "claims" in res:
            found.append(f"a pod whose container {name} has resources.claims")
        requests, limits = as_map(res.get("requests")), as_map(res.get("limits"))
        for key in sorted({*requests, *limits} - set(PINNED_RESOURCES), key=str):
            found.append(f"a pod that requests {key}")
        for key in PINNED_RESOURCES:
            bound = PINNED_BOUNDS[key]
            if key not in limits:
                found.append(f"a pod whose container {name} has no {key} limit")
            elif (why := _beyond(limits[key], bound)) is not None:
                found.append(
                    f"a pod whose container {name} has a {key} limit of {limits[key]} ({why})"
                )
    return found


def scheduling_keys(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 37 #3: no Volcano scheduling key on the Job or its task templates; issue 43:
    but `volcano.sh/preemptable: "false"` in the template annotations of one small CPU task
    (PINNED_KEY above)."""
    del cfg
    found = [
        f"the job's {kind} carry {key}, which Volcano reads to schedule or preempt"
        for kind, key in _metadata_keys(as_map(job.get("metadata")))
    ]
    pinned = []
    for task in (as_map(t) for t in as_seq(as_map(job.get("spec")).get("tasks"))):
        name = task.get("name", "?")
        meta = as_map(as_map(task.get("template")).get("metadata"))
        found += [
            f"task {name}: template {kind} carry {key}, which Volcano reads to schedule or preempt"
            for kind, key in _metadata_keys(meta)
            if not (kind == "annotations" and key == PINNED_KEY)
        ]
        annotations = as_map(meta.get("annotations"))
        if PINNED_KEY not in annotations:
            continue
        pinned.append(str(name))
        value = annotations[PINNED_KEY]
        if value != PINNED_VALUE:
            found.append(
                f"task {name}: template annotations carry {PINNED_KEY}: {value!r}; the only "
                f"value allowed is {PINNED_VALUE!r}, and {PINNED_ONLY}"
            )
        found += [
            f"task {name}: template annotations carry {PINNED_KEY} on {why}; {PINNED_ONLY}"
            for why in _pinned_pod(task)
        ]
    if len(pinned) > 1:
        found.append(
            f"tasks {', '.join(pinned)}: {len(pinned)} templates carry {PINNED_KEY}; at most "
            "one task of a job may opt out of preemption"
        )
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


# workers.sharedGpus in a job spec (jobs/fractional.py renders it).
SHARED_GPUS_ANNOTATION = "trainstack.io/shared-gpus"
SHARED_GPUS_ALLOW = "allow"


def _replicas(task: Mapping[str, Any]) -> int:
    """A task's pods: Volcano's replicas (absent read as 1, the stricter reading here)."""
    value = task.get("replicas", 1)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 1


def shared_gpus(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Time-shared GPUs (nvidia.com/gpu.shared, docs/gpu-sharing.md): a container asks for
    one at most, since a second replica of one GPU adds no compute and the device plugin would
    fail the pod only at the kubelet (k8s-device-plugin v0.18.2 internal/rm/rm.go,
    failRequestsGreaterThanOne); and a job holds more than one only if its Job says so
    (trainstack.io/shared-gpus: allow, from workers.sharedGpus): processes taking turns on a
    GPU make NCCL fail or crawl. The resource name is what the device plugin advertises on
    time-shared nodes only, so it cannot be dodged by a node selector: a pod asking for
    nvidia.com/gpu never lands on them."""
    del cfg
    found: list[str] = []
    holders = 0
    for raw in as_seq(as_map(job.get("spec")).get("tasks")):
        task = as_map(raw)
        name = str(task.get("name", "?"))
        pod = as_map(as_map(task.get("template")).get("spec"))
        for c in containers(pod):
            limit = as_map(as_map(c.get("resources")).get("limits")).get(SHARED_RESOURCE)
            if limit is None:
                continue
            try:
                amount = quantity(limit)
            except ValueError:
                amount = float("inf")
            if amount > 1:
                found.append(
                    f"task {name}: container {c.get('name', '?')} asks for {limit} "
                    f"{SHARED_RESOURCE}; at most 1 (a second share of a GPU adds no compute)"
                )
            holders += _replicas(task)
    annotations = as_map(as_map(job.get("metadata")).get("annotations"))
    if holders > 1 and annotations.get(SHARED_GPUS_ANNOTATION) != SHARED_GPUS_ALLOW:
        found.append(
            f"{holders} containers ask for time-shared GPUs ({SHARED_RESOURCE}) without "
            f"{SHARED_GPUS_ANNOTATION}: {SHARED_GPUS_ALLOW} on the Job: NCCL across processes "
            "that take turns on a GPU fails or crawls"
        )
    return found
