"""Durable per-job logs (issue 44): the node log collector's pipeline and its chart values.

A collector on every node reads each container's log files as the kubelet writes them
(`/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`, CRI format), keeps a Python
traceback together as one record, tags each record of a Volcano job's pod with its team, job,
task, replica and attempt, and ships it to S3 under `logs/teams/<team>/<job>/`. Pods that are not
a Volcano job's are dropped. docs/logs.md ("Collector") tells the whole story.

Why the OpenTelemetry Collector and not Fluent Bit: the collector is Go, so the exact components
deployed here are built from the Go module proxy (trainstack/sandbox/toolchain.py, component
`otelcol`) and the pipeline below runs for real in the tests (tests/logs/test_collector.py, and
tests/e2e/test_logs.py against a real API server and Volcano). Fluent Bit is C and is packaged in
no registry reachable here, so it could only have been configured, never run.

Pinned: every collector module at release v0.158.0 (core stable modules v1.64.0), the newest at
which the module proxy here serves both awss3exporter and k8sattributesprocessor (v0.159.0 to
v0.165.1 of one or the other are refused). Deployed with the upstream chart
`open-telemetry/opentelemetry-collector` 0.170.0 (appVersion 0.158.0) and the contrib image at
0.158.0: the k8s distribution has no awss3exporter (opentelemetry-collector-releases v0.158.0
distributions/otelcol-k8s/manifest.yaml; otelcol-contrib's has every component used here).

Upstream facts relied on (read at those versions; files under the module or chart root):

- The `container` operator (pkg/stanza operator/parser/container/parser.go) parses a CRI line
  into the record's time, `log.iostream` (stdout/stderr) and body, joins CRI partial lines (`P`)
  until the `F` line with an internal recombine keyed by the file path (config.go
  createRecombineConfig), and sets `k8s.namespace.name`, `k8s.pod.name`, `k8s.pod.uid`,
  `k8s.container.name`, `k8s.container.restart_count` on the resource from the file's path
  (extractk8sMetaFromFilePath; needs `include_file_path`).
- The `recombine` operator (operator/transformer/recombine/transformer.go) batches records per
  `source_identifier`; with `is_first_entry` a matching record flushes the batch and starts a
  new one, with `is_last_entry` a matching record is added and flushes. A batch is flushed
  anyway after `force_flush_period`, at `max_batch_size` records or over `max_log_size` bytes.
  The combined record keeps the first record's time and attributes (`overwrite_with: oldest`).
- awss3exporter (exporter.go getUploadOpts, factory.go): `resource_attrs_to_s3.s3_prefix` names
  a resource attribute whose value replaces `s3uploader.s3_prefix`. The exporter takes it from
  the first resource of each payload only, so the factory splits every payload by that
  attribute's value before its queue (pkg/batchperresourceattr NewBatchPerResourceLogs); the
  queue's own batching would merge the parts again (it partitions by client metadata only,
  exporterhelper internal/queuebatch/config.go PartitionConfig; tried: three jobs in one
  object), so it is turned off here and the `batch` processor batches before the split.
  Key: `<prefix>/<s3_partition_format of the upload time>/logs_<unique>.json.gz`
  (internal/upload/partition.go Build), gzip bytes sent
  with `Content-Encoding: gzip` (internal/upload/writer.go Upload: otlp_json is not an archive
  format, marshaler.go newMarshaler).
- k8sattributes (config.go, internal/k8sconfig): `extract.labels`/`annotations` with `tag_name`
  copy a pod's label or annotation to a resource attribute; `filter.labels` with op `exists`
  narrows the pod informer; `auth_type: kubeConfig` reads $KUBECONFIG (tests),
  `serviceAccount` the pod's token (clusters).

Volcano's labels and annotation, verified in volcano.sh/volcano v1.15.1
pkg/controllers/job/job_controller_util.go createJobPod (names from volcano.sh/apis
pkg/apis/batch/v1alpha1/labels.go, at v1.14.0, the version the toolchain builds v1.15.1 with):
it sets the pod labels `volcano.sh/job-name` (JobNameKey), `volcano.sh/task-spec` (TaskSpecKey)
and `volcano.sh/task-index` (TaskIndex) after copying the template's labels, so a template
cannot choose them, and the annotation `volcano.sh/job-retry-count` (JobRetryCountKey), the
run of the job that trainstack.jobs.render reads as RETRY_COUNT_ANNOTATION.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainstack.builders.pools import GPU_TOLERATION, HEALTH_TOLERATION

COLLECTOR_RELEASE: Final = "0.158.0"
CHART: Final = {
    "chart": "opentelemetry-collector",
    "version": "0.170.0",  # Chart.yaml appVersion 0.158.0 (0.169.0 too; 0.170.0 is the newer)
    "repo": "https://open-telemetry.github.io/opentelemetry-helm-charts",
}
# The platform installs it as an add-on (builders/addons.py) of this release name, in its own
# namespace, with a ServiceAccount of this name (IRSA on AWS: collector_s3_policy).
RELEASE: Final = "log-collector"
SERVICE_ACCOUNT: Final = "log-collector"
IMAGE_REPOSITORY: Final = "otel/opentelemetry-collector-contrib"
COMMAND: Final = "otelcol-contrib"  # the binary in that image (its Dockerfile's ENTRYPOINT)

# Where the kubelet writes container logs, and the chart's logsCollection preset mounts them
# (read-only) and its storeCheckpoints preset a hostPath for the offsets (templates/_pod.tpl).
PODS_LOG_GLOB: Final = "/var/log/pods/*/*/*.log"
CHECKPOINT_DIR: Final = "/var/lib/otelcol"

# Resource attributes the records carry (the contract with whoever reads the logs).
TEAM: Final = "trainstack.team"
JOB: Final = "trainstack.job"
TASK: Final = "trainstack.task"
REPLICA: Final = "trainstack.replica"
ATTEMPT: Final = "trainstack.attempt"
LOG_PREFIX: Final = "trainstack.log_prefix"
PREFIX_ROOT: Final = "logs/teams"

# Volcano v1.15.1 createJobPod (module docstring): pod labels and the retry-count annotation.
JOB_NAME_LABEL: Final = "volcano.sh/job-name"
TASK_SPEC_LABEL: Final = "volcano.sh/task-spec"
TASK_INDEX_LABEL: Final = "volcano.sh/task-index"
RETRY_COUNT_ANNOTATION: Final = "volcano.sh/job-retry-count"  # = jobs.render's
# (resource attribute, from, key) as k8sattributes extracts them.
EXTRACT: Final = (
    (JOB, "labels", JOB_NAME_LABEL),
    (TASK, "labels", TASK_SPEC_LABEL),
    (REPLICA, "labels", TASK_INDEX_LABEL),
    (ATTEMPT, "annotations", RETRY_COUNT_ANNOTATION),
)

# -- the traceback rule -------------------------------------------------------------------
# Two recombine stages per (file, stream), so that stdout lines never split a stderr traceback.
#
# Stage 1 (is_first_entry): every line starts a record except a continuation, which joins the
# record before it: an indented line (a traceback's frames, source lines, carets, the
# "[Previous line repeated N more times]" note, an exception group's "  | " box), a blank line,
# a chained-exception line ("During handling of the above exception, another exception
# occurred:", "The above exception was the direct cause of the following exception:") and an
# exception line ("ValueError: bad", "KeyError", "torch.OutOfMemoryError: ...", "Exception:
# x"): a name ending in Error, Exception, Warning, Interrupt, Exit, Iteration or Group (or
# `Exception` itself) alone or followed by ": ". "Traceback (most recent call last):" starts a
# record, so each traceback of a chain ends a stage-1 record with its exception line, the
# chain's blank and marker lines included.
# Stage 2 (is_last_entry): a stage-1 record that ends with a chain marker (and blank lines) is
# open, and joins the next one (the chained traceback); any other record is complete. So a
# chain of any length is one record, exactly its text, and ordinary lines pass alone.
CHAIN_MARKERS: Final = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
EXCEPTION_LINE: Final = (
    r"^(Exception|[A-Za-z_][\w.]*(Error|Exception|Warning|Interrupt|Exit|Iteration|Group))"
    r"(: .*)?$"
)
_MARKERS = "|".join(CHAIN_MARKERS)
# Expressions of expr-lang (the operator's `is_first_entry`/`is_last_entry`), over the body.
CONTINUATION: Final = (
    f'body matches "^(\\\\s|$)" or body matches "^({_MARKERS})$" '
    f"or body matches {json.dumps(EXCEPTION_LINE)}"
)
OPEN_CHAIN: Final = f'body matches "({_MARKERS})\\\\n*$"'
# One record at most this long (bytes) and this many lines; a longer traceback is cut into
# several records (the operator flushes the batch), none lost.
MAX_RECORD_BYTES: Final = 1024 * 1024
MAX_RECORD_LINES: Final = 1000
SOURCE: Final = "trainstack.source"  # the recombine key: file path and stream (then removed)


def _operators() -> list[dict[str, Any]]:
    """The filelog receiver's stanza operators: CRI parsing, then the traceback rule."""
    stage = {
        "type": "recombine",
        "combine_field": "body",
        "combine_with": "\n",
        "source_identifier": f'attributes["{SOURCE}"]',
        "max_log_size": MAX_RECORD_BYTES,
        "max_batch_size": MAX_RECORD_LINES,
        "force_flush_period": "5s",
        "overwrite_with": "oldest",
    }
    return [
        # CRI (containerd, CRI-O) and docker json; partial lines joined; k8s.* from the path.
        {"type": "container", "id": "cri", "max_log_size": MAX_RECORD_BYTES},
        {
            "type": "add",
            "id": "source",
            "field": f'attributes["{SOURCE}"]',
            "value": 'EXPR(attributes["log.file.path"] + " " + attributes["log.iostream"])',
        },
        {**stage, "id": "traceback", "is_first_entry": f"not ({CONTINUATION})"},
        # Stage 1 holds a chain's last traceback until the stream's next line or its flush
        # period (checked every fifth of it), so stage 2 waits longer for it than that.
        {
            **stage,
            "id": "chained",
            "is_last_entry": f"not ({OPEN_CHAIN})",
            "force_flush_period": "15s",
        },
        {"type": "remove", "id": "drop-source", "field": f'attributes["{SOURCE}"]'},
        # The first line's CRI tag says nothing of a joined record; the path is in k8s.*.
        {
            "type": "remove",
            "id": "drop-logtag",
            "field": 'attributes["logtag"]',
            "if": 'attributes["logtag"] != nil',  # docker json lines have none
        },
        {"type": "remove", "id": "drop-path", "field": 'attributes["log.file.path"]'},
    ]


