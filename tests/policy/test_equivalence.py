"""One rule, two enforcement points: the Python rule (CrossGuard, preview) and its CEL
admission policy must give the same verdict on the same objects."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.policy.cel import evaluate
from trainstack.policy.admission import POLICY_PREFIX, admission_policies
from trainstack.policy.objects import Config
from trainstack.policy.rules import K8S_RULES
from trainstack.preview.plan import Plan

CONFIG = Config(
    allowed_registries=("registry.example.com/",),
    team_max_duration_hours={"vision": 168},
    team_priority_classes={"vision": ("trainstack-high", "trainstack-normal")},
)
RULES = {r.name: r for r in K8S_RULES}
NAMESPACE = {
    "metadata": {
        "name": "vision",
        "annotations": {
            "trainstack.io/max-job-hours": "168",
            "trainstack.io/priority-classes": "high,normal",
        },
    }
}

Mutation = Callable[[dict[str, Any]], None]


def pod(job: dict[str, Any], task: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["tasks"][task]["template"]["spec"]
    return spec


def trainer(job: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = pod(job)["containers"][0]
    return c


def set_limit(name: str, value: str) -> Mutation:
    return lambda j: trainer(j)["resources"]["limits"].__setitem__(name, value)


def env_without(*names: str) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        for p in (pod(j, i) for i in range(len(j["spec"]["tasks"]))):
            c = p["containers"][0]
            c["env"] = [e for e in c["env"] if e["name"] not in names]

    return mutate


def swap_volume(name: str, volume: dict[str, Any]) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        vols = pod(j)["volumes"]
        vols[:] = [v if v["name"] != name else {"name": name, **volume} for v in vols]

    return mutate


def add_volume(volume: dict[str, Any], mount: dict[str, Any] | None = None) -> Mutation:
    """The first task's pod gets this volume, and its trainer this mount of it."""

    def mutate(j: dict[str, Any]) -> None:
        pod(j)["volumes"].append(volume)
        if mount is not None:
            trainer(j)["volumeMounts"].append({"name": volume["name"], **mount})

    return mutate


def datasets_mount(read_only: bool | None) -> Mutation:
    """The trainer mounts the datasets claim's volume again, at /x."""

    def mutate(j: dict[str, Any]) -> None:
        mount: dict[str, Any] = {"name": "data", "mountPath": "/x", "subPath": "other"}
        if read_only is not None:
            mount["readOnly"] = read_only
        trainer(j)["volumeMounts"].append(mount)

    return mutate


def metadata(where: str, kind: str, key: str, value: str) -> Mutation:
    """A label or annotation on the Job (`job`) or its first task's template (`template`)."""

    def mutate(j: dict[str, Any]) -> None:
        meta = j["metadata"] if where == "job" else j["spec"]["tasks"][0]["template"]["metadata"]
        meta.setdefault(kind, {})[key] = value

    return mutate


def plugins(value: dict[str, list[str]] | None) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        if value is None:
            j["spec"].pop("plugins")
        else:
            j["spec"]["plugins"] = value

    return mutate


def add_capabilities(*names: str) -> Mutation:
    return lambda j: trainer(j).__setitem__("securityContext", {"capabilities": {"add": [*names]}})


def container_context(context: dict[str, Any]) -> Mutation:
    return lambda j: trainer(j).__setitem__("securityContext", context)


def pod_context(context: dict[str, Any]) -> Mutation:
    return lambda j: pod(j).__setitem__("securityContext", context)


def node_selector(selector: dict[str, str]) -> Mutation:
    """No node affinity; this nodeSelector instead."""

    def mutate(j: dict[str, Any]) -> None:
        pod(j).pop("affinity")
        pod(j)["nodeSelector"] = selector

    return mutate


def add_toleration(toleration: dict[str, Any]) -> Mutation:
    return lambda j: pod(j).setdefault("tolerations", []).append(toleration)


def tolerate_all(j: dict[str, Any]) -> None:
    pod(j)["tolerations"] = [{"operator": "Exists"}]


def _cpu_only(j: dict[str, Any]) -> None:
    for t in range(len(j["spec"]["tasks"])):
        for c in pod(j, t)["containers"]:
            for key in ("requests", "limits"):
                c["resources"][key] = {
                    k: v for k, v in c["resources"][key].items() if k in ("cpu", "memory")
                }


def cpu_only(j: dict[str, Any]) -> None:
    _cpu_only(j)


def cpu_only_tolerating_all(j: dict[str, Any]) -> None:
    _cpu_only(j)
    for t in range(len(j["spec"]["tasks"])):
        pod(j, t)["tolerations"] = [{"operator": "Exists"}]


def cpu_task_in_gpu_job(j: dict[str, Any]) -> None:
    """A parameter-server-like task without GPUs beside the GPU task."""
    extra = copy.deepcopy(j["spec"]["tasks"][0])
    extra["name"] = "ps"
    c = extra["template"]["spec"]["containers"][0]
    for key in ("requests", "limits"):
        c["resources"][key] = {
            k: v for k, v in c["resources"][key].items() if k in ("cpu", "memory")
        }
    j["spec"]["tasks"].append(extra)


