"""`Kube.from_kubeconfig` (trainstack/kube.py): the kubeconfig parts `explain`, `status` and the
sandbox rely on, each against a real HTTPS server on loopback that records what it was sent.

The server's certificate comes from the sandbox's own PKI (trainstack/sandbox/pki.py), so the
client verifies it exactly as it verifies the sandbox's API server. What kubectl would do is
the reference: the current context unless one is named, the first file of $KUBECONFIG, paths
relative to the kubeconfig's folder, `*-data` inline, and an exec plugin's ExecCredential
`status.token` as a bearer token (client-go credential plugins, kubernetes.io/docs/reference/
access-authn-authz/authentication/#client-go-credential-plugins).
"""

from __future__ import annotations

import base64
import json
import ssl
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from trainstack.kube import Kube, KubeconfigError
from trainstack.sandbox import pki

VOLCANO_JOBS = {"resources": [{"name": "jobs", "kind": "Job", "namespaced": True}]}
# What the API server answers when a ValidatingAdmissionPolicy denies a request (its Status).
DENIED = (
    'jobs.batch.volcano.sh "demo-train" is forbidden: ValidatingAdmissionPolicy '
    "'trainstack-images' with binding 'trainstack-images' denied request: image not allowed"
)


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]]
    created: list[dict[str, Any]]

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        if self.path == "/apis/batch.volcano.sh/v1alpha1":
            self._answer(200, VOLCANO_JOBS)
        else:
            self._answer(200, {"kind": "APIVersions", "versions": ["v1"]})

    def do_POST(self) -> None:
        """Creates the first object it is sent; refuses the next as admission would."""
        obj = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not type(self).created:
            type(self).created.append({"path": self.path, "object": obj})
            self._answer(201, obj)
        else:
            self._answer(403, {"kind": "Status", "reason": "Forbidden", "message": DENIED})

    def log_message(self, *args: Any) -> None:
        del args


@dataclass
class Server:
    url: str
    ca: pki.Authority
    seen: list[dict[str, str]]  # each request's headers
    created: list[dict[str, Any]]  # each object created: its path and body


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    ca = pki.Authority(tmp_path_factory.mktemp("pki"))
    serving = ca.issue("server", "127.0.0.1", server=True)
    seen: list[dict[str, str]] = []
    created: list[dict[str, Any]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen, "created": created})
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(serving.cert), str(serving.key))
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield Server(f"https://127.0.0.1:{httpd.server_address[1]}", ca, seen, created)
    httpd.shutdown()


def _config(server: str, user: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **extra}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "other", "context": {"cluster": "missing", "user": "u"}},
            {"name": "mine", "context": {"cluster": "c", "user": "u"}},
        ],
        "current-context": "mine",
    }


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_a_bearer_token_and_a_ca_file_relative_to_the_kubeconfig(
    server: Server, tmp_path: Path
) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_bytes(server.ca.cert.read_bytes())
    config = _config(server.url, {"token": "s3cret"}, **{"certificate-authority": "certs/ca.pem"})
    client = Kube.from_kubeconfig(_write(tmp_path / "config", config))
    before = len(server.seen)
    assert client.request("GET", "/api")["kind"] == "APIVersions"
    assert server.seen[before]["Authorization"] == "Bearer s3cret"


def test_inline_ca_data_and_the_exec_plugin_token_is_sent(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin, runs = tmp_path / "plugin.py", tmp_path / "runs"
    plugin.write_text(
        "import json, os\n"
        "open(os.environ['RUNS'], 'a').write('run\\n')\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
        "'kind': 'ExecCredential', 'status': {'token': 'from-' + os.environ['WHO'], "
        "'expirationTimestamp': '2999-01-01T00:00:00Z'}}))\n",
        encoding="utf-8",
    )
    exec_spec = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(plugin)],
        "env": [{"name": "WHO", "value": "plugin"}, {"name": "RUNS", "value": str(runs)}],
    }
    data = base64.b64encode(server.ca.cert.read_bytes()).decode()
    config = _config(server.url, {"exec": exec_spec}, **{"certificate-authority-data": data})
    monkeypatch.setenv("KUBECONFIG", f"{_write(tmp_path / 'kc', config)}:{tmp_path / 'none'}")
    client = Kube.from_kubeconfig()  # $KUBECONFIG's first file, as kubectl reads it
    before = len(server.seen)
    client.request("GET", "/api")
    client.request("GET", "/api")  # the token until its expirationTimestamp: one plugin run
    assert [h.get("Authorization") for h in server.seen[before:]] == ["Bearer from-plugin"] * 2
    assert runs.read_text().splitlines() == ["run"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("current-context"), "no current-context; pass --context"),
        (lambda c: c.update({"current-context": "other"}), "no cluster named 'missing'"),
        (lambda c: c["users"][0].update({"user": {}}), "no client certificate, token or exec"),
        (
            lambda c: c["clusters"][0]["cluster"].update({"insecure-skip-tls-verify": True}),
            "skips TLS verification",
        ),
        (
            lambda c: c["users"][0].update({"user": {"exec": {"command": "/nonexistent/plug"}}}),
            "'/nonexistent/plug' could not run",
        ),
    ],
)
def test_kubeconfigs_it_cannot_use_say_what_to_fix(
    server: Server, tmp_path: Path, mutate: Any, message: str
) -> None:
    config = _config(server.url, {"token": "t"}, **{"certificate-authority": str(server.ca.cert)})
    mutate(config)
    path = _write(tmp_path / "config", config)
    with pytest.raises(KubeconfigError, match=message) as caught:
        Kube.from_kubeconfig(path).request("GET", "/api")
    assert str(path) in str(caught.value)


