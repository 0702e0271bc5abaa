"""The hardware boundary without hardware: the sysfs walk over a fake tree (the layout of the
kernel's Documentation/ABI/stable/sysfs-class-infiniband), tools that are missing or fail, and
recorded outputs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from trainstack_health import checks
from trainstack_health.cli import STEP_LIMIT_S
from trainstack_health.probes import (
    FILES,
    ProbeError,
    RecordedProbes,
    SystemProbes,
    dcgm_timeout,
    read_fabric,
    read_kmsg,
    run_tool,
)

FIXTURES = Path(__file__).parent / "fixtures"


def fake_device(root: Path, dev: str, driver: str, ports: dict[str, tuple[str, str, str]]) -> None:
    drivers = root / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    device = root / "class" / "infiniband" / dev
    (device / "device").mkdir(parents=True)
    os.symlink(drivers, device / "device" / "driver")
    for port, (state, rate, layer) in ports.items():
        p = device / "ports" / port
        p.mkdir(parents=True)
        (p / "state").write_text(state + "\n")
        (p / "rate").write_text(rate + "\n")
        (p / "link_layer").write_text(layer + "\n")


def test_read_fabric_prints_what_the_checks_parse(tmp_path: Path) -> None:
    fake_device(tmp_path, "rdmap79s0", "efa",
                {"1": ("4: ACTIVE", "100 Gb/sec (4X EDR)", "Unspecified")})  # fmt: skip
    fake_device(tmp_path, "mlx5_0", "mlx5_core",
                {"1": ("1: DOWN", "10 Gb/sec (4X SDR)", "InfiniBand")})  # fmt: skip
    text = read_fabric(tmp_path / "class" / "infiniband")
    ports = {p.name: p for p in checks.parse_fabric(text)}
    assert set(ports) == {"rdmap79s0/1", "mlx5_0/1"}
    assert (ports["rdmap79s0/1"].efa, ports["rdmap79s0/1"].state) == (True, "ACTIVE")
    assert ports["rdmap79s0/1"].rate_gbps == 100
    assert (ports["mlx5_0/1"].efa, ports["mlx5_0/1"].state) == (False, "DOWN")
    assert ports["mlx5_0/1"].link_layer == "InfiniBand"


def test_no_rdma_devices_prints_nothing(tmp_path: Path) -> None:
    assert read_fabric(tmp_path / "absent") == ""


def test_missing_tool_is_a_probe_error_not_a_crash() -> None:
    with pytest.raises(ProbeError, match="not found on PATH"):
        SystemProbes(nvidia_smi="/nonexistent/nvidia-smi").gpus()


def test_failing_tool_reports_its_exit_status_and_stderr() -> None:
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('NVML: Driver Not Loaded\\n'); "
            "sys.exit(9)"]  # fmt: skip
    with pytest.raises(ProbeError, match="exit status 9: NVML: Driver Not Loaded"):
        run_tool(argv, timeout=60)


def test_dcgmi_failing_tests_still_yield_the_report(tmp_path: Path) -> None:
    """dcgmi exits non-zero when a test fails; the JSON on stdout is what counts."""
    report = (FIXTURES / "dcgm-fail" / "dcgmi-diag.json").read_text()
    fake = tmp_path / "dcgmi"
    fake.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write({report!r})\nsys.exit(226)\n"
    )
    fake.chmod(0o755)
    assert SystemProbes(dcgmi=str(fake)).dcgm(2) == report


def test_read_kmsg_of_a_file(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("4,1,1,-;NVRM: Xid (PCI:0000:53:00): 79, pid=1, x\n")
    assert checks.parse_xids(read_kmsg(log))[0].code == 79
    with pytest.raises(ProbeError, match="cannot open"):
        read_kmsg(tmp_path / "none")


def test_recorded_probes_read_files_and_recorded_failures(tmp_path: Path) -> None:
    probes = RecordedProbes(FIXTURES / "healthy")
    assert probes.gpus().startswith("0, NVIDIA H100 80GB HBM3")
    assert "Avg bus bandwidth" in probes.nccl(8)
    with pytest.raises(ProbeError, match="no recorded output"):
        RecordedProbes(tmp_path).fabric()
    (tmp_path / (FILES["dcgm"] + ".error")).write_text("dcgmi: host engine not running")
    with pytest.raises(ProbeError, match="host engine not running"):
        RecordedProbes(tmp_path).dcgm(2)


def test_every_fixture_scenario_has_every_probe() -> None:
    for scenario in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        for name in FILES.values():
            assert (scenario / name).is_file() or (scenario / f"{name}.error").is_file(), (
                scenario.name,
                name,
            )


def test_the_dcgm_time_limit_grows_with_the_level() -> None:
    """A level-4 diagnostic must not be cut off at the level-2 limit (docs/health.md)."""
    limits = [dcgm_timeout(level) for level in (1, 2, 3, 4)]
    assert limits == sorted(limits)
    assert len(set(limits)) == 4
    assert 2 * 3600 <= limits[3] <= STEP_LIMIT_S - 600  # the all-reduce's limit after it
