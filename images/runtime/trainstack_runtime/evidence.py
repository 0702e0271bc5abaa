"""Hardware evidence from the node, not from the training log (issue 22 #6).

A crash (SIGSEGV, SIGBUS, an illegal memory access) or the NCCL watchdog's SIGABRT says
nothing about the GPU by itself: most are software, and an uncorrectable ECC error caught by
the watchdog arrives as the same SIGABRT as a network timeout. What the node's GPU telemetry
says decides: the supervisor reads it when the pod starts and again when the workers failed,
and calls the failure ``hardware`` (201: retry elsewhere, cordon) only if it shows

- a critical Xid (``CRITICAL_XIDS``) as the GPU's last Xid (``DCGM_FI_DEV_XID_ERRORS``, a
  gauge holding the value of the last Xid),
- new double-bit ECC errors since the start (``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` increased), or
- a row-remap failure (``DCGM_FI_DEV_ROW_REMAP_FAILURE`` > 0).

Input: ``TRAINSTACK_GPU_EVIDENCE``, Prometheus text format as dcgm-exporter serves it on
``/metrics`` (the platform's exporter collects exactly these fields,
trainstack/builders/metric_sources.py): an ``http://``/``https://`` URL of this node's
exporter, or a file a node agent keeps up to date (a hostPath mounted read-only). Series are
narrowed to this pod's GPUs when the device plugin named their UUIDs (as mounts under
/var/run/nvidia-container-devices, the platform's default, or in ``NVIDIA_VISIBLE_DEVICES``)
and the series carry dcgm-exporter's ``UUID`` label. Unset, unreadable or empty:
no evidence, and the classes stay what the exit said. Standard library only.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .contract import CRITICAL_XIDS, ENV_GPU_EVIDENCE

log = logging.getLogger("trainstack.evidence")

XID = "DCGM_FI_DEV_XID_ERRORS"
DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
FIELDS = (XID, DBE, REMAP_FAILURE)
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class GpuHealth:
    """The evidence fields per GPU (its UUID, else its index)."""

    values: dict[str, dict[str, float]] = field(default_factory=dict)

    def get(self, gpu: str, name: str) -> float | None:
        return self.values.get(gpu, {}).get(name)


def parse(text: str, visible: frozenset[str] | None = None) -> GpuHealth:
    """The evidence fields from Prometheus text; ``visible`` GPU UUIDs narrow the series."""
    values: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or match.group(1) not in FIELDS:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        gpu = labels.get("UUID") or labels.get("gpu") or ""
        if visible and labels.get("UUID") and labels["UUID"] not in visible:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        values.setdefault(gpu, {})[match.group(1)] = value
    return GpuHealth(values)


# Where the device plugin's volume-mounts strategy puts one entry per allocated GPU, named by
# its UUID (NVIDIA/k8s-device-plugin v0.18.2 deviceListStrategy volume-mounts,
# deviceIDStrategy uuid); NVIDIA_VISIBLE_DEVICES then names this directory, not the GPUs.
DEVICE_MOUNTS = "/var/run/nvidia-container-devices"
_GPU_IDS = ("GPU-", "MIG-")


def visible_gpus(
    env: Mapping[str, str], mounts: str | os.PathLike[str] = DEVICE_MOUNTS
) -> frozenset[str] | None:
    """This container's GPU UUIDs, when the device plugin named them: as mounts (the
    platform's default, docs/security.md), else in NVIDIA_VISIBLE_DEVICES."""
    try:
        mounted = frozenset(n for n in os.listdir(mounts) if n.startswith(_GPU_IDS))
    except OSError:
        mounted = frozenset()
    if mounted:
        return mounted
    raw = env.get("NVIDIA_VISIBLE_DEVICES", "")
    uuids = frozenset(d.strip() for d in raw.split(",") if d.strip().startswith(_GPU_IDS))
    return uuids or None


def read(env: Mapping[str, str] | None = None, timeout: float = 3.0) -> GpuHealth | None:
    """The node's evidence now, or None when there is no source or it cannot be read."""
    env = os.environ if env is None else env
    source = env.get(ENV_GPU_EVIDENCE)
    if not source:
        return None
    try:
        if source.startswith(("http://", "https://")):
            with urllib.request.urlopen(source, timeout=timeout) as resp:
                text = resp.read().decode("utf-8", "replace")
        else:
            text = Path(source).read_text()
    except (OSError, ValueError, http.client.HTTPException) as err:
        log.warning("GPU evidence %s not read: %s", source, err)
        return None
    return parse(text, visible_gpus(env))


def hardware_evidence(before: GpuHealth | None, after: GpuHealth | None) -> str | None:
    """Why the node is suspect, or None. ``before``: the snapshot taken at the start."""
    if after is None:
        return None
    reasons = []
    for gpu in sorted(after.values):
        xid = after.get(gpu, XID)
        if xid is not None and int(xid) in CRITICAL_XIDS:
            reasons.append(f"GPU {gpu}: Xid {int(xid)}")
        dbe, dbe_before = after.get(gpu, DBE), before.get(gpu, DBE) if before else None
        if dbe is not None and dbe_before is not None and dbe > dbe_before:
            reasons.append(f"GPU {gpu}: {int(dbe - dbe_before)} new double-bit ECC errors")
        remap = after.get(gpu, REMAP_FAILURE)
        if remap:
            reasons.append(f"GPU {gpu}: row-remap failure")
    return "; ".join(reasons) or None