def root_init(add: list[str]) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        pod(j).setdefault("initContainers", []).append(
            {
                "name": "setup",
                "image": "registry.example.com/a:1",
                "securityContext": {
                    "runAsNonRoot": False,
                    "runAsUser": 0,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": add},
                },
                "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
            }
        )

    return mutate


def template_annotation(key: str, value: str) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        metadata = j["spec"]["tasks"][0]["template"].setdefault("metadata", {})
        metadata.setdefault("annotations", {})[key] = value

    return mutate


def annotate(value: str | None) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        ann = j["metadata"]["annotations"]
        if value is None:
            ann.pop("trainstack.io/max-duration-seconds")
        else:
            ann["trainstack.io/max-duration-seconds"] = value

    return mutate


PINNED = "volcano.sh/preemptable"


def pinned_task(
    name: str = "rendezvous",
    *,
    value: str = "false",
    kind: str = "annotations",
    replicas: int | None = 1,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    change: Mutation | None = None,
) -> Mutation:
    """Issue 43: a task like an elastic job's rendezvous appended to the demo job: a copy of
    its first task with one CPU container (limits 500m, 512Mi), `replicas`, and the preemptable
    key under `kind` of its template; `change` then edits that task's pod spec, handed to
    it as a job of that one task."""

    def mutate(j: dict[str, Any]) -> None:
        task = copy.deepcopy(j["spec"]["tasks"][0])
        task["name"] = name
        if replicas is None:
            task.pop("replicas")
        else:
            task["replicas"] = replicas
        c = task["template"]["spec"]["containers"][0]
        c["resources"] = {
            "requests": requests if requests is not None else {"cpu": "250m", "memory": "512Mi"},
            "limits": limits if limits is not None else {"cpu": "500m", "memory": "512Mi"},
        }
        task["template"].setdefault("metadata", {}).setdefault(kind, {})[PINNED] = value
        if change is not None:
            change({"spec": {"tasks": [task]}})
        j["spec"]["tasks"].append(task)

    return mutate


def init_container(resources: dict[str, Any], **fields: Any) -> Mutation:
    """An init container with these resources in the first task's pod, as hardened as its
    trainer (so that only the resources decide)."""

    def mutate(j: dict[str, Any]) -> None:
        pod(j).setdefault("initContainers", []).append(
            {
                "name": "setup",
                "image": trainer(j)["image"],
                "securityContext": copy.deepcopy(trainer(j)["securityContext"]),
                "resources": resources,
                **fields,
            }
        )

    return mutate


def both(*mutations: Mutation) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        for m in mutations:
            m(j)

    return mutate


def gpus_as(resource: str, amount: str = "1", tasks: tuple[int, ...] | None = None) -> Mutation:
    """The trainers of the given tasks (default: every task) ask for `amount` of `resource`
    instead of their whole GPU (issue 47: MIG instances and time-shared GPUs)."""

    def mutate(j: dict[str, Any]) -> None:
        for i in tasks if tasks is not None else range(len(j["spec"]["tasks"])):
            res = pod(j, i)["containers"][0]["resources"]
            for side in ("requests", "limits"):
                res[side].pop("nvidia.com/gpu", None)
                res[side][resource] = amount

    return mutate


def then(*mutations: Mutation) -> Mutation:
    def mutate(j: dict[str, Any]) -> None:
        for m in mutations:
            m(j)

    return mutate


def one_task(j: dict[str, Any]) -> None:
    """The master alone: a job of one replica."""
    j["spec"]["tasks"] = j["spec"]["tasks"][:1]
    j["spec"]["minAvailable"] = 1


def shared_init_container(j: dict[str, Any]) -> None:
    """The first task's pod gets an init container holding a time-shared GPU as well."""
    init = copy.deepcopy(trainer(j))
    init["name"] = "warmup"
    init.pop("livenessProbe", None)
    init.pop("ports", None)
    pod(j).setdefault("initContainers", []).append(init)


SHARED = "nvidia.com/gpu.shared"
ALLOW_SHARED = metadata("job", "annotations", "trainstack.io/shared-gpus", "allow")


