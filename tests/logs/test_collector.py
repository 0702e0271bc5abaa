"""The node log collector (issue 44, trainstack/builders/logs.py), run for real.

The OpenTelemetry Collector built from its Go modules (trainstack/sandbox/toolchain.py, `otelcol`,
every component at v0.158.0) runs `collector_config` over CRI log files laid out as the kubelet lays
them out (`<root>/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`) and ships to
moto's S3 server on loopback through the real awss3exporter. The one stand-in: k8s_attributes, which
needs an API server, is replaced by `static_pods_stand_in` (the pods' labels and annotations as
Volcano sets them); tests/e2e/test_logs.py runs the real processor against a real API server and
Volcano.

Skipped, saying so, when the collector is not built (`make e2e-tools`, or
`python -m trainstack.sandbox.toolchain build otelcol`).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from tests.s3server import AWS_ENV as TEST_AWS_ENV
from tests.s3server import moto_s3
from trainstack.builders import logs
from trainstack.jobs.render import RETRY_COUNT_ANNOTATION
from trainstack.logs import parse_object
from trainstack.sandbox import toolchain

REGION = "us-east-1"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
}
assert TEST_AWS_ENV["AWS_DEFAULT_REGION"] == REGION
T0 = 1_796_464_800 * 1_000_000_000  # 2026-12-05T10:00:00Z in Unix nanoseconds


# ---- the harness (tests/e2e/test_logs.py uses it too) -------------------------------------------


def collector_binary() -> Path:
    try:
        return toolchain.locate("otelcol")["otelcol"]
    except toolchain.MissingTools as missing:
        pytest.skip(f"{missing} (or: python -m trainstack.sandbox.toolchain build otelcol)")


def cri_time(ns: int) -> str:
    """A CRI log line's time as containerd writes it: RFC 3339, nanoseconds, UTC."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"


@dataclass(frozen=True)
class Line:
    """One CRI line: time (ns), stream, tag (F full, P partial) and content."""

    ns: int
    stream: str
    text: str
    tag: str = "F"

    def cri(self) -> str:
        return f"{cri_time(self.ns)} {self.stream} {self.tag} {self.text}\n"


def pod_log(root: Path, namespace: str, pod: str, uid: str, container: str, restart: int) -> Path:
    """The file the kubelet writes a container's log to (pkg/kubelet/kuberuntime
    BuildContainerLogsDirectory: <pods dir>/<namespace>_<pod>_<uid>/<container>/<n>.log)."""
    path = root / "var/log/pods" / f"{namespace}_{pod}_{uid}" / container / f"{restart}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def append(path: Path, lines: Sequence[Line]) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write("".join(line.cri() for line in lines))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Collector:
    """The collector binary on a configuration; stopped with SIGTERM (a graceful shutdown)."""

    def __init__(self, binary: Path, config: Mapping[str, Any], workdir: Path, env: dict[str, str]):
        self.binary, self.workdir, self.env = binary, workdir, env
        self.config = workdir / "config.yaml"
        self.config.write_text(yaml.safe_dump(dict(config)), encoding="utf-8")
        self.log = workdir / "collector.log"
        self.health = str(config["extensions"]["health_check"]["endpoint"])
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Collector:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(self.binary), f"--config={self.config}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the collector exited:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"http://{self.health}/", timeout=1) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the collector never became healthy:\n{self.output()}")

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(f"the collector ignored SIGTERM:\n{self.output()}") from None
        assert self.process.returncode == 0, self.output()

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-8000:]


@dataclass(frozen=True)
class Shipped:
    """One record as it landed: its object's key, resource attributes, time, attributes, body."""

    key: str
    resource: dict[str, str]
    ns: int
    attributes: dict[str, str]
    body: str


