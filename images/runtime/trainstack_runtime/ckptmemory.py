"""Whether the pod's memory holds the host copies a save stages (cgroup v2).

Apart from checkpoint.py (the manager) because it reads the container's own limits, not the
training state: the manager asks it once, on the first save, with the bytes to stage.
"""

from __future__ import annotations

from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def staging_memory_issue(need: int, local_ranks: int, cgroup: Path | None = None) -> str | None:
    """Why the pod cannot hold this save's host copies, or None. Every rank of the pod stages
    at once, each about ``need`` bytes, on top of the anonymous memory already in use
    (``memory.stat`` ``anon``: page cache is reclaimable and does not count). A pod that
    cannot is OOM-killed (exit 137, retried forever); better a config error that says so."""
    cgroup = CGROUP if cgroup is None else cgroup
    try:
        raw = (cgroup / "memory.max").read_text().strip()
        stat = (cgroup / "memory.stat").read_text()
    except OSError:
        return None  # no cgroup v2 view (not in a container): nothing to check against
    if raw == "max":
        return None
    anon = next((int(line.split()[1]) for line in stat.splitlines() if line.startswith("anon ")), 0)
    limit, total = int(raw), need * local_ranks
    if anon + total <= limit:
        return None
    gib = 1 << 30
    return (
        f"checkpoint staging needs {total / gib:.1f} GiB of host memory ({local_ranks} ranks x "
        f"{need / gib:.1f} GiB), the pod has {(limit - anon) / gib:.1f} GiB left of its "
        f"{limit / gib:.1f} GiB limit: raise the job's memory request and limit"
    )
