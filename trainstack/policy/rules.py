"""The platform's rules, each a small named function over a resource's properties.

Functions read `props` through the Mapping/Sequence protocols only and treat numbers as
floats, so the same code runs on plain dicts (offline preview, tests) and on the proxies
the CrossGuard analyzer hands a policy. `builders/admission.py` renders the Kubernetes
rules as CEL for in-cluster admission; tests check the two agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Level = Literal["advisory", "mandatory", "disabled"]
VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
ADDON = "aws:eks/addon:Addon"
DEVICE_RESOURCES = ("nvidia.com/gpu", "vpc.amazonaws.com/efa", "hugepages-2Mi")
DEVICE_PREFIXES = ("rdma/",)
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


def is_pinned(image: str, *, production: bool = False) -> bool:
    """Pinned: by a digest; outside production also by a tag that names a build (not one of
    MOVING_TAGS). One definition for the job spec, the rule and its CEL twin."""
    # fullmatch: `$` alone would also match before a final newline, where RE2 (CEL) does not.
    if DIGEST.fullmatch(image):
        return True
    return (
        not production and bool(PINNED_IMAGE.fullmatch(image)) and not MOVING_TAG.fullmatch(image)
    )


_UNITS = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
}  # fmt: skip


def quantity(value: object) -> float:
    """A Kubernetes quantity (`500m`, `16Gi`, `8`) as a number."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"not a quantity: {value!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def is_device(name: str) -> bool:
    return name in DEVICE_RESOURCES or name.startswith(DEVICE_PREFIXES)


@dataclass(frozen=True)
class Config:
    """Thresholds; per stack through `--policy-pack-config` (schema in the pack)."""

    max_cpu_limit_request_ratio: float = 2.0
    max_memory_limit_request_ratio: float = 1.0
    max_duration_hours: float = 168.0
    team_max_duration_hours: Mapping[str, float] = field(default_factory=dict)
    allowed_registries: Sequence[str] = ()
    # Node labels selecting each GPU pool (builders/pools.pool_selector); empty: any value
    # of POOL_LABEL, the label of the pools trainstack creates.
    pool_selectors: Sequence[Mapping[str, str]] = ()
    production: bool = False

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Config:
        return cls(
            max_cpu_limit_request_ratio=float(raw.get("maxCpuLimitRequestRatio", 2.0)),
            max_memory_limit_request_ratio=float(raw.get("maxMemoryLimitRequestRatio", 1.0)),
            max_duration_hours=float(raw.get("maxDurationHours", 168.0)),
            team_max_duration_hours={
                str(k): float(v) for k, v in dict(raw.get("teamMaxDurationHours", {})).items()
            },
            allowed_registries=tuple(raw.get("allowedRegistries", ())),
            pool_selectors=tuple(
                {str(k): str(v) for k, v in _map(sel).items()}
                for sel in _seq(raw.get("poolSelectors", ()))
            ),
            production=bool(raw.get("production", False)),
        )


# -- walking a Volcano Job ------------------------------------------------------------------


# Plain lists and dicts first: the ABC checks (for the analyzer's proxies) are slow, and
# rules walk every pod of every job several times.
def _seq(value: object) -> Sequence[Any]:
    if type(value) is list:
        return value
    return value if isinstance(value, Sequence) and not isinstance(value, str) else ()


def _map(value: object) -> Mapping[str, Any]:
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else {}


def pods(job: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(task name, pod spec) for every task of a Volcano Job."""
    for task in _seq(_map(job.get("spec")).get("tasks")):
        yield str(_map(task).get("name", "?")), _map(_map(_map(task).get("template")).get("spec"))


def containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers"):
        for container in _seq(pod.get(key)):
            yield _map(container)


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
            res = _map(c.get("resources"))
            requests, limits = _map(res.get("requests")), _map(res.get("limits"))
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
            res = _map(c.get("resources"))
            requests, limits = _map(res.get("requests")), _map(res.get("limits"))
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
    meta = _map(job.get("metadata"))
    raw = _map(meta.get("annotations")).get(MAX_DURATION_ANNOTATION)
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
        volumes = {str(_map(v).get("name")): _map(v) for v in _seq(pod.get("volumes"))}
        main = _map(next(iter(_seq(pod.get("containers"))), None))
        mounts = [_map(m) for m in _seq(main.get("volumeMounts"))]
        mount = next((m for m in mounts if m.get("mountPath") == CHECKPOINT_PATH), None)
        if mount is None:
            found.append(f"task {task}: nothing is mounted at {CHECKPOINT_PATH}")
        elif "persistentVolumeClaim" not in volumes.get(str(mount.get("name")), {}):
            found.append(f"task {task}: {CHECKPOINT_PATH} is not a persistent volume claim")
        env = {str(_map(e).get("name")): _map(e).get("value") for e in _seq(main.get("env"))}
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
                pin = "a digest (production)" if cfg.production else "a build tag or a digest"
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
        GPU_TAINT_KEY in _map(_map(c.get("resources")).get("limits")) for c in containers(pod)
    )


def tolerates_gpu(pod: Mapping[str, Any]) -> bool:
    """The pod tolerates the GPU pools' NoSchedule taint: by its key, or by a toleration
    without a key and operator Exists, which tolerates every taint (core/v1 Toleration)."""
    for t in (_map(x) for x in _seq(pod.get("tolerations"))):
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
    selector = _map(pod.get("nodeSelector"))
    if _selects_pool(lambda k: [str(selector[k])] if k in selector else None, cfg):
        return True
    required = _map(_map(_map(pod.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ))  # fmt: skip
    terms = [_map(t) for t in _seq(required.get("nodeSelectorTerms"))]

    def term_selects(term: Mapping[str, Any]) -> bool:
        def values(key: str) -> list[str] | None:
            for e in (_map(x) for x in _seq(term.get("matchExpressions"))):
                if e.get("key") == key and e.get("operator") == "In":
                    return [str(v) for v in _seq(e.get("values"))]
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
    queue = _map(job.get("spec")).get("queue")
    namespace = _map(job.get("metadata")).get("namespace")
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
    team = _map(job.get("metadata")).get("namespace")
    found = []
    for task, pod in pods(job):
        shared = {
            str(_map(v).get("name"))
            for v in _seq(pod.get("volumes"))
            if _map(_map(v).get("persistentVolumeClaim")).get("claimName") == SHARED_CLAIM
        }
        for c in containers(pod):
            for m in (_map(x) for x in _seq(c.get("volumeMounts"))):
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
    name = _map(job.get("spec")).get("schedulerName", "")
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
        volumes = {str(_map(v).get("name")): _map(v) for v in _seq(pod.get("volumes"))}
        main = _map(next(iter(_seq(pod.get("containers"))), {}))
        mount = next(
            (
                _map(m)
                for m in _seq(main.get("volumeMounts"))
                if _map(m).get("mountPath") == "/dev/shm"
            ),
            None,
        )
        shm = _map(volumes.get(str(mount.get("name")), {}).get("emptyDir")) if mount else {}
        if shm.get("medium") != "Memory" or "sizeLimit" not in shm:
            found.append(f"task {task}: /dev/shm is not a sized, memory-backed emptyDir")
    return found


# The Pod Security Standards' baseline level, as k8s.io/pod-security-admission v0.37.2
# checks it (policy/check_*.go of Level baseline), which every team namespace enforces:
# `no-privileged` holds Volcano Jobs to it, so that a job the rules accept never has its pods
# refused after admission, out of the member's sight (issue 19 #3).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
BASELINE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat",
    }
)  # fmt: skip
BASELINE_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t",
                          "container_engine_t")  # fmt: skip
CONFINED_PROFILES = ("RuntimeDefault", "Localhost")  # seccomp and AppArmor profile types
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HANDLERS = ("httpGet", "tcpSocket")


def _security_contexts(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(who, securityContext) for the pod and each of its containers."""
    yield "pod", _map(pod.get("securityContext"))
    for c in containers(pod):
        yield f"container {c.get('name')}", _map(c.get("securityContext"))


def _baseline(task: str, pod: Mapping[str, Any], annotations: Mapping[str, Any]) -> list[str]:
    """What Pod Security baseline refuses beyond host namespaces, privileged and hostPath."""
    found = _baseline_containers(task, pod)
    for who, sc in _security_contexts(pod):
        for key in ("seccompProfile", "appArmorProfile"):
            kind = _map(sc.get(key)).get("type")
            if key in sc and kind not in CONFINED_PROFILES:
                found.append(f"task {task}, {who}: {key} {kind} is not allowed")
        selinux = _map(sc.get("seLinuxOptions"))
        if selinux.get("type", "") not in BASELINE_SELINUX_TYPES or any(
            selinux.get(k) for k in ("user", "role")
        ):
            found.append(f"task {task}, {who}: seLinuxOptions {dict(selinux)} are not allowed")
        if _map(sc.get("windowsOptions")).get("hostProcess") is True:
            found.append(f"task {task}, {who}: windowsOptions.hostProcess is not allowed")
    sysctls = {
        str(_map(x).get("name")) for x in _seq(_map(pod.get("securityContext")).get("sysctls"))
    }
    if sysctls - BASELINE_SYSCTLS:
        found.append(f"task {task}: sysctls {sorted(sysctls - BASELINE_SYSCTLS)} are not allowed")
    for key, value in annotations.items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
            value in ("", "runtime/default") or str(value).startswith("localhost/")
        ):
            found.append(f"task {task}: annotation {key}={value} is not allowed")
    return found


def _baseline_containers(task: str, pod: Mapping[str, Any]) -> list[str]:
    found = []
    for c in containers(pod):
        who = f"task {task}, container {c.get('name')}"
        sc = _map(c.get("securityContext"))
        added = {str(a) for a in _seq(_map(sc.get("capabilities")).get("add"))}
        if added - BASELINE_CAPABILITIES:
            found.append(f"{who}: capabilities {sorted(added - BASELINE_CAPABILITIES)} not allowed")
        if sc.get("procMount", "Default") != "Default" and pod.get("hostUsers") is not False:
            found.append(f"{who}: procMount {sc.get('procMount')} is not allowed")
        if any(_map(p).get("hostPort", 0) != 0 for p in _seq(c.get("ports"))):
            found.append(f"{who}: hostPort is not allowed")
        lifecycle = _map(c.get("lifecycle"))
        for probe in [_map(c.get(k)) for k in PROBES] + [
            _map(lifecycle.get(k)) for k in ("postStart", "preStop")
        ]:
            if any(_map(probe.get(h)).get("host", "") != "" for h in HANDLERS):
                found.append(f"{who}: a probe or lifecycle handler sets host")
    return found


def no_privileged(job: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    found = []
    tasks = [_map(t) for t in _seq(_map(job.get("spec")).get("tasks"))]
    annotations = [
        _map(_map(_map(t.get("template")).get("metadata")).get("annotations")) for t in tasks
    ]
    for (task, pod), task_annotations in zip(pods(job), annotations, strict=True):
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key) is True:
                found.append(f"task {task}: {key} is not allowed")
        for c in containers(pod):
            if _map(c.get("securityContext")).get("privileged") is True:
                found.append(f"task {task}, container {c.get('name')}: privileged is not allowed")
        for v in (_map(x) for x in _seq(pod.get("volumes"))):
            if "hostPath" in v:
                found.append(f"task {task}: volume {v.get('name')} is a hostPath")
        found += _baseline(task, pod, task_annotations)
    return found


# Pod Security `restricted` (k8s.io/pod-security-admission v0.37.2 policy/check_*.go of
# Level restricted), which the platform's own job pods meet (jobs/render.py RESTRICTED_POD)
# but for one stated exception: an init container may run as root to prepare a directory,
# with no capability beyond SETUP_CAPABILITIES (the `checkpoint-dir` container on Lustre).
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})  # check_capabilities_restricted.go
SETUP_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER")
# check_restrictedVolumes.go: a volume passes if it has any of these sources.
RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                      "persistentVolumeClaim", "projected", "secret")  # fmt: skip


