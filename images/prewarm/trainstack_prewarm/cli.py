"""``trainstack-prewarm``: fetch a dataset version into the node cache, verify it, wait for it.

Exit codes are :class:`trainstack_prewarm.errors.ExitCode` (documented in docs/prewarm.md).
Logs are JSON lines on stderr; nothing is written to stdout.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from trainstack_prewarm import cache
from trainstack_prewarm.errors import ExitCode, IncompleteCacheError, PrewarmError, UsageError
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.limits import SourceLimiter
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.sources import make_s3_client, open_source

DEFAULT_CACHE = "/mnt/k8s-disks/0/cache"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _add_target(p: argparse.ArgumentParser, *, allow_dir: bool) -> None:
    p.add_argument(
        "--cache",
        default=os.environ.get("TRAINSTACK_CACHE_ROOT", DEFAULT_CACHE),
        help="cache root; the version lives in <cache>/<dataset>/<version> "
        "(default: $TRAINSTACK_CACHE_ROOT or %(default)s)",
    )
    p.add_argument("--dataset", help="dataset name")
    p.add_argument("--version", help="dataset version")
    if allow_dir:
        p.add_argument(
            "--dir",
            type=Path,
            help="the version directory itself (instead of --cache/--dataset/--version)",
        )
    p.add_argument(
        "--quick",
        action="store_true",
        help="check presence and sizes only, not sha256 (faster, weaker)",
    )
    p.add_argument("--workers", type=_positive_int, default=8, help="hashing threads")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainstack-prewarm",
        description="Copy a dataset version from S3 or a Lustre mount onto the node's NVMe "
        "cache, and gate training on the cache being complete.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    fetch = sub.add_parser("fetch", help="fill the cache (init container)")
    fetch.add_argument("--source", required=True, help="s3://bucket/prefix or /mnt/lustre/path")
    fetch.add_argument("--dataset", required=True)
    fetch.add_argument("--version", required=True)
    fetch.add_argument("--cache", default=os.environ.get("TRAINSTACK_CACHE_ROOT", DEFAULT_CACHE))
    fetch.add_argument(
        "--concurrency",
        type=_positive_int,
        default=8,
        help="simultaneous transfers per source (bucket or filesystem)",
    )
    fetch.add_argument(
        "--max-attempts",
        type=_positive_int,
        default=8,
        help="attempts per request before giving up",
    )
    fetch.add_argument("--base-backoff", type=_non_negative, default=0.5, metavar="SECONDS")
    fetch.add_argument("--max-backoff", type=_non_negative, default=20.0, metavar="SECONDS")
    fetch.add_argument(
        "--lock-timeout",
        type=_non_negative,
        default=3600.0,
        metavar="SECONDS",
        help="wait this long for another fetcher of the same version",
    )
    fetch.add_argument(
        "--start-jitter",
        type=_non_negative,
        default=0.0,
        metavar="SECONDS",
        help="sleep uniformly in [0, SECONDS] before the first request",
    )
    fetch.add_argument("--progress-interval", type=_non_negative, default=10.0, metavar="SECONDS")
    fetch.add_argument(
        "--quick",
        action="store_true",
        help="trust an existing cache on sizes alone (default: sha256)",
    )
    fetch.add_argument(
        "--endpoint-url",
        default=None,
        help="S3 endpoint (default: boto3's; AWS_ENDPOINT_URL_S3 also works)",
    )
    fetch.add_argument("--region", default=None)

    verify = sub.add_parser("verify", help="exit 0 only if the cache is complete (gate)")
    _add_target(verify, allow_dir=True)

    wait = sub.add_parser("wait", help="poll until the cache is complete, then verify it")
    _add_target(wait, allow_dir=True)
    wait.add_argument("--timeout", type=_non_negative, default=3600.0, metavar="SECONDS")
    wait.add_argument("--interval", type=_non_negative, default=5.0, metavar="SECONDS")
    return parser


def _target_dir(args: argparse.Namespace) -> Path:
    if args.dir is not None:
        if args.dataset or args.version:
            raise UsageError("give either --dir or --dataset/--version, not both")
        return Path(args.dir)
    if not args.dataset or not args.version:
        raise UsageError("--dataset and --version are required (or --dir)")
    return cache.version_dir(Path(args.cache), args.dataset, args.version)


def _fetch(args: argparse.Namespace, log: JsonLog) -> int:
    retry = RetryPolicy(args.max_attempts, args.base_backoff, args.max_backoff)
    source = open_source(
        args.source,
        s3_client_factory=lambda: make_s3_client(
            endpoint_url=args.endpoint_url,
            region=args.region,
            max_connections=max(10, args.concurrency + 2),
        ),
    )
    options = FetchOptions(
        concurrency=args.concurrency,
        retry=retry,
        lock_timeout_s=args.lock_timeout,
        start_jitter_s=args.start_jitter,
        progress_interval_s=args.progress_interval,
        deep_check=not args.quick,
    )
    Fetcher(
        source,
        Path(args.cache),
        args.dataset,
        args.version,
        options=options,
        limiter=SourceLimiter(args.concurrency),
        log=log,
    ).run()
    return ExitCode.OK


def _verify(args: argparse.Namespace, log: JsonLog) -> int:
    vdir = _target_dir(args)
    marker = cache.verify(
        vdir, deep=not args.quick, workers=args.workers, dataset=args.dataset, version=args.version
    )
    log(
        "verified",
        cache=str(vdir),
        files=len(marker.files),
        bytes=marker.total_bytes,
        deep=not args.quick,
    )
    return ExitCode.OK


def _wait(
    args: argparse.Namespace,
    log: JsonLog,
    sleep: Callable[[float], object],
    clock: Callable[[], float],
) -> int:
    vdir = _target_dir(args)
    deadline = clock() + args.timeout
    while not (vdir / cache.MARKER).exists():
        if clock() >= deadline:
            raise IncompleteCacheError(f"{vdir}: no {cache.MARKER} after {args.timeout:g}s")
        log("waiting", cache=str(vdir))
        sleep(args.interval)
    return _verify(args, log)


def main(
    argv: Sequence[str] | None = None,
    *,
    log: JsonLog | None = None,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    args = build_parser().parse_args(argv)
    log = log or JsonLog()
    try:
        if args.command == "fetch":
            return _fetch(args, log)
        if args.command == "verify":
            return _verify(args, log)
        return _wait(args, log, sleep, clock)
    except PrewarmError as exc:
        log(
            "error",
            command=args.command,
            kind=type(exc).__name__,
            error=exc.message,
            exit_code=int(exc.exit_code),
        )
        return int(exc.exit_code)
    except Exception as exc:
        log(
            "error",
            command=args.command,
            kind="internal",
            error=repr(exc),
            exit_code=int(ExitCode.INTERNAL),
        )
        traceback.print_exc()
        return int(ExitCode.INTERNAL)