def test_a_missing_kubeconfig_names_the_ways_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="aws eks update-kubeconfig") as caught:
        Kube.from_kubeconfig(tmp_path / "absent")
    assert "trainstack sandbox up" in str(caught.value)


# -- `trainstack render-job --submit`: the job created through this client -------------------


def test_render_job_submit_creates_the_rendered_job_and_relays_a_refusal(
    server: Server, tmp_path: Path
) -> None:
    """The Job the preview renders is what the server receives, in the team's namespace; a
    refusal prints the server's message (admission names its policy) as one clean error."""
    from typer.testing import CliRunner  # noqa: PLC0415  (the CLI only here)

    from trainstack.cli import app  # noqa: PLC0415
    from trainstack.config.project import Project  # noqa: PLC0415
    from trainstack.preview.engine import Previewer  # noqa: PLC0415

    config = _config(server.url, {"token": "t"}, **{"certificate-authority": str(server.ca.cert)})
    kubeconfig = _write(tmp_path / "config", config)
    spec = ROOT / "job_specs" / "vision" / "demo-train.yaml"
    argv = [
        "render-job",
        str(spec),
        "--stack",
        "vision",
        "--submit",
        "--kubeconfig",
        str(kubeconfig),
    ]
    argv += ["--project-dir", str(ROOT)]
    first = CliRunner().invoke(app, argv)
    assert first.exit_code == 0, first.output
    assert first.output.strip().endswith("created job vision/demo-train")
    expected = Previewer(Project.find(ROOT)).render_job("vision", spec)
    assert server.created == [
        {
            "path": "/apis/batch.volcano.sh/v1alpha1/namespaces/vision/jobs?fieldValidation=Strict",
            "object": json.loads(json.dumps(expected)),
        }
    ]
    second = CliRunner().invoke(app, argv)
    assert second.exit_code == 1
    assert f"error: the cluster refused job vision/demo-train: {DENIED}" in " ".join(
        second.output.split()
    )
    assert "Traceback" not in second.output


def test_render_job_submit_without_a_kubeconfig_says_how_to_get_one(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from trainstack.cli import app  # noqa: PLC0415

    spec = ROOT / "job_specs" / "vision" / "demo-train.yaml"
    argv = ["render-job", str(spec), "--stack", "vision", "--submit"]
    result = CliRunner().invoke(
        app, [*argv, "--kubeconfig", str(tmp_path / "none"), "--project-dir", str(ROOT)]
    )
    assert result.exit_code == 1
    assert "no kubeconfig there" in result.output
    assert "Traceback" not in result.output


def test_render_job_submit_to_an_unreachable_server_is_one_message(tmp_path: Path) -> None:
    """urllib3 raises its own errors, not OSError, for a refused connection: the client turns
    them into one (Unreachable), so every command that talks to a cluster reports it cleanly."""
    from typer.testing import CliRunner  # noqa: PLC0415

    from trainstack.cli import app  # noqa: PLC0415

    config = _config("https://127.0.0.1:1", {"token": "t"})  # nothing listens on port 1
    kubeconfig = _write(tmp_path / "config", config)
    spec = ROOT / "job_specs" / "vision" / "demo-train.yaml"
    argv = ["render-job", str(spec), "--stack", "vision", "--submit"]
    argv += ["--kubeconfig", str(kubeconfig), "--project-dir", str(ROOT)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 1, result.output
    assert " ".join(result.output.split()).startswith(
        "error: cannot reach the cluster of the kubeconfig: no answer from https://127.0.0.1:1 ("
    ), result.output
    assert "Traceback" not in result.output
