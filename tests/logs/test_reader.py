"""`trainstack logs JOB` against a real S3 API (moto's server on loopback, a real boto3 client):
a job whose pods are gone, read back from the collector's OTLP JSON objects (issue 44)."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import stat
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from tests.s3server import moto_s3
from trainstack import logs
from trainstack.cli import app
from trainstack.logs import LogRecord, LogsError, merge, merge_key, parse_object, parse_since

runner = CliRunner()
T0 = parse_since("2026-12-05T10:04:00Z", 0)  # the job's start, Unix nanoseconds
S = 1_000_000_000


@dataclass(frozen=True)
class Store:
    endpoint: str
    bucket: str

    @cached_property
    def client(self) -> Any:
        return logs.make_client(self.endpoint)

    def put(self, key: str, data: bytes, **extra: Any) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **extra)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3() as url:
        yield url


@pytest.fixture
def store(endpoint: str) -> Store:
    made = Store(endpoint, f"logs-{uuid.uuid4().hex[:12]}")
    made.client.create_bucket(Bucket=made.bucket)
    return made


def value(v: Any) -> dict[str, Any]:
    """An AnyValue: ints as intValue (a string, as the proto3 JSON mapping writes int64)."""
    if isinstance(v, int):
        return {"intValue": str(v)}
    return {"stringValue": v}


def otlp(
    task: str,
    replica: Any,
    attempt: Any,
    records: list[tuple[int, str]],
    *,
    team: str = "vision",
    job: str = "resnet",
    stream: str = "stdout",
) -> dict[str, Any]:
    """An ExportLogsServiceRequest as the collector's S3 exporter writes it."""
    index = replica["intValue"] if isinstance(replica, dict) else replica
    pod = f"{job}-{task}-{index}"
    resource = {
        "trainstack.team": value(team),
        "trainstack.job": value(job),
        "trainstack.task": value(task),
        "trainstack.replica": replica if isinstance(replica, dict) else value(str(replica)),
        "trainstack.attempt": attempt if isinstance(attempt, dict) else value(str(attempt)),
        "k8s.pod.name": value(pod),
        "k8s.container.name": value("trainer"),
    }
    return {
        "resourceLogs": [
            {
                "resource": {"attributes": [{"key": k, "value": v} for k, v in resource.items()]},
                "scopeLogs": [
                    {
                        "scope": {},
                        "logRecords": [
                            {
                                "timeUnixNano": str(T0 + t),
                                "observedTimeUnixNano": str(T0 + t + S // 10),
                                "body": {"stringValue": body},
                                "attributes": [
                                    {"key": "log.iostream", "value": {"stringValue": stream}}
                                ],
                            }
                            for t, body in records
                        ],
                    }
                ],
            }
        ]
    }


def encoded(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()


def zipped(document: dict[str, Any]) -> bytes:
    return gzip.compress(encoded(document))


JOB = "logs/teams/vision/resnet"
PART0 = "year=2026/month=12/day=05/hour=10/minute=04"
PART1 = "year=2026/month=12/day=05/hour=10/minute=14"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/train.py", line 9, in <module>\n'
    "    step()\n"
    "RuntimeError: NCCL watchdog timeout\n"
)


@pytest.fixture
def finished_job(store: Store) -> Store:
    """A job that ran twice (attempts 0 and 1) and is gone: a master and two workers, plain and
    gzip objects, records out of order across objects, a traceback, ties on the nanosecond."""
    # attempt 0
    store.put(
        f"{JOB}/{PART0}/node-a-0001.json",
        encoded(otlp("master", 0, 0, [(1 * S, "master up"), (5 * S, "step 1 loss 2.31")])),
    )
    store.put(
        f"{JOB}/{PART0}/node-b-0001.json.gz",
        zipped(otlp("worker", 0, 0, [(2 * S, "worker 0 up"), (6 * S, TRACEBACK)], stream="stderr")),
    )
    # The replica as a JSON number, the attempt as intValue: the proto3 mapping allows both.
    store.put(
        f"{JOB}/{PART0}/node-c-0001.json",
        encoded(otlp("worker", {"intValue": 1}, {"intValue": "0"}, [(3 * S, "worker 1 up")])),
    )
    # attempt 1: ten minutes on; the object listed first holds the latest records
    store.put(
        f"{JOB}/{PART1}/node-a-0002.json",
        encoded(otlp("worker", 1, 1, [(604 * S, "worker 1 step 3"), (602 * S, "worker 1 up")])),
    )
    store.put(  # gzip by ContentEncoding only, the key says .json
        f"{JOB}/{PART1}/node-b-0002.json",
        zipped(otlp("master", 0, 1, [(601 * S, "master up again"), (603 * S, "master tie")])),
        ContentEncoding="gzip",
    )
    store.put(
        f"{JOB}/{PART1}/node-c-0002.json",
        encoded(otlp("worker", 0, 1, [(600 * S, "resuming from step 1"), (603 * S, "worker tie")])),
    )
    # Same task, replica and nanosecond in two objects: the order read (keys) decides.
    store.put(f"{JOB}/{PART1}/node-d-0002.json", encoded(otlp("worker", 0, 1, [(605 * S, "d")])))
    store.put(f"{JOB}/{PART1}/node-e-0002.json", encoded(otlp("worker", 0, 1, [(605 * S, "e")])))
    # another job of the team, and a job of another team
    store.put(
        "logs/teams/vision/resnet-eval/x.json", encoded(otlp("worker", 0, 0, [(0, "other job")]))
    )
    store.put("logs/teams/nlp/resnet/x.json", encoded(otlp("worker", 0, 0, [(0, "other team")])))
    return store


def logs_cli(store: Store, *args: str, bucket: str | None = None) -> Result:
    where = ["--bucket", bucket or store.bucket, "--endpoint-url", store.endpoint]
    result = runner.invoke(app, ["logs", *args, "--team", "vision", *where])
    assert isinstance(result.exception, SystemExit | None), result.output
    return result


ATTEMPT0 = """\
[master-0 a0] master up
[worker-0 a0] worker 0 up
[worker-1 a0] worker 1 up
[master-0 a0] step 1 loss 2.31
[worker-0 a0] Traceback (most recent call last):
[worker-0 a0]   File "/app/train.py", line 9, in <module>
[worker-0 a0]     step()
[worker-0 a0] RuntimeError: NCCL watchdog timeout
"""
ATTEMPT1 = """\
[worker-0 a1] resuming from step 1
[master-0 a1] master up again
[worker-1 a1] worker 1 up
[master-0 a1] master tie
[worker-0 a1] worker tie
[worker-1 a1] worker 1 step 3
[worker-0 a1] d
[worker-0 a1] e
"""


def test_the_latest_attempt_by_default_merged_in_time_order(finished_job: Store) -> None:
    result = logs_cli(finished_job, "resnet")
    assert result.exit_code == 0, result.output
    assert result.stdout == ATTEMPT1
    assert result.stderr == (
        "attempt 1 shown, the latest of 0, 1 (--attempt all shows every attempt)\n"
    )


def test_one_attempt_or_all(finished_job: Store) -> None:
    first = logs_cli(finished_job, "resnet", "--attempt", "0")
    assert first.exit_code == 0, first.output
    assert first.stdout == ATTEMPT0
    assert first.stderr == ""
    every = logs_cli(finished_job, "resnet", "--attempt", "all")
    assert every.exit_code == 0, every.output
    assert every.stdout == ATTEMPT0 + ATTEMPT1
    assert logs_cli(finished_job, "resnet", "--attempt", "latest").stdout == ATTEMPT1


def test_one_task_and_replica(finished_job: Store) -> None:
    result = logs_cli(
        finished_job, "resnet", "--task", "worker", "--replica", "1", "--attempt", "all"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "[worker-1 a0] worker 1 up\n[worker-1 a1] worker 1 up\n[worker-1 a1] worker 1 step 3\n"
    )
    masters = logs_cli(finished_job, "resnet", "--task", "master")
    assert masters.stdout == "[master-0 a1] master up again\n[master-0 a1] master tie\n"
    replica0 = logs_cli(finished_job, "resnet", "--replica", "0", "--attempt", "0")
    assert replica0.stdout == "".join(
        line + "\n" for line in ATTEMPT0.splitlines() if "-0 a0]" in line
    )


def test_since_a_time_or_a_while_ago(finished_job: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    since = logs_cli(finished_job, "resnet", "--since", "2026-12-05T10:14:03Z")
    assert since.exit_code == 0, since.output
    assert since.stdout == ATTEMPT1[ATTEMPT1.index("[master-0 a1] master tie") :]
    # Nanoseconds and an offset: 11:14:02.5+01:00 is 10:14:02.5Z.
    offset = logs_cli(finished_job, "resnet", "--since", "2026-12-05T11:14:02.500000000+01:00")
    assert offset.stdout == since.stdout
    monkeypatch.setattr(logs, "now_ns", lambda: T0 + 605 * S)
    assert logs_cli(finished_job, "resnet", "--since", "2s").stdout == since.stdout
    ago = logs_cli(finished_job, "resnet", "--since", "1d", "--attempt", "all")
    assert ago.stdout == ATTEMPT0 + ATTEMPT1
    # Nothing since then: nothing printed, and said on stderr.
    none = logs_cli(finished_job, "resnet", "--since", "2026-12-06T00:00:00Z")
    assert (none.exit_code, none.stdout) == (0, "")
    assert "no log record matches" in none.stderr


def test_timestamps_follow_the_prefix_on_every_line(finished_job: Store) -> None:
    result = logs_cli(finished_job, "resnet", "--attempt", "0", "--task", "worker", "--timestamps")
    assert result.stdout == (
        "[worker-0 a0] 2026-12-05T10:04:02.000000000Z worker 0 up\n"
        "[worker-1 a0] 2026-12-05T10:04:03.000000000Z worker 1 up\n"
        "[worker-0 a0] 2026-12-05T10:04:06.000000000Z Traceback (most recent call last):\n"
        '[worker-0 a0] 2026-12-05T10:04:06.000000000Z   File "/app/train.py", line 9, in <module>\n'
        "[worker-0 a0] 2026-12-05T10:04:06.000000000Z     step()\n"
        "[worker-0 a0] 2026-12-05T10:04:06.000000000Z RuntimeError: NCCL watchdog timeout\n"
    )


def test_an_unknown_job_says_where_it_looked_and_what_to_check(finished_job: Store) -> None:
    result = logs_cli(finished_job, "resnt")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"error: no logs for job 'resnt' under s3://{finished_job.bucket}/logs/teams/vision/"
        "resnt/ (did you mean 'resnet'?); jobs of team 'vision' with logs: resnet, resnet-eval. "
        "Check the job and team names, --bucket and --prefix-root (the collector's bucket and "
        "key prefix), and that the node log collector runs on the job's nodes (docs/logs.md)\n"
    )
    elsewhere = logs_cli(finished_job, "resnet", "--prefix-root", "other/")
    assert elsewhere.exit_code == 1
    assert f"under s3://{finished_job.bucket}/other/teams/vision/resnet/; no job of team" in (
        elsewhere.stderr
    )
    assert "Traceback" not in result.output + elsewhere.output


def test_unknown_task_replica_or_attempt_name_the_ones_the_job_had(finished_job: Store) -> None:
    task = logs_cli(finished_job, "resnet", "--task", "wroker")
    assert (task.exit_code, task.stderr) == (
        1,
        "error: job 'resnet' has no task 'wroker' (did you mean 'worker'?); its tasks: master, "
        "worker\n",
    )
    replica = logs_cli(finished_job, "resnet", "--task", "master", "--replica", "1")
    assert replica.stderr == "error: task 'master' has no replica 1; its replicas: 0\n"
    attempt = logs_cli(finished_job, "resnet", "--attempt", "7")
    assert attempt.stderr == "error: job 'resnet' has no records of attempt 7; its attempts: 0, 1\n"


def test_a_malformed_object_is_named(finished_job: Store) -> None:
    key = f"{JOB}/{PART1}/node-z-0002.json"
    finished_job.put(key, b'{"resourceLogs": [{"resource": ')
    result = logs_cli(finished_job, "resnet")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"error: s3://{finished_job.bucket}/{key}: not an OTLP JSON logs object: not JSON: "
    )
    assert "Traceback" not in result.output
    finished_job.put(key, gzip.compress(b"{}")[:-6], ContentType="application/gzip")
    truncated = logs_cli(finished_job, "resnet")
    assert f"{key}: not an OTLP JSON logs object: not valid gzip" in truncated.stderr
    document = otlp("worker", 0, 1, [(0, "x")])
    document["resourceLogs"][0]["resource"]["attributes"][3]["value"] = {"stringValue": "one"}
    finished_job.put(key, encoded(document))
    bad = logs_cli(finished_job, "resnet")
    assert bad.stderr == (
        f"error: s3://{finished_job.bucket}/{key}: not an OTLP JSON logs object: "
        "resourceLogs[0].resource.trainstack.replica: not a count: 'one'\n"
    )


