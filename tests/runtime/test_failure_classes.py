"""Failure classes from the node's evidence, and a retry-limited crash class (issue 22 #6).

Before: SIGSEGV/SIGBUS and illegal memory access were ``hardware`` (retry elsewhere, cordon)
though mostly software or a full /dev/shm; an ECC error caught by the NCCL watchdog arrived as
SIGABRT and became ``comm_error``. Now the node's DCGM evidence (evidence.py,
``TRAINSTACK_GPU_EVIDENCE``) decides hardware, and a crash is retried at most
``TRAINSTACK_MAX_CRASHES`` times without a new checkpoint (crashes.py).
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from trainstack_runtime.contract import (
    CRITICAL_XIDS,
    ENV_GPU_EVIDENCE,
    FATAL,
    RETRYABLE,
    ExitCode,
)
from trainstack_runtime.crashes import record_crash
from trainstack_runtime.evidence import GpuHealth, hardware_evidence, parse, read, visible_gpus

from tests.runtime.harness import HAVE_TORCH, RunJob

U0, U1 = "GPU-0b1c", "GPU-9f2e"


def exporter_text(xid: int = 0, dbe: int = 0, remap: int = 0, uuid: str = U0) -> str:
    """What dcgm-exporter serves for one GPU (its default labels)."""
    labels = f'gpu="0",UUID="{uuid}",device="nvidia0",modelName="NVIDIA H100",Hostname="n1"'
    return (
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
        f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}\n"
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{labels}}} {dbe}\n"
        f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{labels}}} {remap}\n"
        f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 97\n"
    )


@pytest.mark.parametrize(
    ("before", "after", "suspect"),
    [
        pytest.param(exporter_text(), exporter_text(), None, id="clean"),
        pytest.param(exporter_text(), exporter_text(xid=79), "Xid 79", id="fell-off-the-bus"),
        pytest.param(exporter_text(), exporter_text(xid=48), "Xid 48", id="double-bit-ecc-xid"),
        pytest.param(exporter_text(), exporter_text(xid=13), None, id="xid-13-is-software"),
        pytest.param(exporter_text(xid=31), exporter_text(xid=31), None, id="mmu-fault-xid-31"),
        pytest.param(exporter_text(dbe=2), exporter_text(dbe=3), "1 new double-bit", id="new-dbe"),
        pytest.param(exporter_text(dbe=3), exporter_text(dbe=3), None, id="old-dbe"),
        pytest.param(None, exporter_text(dbe=3), None, id="dbe-without-baseline"),
        pytest.param(exporter_text(), exporter_text(remap=1), "row-remap", id="remap-failure"),
        pytest.param(exporter_text(), "", None, id="empty"),
    ],
)
def test_hardware_evidence(before: str | None, after: str, suspect: str | None) -> None:
    first = parse(before) if before is not None else None
    reason = hardware_evidence(first, parse(after))
    if suspect is None:
        assert reason is None
    else:
        assert reason is not None
        assert suspect in reason


def test_evidence_is_narrowed_to_this_pods_gpus() -> None:
    text = exporter_text(uuid=U0) + exporter_text(xid=79, uuid=U1)
    visible = visible_gpus({"NVIDIA_VISIBLE_DEVICES": U0})
    assert visible == {U0}
    assert hardware_evidence(None, parse(text, visible)) is None
    assert hardware_evidence(None, parse(text, None)) == f"GPU {U1}: Xid 79"
    assert visible_gpus({"NVIDIA_VISIBLE_DEVICES": "all"}) is None
    assert hardware_evidence(None, None) is None
    assert hardware_evidence(GpuHealth(), GpuHealth()) is None


def test_evidence_is_narrowed_under_the_volume_mounts_strategy(tmp_path: Path) -> None:
    """Issue 37: the platform's device plugin hands GPUs as mounts named by UUID under
    /var/run/nvidia-container-devices, and NVIDIA_VISIBLE_DEVICES names that directory; read
    as a list of UUIDs it named none, and another pod's GPU's Xid was taken for this one's."""
    mounts = tmp_path / "nvidia-container-devices"
    mounts.mkdir()
    (mounts / U0).touch()
    env = {"NVIDIA_VISIBLE_DEVICES": str(mounts)}
    visible = visible_gpus(env, mounts)
    assert visible == {U0}
    text = exporter_text(uuid=U0) + exporter_text(xid=79, uuid=U1)
    assert hardware_evidence(None, parse(text, visible)) is None
    assert visible_gpus(env, tmp_path / "absent") is None


