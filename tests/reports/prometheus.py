"""A real Prometheus server on loopback, with history written into it: raw series backfilled
with `promtool tsdb create-blocks-from openmetrics`, then trainstack's recording rules
backfilled over them with `promtool tsdb create-blocks-from rules` (Prometheus 2.42, Debian's
package, as CI installs it).

The rule backfiller evaluates every rule through the running server's query API, so a rule
cannot see what another rule records in the same pass (Prometheus docs, storage.md "Backfilling
for recording rules": rules that depend on other rules are not supported). The rules are
therefore backfilled in layers of dependency depth, the server restarted after each so that it
loads the new blocks: each layer sees exactly what the live server would have recorded.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def binaries() -> tuple[str, str] | None:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    return (prometheus, promtool) if prometheus and promtool else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run(*args: str | Path) -> None:
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, f"{args[:4]}: {result.stdout}{result.stderr}"


def layers(groups: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The recording rules of `groups` by dependency depth: layer 0 reads exported series
    only, layer n what the layers below it record."""
    rules = [r for g in groups for r in g["rules"] if "record" in r]
    recorded = {r["record"] for r in rules}
    uses = [(set(NAME.findall(r["expr"])) & recorded) - {r["record"]} for r in rules]
    done: set[str] = set()
    out: list[list[dict[str, Any]]] = []
    remaining = list(range(len(rules)))
    while remaining:
        ready = [i for i in remaining if uses[i] <= done]
        assert ready, f"rules in a dependency cycle: {[rules[i]['record'] for i in remaining]}"
        out.append([rules[i] for i in ready])
        remaining = [i for i in remaining if i not in ready]
        # A name is done once every rule recording it is placed (one per quantile).
        done = recorded - {rules[i]["record"] for i in remaining}
    return out


@dataclass
class Server:
    prometheus: str
    data: Path
    config: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = _free_port()
        log = (self.data.parent / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.prometheus,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.data}",
                # The backfilled history is years old by the time anyone runs this.
                "--storage.tsdb.retention.time=100y",
                # Backfilled series end without the staleness markers a live server writes
                # when a series (or a rule's output) disappears, so a stopped series would live
                # on for the default 5m lookback, once more in every layer of rules. All the
                # history is on a one-minute grid: a lookback just under a minute sees exactly
                # the sample of each minute, as staleness handling would (the rules' samples
                # lie a fixed phase after the minute, the same for every layer).
                "--query.lookback-delta=59s",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.data.parent / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise AssertionError("Prometheus did not become ready in 30s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None


def openmetrics(series: dict[str, list[tuple[datetime, float]]]) -> str:
    """`name{labels}` -> samples, as the OpenMetrics text promtool reads."""
    lines = []
    for name_labels, samples in series.items():
        lines += [f"{name_labels} {value:g} {at.timestamp():.0f}" for at, value in samples]
    return "\n".join([*lines, "# EOF"]) + "\n"


@contextmanager
def prometheus_with_history(
    tmp: Path,
    series: dict[str, list[tuple[datetime, float]]],
    groups: list[dict[str, Any]],
    start: datetime,
    end: datetime,
) -> Iterator[Server]:
    """A running Prometheus holding `series` and what the recording rules of `groups`
    (evaluated every `interval` from `start` to `end`) record from them."""
    found = binaries()
    assert found is not None
    prometheus, promtool = found
    data, blocks = tmp / "data", tmp / "blocks"
    data.mkdir()
    config = tmp / "prometheus.yml"
    config.write_text("global: {}\n", encoding="utf-8")
    raw = tmp / "series.om"
    raw.write_text(openmetrics(series), encoding="utf-8")
    _run(promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", raw, data)
    server = Server(prometheus, data, config)
    try:
        server.start()
        # One group name and file for every layer: the backfiller evaluates a group at a
        # phase within its interval hashed from both, as a live server does (rules/manager.go
        # Group.EvalTimestamp), and a layer must read the one below at its own instants.
        rules = tmp / "rules.yaml"
        for layer in layers(groups):
            doc = {"groups": [{"name": "backfill", "interval": "60s", "rules": layer}]}
            rules.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
            _run(
                promtool,
                "tsdb",
                "create-blocks-from",
                "rules",
                "--quiet",
                f"--url={server.url}",
                f"--start={start.timestamp():.0f}",
                f"--end={end.timestamp():.0f}",
                f"--output-dir={blocks}",
                rules,
            )
            server.stop()
            for block in blocks.iterdir():
                block.rename(data / block.name)
            server.start()
        yield server
    finally:
        server.stop()