def _ottl(value: str) -> str:
    """An OTTL string literal."""
    return json.dumps(value)


def _attr(name: str) -> str:
    return f'attributes["{name}"]'


def k8s_attributes(
    auth_type: str = "serviceAccount", node_from_env_var: str | None = "K8S_NODE_NAME"
) -> dict[str, Any]:
    """The k8s_attributes processor: Volcano's labels and annotation onto the resource.

    Only pods with `volcano.sh/job-name` enter its informer (the others never get a job, and
    are dropped), and on a node only that node's pods (`node_from_env_var`, which the chart
    sets with the kubernetesAttributes preset in daemonset mode). Pods are found by the uid
    the container operator took from the log file's path. `otel_annotations` stays off, so
    no pod annotation can write a resource attribute.
    """
    extract: dict[str, list[dict[str, str]]] = {"labels": [], "annotations": []}
    for tag, source, key in EXTRACT:
        extract[source].append({"tag_name": tag, "key": key, "from": "pod"})
    pod_filter: dict[str, Any] = {"labels": [{"key": JOB_NAME_LABEL, "op": "exists"}]}
    if node_from_env_var:
        pod_filter["node_from_env_var"] = node_from_env_var
    return {
        "auth_type": auth_type,
        "passthrough": False,
        "filter": pod_filter,
        "pod_association": [
            {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]},
        ],
        "extract": {
            "metadata": ["k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.node.name"],
            "otel_annotations": False,
            **extract,
        },
        # A pod deleted before its last lines were read keeps its metadata this long.
        "pod_delete_grace_period": "10m",
    }


