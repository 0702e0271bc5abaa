"""`trainstack-health repair` as the e2e test and the Deployment run it: `main([...])` against
a fake API server over TLS (the requests it makes, their paths, verbs, content types and
bodies), and its setup errors (exit 2, a message on stderr)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from trainstack_health import contract
from trainstack_health.repair import decide
from trainstack_health.repair.cli import main

from tests.health.test_repair_decide import REPAIR, node_obj, pod
from tests.health.test_repair_http import make_tls, server


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    ca, cert, key = make_tls(tmp_path)
    token = tmp_path / "token"
    token.write_text("sekret\n")
    expectations = tmp_path / "expectations.json"
    repair = {**REPAIR, "mode": "none", "region": None, "prometheusUrl": None}
    expectations.write_text(json.dumps({"pools": {}, "recheckSeconds": 3600, "repair": repair}))
    return {"ca": ca, "cert": cert, "key": key, "token": token, "expectations": expectations}


class FakeApiServer:
    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.pods = pods
        self.requests: list[tuple[str, str, str | None, Any]] = []

    def handle(self, h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(h.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        assert h.headers["Authorization"] == "Bearer sekret"
        doc = json.loads(body) if body else None
        self.requests.append((h.command, parts.path, h.headers.get("Content-Type"), doc))
        items: list[dict[str, Any]] | None = None
        if (h.command, parts.path) == ("GET", "/api/v1/nodes"):
            key, _, value = query["labelSelector"].partition("=")
            items = [n for n in self.nodes
                     if key in n["metadata"]["labels"]
                     and (not value or n["metadata"]["labels"][key] == value)]  # fmt: skip
        elif (h.command, parts.path) == ("GET", "/api/v1/pods"):
            name = query["fieldSelector"].removeprefix("spec.nodeName=")
            items = [p for p in self.pods if p["spec"]["nodeName"] == name]
        if items is not None:
            answer: dict[str, Any] = {"kind": "List", "metadata": {}, "items": items}
            return 200, {"Content-Type": "application/json"}, json.dumps(answer).encode()
        return 201, {"Content-Type": "application/json"}, json.dumps(doc or {}).encode()


def argv(url: str, files: dict[str, Path]) -> list[str]:
    return [
        "--once",
        "--server",
        url,
        "--token-file",
        str(files["token"]),
        "--ca-file",
        str(files["ca"]),
        "--expectations",
        str(files["expectations"]),
    ]


def test_once_drains_a_failed_node_through_the_api(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApiServer([node_obj("gpu-1"), node_obj("gpu-2", state="passed")],
                        [pod("trainer-0"), pod("agent", daemonset=True)])  # fmt: skip
    with server(api.handle, (files["cert"], files["key"])) as url:
        assert main(argv(url, files)) == 0
    writes = [(m, p, c) for m, p, c, _ in api.requests if m != "GET"]
    assert writes == [
        ("PATCH", "/api/v1/nodes/gpu-1", "application/merge-patch+json"),
        ("POST", "/api/v1/namespaces/team-a/pods/trainer-0/eviction", "application/json"),
        ("POST", "/api/v1/namespaces/default/events", "application/json"),
    ]
    patch = next(d for m, _, _, d in api.requests if m == "PATCH")
    assert patch["metadata"]["labels"] == {contract.REPAIR_LABEL: "drained"}
    assert (
        decide.parse_drained_at(patch["metadata"]["annotations"][contract.DRAINED_AT_ANNOTATION])
        is not None
    )
    eviction = api.requests[[r[1] for r in api.requests].index(
        "/api/v1/namespaces/team-a/pods/trainer-0/eviction")][3]  # fmt: skip
    assert eviction == {"apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": "trainer-0", "namespace": "team-a"}}  # fmt: skip
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[-1]["event"] == "pass"
    assert lines[-1]["steps"] == {"gpu-1": "drain"}


def test_once_with_nothing_to_do(files: dict[str, Path]) -> None:
    api = FakeApiServer([node_obj("gpu-1", state="passed")], [])
    with server(api.handle, (files["cert"], files["key"])) as url:
        assert main(argv(url, files)) == 0
    assert [m for m, *_ in api.requests] == ["GET", "GET"]  # failed nodes, repair progress


def test_once_unreachable_api_server_exits_1(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with server(lambda _h, _b: (200, {}, b"{}"), (files["cert"], files["key"])) as url:
        dead = url
    assert main(argv(dead, files)) == 1
    assert '"event": "pass-failed"' in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a, _f: a[:a.index("--token-file")] + a[a.index("--ca-file"):],
         "--server needs --token-file and --ca-file"),
        (lambda _a, f: ["--once", "--token-file", str(f["token"]), "--expectations",
                       str(f["expectations"])], "--token-file and --ca-file need --server"),
        (lambda a, f: [*a[:-1], str(f["token"].parent / "absent.json")], "no expectations"),
        (lambda a, f: [*a[:a.index("--ca-file") + 1], str(f["token"].parent / "no-ca.pem"),
                       *a[a.index("--ca-file") + 2:]], "CA bundle"),
    ],
)  # fmt: skip
def test_setup_errors_exit_2(
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    change: Any,
    message: str,
) -> None:
    args = change(argv("https://127.0.0.1:1", files), files)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainstack-health repair: ")
    assert message in err


def test_not_in_a_pod_exits_2(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["--once", "--expectations", str(files["expectations"])]) == 2
    assert "not in a pod" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--interval", "0"], ["--metrics-port", "70000"], ["--what"]])
def test_bad_flags_exit_2(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(bad) == 2
    assert "usage:" in capsys.readouterr().err
