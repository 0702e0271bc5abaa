"""Training images on the GPU nodes before a job starts (issue 48, docs/prepull.md): one
DaemonSet per GPU pool in the system namespace, whose containers hold the pool's images.

Why a DaemonSet of holding containers, not a pull that ends: the kubelet's image garbage
collector removes only images no container on the node uses, oldest use first, once the image
file system passes imageGCHighThresholdPercent (85) (k8s.io/kubernetes v1.37.2
pkg/kubelet/images/image_gc_manager.go detectImages / freeSpace; defaults in
pkg/kubelet/apis/config/v1beta1/defaults.go). A container that runs keeps its image in use, so
a held image survives the disk pressure that a training run's checkpoints and logs bring; an
image pulled by a Job that then ended is the first to go. The DaemonSet controller puts a pod
on every node its selector and tolerations admit, new nodes included, and rolls a changed
image list out with a surge pod on at most `maxSurge` nodes at a time, the old pod deleted once
the new one is Ready (pkg/controller/daemon/update.go rollingUpdate): that is the bound on
registry load (`prePull.maxParallelPulls`). Creation is not bounded: the controller creates a
pod on every eligible node at once (daemon_controller.go manage; its slow start batches API
calls, not pulls). So the DaemonSet exists from the moment pre-pull is on, holding nothing but
the holder when no job uses the pool yet, and every later image change is a bounded rollout.

Each holding container runs one static busybox, copied into the pod by an init container from
`prePull.holderImage`, as `sleep`: the pulled images' own entrypoints never run, whatever they
are (`command` replaces the image's ENTRYPOINT and `args` its CMD: Kubernetes docs, "Define a
Command and Arguments for a Container"), and the images need no shell or sleep of their own. The
pods run as nobody with the restricted profile, no service-account token and no network.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainstack.builders import containers, labels, netpol, scanner
from trainstack.builders.pools import gpu_daemon_tolerations, pool_selector
from trainstack.config.model import SYSTEM_NAMESPACE, GpuPool, PlatformConfig

APP: Final = "trainstack-prepull"  # the pods' app.kubernetes.io/name (the NetworkPolicy's)
NAME_PREFIX: Final = "trainstack-prepull-"  # + the pool's name: the DaemonSet
# The pool label on the DaemonSet and its pods: what the alert, the recording rules and the
# health agent read (builders/labels.py POOL is the nodes' own label, set by the node groups).
POOL_LABEL: Final = labels.POOL
HOLD_DIR: Final = "/trainstack-hold"
HOLDER: Final = f"{HOLD_DIR}/busybox"
# busybox's own path in the official image (docker-library/busybox: one static binary, the
# applets are links to it).
BUSYBOX: Final = "/bin/busybox"
# 68 years: busybox sleep takes whole seconds; a held container never ends by itself.
SLEEP_S: Final = "2147483647"
# The one container of a pod holding no image yet: the holder's own (daemonset).
HOLDER_ONLY: Final = "holder-only"
USER: Final = 65534  # nobody
# What one holding container costs: a sleeping static binary. The limits keep a misbehaving
# one (none runs anything else) from taking more.
RESOURCES: Final = {
    "requests": {"cpu": "1m", "memory": "4Mi"},
    "limits": {"cpu": "10m", "memory": "16Mi"},
}

# What the scanner finds on the DaemonSet and why each finding stands (builders/scanner.py).
EXCEPTIONS: Final = {
    "CKV_K8S_8": (
        "a holding container runs busybox sleep and nothing else: it is alive while the process "
        "is, which the kubelet sees without a probe; a probe would exec in every held image"
    ),
    "CKV_K8S_9": (
        "readiness is the container running (its image is then on the node), which is what "
        "the rollout bound and the health gate wait for; no Service routes to these pods"
    ),
}


def pools_of(cfg: PlatformConfig) -> tuple[GpuPool, ...]:
    """The pools that pre-pull: every GPU pool with pre-pull on, none without."""
    return cfg.gpu_pools if cfg.pre_pull.enabled else ()


def pool_images(
    cfg: PlatformConfig, team_images: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """Per pool (every pool of pools_of, in order) its images, sorted: the configured ones
    meant for it, and with `teamJobs` those of the team stacks' jobs on it (`team_images`,
    jobs/prepull.py). Images of jobs on a pool the platform does not have are left out (that
    team stack's own preview refuses the job)."""
    result: dict[str, tuple[str, ...]] = {}
    for pool in pools_of(cfg):
        found = {i.image for i in cfg.pre_pull.images if not i.pools or pool.name in i.pools}
        if cfg.pre_pull.team_jobs:
            found.update(team_images.get(pool.name, ()))
        result[pool.name] = tuple(sorted(found))
    return result


def daemonset_name(pool: str) -> str:
    return f"{NAME_PREFIX}{pool}"


def container_name(image: str) -> str:
    """A holding container's name, from its image alone: the same image keeps its name when
    others come and go, so an alert or a dashboard follows it."""
    return f"image-{hashlib.sha256(image.encode()).hexdigest()[:12]}"


def _holding_container(image: str) -> dict[str, Any]:
    return {
        "name": container_name(image),
        "image": image,
        # Pulled when missing, never again for a digest; a tag (outside production) is pulled
        # once per node, as the job's own pods would with the same policy.
        "imagePullPolicy": "IfNotPresent",
        "command": [HOLDER, "sleep", SLEEP_S],
        "args": [],
        "resources": RESOURCES,
        "securityContext": containers.hardened(),
        "volumeMounts": [{"name": "hold", "mountPath": HOLD_DIR, "readOnly": True}],
    }


def daemonset(cfg: PlatformConfig, pool: GpuPool, images: Sequence[str]) -> dict[str, Any]:
    """The pool's DaemonSet: on each of its nodes one pod holding `images` (none: the holder
    alone, so that adding the first image is a rolling update within the bound)."""
    holder = cfg.pre_pull.holder_image
    init = {
        "name": "holder",
        "image": holder,
        "imagePullPolicy": "IfNotPresent",
        "command": [BUSYBOX, "cp", BUSYBOX, HOLDER],
        "resources": RESOURCES,
        "securityContext": containers.hardened(),
        "volumeMounts": [{"name": "hold", "mountPath": HOLD_DIR}],
    }
    held = [_holding_container(image) for image in images]
    if not held:  # a pod needs a container: the holder's own image, already on the node
        held = [{**_holding_container(holder), "name": HOLDER_ONLY}]
    pod_labels = {labels.APP_NAME: APP, POOL_LABEL: pool.name}
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": pool_selector(cfg, pool),
        # The GPU taint, and the health gate's: a new node pulls while it is checked, and with
        # the gate on the agent waits for this pod (docs/prepull.md, "New nodes").
        "tolerations": gpu_daemon_tolerations(cfg),
        # sleep as PID 1 ignores SIGTERM; nothing is lost when it is killed.
        "terminationGracePeriodSeconds": 1,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER,
            "runAsGroup": USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [init],
        "containers": held,
        # A few MiB: one binary.
        "volumes": [{"name": "hold", "emptyDir": {"sizeLimit": "8Mi"}}],
    }
    reasons = {**EXCEPTIONS, **scanner.unpinned_image_reasons([holder, *images])}
    metadata = labels.app_metadata(cfg.stack, APP, daemonset_name(pool.name), SYSTEM_NAMESPACE)
    metadata["labels"][POOL_LABEL] = pool.name
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": scanner.annotate(metadata, reasons),
        "spec": {
            "selector": {"matchLabels": pod_labels},
            # A changed list: a new pod beside the old on at most maxParallelPulls nodes of the
            # pool at once, the old one deleted once the new is Ready (its images pulled). The
            # surge keeps the old images held while the new ones pull (with maxUnavailable the
            # old pod goes first, and the image GC could take images the new list keeps, to
            # pull them again: k8s v1.37.2 pkg/controller/daemon/update.go rollingUpdate). A
            # pod's images already on the node are not pulled again.
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxUnavailable": 0,
                    "maxSurge": cfg.pre_pull.max_parallel_pulls,
                },
            },
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        },
    }


def network_policy(cfg: PlatformConfig) -> dict[str, Any]:
    """None either way: the kubelet pulls, not the pod, and nothing calls a holding
    container."""
    return netpol.network_policy(cfg, APP, ingress=[], egress=[])
