"""A job spec, checked against the platform, rendered as a Volcano Job.

Shared by the TrainingJob component, `trainstack render-job` and the policy rules, so
what an engineer renders with the CLI is exactly what the team stack deploys.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

from trainstack import outputs as out
from trainstack.builders import labels, scanner
from trainstack.builders.autoscaler import SAFE_TO_EVICT
from trainstack.builders.pools import GPU_TOLERATION, TRAINING_UID
from trainstack.builders.scheduling import SVC_PLUGIN_ARGS, priority_class_name
from trainstack.builders.storage import CACHE_DRIVER, CHECKPOINTS_MOUNT
from trainstack.contracts import runtime as contract
from trainstack.jobs import fractional
from trainstack.jobs.checks import cache_source, check
from trainstack.jobs.elastic import elastic_env
from trainstack.jobs.lifecycle import (
    TASK_MAX_RETRY,
    elastic_worker_policies,
    lifecycle_policies,
    volcano_max_retry,
)
from trainstack.jobs.platform import PlatformView, profile
from trainstack.jobs.spec import JobSpec, Resources
from trainstack.policy.isolation import (
    PINNED_CPU_LIMIT,
    PINNED_KEY,
    PINNED_MEMORY_LIMIT,
    PINNED_VALUE,
)

MASTER, WORKER, PS = "master", "worker", "ps"
# An elastic job's c10d store, in a CPU pod of its own (_as_rendezvous below).
RENDEZVOUS = "rendezvous"
# Roles whose pods have no GPUs: no fabric devices, annotations or GPU evidence.
CPU_ROLES = (PS, RENDEZVOUS)
API_VERSION = "batch.volcano.sh/v1alpha1"
CONTAINER = "trainer"
PYTORCH_PORT = 23456
# HyperNode tiers of a job's `topology.tier`: the platform publishes its own in each team's
# slice (`topologyTiers`, builders/topology.tiers); these are a platform's from before it did.
TIERS = {"pool": 1, "zone": 2}


def job_labels(spec: JobSpec) -> dict[str, str]:
    return {
        **dict(spec.labels),
        labels.MANAGED_BY: labels.MANAGER,
        labels.TEAM: spec.team,
        labels.JOB: spec.name,
        labels.POOL: spec.pool,
    }


def _resources(requests: Mapping[str, str], limits: Mapping[str, str]) -> dict[str, Any]:
    return {"requests": dict(sorted(requests.items())), "limits": dict(sorted(limits.items()))}


def _env(spec: JobSpec, view: PlatformView, nproc: int, role: str) -> list[dict[str, str]]:
    gpu = role not in CPU_ROLES
    pool = view.pool(spec.pool)
    assert pool is not None
    values: dict[str, str] = dict(profile(pool).env)
    values |= {
        contract.ENV_CHECKPOINT_DIR: CHECKPOINTS_MOUNT,
        contract.ENV_CHECKPOINT_INTERVAL_S: str(spec.checkpoint.interval_seconds),
        contract.ENV_CHECKPOINT_KEEP: str(spec.checkpoint.keep),
        contract.ENV_MAX_DURATION_S: str(spec.max_duration_seconds),
        contract.ENV_MAX_FAILURES: str(spec.max_retries),  # the runtime's own failure count
        contract.ENV_SHUTDOWN_TIMEOUT_S: str(max(spec.checkpoint.grace_seconds - 30, 10)),
        contract.ENV_NPROC_PER_NODE: str(nproc),
        # The runtime's node ranks: this task's pods first, then the workers (topology.py
        # node_plan). Parameter-server jobs have no master task: their servers come first.
        contract.ENV_VOLCANO_MASTER_TASK: MASTER if spec.mode == "dataParallel" else PS,
        contract.ENV_VOLCANO_WORKER_TASK: WORKER,
        contract.ENV_JOB_NAME: spec.name,
        contract.ENV_TEAM: spec.team,
        # What the hand-off's report says of the job (trainstack_runtime/handoff.py).
        contract.ENV_IMAGE: spec.image,
        contract.ENV_JOB_SPEC: spec_json(spec),
    }
    storage = view.storage(spec.team)
    # The team's prefixes in the platform's bucket (builders/storage.team_storage), the job's
    # folder below each: committed checkpoints copied there (tiering.py), the hand-off of the
    # finished job (handoff.py). The author's env may turn either off ("").
    if "checkpointS3Uri" in storage:
        values[contract.ENV_CHECKPOINT_S3_URI] = f"{storage['checkpointS3Uri']}{spec.name}/"
    if "artifactS3Uri" in storage:
        values[contract.ENV_ARTIFACT_URI] = f"{storage['artifactS3Uri']}{spec.name}/"
    if "objectStoreEndpoint" in storage:  # boto3's settings for an S3-compatible store
        values |= {
            "AWS_ENDPOINT_URL_S3": storage["objectStoreEndpoint"],
            "AWS_DEFAULT_REGION": storage["objectStoreRegion"],
        }
    if spec.data is not None:
        values |= {contract.ENV_DATA_VERSION: spec.data.version, "DATA_DIR": spec.data.mount_path}
    port = _evidence_port(view) if gpu else None
    if port is not None:  # $(NODE_IP) is expanded by the kubelet: _node_ip_env() comes first
        values[contract.ENV_GPU_EVIDENCE] = f"http://$({NODE_IP_ENV}):{port}/metrics"
    values |= dict(spec.env)  # the author's env wins, except where it must not:
    values[contract.ENV_CHECKPOINT_DIR] = CHECKPOINTS_MOUNT
    if spec.workers.scale.elastic:
        values |= elastic_env(
            spec.workers.scale,
            # The rendezvous pod by its Volcano svc plugin name: <job>-<task>-<index>.<job>.
            endpoint=f"{spec.name}-{RENDEZVOUS}-0.{spec.name}:{PYTORCH_PORT}",
            store_host=role == RENDEZVOUS,
            restarts=spec.max_retries + spec.max_preemptions,
        )
    return [{"name": k, "value": v} for k, v in sorted(values.items())]


NODE_IP_ENV = "TRAINSTACK_NODE_IP"


def _store_credentials(storage: Mapping[str, Any], role: str) -> dict[str, Any]:
    """An existing cluster's object store: the team's credentials from the Secret its owners
    keep in the team's namespace (storage.objectStore.credentialsSecret), as boto3's
    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. Not optional: a job whose copies could not
    be written fails to start, naming the Secret, rather than at its first checkpoint. The
    rendezvous pod copies nothing and gets none."""
    secret = storage.get("objectStoreSecret")
    if secret is None or role == RENDEZVOUS:
        return {}
    return {"envFrom": [{"secretRef": {"name": secret}}]}


# Every pod of a job carries it (one env var per task template): rendered once per spec.
@functools.lru_cache(maxsize=256)
def spec_json(spec: JobSpec) -> str:
    """The job spec as the hand-off's report records it: its typed fields, without the local
    path it was read from, and without what Volcano updates in place (the priority, the number
    of workers: lifecycle.UPDATABLE_JOB_FIELDS and UPDATABLE_TASK_FIELDS): in the pod
    template they would make such an update a replacement. The report has the world size the
    job ended with instead."""
    doc = dataclasses.asdict(spec)
    for key in ("source", "priority"):
        doc.pop(key, None)
    doc["workers"].pop("replicas", None)
    if spec.workers.scale.elastic:  # its range is in the pods' env anyway (PET_NNODES)
        doc["workers"]["scale"].pop("size", None)
    else:  # a fixed gang's range is its size, which changes in place
        doc["workers"].pop("scale", None)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _evidence_port(view: PlatformView) -> int | None:
    """The port of the node's dcgm-exporter on the host network, if the platform runs it."""
    port = view.outputs.get(out.MONITORING, {}).get("gpuEvidencePort")
    return None if port is None else int(port)


