"""A crash is retried, a few times (issue 22 #6).

SIGSEGV, SIGBUS, an illegal memory access or a launch failure is usually software (a native
extension, a kernel bug) or a full ``/dev/shm``: worth a retry, since a new pod may not hit it,
but a deterministic crash would otherwise restart until the job's ``maxRetry`` for nothing.
The supervisor counts the job instance's crash exits in the checkpoint directory (shared by
its pods, it outlives them; keyed like the deadline marker) and resets the count when a
checkpoint newer than the one at the last crash was committed. Beyond
``TRAINSTACK_MAX_CRASHES`` (default 2) crashes without progress the verdict is ``crash_loop``
(5, fatal).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .deadline import instance_marker

CRASH_MARKER = ".trainstack-crashes"


def record_crash(checkpoint_dir: Path, instance: str | None, committed: int | None) -> int:
    """Count this crash; returns the crashes since the newest checkpoint ``committed`` (the
    newest step this pod's ranks committed, None if none)."""
    path = checkpoint_dir / instance_marker(CRASH_MARKER, instance)
    try:
        state = json.loads(path.read_text())
        count, step = int(state.get("count", 0)), state.get("step")
    except (OSError, ValueError, AttributeError):
        count, step = 0, None
    if committed is not None and (step is None or committed > int(step)):
        count, step = 0, committed
    count += 1
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"count": count, "step": step}) + "\n")
    os.replace(tmp, path)
    return count
