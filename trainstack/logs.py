"""`trainstack logs JOB`: a training job's container logs, read back from S3 (issue 44).

The node log collector (docs/logs.md, "Collector") ships every container log line of a
training pod to ``s3://BUCKET/<prefix root>teams/<team>/<job>/…`` as OTLP JSON
(``ExportLogsServiceRequest``, the protobuf JSON mapping), plain or gzip-compressed, at any depth
below the job's prefix (the exporter adds time partitions). Each resource carries the pod's
``trainstack.*`` attributes, so the pods need not exist any more: a post-mortem works after
Volcano deleted them.

Pure reading and merging (``parse_object``, ``select``, ``merge``, ``format_record``) plus a
thin S3 layer (``make_client``, ``read_job``) and the command's body (``run``), which the typer
wrapper in ``trainstack/cli.py`` calls. boto3 is imported only when a client is made: the
platform's own environment does not need it.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import re
import shutil
import subprocess
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from trainstack.config.errors import did_you_mean
from trainstack.config.k8s_syntax import dns1123_label

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

DEFAULT_PREFIX_ROOT: Final = "logs/"
# S3 returns at most 1000 keys per ListObjectsV2 page.
PAGE_SIZE: Final = 1000
# Objects read at once: one object per collector flush, so a long job has thousands.
READERS: Final = 16
# `kubectl logs -f` opens one stream per container and refuses more than this at once.
FOLLOW_MAX_LOG_REQUESTS: Final = 128

LATEST: Final = "latest"
ALL: Final = "all"

# Resource attributes the collector sets (the storage contract).
TEAM_ATTR: Final = "trainstack.team"
JOB_ATTR: Final = "trainstack.job"
TASK_ATTR: Final = "trainstack.task"
REPLICA_ATTR: Final = "trainstack.replica"
ATTEMPT_ATTR: Final = "trainstack.attempt"
POD_ATTR: Final = "k8s.pod.name"
CONTAINER_ATTR: Final = "k8s.container.name"
# Log record attribute: stdout or stderr.
STREAM_ATTR: Final = "log.iostream"

# Volcano's pod labels (v1.15.1 job_controller_util.go createJobPod): what --follow selects by.
JOB_NAME_LABEL: Final = "volcano.sh/job-name"
TASK_LABEL: Final = "volcano.sh/task-spec"
INDEX_LABEL: Final = "volcano.sh/task-index"

GZIP_MAGIC: Final = b"\x1f\x8b"
NS_PER_S: Final = 1_000_000_000
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+)([smhd])")
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)


class LogsError(Exception):
    """A user error: one message, no traceback (exit 1)."""


class LogsUsage(ValueError):
    """Bad command-line usage (exit 2)."""


class NoLogs(LogsError):
    """No object at all under the job's prefix."""


class Malformed(ValueError):
    """An object that is not OTLP JSON logs; the message says where inside it."""


@dataclass(frozen=True)
class LogRecord:
    """One log record: a line, or a multi-line traceback the collector kept together."""

    time_ns: int
    team: str
    job: str
    task: str
    replica: int
    attempt: int
    pod: str
    container: str
    stream: str  # stdout or stderr ('' when the record does not say)
    body: str


