"""The shared file system's layout (issue 37): a Job in the system namespace that gives each
team its checkpoint directory, the root of the team's `checkpoints` volume.

Each team's volume is rooted at /checkpoints/<team> (builders/storage.team_volumes): a Lustre
fileset mount, which fails for a directory that does not exist (lustre-release v2_15_0
lustre/mdt/mdt_handler.c mdt_lookup_fileset). The directory is root-owned, group
TRAINER_GID, mode 2770: the kubelet creates each job's sub-path below it with that group and
mode, which the non-root trainer writes through its group (builders/storage.py TEAM_DIR_MODE).
So no pod of a team needs root, and none may run as root (policy rule hardened-pods).

`trainstack-prewarm layout` (images/prewarm, trainstack_prewarm/layout.py) does it: it opens
every path component without following a symlink and refuses anything but a directory, since
before issue 37 any team could write anywhere on the file system; it never deletes. It runs
from the platform's claim on the whole file system (storage.ROOT_CLAIM), in the system
namespace, where no team can create pods. The Job is named after its content: Jobs cannot be
changed in place, so a new team makes a new Job, and `pulumi up` waits for it to complete
(pulumi-kubernetes awaits a Job's `Complete` condition) before the team's volumes are used.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from trainstack.builders import labels, netpol, scanner
from trainstack.builders.storage import (
    ROOT_CLAIM,
    TEAM_DIR_MODE,
    TRAINER_GID,
    team_checkpoint_dir,
)
from trainstack.config.model import SYSTEM_NAMESPACE, PlatformConfig

APP: Final = "trainstack-storage-layout"
ROOT_MOUNT: Final = "/fs"
# What the command needs, each for one reason: CHOWN to make a team's directory root:10001,
# FSETID to keep its setgid bit although root is not in group 10001 (chmod(2) clears it
# otherwise), DAC_OVERRIDE to enter and repair a directory an earlier version or an operator
# left owned by someone else (mode 0750 owned by 10001, which root without it cannot open).
CAPABILITIES: Final = ("CHOWN", "DAC_OVERRIDE", "FSETID")

# What the scanner finds in the Job and why each finding stands (builders/scanner.py); the rest
# of what it checks is met (no privilege escalation, read-only root, seccomp, no token, every
# other capability dropped, and network_policy). checkov's readiness check skips Jobs.
_ROOT = (
    "root on purpose: it creates each team's checkpoint directory owned by root with group "
    "10001 and mode 2770 (builders/storage.py TEAM_DIR_MODE), which the non-root trainers "
    "cannot do themselves; the only root pod on the shared file system, in the system "
    "namespace where no team can create pods (builders/layout.py)"
)
EXCEPTIONS: Final = {
    "CKV_K8S_23": _ROOT,
    "CKV_K8S_40": _ROOT,
    "CKV_K8S_25": (
        "exactly CHOWN, FSETID and DAC_OVERRIDE, every other capability dropped: CHOWN to give "
        "a team's directory to root and group 10001 (chown(2)), FSETID to keep its setgid bit "
        "since root is not in that group (chmod(2) clears it otherwise), DAC_OVERRIDE to enter "
        "and repair a directory an earlier version left owned by 10001 mode 0750 "
        "(capabilities(7); builders/layout.py CAPABILITIES)"
    ),
}


def layout_args(cfg: PlatformConfig) -> list[str]:
    args = [
        "layout",
        "--root", ROOT_MOUNT,
        "--gid", str(TRAINER_GID),
        "--mode", TEAM_DIR_MODE,
        "--read-only-dir", "/datasets",
    ]  # fmt: skip
    for team in cfg.registry.teams:
        args += ["--team-dir", team_checkpoint_dir(team)]
    return args


def job_name(cfg: PlatformConfig) -> str:
    """`trainstack-storage-layout-<hash>`: a Job's pod template cannot change, so one Job
    per content (image and arguments)."""
    content = json.dumps([cfg.storage.layout_image, layout_args(cfg)]).encode()
    return f"{APP}-{hashlib.sha256(content).hexdigest()[:10]}"


def layout_job(cfg: PlatformConfig) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "layout",
        "image": cfg.storage.layout_image,
        "command": ["trainstack-prewarm"],
        "args": layout_args(cfg),
        "securityContext": {
            # Root with three capabilities: see CAPABILITIES. Nothing else of the platform's
            # or of a team's runs as root on the shared file system.
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": list(CAPABILITIES)},
        },
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        },
        "volumeMounts": [{"name": "fs", "mountPath": ROOT_MOUNT}],
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "fs", "persistentVolumeClaim": {"claimName": ROOT_CLAIM}}],
    }
    if cfg.cloud == "aws":
        pod["nodeSelector"] = {labels.ROLE: "system"}
    meta = labels.app_metadata(cfg.stack, APP, job_name(cfg), SYSTEM_NAMESPACE)
    scanner.annotate(
        meta, {**EXCEPTIONS, **scanner.unpinned_image_reasons([cfg.storage.layout_image])}
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": 600,
            "template": {"metadata": {"labels": {labels.APP_NAME: APP}}, "spec": pod},
        },
    }


def network_policy(cfg: PlatformConfig) -> dict[str, Any]:
    """Nothing in, nothing out: it works on a volume the node mounted (the CSI driver's
    mount is the node's traffic, not the pod's) and resolves no name."""
    return netpol.network_policy(cfg, APP, ingress=[], egress=[])
