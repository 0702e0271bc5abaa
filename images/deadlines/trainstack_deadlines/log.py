"""Events as JSON lines (one object per line) on stderr, as trainstack-prewarm writes them."""

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
        line = json.dumps(record, default=str)
        stream = self._stream if self._stream is not None else sys.stderr
        with self._lock:
            stream.write(line + "\n")
            stream.flush()
