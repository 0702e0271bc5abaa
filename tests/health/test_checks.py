"""The node checks against recorded outputs of the real tools (tests/health/fixtures/README.md
says where each format comes from): a healthy p5.48xlarge, each failure kind, and the parsers'
edge cases."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from trainstack_health import checks, contract
from trainstack_health.expectations import Expectations, load
from trainstack_health.probes import ProbeError, RecordedProbes

FIXTURES = Path(__file__).parent / "fixtures"
P5 = "gpu-p5"
DGX = "gpu-dgx"


@pytest.fixture(scope="module")
def expectations() -> Expectations:
    return load(FIXTURES / "expectations.json")


def run(expectations: Expectations, scenario: str, pool: str = P5, *, active: bool = True):
    clock = iter(float(i) for i in range(100))
    return checks.run_checks(
        RecordedProbes(FIXTURES / scenario),
        expectations.for_pool(pool),
        active=active,
        clock=lambda: next(clock),
    )


def test_healthy_p5_passes_every_check_in_order(expectations: Expectations) -> None:
    report = run(expectations, "healthy")
    assert report.passed, report.message
    assert [r.check for r in report.results] == list(contract.CHECKS)
    assert report.failed_check is None
    assert report.busbw_gbps == 471.62  # the slower of out-of-place/in-place at 1 GiB
    by = {r.check: r.message for r in report.results}
    assert by["gpu-count"] == "8 GPUs"
    assert by["efa"] == "32 EFA devices active"
    assert "ignored, not node faults: 13" in by["xid"]  # an application's Xid 13
    assert by["nccl"] == "bus bandwidth 471.62 GB/s at 1073741824 B >= floor 400 GB/s"
    assert all(r.seconds == 1.0 for r in report.results)  # each probe's time, fake clock


def test_passive_checks_skip_dcgm_and_nccl(expectations: Expectations) -> None:
    # The recordings of dcgm-fail and busbw-below-floor would fail the active checks.
    for scenario in ("dcgm-fail", "busbw-below-floor"):
        report = run(expectations, scenario, active=False)
        assert report.passed, report.message
        assert [r.check for r in report.results] == list(checks.PASSIVE)
        assert report.busbw_gbps is None


@pytest.mark.parametrize(
    ("scenario", "pool", "reason", "message"),
    [
        ("missing-gpu", P5, "gpu-count", "found 7 GPUs, pool gpu-p5 expects 8"),
        ("wrong-model", P5, "gpu-model",
         "expected H100: GPU 0 (00000000:53:00.0) is 'NVIDIA A100-SXM4-80GB'"),
        ("ecc-uncorrectable", P5, "ecc",
         "GPU 2 (00000000:75:00.0) has 3 uncorrectable ECC errors; GPU 2 (00000000:75:00.0) "
         "has a row remapping pending a GPU reset"),
        ("xid-fatal", P5, "xid",
         "GPU 6 (PCI 0000:b9:00) logged Xid 79 (GPU has fallen off the bus)"),
        ("dcgm-fail", P5, "dcgm",
         "Integration test 'pcie' failed on GPU 3: Bandwidth of GPU 3 in direction host to "
         "device of 3.41 did not exceed minimum required bandwidth of 17.00."),
        ("efa-missing", P5, "efa", "found 31 EFA devices, pool gpu-p5 expects 32"),
        ("ib-port-down", DGX, "ib", "7 of 8 expected ports usable: mlx5_3/1 is DOWN"),
        ("ib-wrong-rate", DGX, "ib",
         "7 of 8 expected ports usable: mlx5_5/1 runs at 200 Gb/s, expected 400"),
        ("busbw-below-floor", P5, "nccl",
         "bus bandwidth 209.4 GB/s at 1073741824 B is below the floor of 400 GB/s for "
         "p5.48xlarge"),
        ("nccl-wrong-values", P5, "nccl", "all_reduce_perf found 4096 wrong values"),
        ("nvidia-smi-missing", P5, "gpu-count",
         "nvidia-smi-gpus.csv: nvidia-smi: not found on PATH"),
    ],
)  # fmt: skip
def test_each_failure_kind_names_its_check_and_says_why(
    expectations: Expectations, scenario: str, pool: str, reason: str, message: str
) -> None:
    report = run(expectations, scenario, pool)
    assert not report.passed
    assert report.failed_check == reason
    failed = next(r for r in report.results if r.check == reason)
    assert message in failed.message
    assert message in report.message
    assert report.to_json()["failedCheck"] == reason


def test_only_the_broken_thing_fails(expectations: Expectations) -> None:
    """A missing EFA device is not an IB fault, a fatal Xid is not an ECC fault."""
    for scenario, failed in (("efa-missing", ["efa"]), ("xid-fatal", ["xid"]),
                             ("dcgm-fail", ["dcgm"]), ("missing-gpu", ["gpu-count"])):  # fmt: skip
        report = run(expectations, scenario)
        assert [r.check for r in report.results if not r.passed] == failed, scenario


def test_nvidia_smi_missing_fails_every_gpu_check_but_fabric_still_reports(
    expectations: Expectations,
) -> None:
    report = run(expectations, "nvidia-smi-missing")
    failed = [r.check for r in report.results if not r.passed]
    assert failed[:3] == ["gpu-count", "gpu-model", "ecc"]
    assert "efa" not in failed


def test_ib_pool_healthy_and_efa_not_required(expectations: Expectations) -> None:
    report = run(expectations, "ib-healthy", DGX)
    by = {r.check: r for r in report.results}
    assert by["ib"].passed, by["ib"].message
    assert by["ib"].message == "8 ports active at >= 400 Gb/s"
    assert by["efa"].passed
    assert by["nccl"].message.endswith("(no floor for this pool)")


def test_no_floor_reports_the_figure_and_passes(expectations: Expectations) -> None:
    expect = replace(expectations.for_pool(P5), busbw_floor_gbps=None)
    out = checks.collect(RecordedProbes(FIXTURES / "busbw-below-floor"), expect, active=True,
                         clock=lambda: 0.0)  # fmt: skip
    report = checks.evaluate(expect, out, active=True)
    assert report.passed
    assert report.busbw_gbps == 209.4


@pytest.mark.parametrize(
    ("floor", "passed"), [(209.4, True), (209.41, False), (100.0, True), (471.0, False)]
)
def test_floor_per_instance_type_is_a_hard_edge(
    expectations: Expectations, floor: float, passed: bool
) -> None:
    expect = replace(expectations.for_pool(P5), busbw_floor_gbps=floor)
    out = checks.collect(RecordedProbes(FIXTURES / "busbw-below-floor"), expect, active=True,
                         clock=lambda: 0.0)  # fmt: skip
    assert checks.evaluate(expect, out, active=True).passed is passed


# --- parsers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "bus", "code"),
    [
        ("6,1000,100,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
         "0000:3b:00", 79),
        ("[ 1843.3] NVRM: Xid (PCI:0000:B9:00): 48, pid=42, name=python3, An uncorrectable "
         "double bit error", "0000:b9:00", 48),
        ("Oct 01 13:00:00 host kernel: NVRM: Xid (PCI:0002:00:00): 119, pid=1582259, "
         "name=nvc:[driver], Timeout after 6s of waiting for RPC response",
         "0002:00:00", 119),
    ],
)  # fmt: skip
def test_xid_lines_from_kmsg_dmesg_and_journal(line: str, bus: str, code: int) -> None:
    [xid] = checks.parse_xids(line)
    assert (xid.bus, xid.code) == (bus, code)


@pytest.mark.parametrize("code", sorted(checks.FATAL_XIDS))
def test_every_fatal_xid_fails(expectations: Expectations, code: int) -> None:
    log = f"4,1,1,-;NVRM: Xid (PCI:0000:53:00): {code}, pid=1, name=x, detail\n"
    out = checks.Outputs(gpus="", remapped_rows="", kernel_log=log, fabric="")
    report = checks.evaluate(expectations.for_pool(P5), out, active=False)
    xid = next(r for r in report.results if r.check == "xid")
    assert not xid.passed
    assert f"Xid {code} ({checks.FATAL_XIDS[code]})" in xid.message


@pytest.mark.parametrize("code", [13, 31, 43, 45, 63, 94])
def test_application_and_warning_xids_do_not_fail_the_node(
    expectations: Expectations, code: int
) -> None:
    log = f"4,1,1,-;NVRM: Xid (PCI:0000:53:00): {code}, pid=1, name=x, detail\n"
    out = checks.Outputs(gpus="", remapped_rows="", kernel_log=log, fabric="")
    xid = next(
        r for r in checks.evaluate(expectations.for_pool(P5), out, active=False).results
        if r.check == "xid"
    )  # fmt: skip
    assert xid.passed, xid.message


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("0, NVIDIA H100 80GB HBM3, 00000000:53:00.0\n", "expected 7 fields"),
        ("x, H100, 0:53:00.0, GPU-1, Enabled, 0, No\n", "index"),
        ("0, H100, 0:53:00.0, GPU-1, Enabled, many, No\n", "uncorrected"),
        ("0, H100, 0:53:00.0, GPU-1, Enabled, 0, Maybe\n", "Yes/No"),
    ],
)
def test_malformed_nvidia_smi_is_a_parse_error(text: str, error: str) -> None:
    with pytest.raises(checks.ParseError, match=error):
        checks.parse_gpus(text)


def test_na_fields_are_unknown_not_errors() -> None:
    [gpu] = checks.parse_gpus("0, Tesla T4, 00000000:00:1E.0, GPU-1, [N/A], [N/A], N/A\n")
    assert (gpu.ecc_uncorrected, gpu.retired_pending) == (None, None)


def test_remapped_rows_not_reported_is_not_a_failure(expectations: Expectations) -> None:
    gpus = (FIXTURES / "healthy" / "nvidia-smi-gpus.csv").read_text()
    out = checks.Outputs(gpus=gpus, remapped_rows=ProbeError("nvidia-smi", "exit status 2"),
                         kernel_log="", fabric="")  # fmt: skip
    ecc = checks.evaluate(expectations.for_pool(P5), out, active=False).results[2]
    assert ecc.passed
    assert "remapped rows not reported" in ecc.message


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "not JSON"),
        ("[]", "DCGM Diagnostic"),
        ('{"other": {}}', "DCGM Diagnostic"),
    ],
)
def test_malformed_dcgm_report(text: str, error: str) -> None:
    with pytest.raises(checks.ParseError, match=error):
        checks.parse_dcgm(text)


def test_dcgm_runtime_error_fails(expectations: Expectations) -> None:
    report = '{"DCGM Diagnostic": {"runtime_error": "Unable to connect to the host engine"}}'
    out = checks.Outputs(gpus="", remapped_rows="", kernel_log="", fabric="", dcgm=report)
    result = checks.evaluate(expectations.for_pool(P5), out, active=True).results[4]
    assert (result.check, result.passed) == ("dcgm", False)
    assert result.message == "dcgmi diag -r 2 could not run: Unable to connect to the host engine"


def test_nccl_without_summary_is_a_parse_error() -> None:
    text = (FIXTURES / "healthy" / "all_reduce_perf.txt").read_text()
    cut = text[: text.index("# Out of bounds")]
    with pytest.raises(checks.ParseError, match="Avg bus bandwidth"):
        checks.parse_nccl(cut)


def test_fabric_device_without_ports_counts_as_present_but_down() -> None:
    text = "/sys/class/infiniband/rdmap79s0/device/driver -> efa\n"
    [port] = checks.parse_fabric(text)
    assert (port.device, port.efa, port.state) == ("rdmap79s0", True, "NO PORTS")


def test_fabric_unexpected_line() -> None:
    with pytest.raises(checks.ParseError, match="unexpected line"):
        checks.parse_fabric("hello\n")


@pytest.mark.parametrize(
    ("model", "name", "match"),
    [
        ("H100", "NVIDIA H100 80GB HBM3", True),
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("A10G", "NVIDIA A10G", True),
        ("A10", "NVIDIA A100-SXM4-80GB", False),
        ("H100", "NVIDIA H200", False),
    ],
)
def test_model_matches_whole_words(model: str, name: str, match: bool) -> None:
    assert checks._model_matches(model, name) is match