def _strings(attrs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for kv in attrs:
        value = kv["value"]
        assert list(value) == ["stringValue"], f"{kv['key']}: not a string: {value}"
        found[kv["key"]] = value["stringValue"]
    return found


def objects(client: Any, bucket: str) -> dict[str, bytes]:
    """Every object of the bucket, by key, as stored (gzip)."""
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


def records(stored: Mapping[str, bytes]) -> list[Shipped]:
    """Every record of every object (OTLP JSON, gzip), in key then object order."""
    found: list[Shipped] = []
    for key, data in sorted(stored.items()):
        request = json.loads(gzip.decompress(data))
        for resource_logs in request["resourceLogs"]:
            resource = _strings(resource_logs["resource"]["attributes"])
            for scope_logs in resource_logs["scopeLogs"]:
                for record in scope_logs["logRecords"]:
                    found.append(
                        Shipped(
                            key,
                            resource,
                            int(record["timeUnixNano"]),
                            _strings(record.get("attributes", [])),
                            record["body"]["stringValue"],
                        )
                    )
    return found


def wait_for_records(
    read: Callable[[], list[Shipped]], count: int, collector: Collector, timeout: float = 90
) -> list[Shipped]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = read()
        if len(found) >= count:
            return found
        time.sleep(0.5)
    raise AssertionError(
        f"{len(read())} of {count} records shipped after {timeout}s:\n{collector.output()}"
    )


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3 server on loopback, on a port the OS picks (its region is REGION)."""
    with moto_s3() as url:
        yield url


def s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def new_bucket(endpoint: str) -> str:
    name = f"logs-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


def collector_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KUBECONFIG"))}
    return env | AWS_ENV


# ---- the scenario ------------------------------------------------------------------------------


def ms(n: int) -> int:
    return T0 + n * 1_000_000


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    container: str
    restart: int
    labels: dict[str, str]
    annotations: dict[str, str]

    def meta(self) -> dict[str, dict[str, str]]:
        return {"labels": self.labels, "annotations": self.annotations}


def volcano_pod(team: str, job: str, task: str, index: int, retry: int, restart: int = 0) -> Pod:
    """A pod as Volcano v1.15.1 createJobPod names and labels it."""
    return Pod(
        team,
        f"{job}-{task}-{index}",
        str(uuid.uuid4()),
        "trainer",
        restart,
        {
            "volcano.sh/job-name": job,
            "volcano.sh/task-spec": task,
            "volcano.sh/task-index": str(index),
            "volcano.sh/queue-name": team,
        },
        {RETRY_COUNT_ANNOTATION: str(retry), "volcano.sh/task-index": str(index)},
    )


RESNET = volcano_pod("vision", "resnet", "worker", 0, retry=0)
BERT = volcano_pod("vision", "bert", "worker", 1, retry=2, restart=1)
GPT = volcano_pod("nlp", "gpt", "master", 0, retry=1)
# Not a Volcano job's pod: a system daemon, and a bare pod in a team namespace.
DAEMON = Pod(
    "kube-system", "coredns-7d8f9", str(uuid.uuid4()), "coredns", 0, {"k8s-app": "dns"}, {}
)
STRAY = Pod("vision", "debug", str(uuid.uuid4()), "shell", 0, {"run": "debug"}, {})

TRACEBACK = [  # a chained exception, as Python 3.11 prints it
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 41, in load_shard',
    "    return shards[rank]",
    "           ~~~~~~^^^^^^",
    "KeyError: 3",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 88, in <module>',
    "    main()",
    '  File "/app/train.py", line 80, in main',
    "    data = load_shard(rank)",
    "           ^^^^^^^^^^^^^^^^",
    '  File "/app/train.py", line 43, in load_shard',
    '    raise RuntimeError(f"no shard for rank {rank}")',
    "RuntimeError: no shard for rank 3",
]
CAUSE = [  # an explicit cause (raise ... from ...)
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 12, in step',
    "    loss.backward()",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 20, in <module>',
    "    step()",
    "RuntimeError: step 7 ran out of device memory",
]


def resnet_lines() -> list[Line]:
    """stdout and stderr interleaved, a traceback split by stdout lines, a partial line."""
    out: list[Line] = [
        Line(ms(1), "stdout", "step 1 loss 0.50"),
        Line(ms(2), "stderr", "INFO:trainer:checkpoint saved"),
    ]
    for i, text in enumerate(TRACEBACK):
        out.append(Line(ms(10 + i), "stderr", text))
        if i in (2, 9):  # stdout goes on while the traceback prints
            out.append(Line(ms(10 + i) + 500_000, "stdout", f"heartbeat {i}"))
    out += [
        # One 40-character line the runtime split in three (CRI partial lines).
        Line(ms(40), "stdout", "metrics: {'loss': 0.4, ", tag="P"),
        Line(ms(41), "stdout", "'lr': 3e-4, ", tag="P"),
        Line(ms(42), "stdout", "'step': 2}"),
        Line(ms(43), "stdout", "    indented"),
        Line(ms(44), "stdout", "step 3 done"),
    ]
    return out


def expected_resnet() -> list[tuple[int, str, str]]:
    """(time, stream, body) of every record the resnet pod's file gives, in time order."""
    return sorted(
        [
            (ms(1), "stdout", "step 1 loss 0.50"),
            (ms(2), "stderr", "INFO:trainer:checkpoint saved"),
            (ms(10), "stderr", "\n".join(TRACEBACK)),  # one record: the first line's time
            (ms(12) + 500_000, "stdout", "heartbeat 2"),
            (ms(19) + 500_000, "stdout", "heartbeat 9"),
            # The partial lines joined; an indented line continues the record before it.
            (ms(40), "stdout", "metrics: {'loss': 0.4, 'lr': 3e-4, 'step': 2}\n    indented"),
            (ms(44), "stdout", "step 3 done"),
        ]
    )


def _where(pod: Pod) -> dict[str, Any]:
    return {
        "namespace": pod.namespace,
        "pod": pod.name,
        "uid": pod.uid,
        "container": pod.container,
        "restart": pod.restart,
    }


# A limit of the rule, asserted so that a change to it is seen: an exception whose class name
# has none of the usual endings (Error, Exception, ...) is not recognised as the traceback's
# last line, which then becomes a record of its own.
ODD_NAME = [
    "Traceback (most recent call last):",
    '  File "/app/eval.py", line 3, in <module>',
    "    wait()",
    "StallTimeout: no progress in 600s",
]


def scenario(root: Path) -> None:
    append(pod_log(root, **_where(RESNET)), resnet_lines())
    append(
        pod_log(root, **_where(BERT)),
        [Line(ms(5), "stdout", "bert up")]
        + [Line(ms(50 + i), "stderr", text) for i, text in enumerate(CAUSE)],
    )
    append(
        pod_log(root, **_where(GPT)),
        [Line(ms(7), "stdout", "gpt up"), Line(ms(8), "stdout", "")]
        + [Line(ms(70 + i), "stderr", text) for i, text in enumerate(ODD_NAME)],
    )
    append(pod_log(root, **_where(DAEMON)), [Line(ms(3), "stdout", "dns ready")])
    append(pod_log(root, **_where(STRAY)), [Line(ms(4), "stdout", "debugging")])


EXPECTED: dict[tuple[str, str], list[tuple[int, str, str]]] = {
    ("vision", "resnet"): expected_resnet(),
    ("vision", "bert"): [
        (ms(5), "stdout", "bert up"),
        (ms(50), "stderr", "\n".join(CAUSE)),
    ],
    ("nlp", "gpt"): [
        (ms(7), "stdout", "gpt up\n"),  # a blank line continues the record before it
        (ms(70), "stderr", "\n".join(ODD_NAME[:-1])),
        (ms(73), "stderr", ODD_NAME[-1]),
    ],
}
KEY = r"^{prefix}/year=\d{{4}}/month=\d\d/day=\d\d/hour=\d\d/logs_[0-9a-f-]{{36}}\.json\.gz$"


def run_config(tmp: Path, root: Path, bucket: str, endpoint: str, **options: Any) -> dict[str, Any]:
    pods = (RESNET, BERT, GPT, DAEMON, STRAY)
    return logs.collector_config(
        bucket,
        REGION,
        endpoint,
        **options,
        include=[f"{root}/var/log/pods/*/*/*.log"],
        storage_dir=str(tmp / "storage"),
        health_endpoint=f"127.0.0.1:{free_port()}",
        metrics_host=None,
        batch_timeout="1s",
        static_pods={pod.uid: pod.meta() for pod in pods},
    )


@dataclass(frozen=True)
class Run:
    client: Any
    bucket: str
    stored: dict[str, bytes]
    records: list[Shipped]


@pytest.fixture(scope="module")
def shipped(s3: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    binary = collector_binary()
    tmp = tmp_path_factory.mktemp("collector")
    root = tmp / "node"
    scenario(root)
    bucket = new_bucket(s3)
    client = s3_client(s3)
    want = sum(len(v) for v in EXPECTED.values())
    with Collector(binary, run_config(tmp, root, bucket, s3), tmp, collector_env()) as running:
        wait_for_records(lambda: records(objects(client, bucket)), want, running)
        time.sleep(2)  # anything more (a duplicate, a dropped pod's line) would show too
    stored = objects(client, bucket)
    return Run(client, bucket, stored, records(stored))


def test_each_job_gets_exactly_its_records(shipped: Run) -> None:
    got: dict[tuple[str, str], list[tuple[int, str, str]]] = {}
    for r in shipped.records:
        team, job = r.resource[logs.TEAM], r.resource[logs.JOB]
        got.setdefault((team, job), []).append((r.ns, r.attributes["log.iostream"], r.body))
    assert {k: sorted(v) for k, v in got.items()} == EXPECTED


def test_a_chained_traceback_is_one_record_with_its_text(shipped: Run) -> None:
    [chain] = [
        r for r in shipped.records if r.body.startswith("Traceback") and "KeyError" in r.body
    ]
    assert chain.body == "\n".join(TRACEBACK)
    assert chain.ns == ms(10)
    assert chain.attributes == {"log.iostream": "stderr"}
    [cause] = [r for r in shipped.records if "direct cause" in r.body]
    assert cause.body.splitlines() == CAUSE


def test_records_carry_the_pods_tags(shipped: Run) -> None:
    expected = {
        RESNET.uid: (RESNET, "vision", "resnet", "worker", "0", "0"),
        BERT.uid: (BERT, "vision", "bert", "worker", "1", "2"),
        GPT.uid: (GPT, "nlp", "gpt", "master", "0", "1"),
    }
    for r in shipped.records:
        pod, team, job, task, replica, attempt = expected[r.resource["k8s.pod.uid"]]
        assert r.resource == {
            logs.TEAM: team,
            logs.JOB: job,
            logs.TASK: task,
            logs.REPLICA: replica,
            logs.ATTEMPT: attempt,
            logs.LOG_PREFIX: f"logs/teams/{team}/{job}",
            "k8s.namespace.name": pod.namespace,
            "k8s.pod.name": pod.name,
            "k8s.pod.uid": pod.uid,
            "k8s.container.name": pod.container,
            "k8s.container.restart_count": str(pod.restart),
        }
        assert r.attributes.keys() == {"log.iostream"}


def test_objects_land_under_their_jobs_prefix_gzip_encoded(shipped: Run) -> None:
    assert shipped.stored, "nothing shipped"
    prefixes = set()
    for key in shipped.stored:
        in_object = {r.resource[logs.LOG_PREFIX] for r in shipped.records if r.key == key}
        # One job per object, under that job's prefix: the exporter takes an object's prefix
        # from its first resource, so a mixed payload would file a job's lines under another.
        assert len(in_object) == 1, f"{key} holds records of {sorted(in_object)}"
        [prefix] = in_object
        assert re.match(KEY.format(prefix=re.escape(prefix)), key), key
        head = shipped.client.head_object(Bucket=shipped.bucket, Key=key)
        assert head["ContentEncoding"] == "gzip"
        prefixes.add(prefix)
    assert prefixes == {f"logs/teams/{t}/{j}" for t, j in EXPECTED}


def test_pods_of_no_volcano_job_are_not_shipped(shipped: Run) -> None:
    shipped_pods = {r.resource["k8s.pod.uid"] for r in shipped.records}
    assert shipped_pods == {RESNET.uid, BERT.uid, GPT.uid}
    assert not [r for r in shipped.records if r.body in ("dns ready", "debugging")]


def test_the_log_reader_reads_what_the_collector_writes(shipped: Run) -> None:
    """`trainstack logs` (trainstack/logs.py) parses these objects as shipped."""
    read = [rec for data in shipped.stored.values() for rec in parse_object(data)]
    assert sorted((r.time_ns, r.team, r.job, r.stream, r.body) for r in read) == sorted(
        (ns, team, job, stream, body)
        for (team, job), rows in EXPECTED.items()
        for ns, stream, body in rows
    )
    assert {(r.job, r.task, r.replica, r.attempt) for r in read} == {
        ("resnet", "worker", 0, 0),
        ("bert", "worker", 1, 2),
        ("gpt", "master", 0, 1),
    }


def test_a_restarted_collector_resumes_at_its_checkpoint(s3: str, tmp_path: Path) -> None:
    """Offsets in file_storage: a second run ships what was written since, nothing twice."""
    binary = collector_binary()
    root = tmp_path / "node"
    path = pod_log(root, **_where(RESNET))
    bucket = new_bucket(s3)
    client = s3_client(s3)
    config = run_config(tmp_path, root, bucket, s3)
    append(path, [Line(ms(i), "stdout", f"before {i}") for i in range(3)])
    with Collector(binary, config, tmp_path, collector_env()) as running:
        wait_for_records(lambda: records(objects(client, bucket)), 3, running)
    append(path, [Line(ms(10 + i), "stdout", f"after {i}") for i in range(2)])
    with Collector(binary, config, tmp_path, collector_env()) as running:
        wait_for_records(lambda: records(objects(client, bucket)), 5, running)
        time.sleep(2)
    bodies = sorted(r.body for r in records(objects(client, bucket)))
    assert bodies == ["after 0", "after 1", "before 0", "before 1", "before 2"]


def test_only_the_listed_teams_are_shipped(s3: str, tmp_path: Path) -> None:
    binary = collector_binary()
    root = tmp_path / "node"
    scenario(root)
    bucket = new_bucket(s3)
    client = s3_client(s3)
    config = run_config(tmp_path, root, bucket, s3, teams=["vision", "audio"])
    want = len(EXPECTED["vision", "resnet"]) + len(EXPECTED["vision", "bert"])
    with Collector(binary, config, tmp_path, collector_env()) as running:
        wait_for_records(lambda: records(objects(client, bucket)), want, running)
        time.sleep(7)  # past the recombine flush: nlp's last records would be out by now
    teams = sorted({r.resource[logs.TEAM] for r in records(objects(client, bucket))})
    assert teams == ["vision"]
    assert len(records(objects(client, bucket))) == want


# ---- the configuration and the chart's values, without running anything -----------------------


def test_the_attempt_is_the_annotation_the_job_layer_reads() -> None:
    assert logs.RETRY_COUNT_ANNOTATION == RETRY_COUNT_ANNOTATION
    assert ("trainstack.attempt", "annotations", RETRY_COUNT_ANNOTATION) in logs.EXTRACT


def test_the_cluster_config_uses_the_real_processor_and_the_exporters_prefix() -> None:
    config = logs.collector_config("acme-logs", "us-west-2")
    pipeline = config["service"]["pipelines"]["logs"]
    assert pipeline["processors"][1] == "k8s_attributes"
    assert "transform/static_pods" not in config["processors"]
    k8s = config["processors"]["k8s_attributes"]
    assert k8s["auth_type"] == "serviceAccount"
    assert k8s["filter"] == {
        "labels": [{"key": "volcano.sh/job-name", "op": "exists"}],
        "node_from_env_var": "K8S_NODE_NAME",
    }
    assert k8s["extract"]["otel_annotations"] is False
    s3 = config["exporters"]["awss3"]
    assert s3["resource_attrs_to_s3"] == {"s3_prefix": "trainstack.log_prefix"}
    assert s3["marshaler"] == "otlp_json"
    assert s3["sending_queue"]["batch"] == {"enabled": False}
    assert "endpoint" not in s3["s3uploader"]
    assert pipeline["exporters"] == ["awss3"]
    debugging = logs.collector_config("b", "r", file_export_path="/tmp/x.json")
    assert debugging["exporters"]["file"] == {"path": "/tmp/x.json"}
    assert debugging["service"]["pipelines"]["logs"]["exporters"] == ["awss3", "file"]


def test_chart_values_run_the_config_on_every_gpu_node() -> None:
    values = logs.collector_values(
        "acme-logs", "us-west-2", role_arn="arn:aws:iam::123456789012:role/logs"
    )
    assert values["mode"] == "daemonset"
    assert values["image"] == {
        "repository": "otel/opentelemetry-collector-contrib",
        "tag": logs.COLLECTOR_RELEASE,
    }
    assert values["command"] == {"name": "otelcol-contrib"}
    assert values["serviceAccount"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/logs"
    }
    assert "annotations" not in logs.collector_values("b", "r")["serviceAccount"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values[
        "tolerations"
    ]
    assert values["presets"]["logsCollection"] == {"enabled": True, "storeCheckpoints": True}
    # The receiver under the preset's key, so that ours wins the chart's merge (logs.py).
    chart = values["alternateConfig"]
    config = logs.collector_config("acme-logs", "us-west-2")
    assert chart["receivers"] == {"filelog": config["receivers"]["file_log"]}
    assert chart["service"]["pipelines"]["logs"]["receivers"] == ["filelog"]
    assert chart["extensions"] == config["extensions"]
    assert chart["extensions"]["file_storage"]["directory"] == "/var/lib/otelcol"
    assert chart["processors"] == config["processors"]
    assert "health_check" in chart["service"]["extensions"]


def test_the_wrapper_pins_one_collector_release() -> None:
    """Every collector module at the release logs.py names (docs/logs.md)."""
    go_mod = (toolchain.TOOLS / "otelcol" / "go.mod").read_text(encoding="utf-8")
    versions = {
        line.split()[0]: line.split()[1]
        for line in go_mod.splitlines()
        if line.strip().startswith(("go.opentelemetry.io/collector", "github.com/open-telemetry/"))
    }
    assert versions
    stable = {v for m, v in versions.items() if not v.startswith("v0.")}
    assert {v for v in versions.values() if v.startswith("v0.")} == {f"v{logs.COLLECTOR_RELEASE}"}
    assert stable == {"v1.64.0"}
