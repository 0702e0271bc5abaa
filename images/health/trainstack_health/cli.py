"""``trainstack-health``: the GPU node health gate's programs (docs/health.md).

- ``agent``: the DaemonSet's loop on each GPU node (agent.py); ``--once`` runs one step.
- ``check``: the node checks alone, printed as JSON, with no Kubernetes API (on a GPU machine,
  or against recorded outputs with ``--probes-from``); exit 0 when they pass, 1 when not.
- ``repair``: the repair controller (trainstack_health.repair.cli), imported only when asked
  for, so the agent runs without its dependencies.

Exit codes: 0 done, 1 an API error (``agent --once``) or a failed ``check``, 2 a setup error
(the message on stderr: what to fix). Logs are JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from trainstack_health import contract
from trainstack_health.agent import Agent
from trainstack_health.checks import run_checks
from trainstack_health.errors import SetupError
from trainstack_health.expectations import load
from trainstack_health.kube import Access, ApiError, Kube
from trainstack_health.metrics import Metrics, port_arg, serve
from trainstack_health.probes import Probes, RecordedProbes, SystemProbes

DEFAULT_INTERVAL_S = 60.0
# A full check (DCGM level 2-4, NCCL) can take many minutes within one step: /healthz stays
# 200 while a step is under way for up to this long.
STEP_LIMIT_S = 3 * 3600.0


def json_log(event: str, **fields: object) -> None:
    record: dict[str, object] = {"ts": round(time.time(), 3), "event": event, **fields}
    print(json.dumps(record, default=str), file=sys.stderr, flush=True)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _probes(directory: Path | None) -> Probes:
    if directory is None:
        return SystemProbes()
    if not directory.is_dir():
        raise SetupError(f"--probes-from {directory}: not a directory of recorded outputs")
    return RecordedProbes(directory)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=contract.PROG,
        description="trainstack's GPU node health gate: check a node before it takes work.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("agent", help="keep this node's health gate (the DaemonSet)")
    a.add_argument("--once", action="store_true", help="one step, then exit")
    a.add_argument("--node", default=os.environ.get(contract.NODE_NAME_ENV),
                   help=f"the node to check (default ${contract.NODE_NAME_ENV})")  # fmt: skip
    a.add_argument("--expectations", type=Path, default=Path(contract.EXPECTATIONS_PATH),
                   help="expectations.json (default %(default)s)")  # fmt: skip
    a.add_argument(
        "--probes-from",
        type=Path,
        metavar="DIR",
        help="read recorded tool outputs from DIR instead of running the tools",
    )
    a.add_argument("--server", help="API server URL (default: in-cluster)")
    a.add_argument("--token-file", type=Path, help="bearer token file (with --server)")
    a.add_argument("--ca-file", type=Path, help="API server CA bundle (with --server)")
    a.add_argument("--interval", type=_positive, default=DEFAULT_INTERVAL_S,
                   help="seconds between steps (default %(default)g)")  # fmt: skip
    a.add_argument("--metrics-port", type=port_arg, default=None,
                   help=f"serve /metrics and /healthz on this port (default: "
                   f"{contract.METRICS_PORT}; none with --once)")  # fmt: skip
    c = sub.add_parser("check", help="run the checks once and print the report as JSON")
    c.add_argument("--expectations", type=Path, required=True, help="expectations.json")
    c.add_argument("--pool", required=True, help="the pool whose expectations apply")
    c.add_argument(
        "--probes-from",
        type=Path,
        metavar="DIR",
        help="read recorded tool outputs from DIR instead of running the tools",
    )
    c.add_argument("--active", action="store_true",
                   help="also run dcgmi diag and all_reduce_perf (they load the GPUs)")  # fmt: skip
    sub.add_parser("repair", help="the repair controller (trainstack-health repair --help)",
                   add_help=False)  # fmt: skip
    return p


def _access(args: argparse.Namespace) -> Access:
    return Access.from_flags(args.server, args.token_file, args.ca_file)


def check(args: argparse.Namespace) -> int:
    expect = load(args.expectations).for_pool(args.pool, source=str(args.expectations))
    report = run_checks(_probes(args.probes_from), expect, active=args.active,
                        clock=time.monotonic)  # fmt: skip
    print(json.dumps(report.to_json(), indent=2))
    return 0 if report.passed else 1


def agent(args: argparse.Namespace) -> int:
    if not args.node:
        raise SetupError(f"no node: pass --node or set ${contract.NODE_NAME_ENV} (the "
                         "DaemonSet sets it from the downward API's spec.nodeName)")  # fmt: skip
    expectations = load(args.expectations)
    probes = _probes(args.probes_from)
    kube = Kube(_access(args))
    metrics = Metrics()
    worker = Agent(kube=kube, node_name=args.node, expectations=expectations, probes=probes,
                   metrics=metrics, log=json_log)  # fmt: skip
    if args.once:
        try:
            action = worker.step(time.time())
        except ApiError as err:
            json_log("step_failed", node=args.node, error=str(err))
            return 1
        json_log("step", node=args.node, action=action.kind)
        return 0
    return _loop(args, worker, metrics)


def _loop(args: argparse.Namespace, worker: Agent, metrics: Metrics) -> int:
    interval: float = args.interval
    progress = {"started": time.monotonic(), "done": time.monotonic(), "busy": 0.0}

    def healthy() -> bool:
        now = time.monotonic()
        if progress["busy"]:
            return now - progress["started"] < STEP_LIMIT_S
        return now - progress["done"] < 3 * interval + 60

    port = args.metrics_port if args.metrics_port is not None else contract.METRICS_PORT
    if port:
        serve(metrics, port, healthy)
    halt = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        halt.set()

    signal.signal(signal.SIGTERM, _stop)
    json_log("start", node=args.node, interval_s=args.interval)
    while not halt.is_set():
        progress.update(started=time.monotonic(), busy=1.0)
        try:
            # The kubelet updates the mounted ConfigMap: read it again each step.
            worker.expectations = load(args.expectations)
            worker.step(time.time())
        except ApiError as err:
            json_log("step_failed", node=args.node, error=str(err))
        except SetupError as err:  # e.g. the ConfigMap lost this pool: keep trying, say why
            json_log("setup_error", node=args.node, message=err.message)
        else:
            progress["done"] = time.monotonic()
        progress["busy"] = 0.0
        halt.wait(interval)
    json_log("stop", node=args.node)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["repair"]:
        from trainstack_health.repair.cli import main as repair_main  # noqa: PLC0415 - lazy

        return repair_main(args_list[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as stop:  # argparse printed the usage or the help
        return 2 if stop.code else 0
    try:
        return check(args) if args.command == "check" else agent(args)
    except SetupError as err:
        print(f"{contract.PROG} {args.command}: {err.message}", file=sys.stderr, flush=True)
        return 2
