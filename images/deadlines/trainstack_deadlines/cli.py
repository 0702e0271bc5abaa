"""``trainstack-deadlines``: stop Volcano Jobs of team namespaces that ran past their maximum
duration. Runs as a Deployment in trainstack-system; `--once` runs a single pass and exits.

Exit codes are :class:`trainstack_deadlines.errors.ExitCode` (docs/deadlines.md). Logs are JSON
lines on stderr.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from trainstack_deadlines import contract
from trainstack_deadlines.controller import StateStore, read_registry, run_once
from trainstack_deadlines.decide import Settings
from trainstack_deadlines.errors import ExitCode, SetupError
from trainstack_deadlines.kube import Access, Kube
from trainstack_deadlines.log import JsonLog
from trainstack_deadlines.metrics import Metrics, serve

COMMAND_LABELS = {
    "app.kubernetes.io/managed-by": "trainstack",
    "app.kubernetes.io/component": "deadlines",
}


def _seconds(minimum: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {text}")
        return value

    return parse


def _state(text: str) -> tuple[str, str]:
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}")
    return namespace, name


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=contract.PROG,
        description="Stop Volcano Jobs of team namespaces that ran past their maximum duration "
        "(a TerminateJob Command), with Prometheus metrics.",
    )
    p.add_argument("--interval", type=_seconds(1), default=float(contract.DEFAULT_INTERVAL_S),
                   help="seconds between passes (default %(default)g)")  # fmt: skip
    p.add_argument("--margin", type=_seconds(0), default=float(contract.DEFAULT_MARGIN_S),
                   help="seconds after a job's deadline and termination grace period before "
                   "the platform stops it (default %(default)g)")  # fmt: skip
    p.add_argument("--registry", type=Path, default=Path(contract.REGISTRY_PATH),
                   help="the platform's registry.json (default %(default)s)")  # fmt: skip
    p.add_argument("--state", type=_state,
                   default=(contract.SYSTEM_NAMESPACE, contract.STATE_CONFIGMAP),
                   help="NAMESPACE/NAME of the state ConfigMap (default "
                   f"{contract.SYSTEM_NAMESPACE}/{contract.STATE_CONFIGMAP})")  # fmt: skip
    p.add_argument("--port", type=int, default=contract.METRICS_PORT,
                   help="port of /metrics and /healthz; 0: none (default %(default)s)")  # fmt: skip
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--server", help="API server URL (default: in-cluster)")
    p.add_argument("--token-file", type=Path, help="bearer token file (with --server)")
    p.add_argument("--ca-file", type=Path, help="CA bundle of the API server (with --server)")
    return p


def _access(args: argparse.Namespace) -> Access:
    if args.server is None:
        return Access.in_cluster()
    if args.token_file is None or args.ca_file is None:
        raise SetupError("--server needs --token-file and --ca-file")
    return Access(args.server, args.ca_file, args.token_file)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = JsonLog()
    settings = Settings(margin_s=args.margin, reissue_after_s=max(600.0, 5 * args.interval))
    try:
        kube = Kube(_access(args))
        teams = read_registry(args.registry)
    except SetupError as err:
        log("setup_error", message=err.message)
        return ExitCode.SETUP
    store = StateStore(kube, *args.state)
    metrics = Metrics()
    stop = threading.Event()
    last_pass = [time.monotonic()]
    if not args.once:

        def on_term(signum: int, frame: FrameType | None) -> None:
            del signum, frame
            stop.set()

        signal.signal(signal.SIGTERM, on_term)
        if args.port:
            stale = 3 * args.interval + 60  # a pass may wait on a slow API server
            serve(metrics, args.port, lambda: time.monotonic() - last_pass[0] < stale)
    log("start", teams=len(teams), interval_s=args.interval, margin_s=args.margin)
    while True:
        try:
            teams = read_registry(args.registry)  # the kubelet updates the mounted ConfigMap
        except SetupError as err:
            metrics.inc("trainstack_deadline_errors_total", operation="read_registry")
            log("setup_error", message=err.message)
        result = run_once(
            kube, teams, store, now=time.time(), settings=settings, metrics=metrics, log=log,
            command_labels=COMMAND_LABELS,
        )  # fmt: skip
        last_pass[0] = time.monotonic()
        if args.once:
            return ExitCode.PASS_FAILED if result.errors else ExitCode.OK
        if stop.wait(args.interval):
            log("stop")
            return ExitCode.OK