def test_evidence_from_a_url_or_a_file(tmp_path: Path) -> None:
    """dcgm-exporter's /metrics over HTTP, or a node agent's file; unreachable is none."""
    body = exporter_text(xid=79).encode()

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        assert hardware_evidence(None, read({ENV_GPU_EVIDENCE: url})) == f"GPU {U0}: Xid 79"
    finally:
        server.shutdown()
        server.server_close()
    node = tmp_path / "gpu-health.prom"
    node.write_bytes(body)
    assert hardware_evidence(None, read({ENV_GPU_EVIDENCE: str(node)})) == f"GPU {U0}: Xid 79"
    assert read({ENV_GPU_EVIDENCE: str(tmp_path / "absent")}) is None
    assert read({ENV_GPU_EVIDENCE: url}, timeout=1.0) is None  # the exporter is gone
    assert read({}) is None


def test_critical_xids_agree_with_the_platforms_alerts() -> None:
    pytest.importorskip("trainstack")
    from trainstack.builders.monitoring import CRITICAL_XIDS as ALERTED  # noqa: PLC0415

    assert tuple(CRITICAL_XIDS) == tuple(ALERTED)


def test_crash_count_resets_on_a_new_checkpoint(tmp_path: Path) -> None:
    assert record_crash(tmp_path, "job-a-uid1", None) == 1
    assert record_crash(tmp_path, "job-a-uid1", None) == 2
    assert record_crash(tmp_path, "job-a-uid1", 40) == 1  # progress since the last crash
    assert record_crash(tmp_path, "job-a-uid1", 40) == 2  # the same checkpoint again
    assert record_crash(tmp_path, "job-a-uid2", None) == 1  # another job instance
    assert json.loads((tmp_path / ".trainstack-crashes.job-a-uid1").read_text()) == {
        "count": 2,
        "step": 40,
    }


def test_crash_classes_in_the_contract_and_volcano_policies() -> None:
    from trainstack.jobs.lifecycle import EXIT_ACTIONS  # noqa: PLC0415

    assert ExitCode.CRASH in RETRYABLE
    assert ExitCode.CRASH_LOOP in FATAL
    assert EXIT_ACTIONS[205] == "RestartJob"
    assert EXIT_ACTIONS[5] == "AbortJob"
    assert EXIT_ACTIONS[201] == "RestartJob"


needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def _verdict(tmp_path: Path) -> dict[str, object]:
    verdict: dict[str, object] = json.loads((tmp_path / "termination-log").read_text())
    return verdict


@needs_torch
@pytest.mark.faults
def test_a_segfault_is_a_crash_retried_until_the_limit(tmp_path: Path, run_job: RunJob) -> None:
    first = run_job(tmp_path, fault="segv@7,rank=1", TRAINSTACK_MAX_CRASHES="1")
    assert first.code == ExitCode.CRASH, first.output[-3000:]
    assert _verdict(tmp_path)["retryable"] is True
    # The same crash again, before any new checkpoint: the limit of 1 retry is spent.
    second = run_job(tmp_path, fault="segv@7,rank=1", TRAINSTACK_MAX_CRASHES="1")
    assert second.code == ExitCode.CRASH_LOOP, second.output[-3000:]
    verdict = _verdict(tmp_path)
    assert verdict["class"] == "crash_loop"
    assert verdict["retryable"] is False


@needs_torch
@pytest.mark.faults
@pytest.mark.parametrize(
    ("fault", "xid", "expected"),
    [
        pytest.param("abort@7,rank=1", 0, ExitCode.COMM_ERROR, id="watchdog-abort"),
        pytest.param("abort@7,rank=1", 48, ExitCode.HARDWARE, id="watchdog-abort-on-ecc"),
        pytest.param("segv@7,rank=1", 79, ExitCode.HARDWARE, id="segfault-gpu-off-the-bus"),
        pytest.param("segv@7,rank=1", 13, ExitCode.CRASH, id="segfault-software-xid"),
    ],
)
def test_the_nodes_evidence_decides_hardware(
    tmp_path: Path, run_job: RunJob, fault: str, xid: int, expected: ExitCode
) -> None:
    """The node agent's file (here written before the run) as TRAINSTACK_GPU_EVIDENCE."""
    node = tmp_path / "node-gpu-health.prom"
    node.write_text(exporter_text(xid=xid))
    result = run_job(tmp_path / "job", fault=fault, TRAINSTACK_GPU_EVIDENCE=str(node))
    assert result.code == expected, result.output[-3000:]
    verdict = _verdict(tmp_path / "job")
    if expected is ExitCode.HARDWARE:
        assert str(verdict["cause"]).startswith(f"node evidence: GPU {U0}: Xid {xid}")