def test_every_page_of_a_long_job_is_read(store: Store) -> None:
    """More objects than one ListObjectsV2 page (1000) holds: the last ones are only on the
    second page."""
    count = 1003

    def put(i: int) -> None:
        # Keys in listing order run backwards in time, so order comes from the merge alone.
        document = otlp("worker", i % 2, 0, [((count - i) * S, f"line {count - i}")], job="long")
        store.put(f"logs/teams/vision/long/p/{i:05d}.json", encoded(document))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(put, range(count)))
    result = logs_cli(store, "long")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"[worker-{(count - t) % 2} a0] line {t}" for t in range(1, count + 1)
    ]
    pages: list[str] = []
    client = logs.make_client(store.endpoint)
    client.meta.events.register(
        "before-call.s3.ListObjectsV2", lambda params, **_: pages.append(str(params))
    )
    keys = logs.list_keys(client, store.bucket, "logs/teams/vision/long/", page_size=400)
    assert len(keys) == count
    assert keys == sorted(keys)
    assert len(pages) == 3


def test_a_missing_bucket_is_one_line(store: Store) -> None:
    result = logs_cli(store, "resnet", bucket="no-such-bucket-here")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "error: s3://no-such-bucket-here/logs/teams/vision/resnet/: NoSuchBucket: "
    )
    assert result.stderr.endswith("; check --bucket\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attempt", "last"], "--attempt: 'last' is not a number, 'latest' or 'all'"),
        (["--since", "yesterday"], "--since: 'yesterday' is neither a duration"),
        (["--since", "2026-12-05T10:04:00"], "--since: '2026-12-05T10:04:00' is neither"),
        (["--follow", "--attempt", "0"], "--follow shows the live pods, the latest attempt"),
    ],
)
def test_bad_usage_exits_2(store: Store, args: list[str], message: str) -> None:
    result = logs_cli(store, "resnet", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {message}")


def test_a_job_name_that_is_no_name_is_bad_usage(store: Store) -> None:
    result = logs_cli(store, "../nlp/resnet")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: job '../nlp/resnet': a lowercase RFC 1123 label")


def test_follow_prints_the_stored_records_then_the_live_pods(
    finished_job: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text('#!/bin/sh\necho "kubectl $*"\necho "[pod/resnet-worker-0/trainer] live"\n')
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{kubectl.parent}{os.pathsep}{os.environ['PATH']}")
    result = logs_cli(finished_job, "resnet", "--follow", "--task", "worker", "--kubeconfig", "kc")
    assert result.exit_code == 0, result.output
    # From the earliest of the pods' last stored records (worker-1's, 10:14:04), in seconds.
    assert result.stdout == (
        "[worker-0 a1] resuming from step 1\n"
        "[worker-1 a1] worker 1 up\n"
        "[worker-0 a1] worker tie\n"
        "[worker-1 a1] worker 1 step 3\n"
        "[worker-0 a1] d\n"
        "[worker-0 a1] e\n"
        "kubectl logs --follow --namespace vision --selector "
        "volcano.sh/job-name=resnet,volcano.sh/task-spec=worker --all-containers --prefix "
        "--max-log-requests=128 --since-time=2026-12-05T10:14:04Z --kubeconfig kc\n"
        "[pod/resnet-worker-0/trainer] live\n"
    )
    # A job too young for the collector's first flush: the live pods alone, from --since.
    young = logs_cli(
        finished_job, "fresh", "--follow", "--replica", "0", "--since", "2026-12-05T10:00:00Z"
    )
    assert young.exit_code == 0, young.output
    assert young.stdout.splitlines()[0] == (
        "kubectl logs --follow --namespace vision --selector "
        "volcano.sh/job-name=fresh,volcano.sh/task-index=0 --all-containers --prefix "
        "--max-log-requests=128 --since-time=2026-12-05T10:00:00Z"
    )


def test_follow_without_kubectl_says_so(
    finished_job: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = logs_cli(finished_job, "resnet", "--follow")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: --follow needs kubectl on PATH")


def test_without_boto3_the_command_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 raises ImportError
    with pytest.raises(
        LogsError, match=r"^trainstack logs needs boto3: pip install 'trainstack\[logs\]'$"
    ):
        logs.make_client()


def test_help_says_the_default_is_the_latest_attempt() -> None:
    result = runner.invoke(app, ["logs", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "Default: the latest attempt only." in text
    assert "By default only the latest attempt." in text
    assert "<bool>" not in result.output


# ---- parsing ------------------------------------------------------------------------------------


def test_values_of_every_kind_and_the_observed_time_when_the_time_is_unknown() -> None:
    document = otlp("worker", {"intValue": 3}, {"intValue": "2"}, [(0, "")])
    record = document["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    record["timeUnixNano"] = 0  # unknown: the collector's observed time stands in
    record["observedTimeUnixNano"] = T0 + 7
    record["body"] = {
        "kvlistValue": {
            "values": [
                {"key": "msg", "value": {"stringValue": "hi"}},
                {"key": "n", "value": {"intValue": 4}},
                {"key": "ok", "value": {"boolValue": True}},
                {"key": "x", "value": {"doubleValue": 0.5}},
                {"key": "l", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {}]}}},
            ]
        }
    }
    # Two documents, one per line (the file exporter's layout), the second empty.
    (parsed,) = parse_object(encoded(document) + b"\n{}\n")
    assert parsed == LogRecord(
        time_ns=T0 + 7,
        team="vision",
        job="resnet",
        task="worker",
        replica=3,
        attempt=2,
        pod="resnet-worker-3",
        container="trainer",
        stream="stdout",
        body='{"msg":"hi","n":4,"ok":true,"x":0.5,"l":["a",null]}',
    )


def test_an_empty_request_has_no_records() -> None:
    assert parse_object(b"{}") == []
    assert parse_object(gzip.compress(b'{"resourceLogs": []}')) == []


# ---- merging ------------------------------------------------------------------------------------

records = st.builds(
    LogRecord,
    time_ns=st.integers(0, 5),  # few values: many ties
    team=st.just("vision"),
    job=st.just("resnet"),
    task=st.sampled_from(["master", "worker"]),
    replica=st.integers(0, 2),
    attempt=st.integers(0, 1),
    pod=st.just(""),
    container=st.just(""),
    stream=st.just("stdout"),
    body=st.just(""),
)


@given(st.lists(records, max_size=40))
def test_merge_is_a_sorted_stable_permutation(given_records: list[LogRecord]) -> None:
    # Each record's body is its place in the order read, so every one can be told apart.
    read = [replace(r, body=str(i)) for i, r in enumerate(given_records)]
    merged = merge(read)
    # A permutation: every input once.
    assert sorted(int(r.body) for r in merged) == list(range(len(read)))
    assert sorted(merged, key=lambda r: int(r.body)) == read
    # Sorted by time, then task, then replica.
    keys = [merge_key(r) for r in merged]
    assert keys == sorted(keys)
    # Stable: records with the same key keep the order they were read in.
    for before, after in itertools.pairwise(merged):
        if merge_key(before) == merge_key(after):
            assert int(before.body) < int(after.body)