def static_pods_stand_in(pods: Mapping[str, Mapping[str, Mapping[str, str]]]) -> dict[str, Any]:
    """TEST ONLY: a transform processor doing what k8s_attributes would do for these pods.

    `pods` maps a pod uid to its `labels` and `annotations`. Each pod with `volcano.sh/job-name`
    (the informer's filter) gets the EXTRACT attributes it has; the others get nothing. For
    tests without an API server (tests/logs); never in a cluster's configuration.
    """
    statements: list[str] = []
    for uid, meta in sorted(pods.items()):
        if JOB_NAME_LABEL not in meta.get("labels", {}):
            continue
        for tag, source, key in EXTRACT:
            value = meta.get(source, {}).get(key)
            if value is not None:
                statements.append(
                    f"set({_attr(tag)}, {_ottl(value)}) "
                    f"where {_attr('k8s.pod.uid')} == {_ottl(uid)}"
                )
    return {
        "error_mode": "propagate",
        "log_statements": [{"context": "resource", "statements": statements}],
    }


def collector_config(
    bucket: str,
    region: str,
    endpoint: str | None = None,
    *,
    include: Sequence[str] = (PODS_LOG_GLOB,),
    storage_dir: str = CHECKPOINT_DIR,
    teams: Sequence[str] | None = None,
    health_endpoint: str = "${env:MY_POD_IP}:13133",
    metrics_host: str | None = "${env:MY_POD_IP}",
    kube_auth: str = "serviceAccount",
    node_from_env_var: str | None = "K8S_NODE_NAME",
    batch_timeout: str = "10s",
    file_export_path: str | None = None,
    static_pods: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
) -> dict[str, Any]:
    """The collector's configuration (otelcol's YAML as data), with canonical component names.

    `endpoint` (with path-style addressing) is for S3-compatible stores: MinIO, moto. `teams`,
    when given, ships only pods of those namespaces. `include`, `storage_dir`, the endpoints,
    `kube_auth` and `node_from_env_var` are where a test runs it off a node;
    `file_export_path` adds a file exporter beside S3 (tests). `static_pods` is TEST ONLY: it
    replaces k8s_attributes (which needs an API server) by `static_pods_stand_in`.
    """
    processors: dict[str, Any] = {
        # Refuse data before the pod's memory runs out (the receiver then retries).
        "memory_limiter": {
            "check_interval": "1s",
            "limit_percentage": 80,
            "spike_limit_percentage": 25,
        },
        "transform/trainstack": {
            "error_mode": "propagate",
            "log_statements": [
                {
                    "context": "resource",
                    "statements": [
                        # A team's namespace is its name (config.model Team.namespace).
                        f"set({_attr(TEAM)}, {_attr('k8s.namespace.name')}) "
                        f"where {_attr(JOB)} != nil",
                        f"set({_attr(LOG_PREFIX)}, Concat([{_ottl(PREFIX_ROOT)}, "
                        f'{_attr(TEAM)}, {_attr(JOB)}], "/")) where {_attr(JOB)} != nil',
                    ],
                }
            ],
        },
        "filter/unattributed": {
            "error_mode": "propagate",
            "log_conditions": [f"resource.{_attr(JOB)} == nil"],
        },
        "batch": {"timeout": batch_timeout, "send_batch_size": 8192, "send_batch_max_size": 16384},
    }
    if teams is not None:
        allowed = " and ".join(f"resource.{_attr(TEAM)} != {_ottl(t)}" for t in sorted(teams))
        processors["filter/unattributed"]["log_conditions"].append(allowed or "true")
    if static_pods is not None:
        attributes = "transform/static_pods"
        processors[attributes] = static_pods_stand_in(static_pods)
    else:
        attributes = "k8s_attributes"
        processors[attributes] = k8s_attributes(kube_auth, node_from_env_var)

    uploader: dict[str, Any] = {
        "region": region,
        "s3_bucket": bucket,
        # Never used: every shipped record has a prefix (filter/unattributed drops the others).
        "s3_prefix": "logs/unattributed",
        "s3_partition_format": "year=%Y/month=%m/day=%d/hour=%H",
        "s3_partition_timezone": "UTC",
        "unique_key_func_name": "uuidv7",  # keys sort by upload time within an hour
        "compression": "gzip",
    }
    if endpoint is not None:
        uploader |= {"endpoint": endpoint, "s3_force_path_style": True}
    exporters: dict[str, Any] = {
        "awss3": {
            "s3uploader": uploader,
            "marshaler": "otlp_json",
            "resource_attrs_to_s3": {"s3_prefix": LOG_PREFIX},
            # On disk (the checkpoint hostPath), so a restart resends what S3 has not taken.
            # No batching in the queue: it would merge payloads of different prefixes.
            "sending_queue": {"storage": "file_storage", "batch": {"enabled": False}},
            "retry_on_failure": {"enabled": True, "max_elapsed_time": "1h"},
        }
    }
    if file_export_path is not None:
        exporters["file"] = {"path": file_export_path}

    metrics: dict[str, Any] = {"level": "none"}
    if metrics_host is not None:
        metrics = {
            "level": "normal",
            "readers": [
                {"pull": {"exporter": {"prometheus": {"host": metrics_host, "port": 8888}}}}
            ],
        }
    return {
        "extensions": {
            "health_check": {"endpoint": health_endpoint},
            "file_storage": {"directory": storage_dir, "create_directory": True},
        },
        "receivers": {
            "file_log": {
                "include": list(include),
                "exclude": [],
                # With checkpoints a restart resumes at its offsets; a new collector (a new
                # node, a first install) reads the files there from their start.
                "start_at": "beginning",
                "storage": "file_storage",
                "include_file_path": True,
                "include_file_name": False,
                # The receiver trims each line by default (pkg/stanza trim/trim.go): a CRI
                # partial line ending in a space would lose it when joined.
                "preserve_trailing_whitespaces": True,
                "retry_on_failure": {"enabled": True},
                "operators": _operators(),
            }
        },
        "processors": processors,
        "exporters": exporters,
        "service": {
            "extensions": ["health_check", "file_storage"],
            "telemetry": {"metrics": metrics},
            "pipelines": {
                "logs": {
                    "receivers": ["file_log"],
                    "processors": [
                        "memory_limiter",
                        attributes,
                        "transform/trainstack",
                        "filter/unattributed",
                        "batch",
                    ],
                    "exporters": sorted(exporters),
                }
            },
        },
    }


