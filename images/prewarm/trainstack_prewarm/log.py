"""Progress and errors as JSON lines (one object per line, on stderr by default)."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import TextIO


class JsonLog:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: object) -> None:
        record: dict[str, object] = {"ts": round(time.time(), 3), "event": event}
        record.update(fields)
        line = json.dumps(record, sort_keys=False, default=str)
        stream = self._stream if self._stream is not None else sys.stderr
        # One write per line under a lock, so worker threads never interleave records.
        with self._lock:
            stream.write(line + "\n")
            stream.flush()