def _hardened_container(
    who: str, c: Mapping[str, Any], pod_sc: Mapping[str, Any], init: bool
) -> list[str]:
    sc = _map(c.get("securityContext"))
    found = []
    if sc.get("allowPrivilegeEscalation") is not False:
        found.append(f"{who}: allowPrivilegeEscalation is not false")
    caps = _map(sc.get("capabilities"))
    if "ALL" not in [str(x) for x in _seq(caps.get("drop"))]:
        found.append(f"{who}: capabilities.drop does not hold ALL")
    allowed = RESTRICTED_CAPABILITIES | (set(SETUP_CAPABILITIES) if init else set())
    added = {str(a) for a in _seq(caps.get("add"))} - allowed
    if added:
        found.append(f"{who}: adds capabilities {sorted(added)}")
    seccomp = sc.get("seccompProfile") if "seccompProfile" in sc else pod_sc.get("seccompProfile")
    if _map(seccomp).get("type") not in CONFINED_PROFILES:
        found.append(f"{who}: no RuntimeDefault or Localhost seccomp profile")
    if not init:  # the exception: init containers may run as root (see above)
        non_root = sc["runAsNonRoot"] if "runAsNonRoot" in sc else pod_sc.get("runAsNonRoot")
        if non_root is not True:
            found.append(f"{who}: runAsNonRoot is not true")
        if "runAsUser" in sc and float(sc["runAsUser"]) == 0:
            found.append(f"{who}: runAsUser is 0")
    return found