def _chart_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as the chart's `alternateConfig` wants it.

    The chart (0.170.0 templates/_config.tpl) merges its logsCollection preset's receiver under
    the key `filelog` with ours (ours wins, key by key; applyLogsCollectionConfig), then renames
    `filelog` to `file_log`, merging what it renames OVER an existing `file_log`
    (rewriteDeprecatedComponentNames). Under `file_log` ours would lose to the preset's
    `start_at: end` and `exclude`; under `filelog` it wins and comes out as `file_log`. The
    kubernetesAttributes preset already uses `k8s_attributes` and merges under ours
    (applyKubernetesAttributesConfig).
    """
    chart: dict[str, Any] = json.loads(json.dumps(config))
    chart["receivers"] = {"filelog": chart["receivers"].pop("file_log")}
    chart["service"]["pipelines"]["logs"]["receivers"] = ["filelog"]
    return chart


def collector_values(
    bucket: str,
    region: str,
    *,
    role_arn: str | None = None,
    endpoint: str | None = None,
    teams: Sequence[str] | None = None,
    credentials_secret: str | None = None,
) -> dict[str, Any]:
    """Values of the pinned chart: one collector per node (daemonset) with `collector_config`.

    Presets: logsCollection mounts /var/log/pods read-only and, with storeCheckpoints, the
    hostPath /var/lib/otelcol (DirectoryOrCreate) for the offsets and the export queue, and
    then runs the container as root (uid 0) so that it can write there; kubernetesAttributes
    adds the ClusterRole (get, list, watch pods, namespaces, replicasets) and K8S_NODE_NAME.
    `role_arn` annotates the ServiceAccount for IRSA (the role needs s3:PutObject on
    `arn:aws:s3:::<bucket>/logs/teams/*`). Tolerates the GPU taint and the health gate's, so
    it runs on every node a job can run on, from the node's first moment.
    """
    config = collector_config(bucket, region, endpoint, teams=teams)
    service_account: dict[str, Any] = {"create": True, "name": SERVICE_ACCOUNT}
    if role_arn is not None:
        service_account["annotations"] = {"eks.amazonaws.com/role-arn": role_arn}
    return {
        "mode": "daemonset",
        "image": {"repository": IMAGE_REPOSITORY, "tag": COLLECTOR_RELEASE},
        "command": {"name": COMMAND},
        "presets": {
            "logsCollection": {"enabled": True, "storeCheckpoints": True},
            "kubernetesAttributes": {"enabled": True},
        },
        "rewriteDeprecatedComponentNames": True,
        # Not merged with the chart's default `config` (its OTLP, Jaeger, Zipkin and
        # Prometheus receivers); presets still apply (templates/_config.tpl baseConfig).
        "alternateConfig": _chart_config(config),
        # Nothing is received over the network: no container or host ports.
        "ports": {
            name: {"enabled": False}
            for name in ("otlp", "otlp-http", "jaeger-compact", "jaeger-thrift", "jaeger-grpc")
        }
        | {"zipkin": {"enabled": False}, "metrics": {"enabled": True}},
        "serviceAccount": service_account,
        # An existing cluster's store: keys that may write logs/teams/ only, from a Secret in
        # the collector's namespace (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY: the AWS SDK's
        # environment credentials, which awss3exporter's default chain reads).
        **(
            {"extraEnvsFrom": [{"secretRef": {"name": credentials_secret}}]}
            if credentials_secret is not None
            else {}
        ),
        "tolerations": [dict(GPU_TOLERATION), dict(HEALTH_TOLERATION)],
        "priorityClassName": "system-node-critical",
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "512Mi"},  # the chart sets GOMEMLIMIT to 80 % of it
        },
    }


def collector_s3_policy(bucket: str, key_arn: str) -> dict[str, Any]:
    """The collector's role: write objects under every team's log prefix of the bucket and
    nothing else (no read, no list, no delete: a compromised collector cannot read any
    team's logs back or erase them), with the bucket key to encrypt them (SSE-KMS; a
    multipart upload also needs kms:Decrypt, S3 User Guide "Uploading and copying objects
    using multipart upload", permissions)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "WriteJobLogs",
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
                "Resource": f"arn:aws:s3:::{bucket}/{PREFIX_ROOT}/*",
            },
            {
                "Sid": "LogEncryption",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                "Resource": key_arn,
            },
        ],
    }