def _node_ip_env(view: PlatformView) -> list[dict[str, Any]]:
    """The node's IP for the GPU evidence URL; before the variables that refer to it, since
    the kubelet expands ``$(VAR)`` only from variables defined earlier in the list."""
    if _evidence_port(view) is None:
        return []
    return [{"name": NODE_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]


def _command(spec: JobSpec, nproc: int) -> list[str]:
    # A cached dataset needs no gate here: the kubelet starts no container before the cache
    # agent has published the version, complete and verified, under a hold (_cache_volume).
    return [
        spec.command[0], "-m", "trainstack_runtime.supervisor", "--nproc-per-node", str(nproc),
        "--", *spec.command[1:],
    ]  # fmt: skip


def _cache_volume(spec: JobSpec, view: PlatformView, storage: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset version from the node's shared cache, read-only (docs/prewarm.md).

    An inline CSI volume of the node cache agent (Pod Security baseline and restricted allow
    `csi` volumes): on NodePublishVolume it fetches the version once per node (every pod of
    every job on the node that names it shares that fetch and the copy), checks it, holds it
    against eviction and repairs, and bind-mounts it read-only; NodeUnpublishVolume releases
    it. The copy outlives the pod, so a restarted pod fetches nothing.
    """
    assert spec.data is not None
    return {
        "name": "dataset",
        "csi": {
            "driver": storage.get("cacheDriver", CACHE_DRIVER),
            "readOnly": True,
            "volumeAttributes": {
                "source": cache_source(spec, view),
                "dataset": spec.data.dataset,
                "version": spec.data.version,
            },
        },
    }


def _fresh(value: Any) -> Any:
    """A copy of constant JSON data that shares nothing with it (copy.deepcopy without its
    memo and dispatch: four of these per pod were a tenth of rendering one)."""
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fresh(v) for v in value]
    return value


def _pod(
    spec: JobSpec, view: PlatformView, role: str, gpus: int, task_labels: dict[str, str]
) -> dict[str, Any]:
    pool = view.pool(spec.pool)
    storage = view.storage(spec.team)
    assert pool is not None
    devices: dict[str, str] = {}
    nproc = 1
    if role == RENDEZVOUS:
        res = RENDEZVOUS_RESOURCES
    elif role == PS:
        assert spec.parameter_servers is not None
        res = spec.parameter_servers.resources
    else:
        res = spec.workers.resources
        sliced = fractional.devices(spec, pool)
        devices = sliced if sliced is not None else profile(pool).resources_for(gpus)
        nproc = gpus
    requests = {"cpu": res.cpu, "memory": res.memory, **devices}
    limits = {"cpu": res.cpu_limit, "memory": res.memory_limit, **devices}
    # The claim's root is the team's own directory (builders/storage.team_volumes), so the
    # job's directory is a sub-path below it, which the kubelet creates on first use with the
    # group and mode that let the non-root trainer write it (storage.TEAM_DIR_MODE).
    team_dir = storage.get("checkpointSubPath", "")
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {
            "name": "checkpoints",
            "mountPath": CHECKPOINTS_MOUNT,
            "subPath": _join(team_dir, spec.name),
        },
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shared_memory}},
        {
            "name": "checkpoints",
            "persistentVolumeClaim": {"claimName": storage.get("checkpointClaim", "checkpoints")},
        },
    ]
    if spec.data is None or role == RENDEZVOUS:
        pass  # no data to read
    elif spec.data.source == "lustre":
        # The datasets volume is read-only where it is mounted (the PV's mount options); the
        # claim and the mount say so too (policy rule pod-volumes).
        mounts.append(
            {
                "name": "data",
                "mountPath": spec.data.mount_path,
                "subPath": _join(
                    storage.get("datasetSubPath", ""), spec.data.dataset, spec.data.version
                ),
                "readOnly": True,
            }
        )
        volumes.append(
            {
                "name": "data",
                "persistentVolumeClaim": {
                    "claimName": storage.get("datasetClaim", "datasets"),
                    "readOnly": True,
                },
            }
        )
    else:
        mounts.append({"name": "dataset", "mountPath": spec.data.mount_path, "readOnly": True})
        volumes.append(_cache_volume(spec, view, storage))
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "command": _command(spec, nproc),
        "args": list(spec.args),
        "env": [
            *(_node_ip_env(view) if role not in CPU_ROLES else []),
            *_env(spec, view, nproc, role),
            {"name": "TRAINSTACK_ROLE", "value": role},
            _fresh(INSTANCE_ENV),
            _fresh(INCARNATION_ENV),
        ],
        **_store_credentials(storage, role),
        "resources": _resources(requests, limits),
        "ports": [{"name": "metrics", "containerPort": contract.HEALTH_PORT_DEFAULT}],
        "livenessProbe": {
            "httpGet": {"path": contract.HEALTH_PATH, "port": contract.HEALTH_PORT_DEFAULT},
            "periodSeconds": 30,
            "timeoutSeconds": 5,
            "failureThreshold": 4,
        },
        "volumeMounts": mounts,
    }
    fabric = profile(pool)
    # Cluster Autoscaler counts Volcano's pods as replicated and would evict them to remove a
    # node; this keeps the node while the pod runs (builders/autoscaler.py).
    metadata: dict[str, Any] = {"labels": task_labels, "annotations": {SAFE_TO_EVICT: "false"}}
    if role not in CPU_ROLES:  # replicas with the pool's RDMA devices
        metadata["annotations"] |= fabric.pod_annotations()
    container["securityContext"] = _fresh(RESTRICTED_CONTAINER)
    selector = pool.get("nodeSelector", {})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # Volcano reads exit codes only from Failed pods
        "serviceAccountName": storage.get("serviceAccount", "training"),
        # The trainer never calls the Kubernetes API. Cloud credentials (IRSA) come through
        # their own projected token, which the EKS pod identity webhook adds whatever this
        # says (aws/amazon-eks-pod-identity-webhook pkg/handler/handler.go getPodSpecPatch).
        "automountServiceAccountToken": False,
        "securityContext": _fresh(RESTRICTED_POD),
        "terminationGracePeriodSeconds": spec.checkpoint.grace_seconds,
        "containers": [container],
        "volumes": volumes,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": k, "operator": "In", "values": [v]}
                                for k, v in sorted(selector.items())
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": [GPU_TOLERATION],
    }
    pod = {"metadata": metadata, "spec": pod_spec}
    if role == RENDEZVOUS:
        _as_rendezvous(spec, pod)
    return pod


# What the rendezvous pod asks for: a TCPStore for at most a few hundred agents' heartbeats
# and round state. Its limits are the most the `scheduling-keys` rule lets a pod that opts
# out of preemption have (policy/isolation.py).
RENDEZVOUS_RESOURCES = Resources(
    # Within the platform's request-to-limit ratios too (LimitRange: cpu 2, memory 1).
    cpu="500m", memory=PINNED_MEMORY_LIMIT, cpu_limit=PINNED_CPU_LIMIT,
    memory_limit=PINNED_MEMORY_LIMIT,
)  # fmt: skip


def _as_rendezvous(spec: JobSpec, pod: dict[str, Any]) -> None:
    """The pod of an elastic job's `rendezvous` task: the c10d store its workers' torchrun
    agents rendezvous on (trainstack_runtime/rendezvous.py), in the job's own image, and
    nothing else.

    Volcano must never take it: its store holds the rendezvous, and losing it restarts every
    worker. Volcano v1.15.1 has one per-pod exemption: a pod annotated
    `volcano.sh/preemptable: "false"` is left out of every preempt and reclaim victim list
    before any plugin is asked (pkg/scheduler/api/pod_info.go GetPodPreemptable;
    actions/preempt/preempt.go and actions/reclaim/reclaim.go, `!task.Preemptable`); the
    gang plugin's own check counts a job's ready pods, not its roles (plugins/gang/gang.go
    reclaimableFn), so without it the store is as likely a victim as any worker. The
    exemption is the policy's narrow one for a single CPU pod (policy/isolation.py
    scheduling_keys): no devices, and at most 1 CPU and 1 GiB."""
    pod["metadata"]["annotations"][PINNED_KEY] = PINNED_VALUE
    container = pod["spec"]["containers"][0]
    container["name"] = RENDEZVOUS
    container["command"] = [
        spec.command[0], "-m", "trainstack_runtime.rendezvous", "--port", str(PYTORCH_PORT),
    ]  # fmt: skip
    container["args"] = []
    container["ports"] = [{"name": RENDEZVOUS, "containerPort": PYTORCH_PORT}]
    container["livenessProbe"] = {
        "tcpSocket": {"port": PYTORCH_PORT},
        "periodSeconds": 30,
        "timeoutSeconds": 5,
        "failureThreshold": 4,
    }
    # The store does not use the training's shared memory; the rule wants it sized.
    for volume in pod["spec"]["volumes"]:
        if volume["name"] == "dshm":
            volume["emptyDir"]["sizeLimit"] = "64Mi"
    # The store exits on SIGTERM at once (rendezvous.py); no checkpoint to take.
    pod["spec"]["terminationGracePeriodSeconds"] = 30


def _join(*parts: str) -> str:
    """A sub-path from its non-empty parts."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


# Volcano names each pod's PodGroup `<job>-<job uid>` in this annotation (v1.15.1
# pkg/controllers/job/job_controller_util.go createJobPod): the job instance, which a job
# deleted and created again under the same name does not share. The runtime keys the job's
# deadline to it (trainstack_runtime/deadline.py).
PODGROUP_ANNOTATION = "scheduling.k8s.io/group-name"
INSTANCE_ENV: dict[str, Any] = {
    "name": contract.ENV_JOB_INSTANCE,
    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{PODGROUP_ANNOTATION}']"}},
}
# Volcano stamps each pod with the job's retry count when it created it (v1.15.1
# job_controller_util.go createJobPod, batch.JobRetryCountKey): the same for all pods of one
# run, one more after each RestartJob (state/running.go). The runtime counts a failed run once
# by it, and never a preempted one (trainstack_runtime/crashes.py).
RETRY_COUNT_ANNOTATION = "volcano.sh/job-retry-count"
INCARNATION_ENV: dict[str, Any] = {
    "name": contract.ENV_JOB_RETRY,
    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{RETRY_COUNT_ANNOTATION}']"}},
}
# Pod Security `restricted` (k8s.io/pod-security-admission v0.37.2 policy/
# check_runAsNonRoot.go, check_runAsUser.go, check_seccompProfile_restricted.go,
# check_allowPrivilegeEscalation.go, check_capabilities_restricted.go): the images' user, the
# runtime's default seccomp profile, no capabilities, no privilege escalation. No exception
# (issue 37): the `hardened-pods` rule holds every job to this, and team namespaces enforce
# `restricted`.
RESTRICTED_POD: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": TRAINING_UID,
    "runAsGroup": TRAINING_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def _task(
    spec: JobSpec,
    view: PlatformView,
    name: str,
    replicas: int,
    gpus: int,
    *,
    min_available: int | None = None,
) -> dict[str, Any]:
    task_labels = {**job_labels(spec), labels.ROLE: name}
    return {
        "name": name,
        "replicas": replicas,
        "minAvailable": replicas if min_available is None else min_available,
        "maxRetry": TASK_MAX_RETRY,
        "template": _pod(spec, view, PS if name == PS else name, gpus, task_labels),
    }


def render(spec: JobSpec, view: PlatformView, stack_team: str | None = None) -> dict[str, Any]:
    """The Volcano Job for `spec` on this platform (raises ConfigError if it cannot run)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Job",
        "metadata": job_metadata(spec),
        "spec": job_spec(spec, view, stack_team),
    }


# The security scanner's findings on every training pod and why they stand, on the Job since
# checkov reads no pod template's annotations (builders/scanner.py). Only what is inherent to
# batch training; the rest of what it checks the pods meet (RESTRICTED_POD, no token).
SCANNER_EXCEPTIONS: dict[str, str] = {
    "CKV_K8S_9": (
        "readiness gates Service traffic and trainers take none: Volcano's svc plugin gives "
        "the job a headless Service for peer DNS that publishes ready pods only (volcano "
        "v1.15.1 pkg/controllers/job/plugins/svc/svc.go, publishNotReadyAddresses off), so a "
        "readiness probe would withhold the master's name from its workers' rendezvous; the "
        "livenessProbe ends a hung trainer"
    ),
    "CKV_K8S_22": (
        "the trainer's root file system stays writable: the team's own code and its libraries "
        "write caches under $HOME and /tmp (torch.compile and Triton caches, the NCCL flight "
        "recorder's dump), and a container's own files are no boundary between teams, which "
        "the restricted pod, uid 10001 and the team's own volumes are (builders/platform.py "
        "TEAM_POD_SECURITY)"
    ),
}


def job_metadata(spec: JobSpec) -> dict[str, Any]:
    """The Job's metadata: from the spec alone (the namespace is the team's, by contract)."""
    metadata = {
        "name": spec.name,
        "namespace": spec.team,
        "labels": job_labels(spec),
        # Monitoring reads both (kube-state-metrics): deadline and stale-checkpoint alerts.
        "annotations": {
            f"{labels.PREFIX}/max-duration-seconds": str(spec.max_duration_seconds),
            f"{labels.PREFIX}/checkpoint-interval-seconds": str(spec.checkpoint.interval_seconds),
            # workers.sharedGpus: the shared-gpus rule passes a distributed job on time-shared
            # GPUs only with it (policy/isolation.py).
            **fractional.job_annotations(spec),
        },
    }
    return scanner.annotate(metadata, SCANNER_EXCEPTIONS)


def job_spec(spec: JobSpec, view: PlatformView, stack_team: str | None = None) -> dict[str, Any]:
    """The Job's spec against the platform (raises ConfigError if it cannot run)."""
    check(spec, view, stack_team)
    workers = spec.workers
    tasks: list[dict[str, Any]]
    plugins: dict[str, list[str]] = {"svc": list(SVC_PLUGIN_ARGS), "env": []}
    scale = workers.scale
    if spec.mode == "dataParallel" and scale.elastic:
        # The rendezvous pod, then every GPU worker in one task: each worker is a torchrun
        # node like any other, rank 0 included, and none hosts the store (jobs/elastic.py).
        # No pytorch plugin: its MASTER_ADDR, WORLD_SIZE and RANK count pods at creation and
        # would be stale after any resize (torchrun sets them for its workers itself).
        worker = _task(spec, view, WORKER, scale.size, workers.gpus, min_available=scale.min)
        worker["policies"] = elastic_worker_policies()
        tasks = [_task(spec, view, RENDEZVOUS, 1, 0), worker]
    elif spec.mode == "dataParallel":
        # Volcano's pytorch plugin gives the master task RANK 0 and MASTER_ADDR.
        tasks = [_task(spec, view, MASTER, 1, workers.gpus)]
        if workers.replicas > 1:
            tasks.append(_task(spec, view, WORKER, workers.replicas - 1, workers.gpus))
        plugins["pytorch"] = [f"--master={MASTER}", f"--worker={WORKER}", f"--port={PYTORCH_PORT}"]
    else:
        assert spec.parameter_servers is not None
        tasks = [
            _task(spec, view, PS, spec.parameter_servers.replicas, 0),
            _task(spec, view, WORKER, workers.replicas, workers.gpus),
        ]
    policies = lifecycle_policies()
    result: dict[str, Any] = {
        "schedulerName": "volcano",
        "queue": view.scheduling(spec.team).get("queue", spec.team),
        "priorityClassName": priority_class_name(spec.priority),
        # The gang: all or nothing, or an elastic job's minimum and its rendezvous pod
        # (jobs/elastic.py).
        "minAvailable": sum(t["minAvailable"] for t in tasks),
        "maxRetry": volcano_max_retry(spec.max_retries, spec.max_preemptions),
        "plugins": plugins,
        "policies": policies,
        "tasks": tasks,
    }
    if scale.elastic:
        # Done once the minimum's workers are: a job that ends with workers still Pending
        # (above the minimum, waiting for capacity) would otherwise never complete, and its
        # store never stop (jobs/elastic.py, completion).
        result["minSuccess"] = scale.min
    if spec.topology is not None:
        tiers = view.scheduling(spec.team).get("topologyTiers") or TIERS
        result["networkTopology"] = {
            "mode": spec.topology.mode,
            "highestTierAllowed": tiers[spec.topology.tier],
        }
    return result