CASES: list[tuple[str, str, Mutation | None, bool]] = [
    # (rule, case, mutation of the valid demo job, admitted?)
    ("request-limit-ratio", "valid", None, True),
    ("request-limit-ratio", "cpu limit 3x request", set_limit("cpu", "12"), False),
    ("request-limit-ratio", "cpu limit 2x request", set_limit("cpu", "8"), True),
    ("request-limit-ratio", "memory limit above request", set_limit("memory", "17Gi"), False),
    ("devices-requests-equal-limits", "valid", None, True),
    (
        "devices-requests-equal-limits",
        "gpu limit 2, request 1",
        set_limit("nvidia.com/gpu", "2"),
        False,
    ),
    (
        "devices-requests-equal-limits",
        "efa limit differs",
        set_limit("vpc.amazonaws.com/efa", "8"),
        False,
    ),
    (
        "devices-requests-equal-limits",
        "hugepages equal in other units",
        set_limit("hugepages-2Mi", "655360Ki"),
        True,
    ),
    ("max-duration", "valid", None, True),
    ("max-duration", "missing", annotate(None), False),
    ("max-duration", "beyond the team's 168h", annotate(str(200 * 3600)), False),
    ("max-duration", "zero", annotate("0"), False),
    ("checkpoint-volume", "valid", None, True),
    (
        "checkpoint-volume",
        "emptyDir instead of a claim",
        swap_volume("checkpoints", {"emptyDir": {}}),
        False,
    ),
    (
        "checkpoint-volume",
        "hostPath instead of a claim",
        swap_volume("checkpoints", {"hostPath": {"path": "/ckpt"}}),
        False,
    ),
    ("checkpoint-volume", "no interval", env_without("TRAINSTACK_CHECKPOINT_INTERVAL_S"), False),
    ("pinned-images", "valid", None, True),
    (
        "pinned-images",
        ":latest",
        lambda j: trainer(j).__setitem__("image", "registry.example.com/a:latest"),
        False,
    ),
    (
        "pinned-images",
        "untagged",
        lambda j: trainer(j).__setitem__("image", "registry.example.com/a"),
        False,
    ),
    (
        "pinned-images",
        "digest",
        lambda j: trainer(j).__setitem__("image", "registry.example.com/a@sha256:" + "a" * 64),
        True,
    ),
    (
        "pinned-images",
        "malformed digest",
        lambda j: trainer(j).__setitem__("image", "registry.example.com/a@sha256:abc"),
        False,
    ),
    (
        "pinned-images",
        "tag and digest",
        lambda j: trainer(j).__setitem__("image", "registry.example.com/a:1.0@sha256:" + "b" * 64),
        True,
    ),
    (
        "pinned-images",
        "branch tag",  # issue 19 #4: a tag that names a branch moves under a running job
        lambda j: trainer(j).__setitem__("image", "registry.example.com/a:main"),
        False,
    ),
    (
        "pinned-images",
        "build tag",
        lambda j: trainer(j).__setitem__("image", "registry.example.com/a:2025.06.1"),
        True,
    ),
    (
        "pinned-images",
        "trailing newline",  # Python's `$` matched before it; RE2's does not
        lambda j: trainer(j).__setitem__("image", "registry.example.com/a:1\n"),
        False,
    ),
    (
        "pinned-images",
        "other registry",
        lambda j: trainer(j).__setitem__("image", "docker.io/a:1"),
        False,
    ),
    ("gpu-placement", "valid", None, True),
    ("gpu-placement", "no toleration", lambda j: pod(j).pop("tolerations"), False),
    ("gpu-placement", "no pool affinity", lambda j: pod(j).pop("affinity"), False),
    (
        "gpu-placement",
        "no affinity but a nodeSelector",
        node_selector({"trainstack.io/pool": "x"}),
        True,
    ),
    # Issue 19 #5: any node selector passed before.
    (
        "gpu-placement",
        "a nodeSelector on another label",
        node_selector({"kubernetes.io/os": "linux"}),
        False,
    ),
    (
        "gpu-placement",
        "affinity on another label",
        lambda j: pod(j)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ].__setitem__(
            "nodeSelectorTerms",
            [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}],
        ),
        False,
    ),
    (
        "gpu-placement",
        "a second affinity term that selects any node",
        lambda j: pod(j)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"].append(
            {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}
        ),
        False,
    ),
    (
        "gpu-placement",
        "pool label with NotIn",
        lambda j: pod(j)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ].__setitem__(
            "nodeSelectorTerms",
            [
                {
                    "matchExpressions": [
                        {"key": "trainstack.io/pool", "operator": "NotIn", "values": ["x"]}
                    ]
                }
            ],
        ),
        False,
    ),
    ("gpu-placement", "tolerates every taint", tolerate_all, True),
    ("gpu-placement", "a CPU job tolerating the GPU taint", cpu_only, False),
    ("gpu-placement", "a CPU job tolerating every taint", cpu_only_tolerating_all, False),
    ("gpu-placement", "a CPU-only task of a GPU job", cpu_task_in_gpu_job, True),
    # Issue 47: a MIG instance or a time-shared GPU is a GPU to the placement rule too.
    (
        "gpu-placement",
        "a MIG instance, no pool affinity",
        then(gpus_as("nvidia.com/mig-1g.10gb"), lambda j: pod(j).pop("affinity")),
        False,
    ),
    (
        "gpu-placement",
        "a time-shared GPU, no GPU toleration",
        then(gpus_as(SHARED), lambda j: pod(j).pop("tolerations")),
        False,
    ),
    (
        "gpu-placement",
        "MIG instances, pinned and tolerating",
        gpus_as("nvidia.com/mig-1g.10gb"),
        True,
    ),
    # Issue 47: distributed jobs stay off time-shared GPUs unless the Job says so.
    ("shared-gpus", "valid", None, True),
    ("shared-gpus", "two replicas on time-shared GPUs", gpus_as(SHARED), False),
    ("shared-gpus", "two replicas, allowed on the Job", then(gpus_as(SHARED), ALLOW_SHARED), True),
    (
        "shared-gpus",
        "allowed on a task template, not the Job",
        then(
            gpus_as(SHARED),
            metadata("template", "annotations", "trainstack.io/shared-gpus", "allow"),
        ),
        False,
    ),
    ("shared-gpus", "one replica on a time-shared GPU", then(one_task, gpus_as(SHARED)), True),
    (
        "shared-gpus",
        "one replica asking for two shares, allowed",
        then(one_task, gpus_as(SHARED, "2"), ALLOW_SHARED),
        False,
    ),
    (
        "shared-gpus",
        "one replica whose init container holds a share too",
        then(one_task, gpus_as(SHARED), shared_init_container),
        False,
    ),
    (
        "shared-gpus",
        "one task of three replicas",
        then(one_task, gpus_as(SHARED), lambda j: j["spec"]["tasks"][0].__setitem__("replicas", 3)),
        False,
    ),
    ("shared-gpus", "MIG instances in two replicas", gpus_as("nvidia.com/mig-1g.10gb"), True),
    # Issue 42: the node health gate holds against a job that tolerates its taint.
    ("health-gate", "valid", None, True),
    ("health-gate", "tolerates every taint", tolerate_all, False),
    (
        "health-gate",
        "tolerates the gate by its key",
        add_toleration({"key": "trainstack.io/health", "operator": "Exists"}),
        False,
    ),
    (
        "health-gate",
        "tolerates a failed node",
        add_toleration({"key": "trainstack.io/health", "value": "failed", "effect": "NoSchedule"}),
        False,
    ),
    (
        "health-gate",
        "a keyless Exists for NoExecute only (does not match the NoSchedule gate)",
        add_toleration({"operator": "Exists", "effect": "NoExecute"}),
        True,
    ),
    ("own-queue", "valid", None, True),
    ("own-queue", "another team's queue", lambda j: j["spec"].__setitem__("queue", "nlp"), False),
    # Issue 37: what a member's pod may mount. An inline volume of a storage driver would
    # mount what its attributes say (fsx.csi.aws.com: the whole file system).
    ("pod-volumes", "valid", None, True),
    (
        "pod-volumes",
        "an inline FSx volume of the whole file system",
        add_volume(
            {
                "name": "all",
                "csi": {
                    "driver": "fsx.csi.aws.com",
                    "volumeAttributes": {"dnsname": "fs-1.fsx", "mountname": "abcdefgh"},
                },
            },
            {"mountPath": "/all"},
        ),
        False,
    ),
    (
        "pod-volumes",
        "the node cache, writable",
        add_volume(
            {"name": "c", "csi": {"driver": "cache.trainstack.io", "volumeAttributes": {}}},
            {"mountPath": "/c"},
        ),
        False,
    ),
    (
        "pod-volumes",
        "the node cache, read-only",
        add_volume(
            {
                "name": "c",
                "csi": {"driver": "cache.trainstack.io", "readOnly": True, "volumeAttributes": {}},
            },
            {"mountPath": "/c", "readOnly": True},
        ),
        True,
    ),
    (
        "pod-volumes",
        "a generic ephemeral volume (a claim from any spec)",
        add_volume(
            {
                "name": "e",
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "spec": {
                            "accessModes": ["ReadWriteMany"],
                            "volumeName": "nlp-checkpoints",
                            "resources": {"requests": {"storage": "1Gi"}},
                        }
                    }
                },
            },
            {"mountPath": "/e"},
        ),
        False,
    ),
    ("pod-volumes", "datasets mounted writable", datasets_mount(False), False),
    ("pod-volumes", "datasets mounted without readOnly", datasets_mount(None), False),
    ("pod-volumes", "datasets mounted read-only again", datasets_mount(True), True),
    (
        "pod-volumes",
        "the datasets claim, writable",
        lambda j: next(v for v in pod(j)["volumes"] if v["name"] == "data")[
            "persistentVolumeClaim"
        ].pop("readOnly"),
        False,
    ),
    (
        "pod-volumes",
        "the checkpoints claim without a sub-path",
        lambda j: trainer(j)["volumeMounts"].append({"name": "checkpoints", "mountPath": "/all"}),
        True,  # the claim's root is the team's own directory (issue 37 #1)
    ),
    # Issue 37 #2: Volcano mounts Job-level volumes into every container and creates claims.
    ("job-volumes", "valid", None, True),
    (
        "job-volumes",
        "a claim created from any spec",
        lambda j: j["spec"].__setitem__(
            "volumes",
            [
                {
                    "mountPath": "/v",
                    "volumeClaim": {
                        "accessModes": ["ReadWriteMany"],
                        "volumeName": "nlp-checkpoints",
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        ),
        False,
    ),
    (
        "job-volumes",
        "an existing claim mounted everywhere",
        lambda j: j["spec"].__setitem__(
            "volumes", [{"mountPath": "/v", "volumeClaimName": "datasets"}]
        ),
        False,
    ),
    ("job-volumes", "an empty list", lambda j: j["spec"].__setitem__("volumes", []), True),
    # Issue 37 #3: keys that take pods off the preempt and reclaim lists, and the like.
    ("scheduling-keys", "valid", None, True),
    (
        "scheduling-keys",
        "preemptable false on the job",
        metadata("job", "annotations", "volcano.sh/preemptable", "false"),
        False,
    ),
    (
        "scheduling-keys",
        "preemptable as a job label",
        metadata("job", "labels", "volcano.sh/preemptable", "false"),
        False,
    ),
    (
        "scheduling-keys",
        "preemptable on a template",
        metadata("template", "annotations", "volcano.sh/preemptable", "no"),
        False,
    ),
    (
        "scheduling-keys",
        "preemptable as a template label",
        metadata("template", "labels", "volcano.sh/preemptable", "false"),
        False,
    ),
    (
        "scheduling-keys",
        "a cooldown that protects from preemption",
        metadata("job", "annotations", "volcano.sh/cooldown-time", "87600h"),
        False,
    ),
    (
        "scheduling-keys",
        "the bare sla key",
        metadata("job", "annotations", "sla-waiting-time", "1s"),
        False,
    ),
    (
        "scheduling-keys",
        "a task priority",
        metadata("template", "annotations", "volcano.sh/task-priority", "1000000"),
        False,
    ),
    (
        "scheduling-keys",
        "another pod group",
        metadata("template", "annotations", "scheduling.k8s.io/group-name", "nlp-x"),
        False,
    ),
    (
        "scheduling-keys",
        "a queue allocation gate",
        metadata("job", "annotations", "scheduling.volcano.sh/queue-allocation-gate", "x"),
        False,
    ),
    # Issue 43: the one exception, an elastic job's rendezvous pod: `preemptable: "false"`
    # in the template annotations of one one-replica task whose pod is small and CPU only.
    ("scheduling-keys", "preemptable false on a small CPU task", pinned_task(), True),
    (
        "scheduling-keys",
        "preemptable false on a CPU task at the bounds",
        pinned_task(
            requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "1000m", "memory": "1Gi"}
        ),
        True,
    ),
    (
        "scheduling-keys",
        "preemptable false on a CPU task with a small init container",
        pinned_task(change=init_container({"limits": {"cpu": "1", "memory": "64Mi"}})),
        True,
    ),
    (
        "scheduling-keys",
        "preemptable false on a GPU task",
        metadata("template", "annotations", PINNED, "false"),
        False,
    ),
    (
        "scheduling-keys",
        "preemptable false as a label of the CPU task",
        pinned_task(kind="labels"),
        False,
    ),
    (
        "scheduling-keys",
        "preemptable false on the job beside the CPU task",
        both(pinned_task(), metadata("job", "annotations", PINNED, "false")),
        False,
    ),
    ("scheduling-keys", "preemptable no on the CPU task", pinned_task(value="no"), False),
    ("scheduling-keys", "preemptable False on the CPU task", pinned_task(value="False"), False),
    ("scheduling-keys", "preemptable 0 on the CPU task", pinned_task(value="0"), False),
    ("scheduling-keys", "preemptable true on the CPU task", pinned_task(value="true"), False),
    ("scheduling-keys", "two replicas of the CPU task", pinned_task(replicas=2), False),
    ("scheduling-keys", "replicas unset on the CPU task", pinned_task(replicas=None), False),
    (
        "scheduling-keys",
        "two CPU tasks with preemptable false",
        both(pinned_task("rendezvous"), pinned_task("store")),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task with a cpu limit of 2",
        pinned_task(
            requests={"cpu": "1", "memory": "512Mi"}, limits={"cpu": "2", "memory": "512Mi"}
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task with a memory limit of 2Gi",
        pinned_task(
            requests={"cpu": "250m", "memory": "2Gi"}, limits={"cpu": "500m", "memory": "2Gi"}
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task without a memory limit",
        pinned_task(limits={"cpu": "500m"}),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task whose init container requests a GPU",
        pinned_task(
            change=init_container(
                {
                    "requests": {"nvidia.com/gpu": "1"},
                    "limits": {"cpu": "1", "memory": "64Mi", "nvidia.com/gpu": "1"},
                }
            )
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task whose init container has no limits",
        pinned_task(change=init_container({"requests": {"cpu": "4", "memory": "16Gi"}})),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task whose init container's limits exceed the bound",
        pinned_task(change=init_container({"limits": {"cpu": "8", "memory": "64Gi"}})),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task with a sidecar",
        pinned_task(
            change=init_container({"limits": {"cpu": "1", "memory": "1Gi"}}, restartPolicy="Always")
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task of two containers",
        pinned_task(
            change=lambda j: pod(j)["containers"].append(
                {**copy.deepcopy(pod(j)["containers"][0]), "name": "second"}
            )
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task with a pod resourceClaims entry",
        pinned_task(
            change=lambda j: pod(j).__setitem__(
                "resourceClaims", [{"name": "gpu", "resourceClaimTemplateName": "gpus"}]
            )
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task whose container names a claim",
        pinned_task(
            change=lambda j: pod(j)["containers"][0]["resources"].__setitem__(
                "claims", [{"name": "gpu"}]
            )
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task with pod-level resources",
        pinned_task(change=lambda j: pod(j).__setitem__("resources", {"limits": {"cpu": "64"}})),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task requesting EFA",
        pinned_task(
            requests={"cpu": "250m", "memory": "512Mi", "vpc.amazonaws.com/efa": "1"},
            limits={"cpu": "500m", "memory": "512Mi", "vpc.amazonaws.com/efa": "1"},
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task with hugepages",
        pinned_task(
            requests={"cpu": "250m", "memory": "512Mi", "hugepages-2Mi": "64Mi"},
            limits={"cpu": "500m", "memory": "512Mi", "hugepages-2Mi": "64Mi"},
        ),
        False,
    ),
    (
        "scheduling-keys",
        "a CPU task with another volcano.sh key beside preemptable",
        pinned_task(
            change=lambda j: j["spec"]["tasks"][0]["template"]["metadata"][
                "annotations"
            ].__setitem__("volcano.sh/task-priority", "1000000")
        ),
        False,
    ),
    (
        "scheduling-keys",
        "an annotation of the team's own",
        metadata("job", "annotations", "example.com/owner", "ana"),
        True,
    ),
    # Issue 37: plugins and arguments beyond the job layer's.
    ("job-plugins", "valid", None, True),
    ("job-plugins", "no plugins", plugins(None), True),
    (
        "job-plugins",
        "ssh",
        lambda j: j["spec"]["plugins"].__setitem__("ssh", []),
        False,
    ),
    (
        "job-plugins",
        "svc managing a NetworkPolicy named like the job",
        lambda j: j["spec"]["plugins"].__setitem__("svc", []),
        False,
    ),
    (
        "job-plugins",
        "pytorch's init container of any image",
        lambda j: j["spec"]["plugins"]["pytorch"].append("--wait-master-image=evil:1"),
        False,
    ),
    (
        "job-plugins",
        "a pytorch argument twice",
        lambda j: j["spec"]["plugins"]["pytorch"].append("--port=1"),
        False,
    ),
    (
        "job-plugins",
        "env with an argument",
        lambda j: j["spec"]["plugins"].__setitem__("env", ["x"]),
        False,
    ),
    ("volcano-scheduled", "valid", None, True),
    (
        "volcano-scheduled",
        "another scheduler for the job",
        lambda j: j["spec"].__setitem__("schedulerName", "default-scheduler"),
        False,
    ),
    (
        "volcano-scheduled",
        "another scheduler for a task",
        lambda j: pod(j).__setitem__("schedulerName", "default-scheduler"),
        False,
    ),
    (
        "volcano-scheduled",
        "a task's own priority class",
        lambda j: pod(j).__setitem__("priorityClassName", "trainstack-critical"),
        False,
    ),
    (
        "volcano-scheduled",
        "volcano named on a task",
        lambda j: pod(j).__setitem__("schedulerName", "volcano"),
        True,
    ),
    # Issue 37 #3: a node named in the template skips the scheduler, its queue and taints.
    (
        "volcano-scheduled",
        "a node named in the template",
        lambda j: pod(j).__setitem__("nodeName", "gpu-node-7"),
        False,
    ),
    (
        "volcano-scheduled",
        "a system priority class for the job",
        lambda j: j["spec"].__setitem__("priorityClassName", "system-node-critical"),
        False,
    ),
    (
        "volcano-scheduled",
        "a class the team may not use",
        lambda j: j["spec"].__setitem__("priorityClassName", "trainstack-critical"),
        False,
    ),
    (
        "volcano-scheduled",
        "one of the team's classes",
        lambda j: j["spec"].__setitem__("priorityClassName", "trainstack-high"),
        True,
    ),
    (
        "volcano-scheduled",
        "no class",
        lambda j: j["spec"].pop("priorityClassName"),
        True,
    ),
    ("shm-sized", "valid", None, True),
    ("shm-sized", "unsized", swap_volume("dshm", {"emptyDir": {"medium": "Memory"}}), False),
    ("shm-sized", "disk-backed", swap_volume("dshm", {"emptyDir": {"sizeLimit": "8Gi"}}), False),
    ("hardened-pods", "valid", None, True),
    (
        "hardened-pods",
        "the service-account token",
        lambda j: pod(j).pop("automountServiceAccountToken"),
        False,
    ),
    ("hardened-pods", "no pod security context", lambda j: pod(j).pop("securityContext"), False),
    (
        "hardened-pods",
        "non-root only on the trainer",
        lambda j: (
            pod(j)["securityContext"].pop("runAsNonRoot"),
            trainer(j)["securityContext"].__setitem__("runAsNonRoot", True),
        ),
        True,
    ),
    (
        "hardened-pods",
        "the trainer as root",
        lambda j: trainer(j)["securityContext"].__setitem__("runAsUser", 0),
        False,
    ),
    (
        "hardened-pods",
        "the trainer opts out of runAsNonRoot",
        lambda j: trainer(j)["securityContext"].__setitem__("runAsNonRoot", False),
        False,
    ),
    (
        "hardened-pods",
        "privilege escalation",
        lambda j: trainer(j)["securityContext"].__setitem__("allowPrivilegeEscalation", True),
        False,
    ),
    (
        "hardened-pods",
        "capabilities not dropped",
        lambda j: trainer(j)["securityContext"].pop("capabilities"),
        False,
    ),
    (
        "hardened-pods",
        "IPC_LOCK on the trainer",
        lambda j: trainer(j)["securityContext"]["capabilities"].__setitem__("add", ["IPC_LOCK"]),
        False,
    ),
    (
        "hardened-pods",
        "NET_BIND_SERVICE on the trainer",
        lambda j: trainer(j)["securityContext"]["capabilities"].__setitem__(
            "add", ["NET_BIND_SERVICE"]
        ),
        True,
    ),
    (
        "hardened-pods",
        "seccomp on the trainer only",
        lambda j: (
            pod(j)["securityContext"].pop("seccompProfile"),
            trainer(j)["securityContext"].__setitem__("seccompProfile", {"type": "RuntimeDefault"}),
        ),
        True,  # every container of that pod sets its own (restricted allows that)
    ),
    (
        "hardened-pods",
        "no seccomp profile",
        lambda j: pod(j)["securityContext"].pop("seccompProfile"),
        False,
    ),
    (
        "hardened-pods",
        "an nfs volume",
        lambda j: pod(j)["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
        False,
    ),
    # Issue 37: the init-container exception let any member run any image as root.
    ("hardened-pods", "a root setup init container", root_init(["CHOWN"]), False),
    ("hardened-pods", "a root init container without capabilities", root_init([]), False),
    ("hardened-pods", "a root init container with SYS_ADMIN", root_init(["SYS_ADMIN"]), False),
    ("limits-set", "valid", None, True),
    (
        "limits-set",
        "no cpu limit",
        lambda j: trainer(j)["resources"]["limits"].pop("cpu"),
        False,
    ),
    (
        "limits-set",
        "no limits on an init container",
        lambda j: pod(j).__setitem__(
            "initContainers",
            [{**copy.deepcopy(trainer(j)), "name": "setup", "resources": {}}],
        ),
        False,
    ),
    ("no-privileged", "valid", None, True),
    (
        "no-privileged",
        "privileged",
        lambda j: trainer(j).__setitem__("securityContext", {"privileged": True}),
        False,
    ),
    ("no-privileged", "hostNetwork", lambda j: pod(j).__setitem__("hostNetwork", True), False),
    (
        "no-privileged",
        "hostPath",
        lambda j: pod(j)["volumes"].append({"name": "h", "hostPath": {"path": "/var/run"}}),
        False,
    ),
    # Issue 19 #3: baseline forbids every hostPath, and IPC_LOCK (RDMA teams' namespaces
    # enforced `privileged` for it before); k8s.io/pod-security-admission v0.37.2
    # policy/check_hostPathVolumes.go, check_capabilities_baseline.go.
    (
        "no-privileged",
        "the formerly allow-listed device path",
        lambda j: pod(j)["volumes"].append({"name": "h", "hostPath": {"path": "/dev/infiniband"}}),
        False,
    ),
    ("no-privileged", "IPC_LOCK", add_capabilities("IPC_LOCK"), False),
    ("no-privileged", "a baseline capability", add_capabilities("NET_BIND_SERVICE"), True),
    ("no-privileged", "SYS_ADMIN", add_capabilities("SYS_ADMIN"), False),
    ("no-privileged", "NET_RAW", add_capabilities("NET_RAW"), False),
    (
        "no-privileged",
        "hostPort",
        lambda j: trainer(j)["ports"].append({"containerPort": 22, "hostPort": 2222}),
        False,
    ),
    (
        "no-privileged",
        "seccomp RuntimeDefault",
        pod_context({"seccompProfile": {"type": "RuntimeDefault"}}),
        True,
    ),
    (
        "no-privileged",
        "seccomp Unconfined",
        pod_context({"seccompProfile": {"type": "Unconfined"}}),
        False,
    ),
    (
        "no-privileged",
        "AppArmor Unconfined on a container",
        container_context({"appArmorProfile": {"type": "Unconfined"}}),
        False,
    ),
    (
        "no-privileged",
        "AppArmor unconfined by annotation",
        template_annotation("container.apparmor.security.beta.kubernetes.io/trainer", "unconfined"),
        False,
    ),
    (
        "no-privileged",
        "AppArmor localhost profile by annotation",
        template_annotation(
            "container.apparmor.security.beta.kubernetes.io/trainer", "localhost/train"
        ),
        True,
    ),
    (
        "no-privileged",
        "SELinux type spc_t",
        container_context({"seLinuxOptions": {"type": "spc_t"}}),
        False,
    ),
    (
        "no-privileged",
        "SELinux level only",
        pod_context({"seLinuxOptions": {"level": "s0:c1,c2"}}),
        True,
    ),
    (
        "no-privileged",
        "SELinux user",
        pod_context({"seLinuxOptions": {"user": "system_u"}}),
        False,
    ),
    (
        "no-privileged",
        "procMount Unmasked",
        container_context({"procMount": "Unmasked"}),
        False,
    ),
    (
        "no-privileged",
        "safe sysctl",
        pod_context({"sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}),
        True,
    ),
    (
        "no-privileged",
        "unsafe sysctl",
        pod_context({"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}),
        False,
    ),
    (
        "no-privileged",
        "Windows host process",
        pod_context({"windowsOptions": {"hostProcess": True}}),
        False,
    ),
    (
        "no-privileged",
        "probe to another host",
        lambda j: trainer(j)["livenessProbe"]["httpGet"].__setitem__("host", "169.254.169.254"),
        False,
    ),
]


@pytest.fixture(scope="module")
def policies() -> dict[str, dict[str, Any]]:
    return {
        m["metadata"]["name"].removeprefix(POLICY_PREFIX): m
        for m in admission_policies(CONFIG, "test")
        if m["kind"] == "ValidatingAdmissionPolicy"
    }


def demo_job(plan: Plan) -> dict[str, Any]:
    job = next(
        r
        for r in plan.resources
        if r.type.endswith(":Job") and r.name.endswith("demo-train-volcano")
    )
    return copy.deepcopy(job.inputs)


def test_every_kubernetes_rule_has_cases_and_a_policy(policies: dict[str, dict[str, Any]]) -> None:
    assert set(policies) == set(RULES)
    assert {rule for rule, *_ in CASES} == set(RULES)
    for rule in RULES:
        assert any(not ok for r, _, _, ok in CASES if r == rule), f"{rule} has no failing case"


@pytest.mark.parametrize(
    ("rule", "case", "mutate", "admitted"), CASES, ids=[f"{r}: {c}" for r, c, _, _ in CASES]
)
def test_python_rule_and_cel_agree(
    rule: str,
    case: str,
    mutate: Mutation | None,
    admitted: bool,
    policies: dict[str, dict[str, Any]],
    example_plans: dict[str, Plan],
) -> None:
    del case
    job = demo_job(example_plans["vision"])
    if mutate is not None:
        mutate(job)
    python_ok = not RULES[rule].check(job, CONFIG)
    cel_ok = evaluate(policies[rule], job, NAMESPACE)
    assert python_ok is admitted, RULES[rule].check(job, CONFIG)
    assert cel_ok is admitted


PRODUCTION = Config(
    allowed_registries=("registry.example.com/",),
    team_max_duration_hours={"vision": 168},
    production=True,
)


@pytest.mark.parametrize(
    ("image", "admitted"),
    [
        ("registry.example.com/a:2025.06.1", False),
        ("registry.example.com/a@sha256:" + "c" * 64, True),
        ("registry.example.com/a:2025.06.1@sha256:" + "c" * 64, True),
        ("docker.io/a@sha256:" + "c" * 64, False),
    ],
    ids=["build tag", "digest", "tag and digest", "digest elsewhere"],
)
def test_production_takes_digests_in_both_enforcers(
    image: str, admitted: bool, example_plans: dict[str, Plan]
) -> None:
    """Any tag can be re-pushed: production stacks pin images by digest (docs/policies.md)."""
    policy = next(
        m
        for m in admission_policies(PRODUCTION, "test")
        if m["metadata"]["name"] == f"{POLICY_PREFIX}pinned-images"
        and m["kind"] == "ValidatingAdmissionPolicy"
    )
    job = demo_job(example_plans["vision"])
    trainer(job)["image"] = image
    for c in pod(job).get("initContainers", []):
        c["image"] = image
    assert (not RULES["pinned-images"].check(job, PRODUCTION)) is admitted
    assert evaluate(policy, job, NAMESPACE) is admitted


POOL_SELECTORS = {
    name: {"trainstack.io/pool": name} for name in ("h100-block", "h100-reserved", "h200-burst")
}
CONFINED = Config(
    pool_selectors=tuple(POOL_SELECTORS.values()),
    pools=POOL_SELECTORS,
    team_pools={"vision": ("h100-reserved", "h200-burst")},
)


def _pin(job: dict[str, Any], pool: str) -> None:
    for t in range(len(job["spec"]["tasks"])):
        terms = pod(job, t)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        terms[:] = [
            {
                "matchExpressions": [
                    {"key": "trainstack.io/pool", "operator": "In", "values": [pool]}
                ]
            }
        ]


@pytest.mark.parametrize(
    ("pool", "annotated", "admitted"),
    [
        ("h100-reserved", True, True),
        ("h200-burst", True, True),
        ("h100-block", True, False),  # a pool of the platform, not of this team
        ("h100-block", False, True),  # a namespace that names no pools: any of the platform's
        ("elsewhere", False, False),
    ],
    ids=["its pool", "its other pool", "another team's pool", "no team pools", "no pool"],
)
def test_gpu_pods_pin_one_of_their_teams_pools_in_both_enforcers(
    pool: str, annotated: bool, admitted: bool, example_plans: dict[str, Plan]
) -> None:
    """Issue 37: gpu-placement took any of the platform's pools, so a team confined to some
    (the registry's `pools`) could hold another pool's GPUs with a hand-made Job."""
    policy = next(
        m
        for m in admission_policies(CONFINED, "test")
        if m["metadata"]["name"] == f"{POLICY_PREFIX}gpu-placement"
        and m["kind"] == "ValidatingAdmissionPolicy"
    )
    job = demo_job(example_plans["vision"])
    _pin(job, pool)
    config = (
        CONFINED
        if annotated
        else Config(pool_selectors=CONFINED.pool_selectors, pools=CONFINED.pools)
    )
    namespace = copy.deepcopy(NAMESPACE)
    if annotated:
        namespace["metadata"]["annotations"]["trainstack.io/pools"] = "h100-reserved,h200-burst"
    assert (not RULES["gpu-placement"].check(job, config)) is admitted
    assert evaluate(policy, job, namespace) is admitted
