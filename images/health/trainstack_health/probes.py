"""The hardware boundary: each probe returns the raw text one tool prints, and nothing else.

`checks.py` parses that text, so the same parsers run on a GPU node (`SystemProbes`) and in the
tests and the end-to-end test (`RecordedProbes`, `--probes-from DIR`: the agent's own code with
only this boundary replaced by recorded outputs, tests/health/fixtures/README.md).

A probe that cannot run (tool missing, timeout, refused) raises `ProbeError`; the check that
reads it then fails with that message, because a node whose GPUs cannot even be queried must
not take work. The commands and their output formats (cited where they are parsed, checks.py):

- `nvidia-smi --query-gpu=... --format=csv,noheader` and `--query-remapped-rows=...`
- the kernel log since boot (`/dev/kmsg`, where the NVIDIA driver logs `NVRM: Xid ...`)
- `dcgmi diag -r LEVEL -j`
- /sys/class/infiniband: per port `state`, `rate`, `link_layer`, and the device's driver
- nccl-tests `all_reduce_perf -b 8 -e 1G -f 2 -g GPUS`
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

GPU_FIELDS = (
    "index",
    "name",
    "pci.bus_id",
    "uuid",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
)
REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")

# Recorded outputs in a --probes-from directory: one file per probe. A file named
# <file>.error instead makes that probe fail with the file's text (a tool that is missing or
# exited non-zero), so failure paths are recorded as well.
FILES = {
    "gpus": "nvidia-smi-gpus.csv",
    "remapped_rows": "nvidia-smi-remapped-rows.csv",
    "kernel_log": "kmsg.txt",
    "dcgm": "dcgmi-diag.json",
    "fabric": "infiniband.txt",
    "nccl": "all_reduce_perf.txt",
}

DEFAULT_TIMEOUTS = {"nvidia-smi": 60.0, "dcgmi": 1800.0, "all_reduce_perf": 600.0}
# `dcgmi diag -r LEVEL` by level: dcgmi's help gives 1 seconds, 2 about 2 minutes, 3 about 15
# minutes and 4 as "extended" (NVIDIA/DCGM v4.5.3 dcgmi/CommandLineParser.cpp); each limit
# leaves several times that, and level 4 two and a half hours: with the all-reduce's limit, a
# step stays within the agent's liveness limit (cli.py STEP_LIMIT_S, three hours).
DCGM_TIMEOUTS = {1: 300.0, 2: 1800.0, 3: 3600.0, 4: 9000.0}


def dcgm_timeout(level: int) -> float:
    return DCGM_TIMEOUTS.get(level, DEFAULT_TIMEOUTS["dcgmi"])


class ProbeError(Exception):
    """A probe could not produce its output; `message` says which tool and why."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"{tool}: {message}")
        self.tool = tool
        self.message = f"{tool}: {message}"


class Probes(Protocol):
    def gpus(self) -> str: ...
    def remapped_rows(self) -> str: ...
    def kernel_log(self) -> str: ...
    def dcgm(self, level: int) -> str: ...
    def fabric(self) -> str: ...
    def nccl(self, gpus: int) -> str: ...


def run_tool(argv: Sequence[str], timeout: float, *, ok_codes: tuple[int, ...] = (0,)) -> str:
    """stdout of argv, or ProbeError naming the tool: not installed, timed out, or an exit
    status outside ok_codes (with the end of its stderr, which is where the tools say why)."""
    tool = os.path.basename(argv[0])
    if shutil.which(argv[0]) is None:
        raise ProbeError(tool, "not found on PATH (is this the trainstack-health image?)")
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ProbeError(tool, f"did not finish within {timeout:g} s") from None
    except OSError as err:
        raise ProbeError(tool, str(err)) from None
    if done.returncode not in ok_codes:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ProbeError(tool, f"exit status {done.returncode}: {' | '.join(tail)}")
    return done.stdout


def read_kmsg(path: Path = Path("/dev/kmsg")) -> str:
    """Every record in the kernel's ring buffer, i.e. since boot unless it wrapped.

    A new reader of /dev/kmsg starts at the oldest record still buffered; each read() returns
    one record `prio,seq,usec,flags;message`; a non-blocking read returns EAGAIN once no record
    is left, and EPIPE when records were overwritten under the reader, which moves it on to the
    next one (kernel Documentation/ABI/testing/dev-kmsg). Reading needs CAP_SYSLOG where
    kernel.dmesg_restrict is 1: the agent runs privileged as root (docs/health.md)."""
    records: list[str] = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise ProbeError("kmsg", f"cannot open {path}: {err.strerror}") from None
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:
                    continue
                if err.errno == errno.EAGAIN:
                    break
                raise ProbeError("kmsg", f"read {path}: {err.strerror}") from None
            if not chunk:
                break
            records.append(chunk.decode(errors="replace").rstrip("\n"))
    finally:
        os.close(fd)
    return "\n".join(records) + ("\n" if records else "")


