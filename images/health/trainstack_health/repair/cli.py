"""`trainstack-health repair`: drain and repair GPU nodes that failed their health check, and
ask for a re-check of nodes whose ranks keep straggling. One Deployment replica in
trainstack-system runs a pass every --interval seconds; --once runs one pass and exits.

Exit codes: 0 (a pass, or passes until SIGTERM), 1 (--once: the pass could not list the
nodes, or an operation failed), 2 (setup: flags, expectations, token, CA).
Logs are JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from trainstack_health.contract import EXPECTATIONS_PATH, METRICS_PORT, PROG
from trainstack_health.errors import SetupError
from trainstack_health.kube import Access, ApiError, Kube
from trainstack_health.metrics import port_arg
from trainstack_health.repair import aws, http
from trainstack_health.repair.controller import Deps, json_log, run_once
from trainstack_health.repair.decide import read_settings
from trainstack_health.repair.metrics import Metrics, serve

DEFAULT_INTERVAL_S = 30.0


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} repair",
        description="Drain the training pods of GPU nodes that failed their health check, then "
        "have them replaced (EC2 Auto Scaling) or repaired (the cluster owner's hook).",
    )
    p.add_argument("--once", action="store_true", help="run one pass and exit")
    p.add_argument("--interval", type=_seconds, default=DEFAULT_INTERVAL_S,
                   help="seconds between passes (default %(default)g)")  # fmt: skip
    p.add_argument("--expectations", type=Path, default=Path(EXPECTATIONS_PATH),
                   help="the platform's expectations.json (default %(default)s)")  # fmt: skip
    p.add_argument("--server", help="API server URL (default: in-cluster)")
    p.add_argument("--token-file", type=Path, help="bearer token file (with --server)")
    p.add_argument("--ca-file", type=Path, help="API server CA bundle (with --server)")
    p.add_argument("--metrics-port", type=port_arg, default=None,
                   help=f"serve /metrics and /healthz on this port (in the Deployment: "
                   f"{METRICS_PORT}; default with --once: none, else {METRICS_PORT})")  # fmt: skip
    return p


def _access(args: argparse.Namespace) -> Access:
    return Access.from_flags(args.server, args.token_file, args.ca_file)


def main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse printed the usage error
        return 2 if stop.code else 0
    try:
        settings = read_settings(args.expectations)
        kube = Kube(_access(args))
        replacer = None
        if settings.mode == "replace" and settings.region:
            replacer = aws.Replacer(aws.client(settings.region), settings.cluster_name)
    except SetupError as err:
        print(f"{PROG} repair: {err.message}", file=sys.stderr, flush=True)
        return 2
    metrics = Metrics()
    deps = Deps(kube=kube, settings=settings, metrics=metrics, replacer=replacer,
                post_hook=http.post_hook, query=http.query)  # fmt: skip
    port = args.metrics_port if args.metrics_port is not None else (
        None if args.once else METRICS_PORT)  # fmt: skip
    last_ok = [time.monotonic()]
    if port is not None:
        serve(metrics, port, lambda: time.monotonic() - last_ok[0] < 3 * args.interval + 60)
    if args.once:
        try:
            result = run_once(deps)
        except ApiError as err:
            json_log("pass-failed", error=str(err))
            return 1
        json_log("pass", steps=result.steps, evicted=result.evicted, rechecks=result.rechecks,
                 errors=result.errors)  # fmt: skip
        return 1 if result.errors else 0
    halt = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001
        halt.set()

    signal.signal(signal.SIGTERM, _stop)
    while not halt.is_set():
        try:
            result = run_once(deps)
            last_ok[0] = time.monotonic()
            if result.steps or result.rechecks or result.errors:
                json_log("pass", steps=result.steps, evicted=result.evicted,
                         rechecks=result.rechecks, errors=result.errors)  # fmt: skip
        except ApiError as err:
            json_log("pass-failed", error=str(err))
        halt.wait(args.interval)
    return 0