def hardened_pods(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 19 #10: job pods meet Pod Security restricted, with the init-container exception,
    and do not mount the service-account token they never use."""
    del cfg
    found = []
    for task, pod in pods(job):
        if pod.get("automountServiceAccountToken") is not False:
            found.append(f"task {task}: automountServiceAccountToken is not false")
        pod_sc = _map(pod.get("securityContext"))
        if "runAsUser" in pod_sc and float(pod_sc["runAsUser"]) == 0:
            found.append(f"task {task}: the pod's runAsUser is 0")
        for v in (_map(x) for x in _seq(pod.get("volumes"))):
            if not any(k in v for k in RESTRICTED_VOLUMES):
                found.append(f"task {task}: volume {v.get('name')} is not of a restricted type")
        for key, init in (("initContainers", True), ("containers", False)):
            for c in (_map(x) for x in _seq(pod.get(key))):
                who = f"task {task}, container {c.get('name')}"
                found += _hardened_container(who, c, pod_sc, init)
    return found


def limits_set(job: Mapping[str, Any], cfg: Config) -> list[str]:
    """Issue 19 #3: without limits the namespace's LimitRange defaults them (builders/teams.
    limit_range), and a request above that default makes the pod invalid, after admission."""
    del cfg
    found = []
    for task, pod in pods(job):
        for c in containers(pod):
            limits = _map(_map(c.get("resources")).get("limits"))
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
    meta, spec = _map(job.get("metadata")), _map(job.get("spec"))
    templates = [_map(t).get("template") for t in _seq(spec.get("tasks"))]
    reads = UPDATE_READS.get(rule, "templates")
    if reads == "annotation":
        return _map(meta.get("annotations")).get(MAX_DURATION_ANNOTATION, "")
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
    if _map(props.get("metadataOptions")).get("httpTokens") != "required":
        return ["metadataOptions.httpTokens must be 'required' (IMDSv2)"]
    return []


def ebs_encrypted(props: Mapping[str, Any], cfg: Config) -> list[str]:
    del cfg
    return [
        f"block device {_map(d).get('deviceName')} is not encrypted"
        for d in _seq(props.get("blockDeviceMappings"))
        if str(_map(_map(d).get("ebs")).get("encrypted")).lower() != "true"
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
    vpc = _map(props.get("vpcConfig"))
    if vpc.get("endpointPublicAccess") is False:
        return []
    cidrs = [str(c) for c in _seq(vpc.get("publicAccessCidrs"))]
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
    if _map(values).get("enableNetworkPolicy") != "true":
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


# -- stack-level rules: S3 buckets and their companion resources -------------------------------

BUCKET = "aws:s3/bucket:Bucket"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
PAB_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


@dataclass(frozen=True)
class StackResource:
    """A resource as a stack rule sees it. `key` is its identity: the URN under CrossGuard,
    `type::name` in the plan (names repeat: a bucket and its five companions share one).
    `depends_on` maps a property to the keys of the resources its value comes from (the
    engine's property dependencies), which link resources while values are still unknown."""

    type: str
    name: str
    props: Mapping[str, Any]
    key: str = ""
    depends_on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        return self.key or f"{self.type}::{self.name}"


StackCheck = Callable[[Sequence[StackResource]], list[tuple[str, str]]]


@dataclass(frozen=True)
class StackRule:
    name: str
    description: str
    remediation: str
    check: StackCheck  # (identity of the resource, message) per finding
    resource_types: tuple[str, ...]  # what `check` reads; the preview passes only these
    level: Level = "mandatory"


def _bucket_companions(
    resources: Sequence[StackResource], companion: str
) -> dict[str, list[Mapping[str, Any]]]:
    """Each bucket's companion resources, by the bucket's identity.

    Issue 19 #6: a companion names its bucket by id, which is unknown at preview while the
    bucket is new; reading it raised in the analyzer ("can't run policy"). The property
    dependency of `bucket` links them whatever the value is; the value (the bucket's name,
    or `<name>-id` offline) is read only for a companion registered without dependencies.
    """
    buckets = {r.identity: r for r in resources if r.type == BUCKET}

    def by_value(value: str) -> list[str]:
        return [
            key
            for key, b in buckets.items()
            if value in (f"{b.name}-id", str(b.props.get("bucket", b.name)))
        ]

    result: dict[str, list[Mapping[str, Any]]] = {key: [] for key in buckets}
    for r in resources:
        if r.type == companion:
            deps = r.depends_on.get("bucket", ())
            linked = (
                [k for k in deps if k in buckets] if deps else by_value(str(r.props.get("bucket")))
            )
            for key in linked:
                result[key].append(r.props)
    return result


def s3_encrypted(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    found = []
    for name, configs in _bucket_companions(resources, SSE).items():
        algorithms = {
            str(_map(_map(r).get("applyServerSideEncryptionByDefault")).get("sseAlgorithm"))
            for c in configs
            for r in _seq(c.get("rules"))
        }
        if not algorithms & {"aws:kms", "aws:kms:dsse", "AES256"}:
            found.append((name, "bucket has no server-side encryption configuration"))
    return found


def s3_public_access_blocked(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    found = []
    for name, configs in _bucket_companions(resources, PAB).items():
        if not any(all(c.get(flag) is True for flag in PAB_FLAGS) for c in configs):
            found.append((name, "bucket has no public access block with all four settings on"))
    return found


def cni_enforces_network_policy(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """NetworkPolicies in a stack that manages no CNI (an existing cluster): nothing here can
    make them enforced, or check that they are. One finding per stack."""
    policies = sorted(r.identity for r in resources if r.type == NETWORK_POLICY)
    managed = any(r.type == ADDON and r.props.get("addonName") == "vpc-cni" for r in resources)
    if not policies or managed:
        return []
    return [
        (
            policies[0],
            f"{len(policies)} NetworkPolicies (team isolation) are enforced only if this "
            "cluster's CNI enforces NetworkPolicy, which trainstack cannot configure or check "
            "on a cluster it does not create",
        )
    ]


PERSISTENT_VOLUME = "kubernetes:core/v1:PersistentVolume"


def pv_unique_volume_handle(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """No two CSI PersistentVolumes of a plan name the same volume.

    The kubelet names a CSI persistent volume `<driver>^<volumeHandle>` and keeps one entry
    per name (k8s.io/kubernetes@v1.37.2 pkg/volume/csi/csi_plugin.go GetVolumeName,
    CanDeviceMount; kubelet/volumemanager/cache/desired_state_of_world.go AddPodToVolume):
    a pod using two such PVs waits for the second forever (kubernetes/kubernetes#91556).
    """
    by_volume: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for r in resources:
        if r.type != PERSISTENT_VOLUME:
            continue  # the analyzer hands a stack policy every resource
        name, props = r.identity, r.props
        csi = _map(_map(props.get("spec")).get("csi"))
        if not csi:
            continue
        key = (str(csi.get("driver")), str(csi.get("volumeHandle")))
        pv_name = str(_map(props.get("metadata")).get("name", r.name))
        by_volume.setdefault(key, []).append((name, pv_name))
    found = []
    for (driver, handle), volumes in by_volume.items():
        if len(volumes) < 2:
            continue
        for name, pv_name in volumes:
            others = ", ".join(sorted(p for n, p in volumes if n != name))
            found.append(
                (
                    name,
                    f"PersistentVolume {pv_name} has CSI driver {driver} and volumeHandle "
                    f"{handle!r}, like {others}: the kubelet takes them for one volume "
                    "(<driver>^<volumeHandle>), so a pod using both never starts "
                    "(kubernetes/kubernetes#91556)",
                )
            )
    return found


STACK_RULES: tuple[StackRule, ...] = (
    StackRule("s3-encrypted", "S3 buckets are encrypted at rest",
              "add a BucketServerSideEncryptionConfiguration (aws:kms)", s3_encrypted,
              (BUCKET, SSE)),
    StackRule("s3-public-access-blocked", "S3 buckets block public access",
              "add a BucketPublicAccessBlock with all four settings true",
              s3_public_access_blocked, (BUCKET, PAB)),
    StackRule("cni-enforces-network-policy",
              "NetworkPolicies are enforced by the cluster's CNI",
              "make sure the cluster's CNI enforces NetworkPolicy (Calico, Cilium, or the VPC "
              "CNI with enableNetworkPolicy): README, Existing clusters",
              cni_enforces_network_policy,
              (NETWORK_POLICY, ADDON), level="advisory"),
    StackRule("pv-unique-volume-handle",
              "no two CSI PersistentVolumes share a driver and volumeHandle",
              "give every PersistentVolume its own volumeHandle; for the platform's Lustre on "
              "an existing cluster put {team} into storage.existingLustre.volumeHandle if the "
              "CSI driver reads the file system from volumeAttributes (docs/architecture.md, "
              "Storage)", pv_unique_volume_handle, (PERSISTENT_VOLUME,)),
)  # fmt: skip
