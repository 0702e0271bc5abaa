"""``trainstack-prewarm``: fetch a dataset version into the node cache, verify it, wait for it.

Exit codes are :class:`trainstack_prewarm.errors.ExitCode` (documented in docs/prewarm.md).
Logs are JSON lines on stderr; nothing is written to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from trainstack_prewarm import agent as node_agent
from trainstack_prewarm import cache, csi, layout
from trainstack_prewarm.errors import ExitCode, IncompleteCacheError, PrewarmError, UsageError
from trainstack_prewarm.fetch import (
    DEFAULT_FILE_ROUNDS,
    DEFAULT_PART_SIZE,
    DEFAULT_RANGED_THRESHOLD,
    DEFAULT_START_JITTER_S,
    Fetcher,
    FetchOptions,
)
from trainstack_prewarm.limits import (
    DEFAULT_MAX_RATE,
    DEFAULT_RETRY_BUDGET,
    RateOptions,
    SourceLimiter,
)
from trainstack_prewarm.location import open_source
from trainstack_prewarm.log import JsonLog
from trainstack_prewarm.retry import RetryPolicy
from trainstack_prewarm.s3 import make_s3_client
from trainstack_prewarm.sources import Source

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


# The --reserve default where the flag is not given (the DaemonSet always gives it).
RESERVE_ENV = "TRAINSTACK_CACHE_RESERVE"


def _reserve_percent(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 90:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be 0-90 (percent of the volume), got {text}")
    return value


def _default_reserve() -> float:
    text = os.environ.get(RESERVE_ENV)
    if text is None:
        return cache.DEFAULT_RESERVE_PERCENT
    try:
        return _reserve_percent(text)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise UsageError(f"${RESERVE_ENV}={text!r}: {exc}") from None


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G/T suffix (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.rstrip("KMGTkmgtiIbB"), text[len(text.rstrip("KMGTkmgtiIbB")) :]
    try:
        value = int(float(number) * units[unit.upper()[:1]])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 byte, got {text}")
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
    depth = p.add_mutually_exclusive_group()
    depth.add_argument(
        "--deep",
        action="store_true",
        help="re-hash every file against the marker (default: trust the marker and sizes; "
        "fetch hashed every byte before writing it)",
    )
    depth.add_argument("--quick", action="store_true", help="sizes only (the default)")
    p.add_argument("--workers", type=_positive_int, default=8, help="hashing threads")


def _add_fetch_tuning(p: argparse.ArgumentParser) -> None:
    """How a fetch runs: shared by `fetch` and the node `agent`."""
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        default=8,
        help="simultaneous transfers per source (bucket or filesystem)",
    )
    p.add_argument(
        "--max-attempts",
        type=_positive_int,
        default=8,
        help="attempts per request before giving up",
    )
    p.add_argument("--base-backoff", type=_non_negative, default=0.5, metavar="SECONDS")
    p.add_argument("--max-backoff", type=_non_negative, default=20.0, metavar="SECONDS")
    p.add_argument(
        "--lock-timeout",
        type=_non_negative,
        default=3600.0,
        metavar="SECONDS",
        help="wait this long for another fetcher of the same version",
    )
    p.add_argument(
        "--start-jitter",
        type=_non_negative,
        default=DEFAULT_START_JITTER_S,
        metavar="SECONDS",
        help="sleep uniformly in [0, SECONDS] before the first request (default %(default)s)",
    )
    p.add_argument(
        "--max-request-rate",
        type=_non_negative,
        default=DEFAULT_MAX_RATE,
        metavar="PER_SECOND",
        help="requests/s per source from this node; halves on throttling and grows back "
        "slowly (default %(default)s; 0: off, botocore's adaptive mode paces instead)",
    )
    p.add_argument(
        "--retry-budget",
        type=_non_negative,
        default=DEFAULT_RETRY_BUDGET,
        metavar="N",
        help="retries shared by all workers, refilled 0.1 per success (default %(default)s)",
    )
    p.add_argument(
        "--file-rounds",
        type=int,
        default=DEFAULT_FILE_ROUNDS,
        metavar="N",
        help="later rounds for files that failed transiently (default %(default)s)",
    )
    p.add_argument(
        "--part-size",
        type=_size,
        default=DEFAULT_PART_SIZE,
        metavar="BYTES",
        help="ranged part size for large objects (default 64M)",
    )
    p.add_argument(
        "--ranged-threshold",
        type=_size,
        default=DEFAULT_RANGED_THRESHOLD,
        metavar="BYTES",
        help="objects at least this large are fetched in parallel ranged parts (default 128M)",
    )
    p.add_argument(
        "--no-evict",
        action="store_true",
        help="never evict other versions to make room (default: LRU versions no pod holds)",
    )
    p.add_argument(
        "--reserve",
        type=_reserve_percent,
        default=_default_reserve(),
        metavar="PERCENT",
        help="keep this share of the cache's volume free, for the kubelet and containerd "
        f"that share it (default %(default)g, or ${RESERVE_ENV}: above the kubelet's "
        "eviction and image garbage collection thresholds; 0 for a volume of its own)",
    )
    p.add_argument("--progress-interval", type=_non_negative, default=10.0, metavar="SECONDS")
    depth = p.add_mutually_exclusive_group()
    depth.add_argument(
        "--deep",
        action="store_true",
        help="re-hash a complete cache before trusting it (default: marker and sizes)",
    )
    depth.add_argument("--quick", action="store_true", help="marker and sizes (the default)")
    p.add_argument(
        "--endpoint-url",
        default=None,
        help="S3 endpoint (default: boto3's; AWS_ENDPOINT_URL_S3 also works)",
    )
    p.add_argument("--region", default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainstack-prewarm",
        description="Copy a dataset version from S3 or a Lustre mount onto the node's NVMe "
        "cache, and gate training on the cache being complete.",
    )
    sub = parser.add_subparsers(dest="subcommand", required=True)

    fetch = sub.add_parser("fetch", help="fill the cache (init container)")
    fetch.add_argument("--source", required=True, help="s3://bucket/prefix or /mnt/lustre/path")
    fetch.add_argument("--dataset", required=True)
    fetch.add_argument("--version", required=True)
    fetch.add_argument("--cache", default=os.environ.get("TRAINSTACK_CACHE_ROOT", DEFAULT_CACHE))
    _add_fetch_tuning(fetch)

    verify = sub.add_parser("verify", help="exit 0 only if the cache is complete (gate)")
    _add_target(verify, allow_dir=True)
    verify.add_argument(
        "--hold-timeout",
        type=_non_negative,
        default=3600.0,
        metavar="SECONDS",
        help="with a command: wait this long while a repair or eviction has the version",
    )
    verify.add_argument(
        "command",
        nargs="*",
        metavar="-- CMD",
        help="hold the version (shared) and exec CMD: eviction and repairs leave it alone "
        "until CMD exits",
    )

    evict = sub.add_parser("evict", help="remove versions no pod holds, least recently used first")
    evict.add_argument("--cache", default=os.environ.get("TRAINSTACK_CACHE_ROOT", DEFAULT_CACHE))
    evict.add_argument(
        "--high-water",
        required=True,
        metavar="BYTES|PCT%",
        help="evict until the cache's versions occupy at most this (bytes, K/M/G/T, or a "
        "percentage of the volume)",
    )

    agent = sub.add_parser(
        "agent", help="node agent: the CSI node service that publishes cached versions"
    )
    agent.add_argument("--cache", default=os.environ.get("TRAINSTACK_CACHE_ROOT", DEFAULT_CACHE))
    agent.add_argument(
        "--csi-endpoint",
        default=os.environ.get("CSI_ENDPOINT", "unix:///csi/csi.sock"),
        help="the unix socket the kubelet (through node-driver-registrar) calls",
    )
    agent.add_argument("--node-id", default=os.environ.get("NODE_NAME", ""), required=False)
    agent.add_argument(
        "--allow-source",
        action="append",
        default=[],
        metavar="PREFIX",
        help="a source prefix volumes may name (repeatable); others are refused",
    )
    agent.add_argument(
        "--publish-wait",
        type=_non_negative,
        default=60.0,
        metavar="SECONDS",
        help="how long a publish waits for its fill before asking the kubelet to retry",
    )
    agent.add_argument("--fill-workers", type=_positive_int, default=4, metavar="N")
    agent.add_argument(
        "--reserve-interval",
        type=_non_negative,
        default=60.0,
        metavar="SECONDS",
        help="how often the agent evicts versions no pod holds when the volume's free space "
        "fell below --reserve (other tenants grow after a fill); also after each unpublish; "
        "0: only then",
    )
    _add_fetch_tuning(agent)

    probe = sub.add_parser(
        "probe",
        help="exit 0 only if the node agent answers the CSI Identity.Probe ready (liveness)",
    )
    probe.add_argument(
        "--csi-endpoint",
        default=os.environ.get("CSI_ENDPOINT", "unix:///csi/csi.sock"),
        help="the agent's socket (default: $CSI_ENDPOINT or %(default)s)",
    )
    probe.add_argument(
        "--timeout",
        type=_non_negative,
        default=5.0,
        metavar="SECONDS",
        help="how long the agent may take to answer (default %(default)s)",
    )

    layout_cmd = sub.add_parser(
        "layout",
        help="the platform's job: make each team's checkpoint directory on the shared file "
        "system (root:GID, MODE), never following a symlink",
    )
    layout_cmd.add_argument("--root", required=True, help="the file system's root, mounted")
    layout_cmd.add_argument("--gid", type=_non_negative_int, required=True)
    layout_cmd.add_argument("--mode", required=True, help="octal, e.g. 2770")
    layout_cmd.add_argument(
        "--team-dir", action="append", default=[], metavar="PATH", help="e.g. /checkpoints/vision"
    )
    layout_cmd.add_argument(
        "--read-only-dir",
        action="append",
        default=[],
        metavar="PATH",
        help="made (root, 0755) if missing, e.g. /datasets",
    )

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


def _fetch_setup(
    args: argparse.Namespace,
) -> tuple[FetchOptions, SourceLimiter, Callable[..., Source]]:
    """Options, the node's limiter and a source opener from the tuning flags (the opener's
    ``within``: the agent's allowed prefixes, location.open_source)."""
    retry = RetryPolicy(args.max_attempts, args.base_backoff, args.max_backoff)
    if args.file_rounds < 0:
        raise UsageError("--file-rounds must be >= 0")
    rate_limited = args.max_request_rate > 0

    def opener(location: str, within: Sequence[str] | None = None) -> Source:
        return open_source(
            location,
            within=within,
            s3_client_factory=lambda: make_s3_client(
                endpoint_url=args.endpoint_url,
                region=args.region,
                max_connections=max(10, args.concurrency + 2),
                adaptive=not rate_limited,
            ),
        )

    options = FetchOptions(
        concurrency=args.concurrency,
        retry=retry,
        lock_timeout_s=args.lock_timeout,
        start_jitter_s=args.start_jitter,
        progress_interval_s=args.progress_interval,
        deep_check=args.deep,
        file_rounds=args.file_rounds,
        part_size=args.part_size,
        ranged_threshold=args.ranged_threshold,
        evict=not args.no_evict,
        reserve_percent=args.reserve,
    )
    rate = RateOptions(
        max_rate=args.max_request_rate if rate_limited else None,
        retry_budget=args.retry_budget,
    )
    return options, SourceLimiter(args.concurrency, rate=rate), opener


