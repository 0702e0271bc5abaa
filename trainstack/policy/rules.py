"""The platform's rules, each a small named function over a resource's properties.

The table of every per-resource rule (K8S_RULES, RULES), the resource and shape rules over
Volcano Jobs, and what an UPDATE is judged by live here; the rules that keep teams apart in
isolation.py, Pod Security's in pod_security.py, the AWS ones in aws_rules.py, the stack-wide
ones in stack_rules.py, and what they all read (and the Rule itself) in objects.py.
`policy/admission.py` renders the Kubernetes rules as CEL for in-cluster admission; tests check
the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainstack.config.images import (
    from_allowed_registry,
    is_pinned,
    pin_required,
)
from trainstack.policy.aws_rules import AWS_RULES
from trainstack.policy.isolation import (
    PINNED_CPU_LIMIT,
    PINNED_KEY,
    PINNED_MEMORY_LIMIT,
    PINNED_VALUE,
    gpu_placement,
    health_gate,
    job_plugins,
    job_volumes,
    own_queue,
    pod_volumes,
    scheduling_keys,
    shared_gpus,
    volcano_scheduled,
)
from trainstack.policy.objects import (
    VOLCANO_JOB,
    Config,
    Rule,
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


RATIO_SETTINGS = {
    "cpu": "policy.maxCpuLimitRequestRatio",
    "memory": "policy.maxMemoryLimitRequestRatio",
}


def _amount(value: float, name: str) -> str:
    """A quantity to write in a spec: CPUs as cores or millicores, memory in Gi, Mi or Ki."""
    if name == "cpu":
        return f"{value:g}" if value == int(value) else f"{int(value * 1000)}m"
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{int(value // 2**10)}Ki"


def request_limit_ratio(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Each limit too far above its request, once for the tasks it is the same in: a spec's
    `workers` become tasks `master` and `worker`, which the user never wrote (issue 41 #4:
    the finding came twice, with the setting's internal name and no limit to use)."""
    found: dict[str, list[str]] = {}
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
                        most = _amount(quantity(requests[name]) * bound, name)
                        message = (
                            f"container {c.get('name')}: {name} limit {limits[name]} is "
                            f"{ratio:g} x the request {requests[name]}, more than the "
                            f"{bound:g} x that {cfg.setting(RATIO_SETTINGS[name])} allows: "
                            f"set the {name} limit at most {most}"
                        )
                        found.setdefault(message, []).append(str(task))
    return [
        f"task{'s' if len(tasks) > 1 else ''} {', '.join(tasks)}, {message}"
        for message, tasks in found.items()
    ]


def request_limit_ratio_fix(cfg: Config) -> str:
    """The ratios in numbers, and where they are set (issue 41 #4: the setting's name alone)."""
    return (
        f"keep limits at most {cfg.max_cpu_limit_request_ratio:g} x the request for cpu and "
        f"{cfg.max_memory_limit_request_ratio:g} x for memory ({cfg.setting('policy')}: "
        "maxCpuLimitRequestRatio, maxMemoryLimitRequestRatio), or leave limits out: they "
        "default to the requests"
    )


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
            elif not from_allowed_registry(image, tuple(cfg.allowed_registries)):
                # Which registries are allowed, and where, is the fix (pinned_images_fix).
                found.append(f"task {task}: image {image!r} is not from an allowed registry")
    return found


def pinned_images_fix(cfg: Config) -> str:
    """What `pinned_images` asks, in this stack's terms: the pin its environment requires,
    and the registries only where the stack names some (issue 41)."""
    pin = "image@sha256:…" if cfg.production else "image:<build tag> or image@sha256:…"
    if not cfg.allowed_registries:
        return f"use {pin}"
    return (
        f"use {pin} from {' or '.join(cfg.allowed_registries)} "
        f"(set in {cfg.setting('policy.allowedRegistries')})"
    )


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
    # Replicas change in place (an elastic job's resize) and so may the annotation: judged on
    # every UPDATE, like scheduling-keys.
    "shared-gpus": "always",
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


K8S_RULES: tuple[Rule, ...] = (
    Rule("request-limit-ratio", "CPU and memory limits stay within a ratio of requests",
         "lower the limits to the ratio the platform allows, or leave them out: they default "
         "to the requests", (VOLCANO_JOB,), request_limit_ratio, fix=request_limit_ratio_fix),
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
         "from the registries policy.allowedRegistries names, if it names any",
         "use image@sha256:… (production), otherwise image:<build tag> or a digest, from a "
         "registry policy.allowedRegistries names, if it names any", (VOLCANO_JOB,),
         pinned_images, fix=pinned_images_fix),
    Rule("gpu-placement",
         "GPU pods tolerate the GPU taint and pin a GPU pool by its labels; only GPU jobs "
         "tolerate the taint",
         "set spec.pool in the job spec; keep the GPU toleration off jobs without GPUs",
         (VOLCANO_JOB,), gpu_placement),
    Rule("health-gate",
         "no pod tolerates the node health gate's taint (trainstack.io/health), nor every "
         "taint",
         "remove the toleration: tolerate nvidia.com/gpu by its key (the job layer does)",
         (VOLCANO_JOB,), health_gate),
    Rule("shared-gpus",
         "a container asks for one time-shared GPU (nvidia.com/gpu.shared) at most, and a job "
         "holds several only with trainstack.io/shared-gpus: allow",
         "use one replica on a time-shared pool, a MIG or whole-GPU pool for distributed "
         "jobs, or set workers.sharedGpus: true in the job spec if it does not use NCCL",
         (VOLCANO_JOB,), shared_gpus),
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
         "scheduling.k8s.io/) on the job or its task templates, but "
         f"{PINNED_KEY}: \"{PINNED_VALUE}\" in the template annotations of one small CPU task",
         "remove them; priority and preemptibility come from the job spec's priority class "
         f"({PINNED_KEY}: \"{PINNED_VALUE}\" only on one task of one replica, one container, "
         f"cpu and memory only, limits at most {PINNED_CPU_LIMIT} CPU and "
         f"{PINNED_MEMORY_LIMIT}: an elastic job's rendezvous pod)",
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
RULES: tuple[Rule, ...] = K8S_RULES + AWS_RULES
