"""Checks of the node a trainer landed on, before any worker starts.

RDMA memory registration pins pages, and the kernel refuses to pin more than RLIMIT_MEMLOCK
unless the process holds CAP_IPC_LOCK (torvalds/linux drivers/infiniband/core/umem.c,
ib_umem_get). The trainer runs as a non-root user, for whom an added capability never takes
effect (containerd sets no ambient capabilities: v1.7.29 pkg/cri/server/
container_create_linux.go WithoutAmbientCaps; kubernetes/kubernetes#56374), so only the limit
counts, and a container inherits it from the container runtime (containerd's CRI drops the
default rlimits, pkg/cri/opts/spec_opts.go WithoutDefaultSecuritySettings). With a small limit
NCCL fails its first InfiniBand registration deep inside a collective; this says why, first.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Mapping

RLimit = Callable[[int], tuple[int, int]]


def uses_ib_verbs(env: Mapping[str, str]) -> bool:
    """NCCL's InfiniBand/RoCE transport is on: HCAs named and IB not disabled (the job layer's
    fabric profiles set exactly these, builders/fabric.py)."""
    return bool(env.get("NCCL_IB_HCA")) and env.get("NCCL_IB_DISABLE", "0") != "1"


def memlock_issue(env: Mapping[str, str], getrlimit: RLimit = resource.getrlimit) -> str | None:
    """Why RDMA registration would fail on this node, or None."""
    if not uses_ib_verbs(env):
        return None
    soft, _ = getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return None
    return (
        f"RLIMIT_MEMLOCK is {soft} bytes, but NCCL over InfiniBand/RoCE (NCCL_IB_HCA="
        f"{env['NCCL_IB_HCA']}) pins its buffers and a non-root trainer cannot exceed the "
        "limit; run the node's containerd with LimitMEMLOCK=infinity (docs/fabrics.md)"
    )
