"""The runtime's MLflow model registry client (trainstack_runtime/registry.py) against a real
MLflow tracking server, and its retries and credentials against a small recording server.

The MLflow server is the one pinned in mlflow-constraints.txt, which `make mlflow-server`
installs (`make test` does it first) into its own venv at TRAINSTACK_MLFLOW_HOME
(~/.cache/trainstack/mlflow-<version>): mlflow is not in .venv, and the runtime needs none.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from trainstack_runtime.registry import (
    MAX_TAG_VALUE_LENGTH,
    ModelVersion,
    RegistryError,
    register_model,
)

CONSTRAINTS = Path(__file__).with_name("mlflow-constraints.txt")
SOURCE = "s3://trainstack-artifacts/teams/vision/resnet-demo/final/model"


def pinned_version() -> str:
    """The MLflow version the Makefile installs: the constraints file's mlflow-skinny line."""
    for line in CONSTRAINTS.read_text().splitlines():
        if line.startswith("mlflow-skinny=="):
            return line.removeprefix("mlflow-skinny==").strip()
    raise AssertionError(f"{CONSTRAINTS} pins no mlflow-skinny version")


def mlflow_home() -> Path:
    """Where `make mlflow-server` installs it (the Makefile exports TRAINSTACK_MLFLOW_HOME)."""
    default = Path.home() / ".cache" / "trainstack" / f"mlflow-{pinned_version()}"
    return Path(os.environ.get("TRAINSTACK_MLFLOW_HOME") or default)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(autouse=True)
