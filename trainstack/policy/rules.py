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


def _selects_pool(labels_of: Callable[[str], Sequence[str] | None], cfg: Config) -> bool:
    """`labels_of(key)` gives the values a placement allows for a label key (None: any)."""
    if not cfg.pool_selectors:
        values = labels_of(POOL_LABEL)
        return values is not None and len(values) > 0
    return any(
        all(labels_of(k) == [v] for k, v in selector.items()) for selector in cfg.pool_selectors
    )


def targets_pool(pod: Mapping[str, Any], cfg: Config) -> bool:
    """The pod's nodeSelector, or every term of its required node affinity, pins one of the
    platform's pools by the pool's own labels (`In` with exactly that value)."""
    selector = as_map(pod.get("nodeSelector"))
    if _selects_pool(lambda k: [str(selector[k])] if k in selector else None, cfg):
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

        return _selects_pool(values, cfg)

    return bool(terms) and all(term_selects(t) for t in terms)


def gpu_placement(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """GPU pods tolerate the GPU taint and pin a pool by its labels (issue 19 #5: any node
    selector passed); a pod without GPUs tolerates the taint only as part of a job that has
    GPU pods (its parameter servers run beside the workers, on the same fabric)."""
    found = []
    all_pods = list(pods(job))
    gpu_job = any(wants_gpu(p) for _, p in all_pods)
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
        if not targets_pool(pod, cfg):
            pools = (
                "; ".join(
                    ", ".join(f"{k}={v}" for k, v in sorted(s.items())) for s in cfg.pool_selectors
                )
                or f"{POOL_LABEL}=<pool>"
            )
            found.append(
                f"task {task}: requests GPUs but does not pin a GPU pool by its labels "
                f"(nodeSelector or every required node affinity term; pools: {pools})"
            )
    return found


def own_queue(job: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    queue = as_map(job.get("spec")).get("queue")
    namespace = as_map(job.get("metadata")).get("namespace")
    if queue != namespace:
        return [f"queue {queue!r} is not the team's own queue {namespace!r}"]
    return []


# The team's claim on the shared file system (builders/storage.LUSTRE_CLAIM): its PV mounts
# the whole file system, so the sub-path is what keeps one team out of another's checkpoints.
SHARED_CLAIM = "lustre"
DATASETS_DIR = "datasets"  # builders/storage.DATASETS_PATH, relative


def shared_subpath_ok(sub: object, team: object, read_only: object) -> bool:
    if not isinstance(sub, str) or ".." in sub:
        return False
    own = f"checkpoints/{team}"
    if sub == own or sub.startswith(own + "/"):
        return True
    return read_only is True and (sub == DATASETS_DIR or sub.startswith(DATASETS_DIR + "/"))


def shared_filesystem_subpaths(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 17 #5: a job mounts the shared file system only at its team's checkpoint
    directory, or read-only below datasets/. Without a sub-path (or with subPathExpr) the
    team's PV gives the whole file system, every team's checkpoints included."""
    del cfg
    team = as_map(job.get("metadata")).get("namespace")
    found = []
    for task, pod in pods(job):
        shared = {
            str(as_map(v).get("name"))
            for v in as_seq(pod.get("volumes"))
            if as_map(as_map(v).get("persistentVolumeClaim")).get("claimName") == SHARED_CLAIM
        }
        for c in containers(pod):
            for m in (as_map(x) for x in as_seq(c.get("volumeMounts"))):
                if str(m.get("name")) not in shared:
                    continue
                sub = m.get("subPath")
                if "subPathExpr" in m or not shared_subpath_ok(sub, team, m.get("readOnly")):
                    found.append(
                        f"task {task}: {c.get('name')} mounts the shared file system at "
                        f"{m.get('mountPath')} with subPath {sub!r}; allowed: "
                        f"checkpoints/{team}/…, or read-only {DATASETS_DIR}/…"
                    )
    return found


VOLCANO_SCHEDULER = "volcano"


def volcano_scheduled(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """The job's pods are scheduled by Volcano, in the job's queue, at the job's priority.

    Volcano's job controller gives a pod the template's schedulerName and priorityClassName
    when set, the job's otherwise (v1.15.1 pkg/controllers/job/job_controller_util.go
    createJobPod); its mutating webhook sets an empty job schedulerName to `volcano`
    (mutate_job.go). A template naming another scheduler would run pods outside the team's
    queue, which is the only GPU quota a team namespace has (builders/teams.resource_quota).
    """
    del cfg
    found = []
    name = as_map(job.get("spec")).get("schedulerName", "")
    if name not in ("", VOLCANO_SCHEDULER):
        found.append(f"schedulerName {name!r} bypasses the team's queue")
    for task, pod in pods(job):
        name = pod.get("schedulerName", "")
        if name not in ("", VOLCANO_SCHEDULER):
            found.append(f"task {task}: schedulerName {name!r} bypasses the team's queue")
        if pod.get("priorityClassName", "") != "":
            found.append(f"task {task}: priorityClassName overrides the job's priority class")
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
        return (spec.get("schedulerName", ""), templates)
    return templates


def judged_on_update(rule: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
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
         "leave schedulerName and the pod templates' priorityClassName unset (or "
         "schedulerName: volcano)", (VOLCANO_JOB,), volcano_scheduled),
    Rule("shared-filesystem-subpaths",
         "the shared file system is mounted only at the team's checkpoints, or read-only "
         "at datasets",
         "mount the team's lustre claim with subPath checkpoints/<team>/… or, readOnly, "
         "datasets/… (the job layer does)", (VOLCANO_JOB,), shared_filesystem_subpaths),
    Rule("shm-sized", "/dev/shm is a sized, memory-backed volume",
         "set sharedMemory in the job spec", (VOLCANO_JOB,), shm_sized),
    Rule("no-privileged",
         "the pods meet Pod Security baseline, which team namespaces enforce: no privileged "
         "containers, host namespaces, hostPath or hostPort",
         "remove privileged/hostNetwork/hostPID/hostIPC, hostPath volumes, hostPort, added "
         "capabilities other than baseline's, and unconfined seccomp, AppArmor or SELinux "
         "settings", (VOLCANO_JOB,), no_privileged),
    Rule("hardened-pods",
         "the pods meet Pod Security restricted (init containers may run as root with CHOWN, "
         "DAC_OVERRIDE, FOWNER) and do not mount the service-account token",
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