def _fetch(args: argparse.Namespace, log: JsonLog) -> int:
    options, limiter, opener = _fetch_setup(args)
    Fetcher(
        opener(args.source),
        Path(args.cache),
        args.dataset,
        args.version,
        options=options,
        limiter=limiter,
        log=log,
    ).run()
    return ExitCode.OK


def build_agent(
    args: argparse.Namespace, log: JsonLog, *, mounter: node_agent.Mounter | None = None
) -> node_agent.CacheAgent:
    """The node agent `agent` serves: fills with the tuning flags, one limiter (the node's
    request rate), sources opened only under ``--allow-source`` and a directory source read
    following no link (dirsource.DirSource), versions bind-mounted read-only."""
    options, limiter, opener = _fetch_setup(args)
    root = Path(args.cache)
    allowed = tuple(args.allow_source)

    def fill(req: node_agent.VersionRequest) -> object:
        fetcher = Fetcher(
            opener(req.source, within=allowed),
            root,
            req.dataset,
            req.version,
            options=options,
            limiter=limiter,
            log=log,
        )
        return fetcher.run()

    staging = root / node_agent.AGENT_DIR / node_agent.STAGING_DIR
    return node_agent.CacheAgent(
        root,
        fill=fill,
        mounter=mounter or node_agent.SystemMounter(staging=staging),
        allowed_sources=allowed,
        log=log,
        fill_workers=args.fill_workers,
        reserve_percent=None if args.no_evict else args.reserve,
    )


