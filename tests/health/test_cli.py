"""`trainstack-health`: the check command, `agent --once` as the e2e test calls it (with the
API replaced by the fake), the repair dispatch, and setup errors that name what to fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trainstack_health import cli, contract
from trainstack_health.errors import SetupError
from trainstack_health.expectations import parse

from tests.health.fakekube import FakeKube, node

FIXTURES = Path(__file__).parent / "fixtures"
EXPECT = str(FIXTURES / "expectations.json")
NAME = "ip-10-1-23-45.ec2.internal"


def test_check_prints_the_report_and_exits_0_when_it_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = cli.main(["check", "--expectations", EXPECT, "--pool", "gpu-p5",
                   "--probes-from", str(FIXTURES / "healthy"), "--active"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert report["passed"] is True
    assert [c["check"] for c in report["checks"]] == list(contract.CHECKS)


def test_check_exits_1_naming_the_failed_check(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["check", "--expectations", EXPECT, "--pool", "gpu-p5",
                   "--probes-from", str(FIXTURES / "xid-fatal")])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert (rc, report["failedCheck"], report["active"]) == (1, "xid", False)


@pytest.fixture
def credentials(tmp_path: Path) -> list[str]:
    (tmp_path / "token").write_text("t0k3n\n")
    (tmp_path / "ca.crt").write_text("unused by the fake\n")
    return ["--server", "https://127.0.0.1:6443", "--token-file", str(tmp_path / "token"),
            "--ca-file", str(tmp_path / "ca.crt")]  # fmt: skip


def test_agent_once_with_recorded_probes_removes_the_taint(
    monkeypatch: pytest.MonkeyPatch, credentials: list[str]
) -> None:
    """The call the e2e test makes, with the fake API in place of the real server."""
    kube = FakeKube(node(NAME, taints=[{"key": contract.TAINT_KEY, "value": "pending",
                                        "effect": "NoSchedule"}]))  # fmt: skip
    seen: list[Any] = []

    def fake_kube(access: Any) -> FakeKube:
        seen.append(access)
        return kube

    monkeypatch.setattr(cli, "Kube", fake_kube)
    rc = cli.main(["agent", "--once", "--node", NAME, *credentials, "--expectations", EXPECT,
                   "--probes-from", str(FIXTURES / "healthy")])  # fmt: skip
    assert rc == 0
    assert seen[0].server == "https://127.0.0.1:6443"
    assert kube.node["spec"]["taints"] == []
    assert kube.node["metadata"]["labels"][contract.STATE_LABEL] == "passed"


def test_agent_node_defaults_to_the_downward_api_env(
    monkeypatch: pytest.MonkeyPatch, credentials: list[str]
) -> None:
    monkeypatch.setenv(contract.NODE_NAME_ENV, NAME)
    kube = FakeKube(node(NAME, labels={contract.STATE_LABEL: "passed"}))
    monkeypatch.setattr(cli, "Kube", lambda _: kube)
    args = cli.build_parser().parse_args(["agent", "--once", *credentials])
    assert args.node == NAME


def test_agent_once_api_error_exits_1(
    monkeypatch: pytest.MonkeyPatch, credentials: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from trainstack_health.kube import ApiError  # noqa: PLC0415

    class Down(FakeKube):
        def get_node(self, name: str) -> dict[str, Any]:
            raise ApiError("GET", f"/api/v1/nodes/{name}", 0, "Unreachable", "refused")

    monkeypatch.setattr(cli, "Kube", lambda _: Down(node(NAME)))
    rc = cli.main(["agent", "--once", "--node", NAME, *credentials, "--expectations", EXPECT,
                   "--probes-from", str(FIXTURES / "healthy")])  # fmt: skip
    assert rc == 1
    assert "step_failed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["agent", "--once", "--expectations", EXPECT], "no node: pass --node or set $NODE_NAME"),
        (["agent", "--once", "--node", NAME, "--expectations", EXPECT, "--server", "https://x"],
         "--server needs --token-file and --ca-file"),
        (["agent", "--once", "--node", NAME, "--expectations", "/nonexistent.json"],
         "cannot read expectations /nonexistent.json"),
        (["agent", "--once", "--node", NAME, "--expectations", EXPECT, "--probes-from",
          "/nonexistent"], "--probes-from /nonexistent: not a directory"),
        (["agent", "--once", "--node", NAME, "--expectations", EXPECT],
         "not in a pod (KUBERNETES_SERVICE_HOST/PORT unset)"),
        (["check", "--expectations", EXPECT, "--pool", "cpu"], "no pool 'cpu'"),
    ],
)  # fmt: skip
def test_setup_errors_exit_2_and_say_what_to_fix(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.delenv(contract.NODE_NAME_ENV, raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["agent", "--interval", "0"]) == 2
    assert cli.main([]) == 2
    assert "must be > 0" in capsys.readouterr().err


def test_repair_is_dispatched_with_its_own_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainstack_health.repair.cli as repair_cli  # noqa: PLC0415

    got: list[list[str]] = []
    monkeypatch.setattr(repair_cli, "main", lambda argv: got.append(argv) or 7)
    assert cli.main(["repair", "--once", "--expectations", EXPECT]) == 7
    assert got == [["--once", "--expectations", EXPECT]]


# --- expectations.json ---------------------------------------------------------------------

GOOD = {"gpus": 8, "gpuModel": "H100", "efaDevices": 32, "ibPorts": 0, "ibRateGbps": None,
        "busbwFloorGBps": 400.0, "dcgmLevel": 2, "instanceType": "p5.48xlarge"}  # fmt: skip


def doc(**pool: Any) -> str:
    return json.dumps({"pools": {"p": {**GOOD, **pool}}, "recheckSeconds": 3600})


def test_expectations_parse_the_contract_format() -> None:
    exp = parse(doc(), "e.json")
    p = exp.for_pool("p")
    assert (p.gpus, p.gpu_model, p.efa_devices, p.busbw_floor_gbps, p.dcgm_level) == (
        8, "H100", 32, 400.0, 2)  # fmt: skip
    assert exp.recheck_seconds == 3600


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "e.json: not JSON"),
        ("[]", "e.json: must be a JSON object"),
        ('{"pools": []}', "e.json: field 'pools' must be an object"),
        (doc(gpus=None), "e.json: pools.p: field 'gpus' must be int, got None"),
        (doc(gpus=0), "e.json: pools.p: field 'gpus' must be >= 1"),
        (doc(gpus=True), "field 'gpus' must be int, got True"),
        (doc(gpuModel=3), "pools.p: field 'gpuModel' must be str"),
        (doc(efaDevices=-1), "pools.p: field 'efaDevices' must be >= 0"),
        (doc(busbwFloorGBps="fast"), "pools.p: field 'busbwFloorGBps' must be int/float"),
        (doc(busbwFloorGBps=0), "field 'busbwFloorGBps' must be > 0 or null"),
        (doc(ibRateGbps=0), "field 'ibRateGbps' must be > 0 or null"),
        (doc(dcgmLevel=5), "field 'dcgmLevel' must be 1 to 4"),
        (json.dumps({"pools": {"p": "x"}}), "pools.p: must be an object"),
        (json.dumps({"pools": {"p": {}}}), "pools.p: missing field 'gpus'"),
        (json.dumps({"pools": {}, "recheckSeconds": 5}), "field 'recheckSeconds' must be >= 60"),
    ],
)
def test_malformed_expectations_name_file_and_field(text: str, message: str) -> None:
    with pytest.raises(SetupError, match=None) as err:
        parse(text, "e.json")
    assert message in err.value.message


def test_node_without_pool_label_is_a_setup_error() -> None:
    with pytest.raises(SetupError, match=r"no trainstack\.io/pool label"):
        parse(doc(), "e.json").for_pool(None)