def read_fabric(root: Path = Path("/sys/class/infiniband")) -> str:
    """The RDMA devices' port attributes as `grep -H . FILE` prints them (`PATH:VALUE`), one
    per line, and each device's driver as `PATH/device/driver -> DRIVER` (the basename of the
    symlink's target: `efa` for EFA, `mlx5_core` for ConnectX). The files are the kernel's
    stable ABI (Documentation/ABI/stable/sysfs-class-infiniband: ports/<n>/state, rate,
    link_layer). No devices (no directory) prints nothing: the checks compare with the pool's
    expected counts."""
    if not root.is_dir():
        return ""
    lines: list[str] = []
    for dev in sorted(root.iterdir()):
        driver = dev / "device" / "driver"
        try:
            target = os.path.basename(os.readlink(driver))
        except OSError:
            target = "unknown"
        lines.append(f"{driver} -> {target}")
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir(), key=lambda p: (len(p.name), p.name)):
            for attr in ("state", "rate", "link_layer"):
                try:
                    value = (port / attr).read_text().strip()
                except OSError as err:
                    value = f"<unreadable: {err.strerror}>"
                lines.append(f"{port / attr}:{value}")
    return "\n".join(lines) + ("\n" if lines else "")


@dataclass(frozen=True)
class SystemProbes:
    """The real tools, as the image installs them (images/health/Dockerfile)."""

    nvidia_smi: str = "nvidia-smi"
    dcgmi: str = "dcgmi"
    all_reduce_perf: str = "all_reduce_perf"
    kmsg: Path = Path("/dev/kmsg")
    sysfs_infiniband: Path = Path("/sys/class/infiniband")

    def gpus(self) -> str:
        return run_tool(
            [self.nvidia_smi, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader"],
            DEFAULT_TIMEOUTS["nvidia-smi"],
        )

    def remapped_rows(self) -> str:
        return run_tool(
            [
                self.nvidia_smi,
                f"--query-remapped-rows={','.join(REMAP_FIELDS)}",
                "--format=csv,noheader",
            ],
            DEFAULT_TIMEOUTS["nvidia-smi"],
        )

    def kernel_log(self) -> str:
        return read_kmsg(self.kmsg)

    def dcgm(self, level: int) -> str:
        # dcgmi exits non-zero when a test fails but still prints the JSON report, which is
        # what the check reads; an empty stdout is the failure to report.
        out = run_tool(
            [self.dcgmi, "diag", "-r", str(level), "-j"],
            dcgm_timeout(level),
            ok_codes=tuple(range(256)),
        )
        if not out.strip():
            raise ProbeError("dcgmi", "printed no report")
        return out

    def fabric(self) -> str:
        return read_fabric(self.sysfs_infiniband)

    def nccl(self, gpus: int) -> str:
        return run_tool(
            [self.all_reduce_perf, "-b", "8", "-e", "1G", "-f", "2", "-g", str(gpus)],
            DEFAULT_TIMEOUTS["all_reduce_perf"],
        )


@dataclass(frozen=True)
class RecordedProbes:
    """Recorded outputs from a directory (`--probes-from DIR`), file names in FILES."""

    root: Path

    def _read(self, probe: str) -> str:
        name = FILES[probe]
        failed = self.root / f"{name}.error"
        if failed.is_file():
            raise ProbeError(name, failed.read_text().strip())
        path = self.root / name
        if not path.is_file():
            raise ProbeError(name, f"no recorded output {path}")
        return path.read_text()

    def gpus(self) -> str:
        return self._read("gpus")

    def remapped_rows(self) -> str:
        return self._read("remapped_rows")

    def kernel_log(self) -> str:
        return self._read("kernel_log")

    def dcgm(self, level: int) -> str:  # noqa: ARG002 - the recording was made at some level
        return self._read("dcgm")

    def fabric(self) -> str:
        return self._read("fabric")

    def nccl(self, gpus: int) -> str:  # noqa: ARG002 - recorded with the pool's GPU count
        return self._read("nccl")