def _agent(args: argparse.Namespace, log: JsonLog) -> int:
    """The node agent: serve the CSI node service until terminated (docs/prewarm.md)."""
    agent = build_agent(args, log)
    agent.recover()  # before serving: holds of the volumes still mounted
    agent.start_reserve_keeper(args.reserve_interval)
    server = csi.serve(agent, args.csi_endpoint, args.node_id, publish_wait_s=args.publish_wait)
    server.wait_for_termination()
    return ExitCode.OK


def _probe(args: argparse.Namespace) -> int:
    """The agent's liveness check: its CSI server answers, not just its process runs."""
    if args.timeout <= 0:
        raise UsageError("--timeout must be > 0")
    csi.probe(args.csi_endpoint, timeout_s=args.timeout)
    return ExitCode.OK  # silent: the kubelet runs this every period


def _check(args: argparse.Namespace, log: JsonLog, vdir: Path) -> None:
    marker = cache.verify(
        vdir, deep=args.deep, workers=args.workers, dataset=args.dataset, version=args.version
    )
    log(
        "verified",
        cache=str(vdir),
        files=len(marker.files),
        bytes=marker.total_bytes,
        deep=args.deep,
    )


def _verify(
    args: argparse.Namespace,
    log: JsonLog,
    sleep: Callable[[float], object],
    clock: Callable[[], float],
    execvp: Callable[[str, list[str]], object],
) -> int:
    vdir = _target_dir(args)
    command = list(getattr(args, "command", None) or [])
    if not command:
        _check(args, log, vdir)
        return ExitCode.OK
    # Hold first, then check: a repair or eviction cannot start between the check and CMD.
    with cache.hold(
        vdir,
        timeout_s=args.hold_timeout,
        sleep=sleep,
        clock=clock,
        on_wait=lambda: log("hold_wait", cache=str(vdir)),
    ) as fd:
        _check(args, log, vdir)
        log("holding", cache=str(vdir), command=command[0])
        os.set_inheritable(fd, True)  # the flock lives as long as CMD's copy of the fd
        execvp(command[0], command)
    return ExitCode.OK  # only reached with a test's execvp