def no_mlflow_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` on a free loopback port, SQLite backend; its URL."""
    exe = mlflow_home() / "bin" / "mlflow"
    if not exe.is_file():
        pytest.skip(
            f"mlflow {pinned_version()} is not installed at {exe.parent.parent}: "
            "`make mlflow-server` installs it (`make test` does it first)"
        )
    tmp = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env |= {
        # Nothing phones home: mlflow/telemetry/utils.py, is_telemetry_disabled.
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        # No background job runner (huey, not installed; mlflow/server/__init__.py).
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            str(exe),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp}/mlflow.db",
            "--default-artifact-root",
            str(tmp / "artifacts"),
        ],
        cwd=tmp,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its uvicorn worker too is stopped with the group
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (tmp / "server.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"mlflow server did not come up (exit {proc.poll()}):\n{tail}")
            time.sleep(0.25)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


def rest(url: str, endpoint: str, **query: str) -> dict[str, Any]:
    """GET an MLflow REST endpoint, independently of the client under test."""
    full = f"{url}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(full, timeout=10) as response:
        answer: dict[str, Any] = json.load(response)
        return answer


def report_tags(**overrides: str) -> dict[str, str]:
    """The tags a finished job's report gives its model."""
    tags = {
        "trainstack.io/job": "resnet-demo",
        "trainstack.io/team": "vision",
        "trainstack.io/image-digest": "sha256:" + "ab" * 32,
        "trainstack.io/data-version": "imagenet-2024-10-01",
        "trainstack.io/steps": "120000",
        "trainstack.io/gpu-hours": "311.25",
        "trainstack.io/attempts": "3",
        "trainstack.io/exit-class": "ok",
        "trainstack.io/checkpoint": "s3://trainstack-ckpt/teams/vision/resnet-demo/step-000120000/",
        "trainstack.io/final-metrics": json.dumps({"loss": 0.8123, "top1": 0.7641, "top5": 0.93}),
    }
    return tags | overrides


# -- a real MLflow server -----------------------------------------------------------------------


def test_registers_a_model_with_its_report_as_tags(mlflow_server: str) -> None:
    tags = report_tags()
    got = register_model(mlflow_server, "vision-resnet", SOURCE, tags, "resnet-demo, final")
    assert got == ModelVersion("vision-resnet", "1", SOURCE, "READY")

    model = rest(mlflow_server, "registered-models/get", name="vision-resnet")
    assert model["registered_model"]["name"] == "vision-resnet"
    version = rest(mlflow_server, "model-versions/get", name="vision-resnet", version="1")
    mv = version["model_version"]
    assert (mv["name"], mv["version"], mv["source"], mv["status"]) == (
        "vision-resnet",
        "1",
        SOURCE,
        "READY",
    )
    assert mv["description"] == "resnet-demo, final"
    assert {t["key"]: t["value"] for t in mv["tags"]} == tags
    assert json.loads(tags["trainstack.io/final-metrics"])["top1"] == 0.7641

    found = rest(mlflow_server, "model-versions/search", filter="name='vision-resnet'")
    assert [(v["version"], v["source"]) for v in found["model_versions"]] == [("1", SOURCE)]


def test_a_second_registration_is_version_2_of_the_same_model(mlflow_server: str) -> None:
    first = register_model(mlflow_server, "vision-twice", SOURCE, report_tags())
    second_source = SOURCE.replace("final", "final-2")
    second = register_model(
        mlflow_server, "vision-twice", second_source, report_tags(**{"trainstack.io/steps": "9"})
    )
    assert (first.version, second.version) == ("1", "2")
    assert second.source == second_source
    v2 = rest(mlflow_server, "model-versions/get", name="vision-twice", version="2")
    assert {t["key"]: t["value"] for t in v2["model_version"]["tags"]}["trainstack.io/steps"] == "9"
    found = rest(mlflow_server, "model-versions/search", filter="name='vision-twice'")
    assert sorted(v["version"] for v in found["model_versions"]) == ["1", "2"]


def test_mlflow_refusal_carries_its_error_code(mlflow_server: str) -> None:
    """A model name with '/' (mlflow/utils/validation.py, _validate_model_name): a 400 with
    INVALID_PARAMETER_VALUE, raised at once."""
    with pytest.raises(RegistryError) as caught:
        register_model(mlflow_server, "vision/resnet", SOURCE, report_tags())
    err = caught.value
    assert (err.status, err.error_code, err.endpoint) == (
        400,
        "INVALID_PARAMETER_VALUE",
        "registered-models/create",
    )
    message = str(err)
    assert message.startswith(f"MLflow at {mlflow_server}: POST registered-models/create: ")
    assert "INVALID_PARAMETER_VALUE: Invalid model name 'vision/resnet'" in message
    assert "attempt" not in message  # not retried


def test_a_local_source_needs_a_run(mlflow_server: str) -> None:
    """MLflow refuses a file: source without the run whose artifacts hold it
    (mlflow/server/handlers.py, _validate_source_run)."""
    with pytest.raises(RegistryError) as caught:
        register_model(mlflow_server, "vision-local", "file:///models/final", report_tags())
    assert caught.value.endpoint == "model-versions/create"
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    assert "run_id request parameter has to be specified" in str(caught.value)


def test_a_tag_over_the_limit_fails_before_any_request(mlflow_server: str) -> None:
    longest = "x" * MAX_TAG_VALUE_LENGTH
    tags = report_tags(**{"trainstack.io/notes": longest})
    assert register_model(mlflow_server, "vision-long", SOURCE, tags).version == "1"
    stored = rest(mlflow_server, "model-versions/get", name="vision-long", version="1")
    assert {t["key"]: t["value"] for t in stored["model_version"]["tags"]} == tags  # intact

    too_long = report_tags(**{"trainstack.io/notes": longest + "x"})
    with pytest.raises(RegistryError) as caught:
        register_model(mlflow_server, "vision-too-long", SOURCE, too_long)
    assert str(caught.value) == (
        f"MLflow at {mlflow_server}: tag 'trainstack.io/notes': the value has 5001 characters, "
        "more than the 5000 every MLflow server stores (registry.py explains the limit); "
        "nothing was registered"
    )
    with pytest.raises(urllib.error.HTTPError) as missing:
        rest(mlflow_server, "registered-models/get", name="vision-too-long")
    assert json.load(missing.value)["error_code"] == "RESOURCE_DOES_NOT_EXIST"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("k" * 251, "the key has 251 characters, MLflow takes at most 250"),
        ("metrics{top1}", "MLflow takes keys of letters"),
        ("trainstack.io//job", "normalized relative path"),
        ("/job", "normalized relative path"),
        ("", "normalized relative path"),
    ],
)
def test_tag_keys_mlflow_refuses(key: str, problem: str) -> None:
    with pytest.raises(RegistryError, match=problem):
        register_model("http://127.0.0.1:9", "m", SOURCE, {key: "v"})  # no request is made


# -- retries and credentials, against a recording server ---------------------------------------


@dataclass
class Recorder:
    """A loopback HTTP server answering each endpoint from a script; records every request."""

    # endpoint (after /api/2.0/mlflow/) -> answers in turn, the last repeated: (status, body)
    script: dict[str, list[tuple[int, dict[str, Any]]]]
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""

    def endpoints(self) -> list[str]:
        return [path for _, path, _ in self.requests]


READY = {"model_version": {"name": "m", "version": "1", "source": SOURCE, "status": "READY"}}


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder(script={})

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            path = urllib.parse.urlsplit(self.path).path.removeprefix("/api/2.0/mlflow/")
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            rec.requests.append((self.command, path, dict(self.headers)))
            answers = rec.script.get(path) or [(404, {"error_code": "ENDPOINT_NOT_FOUND"})]
            status, body = answers.pop(0) if len(answers) > 1 else answers[0]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def ok_script() -> dict[str, list[tuple[int, dict[str, Any]]]]:
    return {
        "registered-models/create": [(200, {"registered_model": {"name": "m"}})],
        "model-versions/create": [(200, READY)],
    }


def test_basic_auth_from_the_environment(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder.script = ok_script()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "vision-bot")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cr:t")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "ignored-when-basic-is-set")
    assert register_model(recorder.url, "m", SOURCE, {"a": "b"}).status == "READY"
    expected = "Basic " + base64.b64encode(b"vision-bot:s3cr:t").decode()
    assert [h.get("Authorization") for _, _, h in recorder.requests] == [expected] * 2


def test_bearer_token_from_the_environment(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder.script = ok_script()
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-123")
    register_model(recorder.url, "m", SOURCE, {})
    assert [h.get("Authorization") for _, _, h in recorder.requests] == ["Bearer tok-123"] * 2


def test_no_credentials_no_header(recorder: Recorder) -> None:
    recorder.script = ok_script()
    register_model(recorder.url, "m", SOURCE, {})
    assert all("Authorization" not in h for _, _, h in recorder.requests)


def test_an_existing_model_is_not_an_error(recorder: Recorder) -> None:
    recorder.script = ok_script()
    recorder.script["registered-models/create"] = [
        (400, {"error_code": "RESOURCE_ALREADY_EXISTS", "message": "exists"})
    ]
    assert register_model(recorder.url, "m", SOURCE, {}).version == "1"


def test_5xx_and_429_are_retried_with_bounds(recorder: Recorder) -> None:
    recorder.script = ok_script()
    recorder.script["registered-models/create"] = [
        (503, {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy"}),
        (429, {"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "slow down"}),
        (200, {"registered_model": {"name": "m"}}),
    ]
    assert register_model(recorder.url, "m", SOURCE, {}).version == "1"
    assert recorder.endpoints() == ["registered-models/create"] * 3 + ["model-versions/create"]

    recorder.requests.clear()
    recorder.script["registered-models/create"] = [(500, {"error_code": "INTERNAL_ERROR"})]
    with pytest.raises(RegistryError) as caught:
        register_model(recorder.url, "m", SOURCE, {}, retries=2)
    assert recorder.endpoints() == ["registered-models/create"] * 3
    assert str(caught.value) == (
        f"MLflow at {recorder.url}: POST registered-models/create: INTERNAL_ERROR (HTTP 500) "
        "(gave up after 3 attempts)"
    )


def test_4xx_is_not_retried(recorder: Recorder) -> None:
    recorder.script = ok_script()
    recorder.script["model-versions/create"] = [
        (404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such model"})
    ]
    with pytest.raises(RegistryError) as caught:
        register_model(recorder.url, "m", SOURCE, {})
    assert recorder.endpoints() == ["registered-models/create", "model-versions/create"]
    assert caught.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    assert "model-versions/create: RESOURCE_DOES_NOT_EXIST: no such model (HTTP 404)" in str(
        caught.value
    )


def test_a_version_is_not_created_twice(recorder: Recorder) -> None:
    """A 5xx after model-versions/create may come after the version was committed: not
    repeated (a repeat is a second version); a 429 says it was not processed: repeated."""
    recorder.script = ok_script()
    recorder.script["model-versions/create"] = [(503, {"error_code": "TEMPORARILY_UNAVAILABLE"})]
    with pytest.raises(RegistryError, match="TEMPORARILY_UNAVAILABLE"):
        register_model(recorder.url, "m", SOURCE, {})
    assert recorder.endpoints().count("model-versions/create") == 1

    recorder.requests.clear()
    recorder.script["model-versions/create"] = [(429, {}), (200, READY)]
    assert register_model(recorder.url, "m", SOURCE, {}).version == "1"
    assert recorder.endpoints().count("model-versions/create") == 2


def test_waits_for_a_pending_version(recorder: Recorder) -> None:
    pending = {"model_version": {**READY["model_version"], "status": "PENDING_REGISTRATION"}}
    recorder.script = ok_script()
    recorder.script["model-versions/create"] = [(200, pending)]
    recorder.script["model-versions/get"] = [(200, pending), (200, READY)]
    assert register_model(recorder.url, "m", SOURCE, {}).status == "READY"
    assert recorder.endpoints()[-2:] == ["model-versions/get"] * 2

    failed = {"model_version": {**pending["model_version"], "status": "FAILED_REGISTRATION"}}
    failed["model_version"]["status_message"] = "copy of the artifacts failed"
    recorder.script["model-versions/get"] = [(200, failed)]
    with pytest.raises(RegistryError, match="FAILED_REGISTRATION: copy of the artifacts failed"):
        register_model(recorder.url, "m", SOURCE, {})

    recorder.script["model-versions/get"] = [(200, pending)]
    with pytest.raises(RegistryError, match="version 1 still PENDING_REGISTRATION after 2 s"):
        register_model(recorder.url, "m", SOURCE, {}, timeout_s=2)


def test_an_unreachable_server_fails_after_bounded_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there any more
    start = time.monotonic()
    with pytest.raises(RegistryError) as caught:
        register_model(url, "m", SOURCE, report_tags(), retries=2)
    elapsed = time.monotonic() - start
    message = str(caught.value)
    assert message.startswith(f"MLflow at {url}: POST registered-models/create: cannot connect: ")
    assert "Connection refused" in message
    assert message.endswith("(gave up after 3 attempts)")
    assert 1.4 < elapsed < 10  # backoff 0.5 + 1 s


def test_credentials_in_the_uri_stay_out_of_messages() -> None:
    with pytest.raises(RegistryError) as caught:
        register_model(f"http://bot:pw@127.0.0.1:{free_port()}/", "m", SOURCE, {}, retries=0)
    assert "pw" not in str(caught.value)
    assert caught.value.server.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("uri", ["databricks", "file:///tmp/mlruns", "sqlite:///x.db", "http://"])
def test_not_a_tracking_server_url(uri: str) -> None:
    with pytest.raises(RegistryError, match="an http\\(s\\):// URL of a tracking server"):
        register_model(uri, "m", SOURCE, {})