# ---- parsing one object ------------------------------------------------------------------------


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Malformed(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Malformed(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _integer(value: Any, where: str) -> int:
    """A proto3 JSON (u)int64: a number or a decimal string."""
    if isinstance(value, bool):
        raise Malformed(f"{where}: not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    raise Malformed(f"{where}: not an integer: {value!r}")


def _double(value: Any, where: str) -> float:
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise Malformed(f"{where}: not a number: {value!r}")


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise Malformed(f"{where}: not true or false: {value!r}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise Malformed(f"{where}: not a string: {value!r}")
    return value


def _array(value: Any, where: str) -> list[Any]:
    values = _list(_object(value, where).get("values"), f"{where}.values")
    return [any_value(v, f"{where}.values[{i}]") for i, v in enumerate(values)]


def _kvlist(value: Any, where: str) -> dict[str, Any]:
    return attributes(_object(value, where).get("values"), f"{where}.values")


# AnyValue's kinds (opentelemetry-proto common.proto), each as a Python value; bytes stay the
# base64 text the object holds.
_KINDS: Final[dict[str, Callable[[Any, str], Any]]] = {
    "stringValue": _string,
    "intValue": _integer,
    "boolValue": _bool,
    "doubleValue": _double,
    "bytesValue": _string,
    "arrayValue": _array,
    "kvlistValue": _kvlist,
}


def any_value(value: Any, where: str) -> Any:
    """An OTLP AnyValue as a Python value: str, int, float, bool, list, dict or None (empty)."""
    raw = _object(value, where)
    if not raw:
        return None
    kind = next((k for k in _KINDS if k in raw), None)
    if kind is None:
        raise Malformed(f"{where}: unknown value kind {sorted(raw)}")
    return _KINDS[kind](raw[kind], f"{where}.{kind}")


def attributes(value: Any, where: str) -> dict[str, Any]:
    """A KeyValue list as a dict (a key twice: the last one, as the collector's maps do)."""
    found: dict[str, Any] = {}
    for i, item in enumerate(_list(value, where)):
        pair = _object(item, f"{where}[{i}]")
        key = pair.get("key")
        if not isinstance(key, str):
            raise Malformed(f"{where}[{i}].key: not a string: {key!r}")
        found[key] = any_value(pair.get("value"), f"{where}[{i}].value")
    return found


def as_text(value: Any) -> str:
    """How a value prints: strings as they are, structured bodies as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _count(attrs: Mapping[str, Any], name: str, where: str) -> int:
    if name not in attrs:
        raise Malformed(f"{where}: no {name} attribute")
    value = attrs[name]
    if isinstance(value, str) and re.fullmatch(r"\d+", value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise Malformed(f"{where}.{name}: not a count: {value!r}")


def _documents(text: str) -> Iterator[Any]:
    """The JSON documents of an object: one (the S3 exporter's), or one per line (the file
    exporter's)."""
    decoder = json.JSONDecoder()
    index = 0
    while True:
        while index < len(text) and text[index] in " \t\r\n":
            index += 1
        if index == len(text):
            return
        document, index = decoder.raw_decode(text, index)
        yield document


def decompress(data: bytes) -> bytes:
    """The object's bytes, gunzipped when they start with gzip's magic (whatever its key or
    ContentEncoding say: a transport may have decoded it already)."""
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise Malformed(f"not valid gzip: {err}") from None


def parse_object(data: bytes) -> list[LogRecord]:
    """Every log record of one object, in the order it holds them."""
    try:
        text = decompress(data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise Malformed(f"not UTF-8 text: {err}") from None
    records: list[LogRecord] = []
    try:
        documents = list(_documents(text))
    except json.JSONDecodeError as err:
        raise Malformed(f"not JSON: {err}") from None
    for d, document in enumerate(documents):
        top = f"document {d + 1}: " if len(documents) > 1 else ""
        request = _object(document, f"{top}request")
        for r, resource_logs in enumerate(_list(request.get("resourceLogs"), "resourceLogs")):
            where = f"{top}resourceLogs[{r}]"
            scoped = _object(resource_logs, where)
            resource = _object(scoped.get("resource"), f"{where}.resource")
            attrs = attributes(resource.get("attributes"), f"{where}.resource.attributes")
            task = as_text(attrs.get(TASK_ATTR))
            if not task:
                raise Malformed(f"{where}.resource: no {TASK_ATTR} attribute")
            replica = _count(attrs, REPLICA_ATTR, f"{where}.resource")
            attempt = _count(attrs, ATTEMPT_ATTR, f"{where}.resource")
            for s, scope_logs in enumerate(_list(scoped.get("scopeLogs"), f"{where}.scopeLogs")):
                at = f"{where}.scopeLogs[{s}]"
                logs = _list(_object(scope_logs, at).get("logRecords"), f"{at}.logRecords")
                for i, raw in enumerate(logs):
                    here = f"{at}.logRecords[{i}]"
                    record = _object(raw, here)
                    time_ns = _integer(record.get("timeUnixNano", 0), f"{here}.timeUnixNano")
                    if time_ns == 0:  # OTLP: 0 means unknown; the collector's time instead
                        observed = record.get("observedTimeUnixNano", 0)
                        time_ns = _integer(observed, f"{here}.observedTimeUnixNano")
                    own = attributes(record.get("attributes"), f"{here}.attributes")
                    records.append(
                        LogRecord(
                            time_ns=time_ns,
                            team=as_text(attrs.get(TEAM_ATTR)),
                            job=as_text(attrs.get(JOB_ATTR)),
                            task=task,
                            replica=replica,
                            attempt=attempt,
                            pod=as_text(attrs.get(POD_ATTR)),
                            container=as_text(attrs.get(CONTAINER_ATTR)),
                            stream=as_text(own.get(STREAM_ATTR)),
                            body=as_text(any_value(record.get("body"), f"{here}.body")),
                        )
                    )
    return records


# ---- choosing and ordering ---------------------------------------------------------------------


def parse_attempt(text: str) -> int | str:
    """`--attempt`: a run's number (0 for the first), `latest` or `all`."""
    value = text.strip().lower()
    if value in (LATEST, ALL):
        return value
    if re.fullmatch(r"\d+", value):
        return int(value)
    raise LogsUsage(f"--attempt: {text!r} is not a number, 'latest' or 'all'")


def parse_since(text: str, now_ns: int) -> int:
    """`--since`: a duration back from now (10m, 2h, 1d, 30s) or an RFC 3339 time
    (2026-12-05T10:04:00Z, with any UTC offset and up to nanoseconds), as Unix nanoseconds."""
    value = text.strip()
    duration = _DURATION.fullmatch(value)
    if duration:
        return now_ns - int(duration[1]) * _UNITS[duration[2]] * NS_PER_S
    stamp = _RFC3339.fullmatch(value)
    if stamp is None:
        raise LogsUsage(
            f"--since: {text!r} is neither a duration (10m, 2h, 1d) nor an RFC 3339 time "
            "(2026-12-05T10:04:00Z)"
        )
    date, clock, fraction, offset = stamp.groups()
    zone = "+00:00" if offset in ("Z", "z") else offset
    try:
        whole = datetime.fromisoformat(f"{date}T{clock}{zone}")
    except ValueError as err:
        raise LogsUsage(f"--since: {text!r}: {err}") from None
    return int(whole.timestamp()) * NS_PER_S + int((fraction or "").ljust(9, "0"))


@dataclass(frozen=True)
class Query:
    """Which job's logs, where, and which of its records."""

    team: str
    job: str
    bucket: str
    prefix_root: str = DEFAULT_PREFIX_ROOT
    task: str | None = None
    replica: int | None = None
    attempt: int | str = LATEST
    since_ns: int | None = None

    @property
    def prefix(self) -> str:
        root = self.prefix_root.strip("/")
        return f"{root}/teams/{self.team}/{self.job}/" if root else f"teams/{self.team}/{self.job}/"

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def _listed(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in sorted(set(values)))


def select(records: Sequence[LogRecord], query: Query) -> tuple[list[LogRecord], int | None]:
    """The records the query asks for, in their original order, and the attempt chosen (None
    for all). The default, the latest attempt, is the highest of the job's records, whatever
    the other filters: a replica that ran only in an earlier attempt shows nothing. A task,
    replica or attempt the job never had is an error naming the ones it had."""
    if not records:  # --follow on a job with nothing stored yet
        return [], None
    attempts = {r.attempt for r in records}
    chosen: int | None
    if query.attempt == ALL:
        chosen = None
    elif query.attempt == LATEST:
        chosen = max(attempts)
    else:
        assert isinstance(query.attempt, int)
        chosen = query.attempt
        if chosen not in attempts:
            raise LogsError(
                f"job {query.job!r} has no records of attempt {chosen}; its attempts: "
                f"{_listed(attempts)}"
            )
    if query.task is not None:
        tasks = {r.task for r in records}
        if query.task not in tasks:
            raise LogsError(
                f"job {query.job!r} has no task {query.task!r}{did_you_mean(query.task, tasks)}; "
                f"its tasks: {_listed(tasks)}"
            )
    if query.replica is not None:
        replicas = {r.replica for r in records if query.task in (None, r.task)}
        if query.replica not in replicas:
            of = f"task {query.task!r}" if query.task is not None else f"job {query.job!r}"
            raise LogsError(
                f"{of} has no replica {query.replica}; its replicas: {_listed(replicas)}"
            )
    chosen_records = [
        r
        for r in records
        if chosen in (None, r.attempt)
        and query.task in (None, r.task)
        and query.replica in (None, r.replica)
        and (query.since_ns is None or r.time_ns >= query.since_ns)
    ]
    return chosen_records, chosen


def merge_key(record: LogRecord) -> tuple[int, str, int]:
    return (record.time_ns, record.task, record.replica)


def merge(records: Iterable[LogRecord]) -> list[LogRecord]:
    """All records in time order. Ties (the same nanosecond) go by task name, then replica,
    then the order read: objects by key (S3 lists keys in UTF-8 byte order), records as each
    object holds them. Python's sort is stable, so the order read needs no key of its own."""
    return sorted(records, key=merge_key)


def timestamp(time_ns: int) -> str:
    """RFC 3339 in UTC with nanoseconds: 2026-12-05T10:04:00.123456789Z."""
    seconds, nanos = divmod(time_ns, NS_PER_S)
    whole = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{nanos:09d}Z"


def format_record(record: LogRecord, *, timestamps: bool = False) -> list[str]:
    """A record's lines: `[task-replica a<attempt>] ` (then its time, with timestamps) before
    each line of its body; a multi-line body (a traceback) keeps its lines, each with the same
    prefix. One trailing newline of the body is dropped."""
    prefix = f"[{record.task}-{record.replica} a{record.attempt}] "
    if timestamps:
        prefix += f"{timestamp(record.time_ns)} "
    body = record.body.removesuffix("\n").removesuffix("\r")
    return [f"{prefix}{line}" for line in body.split("\n")]


# ---- S3 ----------------------------------------------------------------------------------------


def make_client(endpoint_url: str | None = None) -> S3Client:
    """An S3 client with the standard credential chain (environment, profile, instance role).
    boto3 is imported here only: `trainstack logs` is the one command that needs it."""
    try:
        import boto3  # noqa: PLC0415 - optional: only this command needs it
        from botocore.config import Config  # noqa: PLC0415
    except ImportError:
        raise LogsError("trainstack logs needs boto3: pip install 'trainstack[logs]'") from None
    config = Config(max_pool_connections=READERS, retries={"mode": "standard"})
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


@contextlib.contextmanager
def _s3_errors(where: str) -> Iterator[None]:
    """botocore's errors as one line naming the bucket and key or prefix."""
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    try:
        yield
    except ClientError as err:
        error = err.response.get("Error", {})
        code = error.get("Code", "error")
        hint = {
            "NoSuchBucket": "check --bucket",
            "AccessDenied": "check your AWS credentials: they need s3:ListBucket and "
            "s3:GetObject on the bucket",
        }.get(str(code), "")
        message = error.get("Message", "") or str(err)
        raise LogsError(f"{where}: {code}: {message}{'; ' + hint if hint else ''}") from None
    except BotoCoreError as err:
        raise LogsError(f"{where}: {err}") from None


def list_keys(
    client: S3Client, bucket: str, prefix: str, *, page_size: int = PAGE_SIZE
) -> list[str]:
    """Every object key below `prefix`, at any depth, in S3's order (every page)."""
    keys: list[str] = []
    token: str | None = None
    with _s3_errors(f"s3://{bucket}/{prefix}"):
        while True:
            if token is None:
                page = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=page_size)
            else:
                page = client.list_objects_v2(
                    Bucket=bucket, Prefix=prefix, MaxKeys=page_size, ContinuationToken=token
                )
            keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return keys


def sibling_jobs(client: S3Client, query: Query) -> list[str]:
    """The jobs of the team that have logs (one page: a hint, not a listing)."""
    parent = query.prefix.removesuffix(f"{query.job}/")
    with _s3_errors(f"s3://{query.bucket}/{parent}"):
        page = client.list_objects_v2(Bucket=query.bucket, Prefix=parent, Delimiter="/")
    return sorted(p["Prefix"][len(parent) :].rstrip("/") for p in page.get("CommonPrefixes", []))


def read_object(client: S3Client, bucket: str, key: str) -> list[LogRecord]:
    where = f"s3://{bucket}/{key}"
    with _s3_errors(where):
        data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    try:
        return parse_object(data)
    except Malformed as err:
        raise LogsError(f"{where}: not an OTLP JSON logs object: {err}") from None


def read_job(
    client: S3Client, query: Query, *, page_size: int = PAGE_SIZE, readers: int = READERS
) -> list[LogRecord]:
    """Every record of the job, objects in key order, each object's records in its order. No
    object at all is an error saying where it looked and what to check."""
    keys = list_keys(client, query.bucket, query.prefix, page_size=page_size)
    if not keys:
        others = sibling_jobs(client, query)
        known = (
            f"{did_you_mean(query.job, others)}; jobs of team {query.team!r} with logs: "
            f"{', '.join(others)}"
            if others
            else f"; no job of team {query.team!r} has logs there"
        )
        raise NoLogs(
            f"no logs for job {query.job!r} under {query.location}{known}. Check the job and "
            "team names, --bucket and --prefix-root (the collector's bucket and key prefix), "
            "and that the node log collector runs on the job's nodes (docs/logs.md)"
        )
    with ThreadPoolExecutor(max_workers=readers) as pool:
        parts = pool.map(lambda key: read_object(client, query.bucket, key), keys)
        return [record for part in parts for record in part]


# ---- the command -------------------------------------------------------------------------------


def check_name(what: str, value: str) -> None:
    problems = dns1123_label(value)
    if problems:
        raise LogsUsage(f"{what} {value!r}: {'; '.join(problems)}")


def follow_command(
    query: Query, records: Sequence[LogRecord], kubeconfig: Path | None, timestamps: bool
) -> list[str]:
    """`kubectl logs -f` for the job's live pods in the team's namespace, from where the
    stored records end. It starts at the earliest of the pods' last stored records (a pod the
    collector has not flushed yet loses nothing), so lines near there may show twice; with no
    stored record, at --since or the containers' start."""
    selector = [f"{JOB_NAME_LABEL}={query.job}"]
    if query.task is not None:
        selector.append(f"{TASK_LABEL}={query.task}")
    if query.replica is not None:
        selector.append(f"{INDEX_LABEL}={query.replica}")
    command = [
        "logs",
        "--follow",
        "--namespace",
        query.team,
        "--selector",
        ",".join(selector),
        "--all-containers",
        "--prefix",
        f"--max-log-requests={FOLLOW_MAX_LOG_REQUESTS}",
    ]
    last: dict[tuple[str, str], int] = {}
    for record in records:
        pod = (record.pod, record.container)
        last[pod] = max(last.get(pod, 0), record.time_ns)
    start = min(last.values()) if last else query.since_ns
    if start is not None:
        seconds = start // NS_PER_S  # the API keeps whole seconds: start at or before
        command.append(f"--since-time={datetime.fromtimestamp(seconds, UTC):%Y-%m-%dT%H:%M:%SZ}")
    if timestamps:
        command.append("--timestamps")
    if kubeconfig is not None:
        command += ["--kubeconfig", str(kubeconfig)]
    return command


def kubectl_path() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise LogsError(
            "--follow needs kubectl on PATH (and a kubeconfig for the cluster); without "
            "--follow the stored logs print"
        )
    return kubectl


def follow(kubectl: str, command: list[str], echo: Callable[[str], None]) -> int:
    """Run kubectl and relay its lines until it ends (the pods end) or Ctrl-C."""
    with subprocess.Popen([kubectl, *command], stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        try:
            for line in process.stdout:
                echo(line.removesuffix("\n"))
        except KeyboardInterrupt:
            process.terminate()
            return 0
        return process.wait()


@dataclass(frozen=True)
class Options:
    """`trainstack logs` as the user typed it."""

    job: str
    team: str
    bucket: str
    prefix_root: str = DEFAULT_PREFIX_ROOT
    task: str | None = None
    replica: int | None = None
    attempt: str = LATEST
    since: str | None = None
    timestamps: bool = False
    follow: bool = False
    kubeconfig: Path | None = None
    endpoint_url: str | None = None


def now_ns() -> int:
    return time.time_ns()


def run(
    options: Options,
    echo: Callable[[str], None],
    note: Callable[[str], None],
    *,
    client: S3Client | None = None,
) -> int:
    """The command: the stored records merged in time order, then with --follow the live
    pods'. LogsUsage for bad usage, LogsError for anything else the user must fix; the exit
    status otherwise (kubectl's, with --follow)."""
    check_name("team", options.team)
    check_name("job", options.job)
    attempt = parse_attempt(options.attempt)
    if options.follow and attempt != LATEST:
        raise LogsUsage("--follow shows the live pods, the latest attempt: drop --attempt")
    kubectl = kubectl_path() if options.follow else ""
    query = Query(
        team=options.team,
        job=options.job,
        bucket=options.bucket,
        prefix_root=options.prefix_root,
        task=options.task,
        replica=options.replica,
        attempt=attempt,
        since_ns=None if options.since is None else parse_since(options.since, now_ns()),
    )
    if client is None:
        client = make_client(options.endpoint_url)
    try:
        records = read_job(client, query)
    except NoLogs:
        if not options.follow:
            raise
        records = []  # a job too young for the collector's first flush: live pods only
    chosen, attempt_shown = select(records, query)
    for record in merge(chosen):
        for line in format_record(record, timestamps=options.timestamps):
            echo(line)
    attempts = sorted({r.attempt for r in records})
    if query.attempt == LATEST and len(attempts) > 1:
        note(
            f"attempt {attempt_shown} shown, the latest of {_listed(attempts)} "
            "(--attempt all shows every attempt)"
        )
    if not chosen and records:
        note("no log record matches")
    if options.follow:
        command = follow_command(query, chosen, options.kubeconfig, options.timestamps)
        return follow(kubectl, command, echo)
    return 0