def _parse_high_water(text: str, cache_root: Path) -> int:
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise UsageError(f"--high-water {text!r}: not a percentage") from None
        if not 0 <= pct <= 100:
            raise UsageError(f"--high-water {text!r}: must be 0-100%")
        try:
            total = shutil.disk_usage(cache_root).total
        except OSError as exc:
            raise cache.local_error(exc, f"stat {cache_root}") from exc
        return int(total * pct / 100)
    try:
        return _size(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--high-water: {exc}") from None


def _evict(args: argparse.Namespace, log: JsonLog) -> int:
    root = Path(args.cache)
    high_water = _parse_high_water(args.high_water, root)
    evicted = cache.evict(
        root,
        high_water=high_water,
        on_evict=lambda vdir, size: log("evicted", cache=str(vdir), bytes=size),
    )
    left = sum(cache.disk_bytes(v) for v in cache.version_dirs(root))
    log("evict_done", evicted=len(evicted), bytes=left, high_water=high_water)
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
    _check(args, log, vdir)
    return ExitCode.OK


def _layout(args: argparse.Namespace, log: JsonLog) -> int:
    layout.apply(
        layout.from_args(args.root, args.gid, args.mode, args.team_dir, args.read_only_dir), log
    )
    return ExitCode.OK


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw}: must be >= 0")
    return value


def main(
    argv: Sequence[str] | None = None,
    *,
    log: JsonLog | None = None,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    execvp: Callable[[str, list[str]], object] = os.execvp,
) -> int:
    log = log or JsonLog()
    try:
        parser = build_parser()
    except PrewarmError as exc:  # a bad default from the environment
        log("error", kind=type(exc).__name__, error=exc.message, exit_code=int(exc.exit_code))
        return int(exc.exit_code)
    args = parser.parse_args(argv)
    commands: dict[str, Callable[[], int]] = {
        "fetch": lambda: _fetch(args, log),
        "verify": lambda: _verify(args, log, sleep, clock, execvp),
        "evict": lambda: _evict(args, log),
        "agent": lambda: _agent(args, log),
        "probe": lambda: _probe(args),
        "wait": lambda: _wait(args, log, sleep, clock),
        "layout": lambda: _layout(args, log),
    }
    try:
        return commands[args.subcommand]()
    except PrewarmError as exc:
        log(
            "error",
            command=args.subcommand,
            kind=type(exc).__name__,
            error=exc.message,
            exit_code=int(exc.exit_code),
        )
        return int(exc.exit_code)
    except Exception as exc:
        log(
            "error",
            command=args.subcommand,
            kind="internal",
            error=repr(exc),
            exit_code=int(ExitCode.INTERNAL),
        )
        traceback.print_exc()
        return int(ExitCode.INTERNAL)
