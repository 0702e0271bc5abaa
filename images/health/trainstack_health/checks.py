"""The node checks: pure parsers of each tool's output, and the decision (`evaluate`).

Passive checks (gpu-count, gpu-model, ecc, xid, efa, ib) read state and may run while training
pods use the GPUs; active ones (dcgm, nccl) load every GPU, so the agent runs them only while
its taint keeps work away. Results come in contract.CHECKS order; a failed report names the
first failed check, which becomes the node's REASON_LABEL value.

Output formats, as the tools print them (recorded samples: tests/health/fixtures/README.md):
- nvidia-smi `--format=csv,noheader`: one line per GPU, fields in query order joined by ", ",
  unsupported fields as "[N/A]" or "N/A" (nvidia-smi(1), "--format").
- kernel log: the driver logs `NVRM: Xid (PCI:0000:53:00): 79, pid=..., ...`; through
  /dev/kmsg each record is prefixed `prio,seq,usec,flags;` (DCGM v4.5.3
  dcgmlib/src/DcgmKmsgReader.cpp `ParseKmsgLineForXid` parses exactly this shape).
- `dcgmi diag -j`: {"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"entity_group", "entity_id", "status", "warnings": [{"warning", "error_id"}]}],
  "test_summary": {"status"}}]}], "runtime_error"?}} with statuses Pass/Skip/Warn/Fail/Not Run
  (DCGM v4.5.3 nvvs/include/NvvsJsonStrings.h, dcgmi/Diag.cpp `HelperJsonBuildOutput`,
  `HelperDisplayDiagResult`; testing/python3/dcgm_diag_schema.json).
- sysfs: ports/<n>/state "4: ACTIVE", rate "400 Gb/sec (4X NDR)" (kernel
  drivers/infiniband/core/sysfs.c `state_show`, `rate_show`), link_layer "InfiniBand",
  "Ethernet" (RoCE) or "Unspecified" (EFA: drivers/infiniband/hw/efa/efa_verbs.c
  `efa_port_link_layer`); EFA devices are the ones bound to the `efa` driver.
- nccl-tests: `# Out of bounds values : 0 OK` and `# Avg bus bandwidth    : 478.2 `
  (NVIDIA/nccl-tests v2.19.6 src/util.cu `writeResultFooter`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainstack_health import contract
from trainstack_health.expectations import PoolExpectation
from trainstack_health.parsers import (
    Gpu,
    ParseError,
    bus_key,
    parse_dcgm,
    parse_fabric,
    parse_gpus,
    parse_nccl,
    parse_remapped_rows,
    parse_xids,
)
from trainstack_health.probes import ProbeError, Probes

__all__ = [
    "ACTIVE",
    "FATAL_XIDS",
    "PASSIVE",
    "CheckResult",
    "Outputs",
    "ParseError",
    "Report",
    "collect",
    "evaluate",
    "parse_dcgm",
    "parse_fabric",
    "parse_gpus",
    "parse_nccl",
    "parse_remapped_rows",
    "parse_xids",
    "run_checks",
]

PASSIVE = (
    contract.CHECK_GPU_COUNT,
    contract.CHECK_GPU_MODEL,
    contract.CHECK_ECC,
    contract.CHECK_XID,
    contract.CHECK_EFA,
    contract.CHECK_IB,
)
ACTIVE = (contract.CHECK_DCGM, contract.CHECK_NCCL)

# XIDs that fail a node: DCGM's "devastating" XIDs that its health watch reports as FAIL
# (48 double-bit ECC, 74 NVLink, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP, 140
# ECC unrecovered) and 64 (row remapping failure, FAIL in its memory watch): DCGM v4.5.3
# modules/health/DcgmHealthWatch.cpp `BuildXidMappings`. These are the codes whose immediate
# action in NVIDIA's Xid catalog is a GPU reset or a node reboot, not an application restart
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). Contained errors
# (94) and new remappings (63) are warnings there: the memory they affect shows up in the ecc
# check as a pending remap until the GPU is reset. Application errors (13 graphics exception,
# 31 MMU fault, 43 reset channel, 45 preemptive cleanup) are the job's, not the node's.
FATAL_XIDS: Mapping[int, str] = {
    48: "double-bit ECC error",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "ECC unrecovered error",
}


# --- the decision ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outputs:
    """What the probes printed (or why they could not); None: not run (passive check)."""

    gpus: str | ProbeError
    remapped_rows: str | ProbeError
    kernel_log: str | ProbeError
    fabric: str | ProbeError
    dcgm: str | ProbeError | None = None
    nccl: str | ProbeError | None = None
    seconds: Mapping[str, float] = field(default_factory=dict)  # probe name -> wall time


@dataclass(frozen=True)
class CheckResult:
    check: str
    passed: bool
    message: str
    seconds: float = 0.0


@dataclass(frozen=True)
class Report:
    active: bool
    results: tuple[CheckResult, ...]
    busbw_gbps: float | None = None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed_check(self) -> str | None:
        """The first failed check in contract.CHECKS order: the REASON_LABEL value."""
        return next((r.check for r in self.results if not r.passed), None)

    @property
    def message(self) -> str:
        failed = [f"{r.check}: {r.message}" for r in self.results if not r.passed]
        if failed:
            return "; ".join(failed)
        kind = "full" if self.active else "passive"
        return f"all {len(self.results)} {kind} checks passed"

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "active": self.active,
            "failedCheck": self.failed_check,
            "message": self.message,
            "busbwGBps": self.busbw_gbps,
            "checks": [
                {"check": r.check, "passed": r.passed, "message": r.message, "seconds": r.seconds}
                for r in self.results
            ],
        }


class _Fail(Exception):
    pass


def _text(output: str | ProbeError | None) -> str:
    if isinstance(output, ProbeError):
        raise _Fail(output.message)
    if output is None:
        raise _Fail("not run")
    return output


def _gpu_label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.bus_id})"


def _check_gpu_count(expect: PoolExpectation, out: Outputs) -> str:
    gpus = parse_gpus(_text(out.gpus))
    if len(gpus) != expect.gpus:
        present = ", ".join(_gpu_label(g) for g in gpus) or "none"
        raise _Fail(f"found {len(gpus)} GPUs, pool {expect.pool} expects {expect.gpus} ({present})")
    return f"{len(gpus)} GPUs"


def _model_matches(model: str, name: str) -> bool:
    # "H100" in "NVIDIA H100 80GB HBM3", "A100" in "NVIDIA A100-SXM4-80GB", not "A10" in "A100".
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![A-Za-z0-9])", name, re.I) is not None


def _check_gpu_model(expect: PoolExpectation, out: Outputs) -> str:
    gpus = parse_gpus(_text(out.gpus))
    if expect.gpu_model is None:
        return "no model expected"
    wrong = [g for g in gpus if not _model_matches(expect.gpu_model, g.name)]
    if wrong:
        found = ", ".join(f"{_gpu_label(g)} is {g.name!r}" for g in wrong)
        raise _Fail(f"expected {expect.gpu_model}: {found}")
    return f"all {expect.gpu_model}"


def _check_ecc(_: PoolExpectation, out: Outputs) -> str:
    gpus = parse_gpus(_text(out.gpus))
    remap: dict[str, tuple[bool | None, bool | None]] = {}
    note = ""
    if isinstance(out.remapped_rows, str):
        remap = parse_remapped_rows(out.remapped_rows)
    else:  # GPUs before Ampere have no row remapper; the counters below still apply
        note = "; remapped rows not reported"
    problems = []
    for g in gpus:
        if g.ecc_uncorrected:
            problems.append(f"{_gpu_label(g)} has {g.ecc_uncorrected} uncorrectable ECC errors")
        if g.retired_pending:
            problems.append(f"{_gpu_label(g)} has retired pages pending a reset")
        pending, failure = remap.get(bus_key(g.bus_id), (None, None))
        if pending:
            problems.append(f"{_gpu_label(g)} has a row remapping pending a GPU reset")
        if failure:
            problems.append(f"{_gpu_label(g)} had a row remapping failure")
    if problems:
        raise _Fail("; ".join(problems))
    disabled = [str(g.index) for g in gpus if g.ecc_mode.lower() == "disabled"]
    if disabled:
        note += f"; ECC disabled on GPU {','.join(disabled)}"
    return f"no uncorrectable errors{note}"


def _check_xid(_: PoolExpectation, out: Outputs) -> str:
    xids = parse_xids(_text(out.kernel_log))
    names: dict[str, str] = {}
    if isinstance(out.gpus, str):
        names = {bus_key(g.bus_id): f"GPU {g.index} " for g in parse_gpus(out.gpus)}
    fatal = [x for x in xids if x.code in FATAL_XIDS]
    if fatal:
        raise _Fail(
            "; ".join(
                f"{names.get(x.bus, '')}(PCI {x.bus}) logged Xid {x.code} "
                f"({FATAL_XIDS[x.code]}): {x.text}"
                for x in fatal
            )
        )
    if xids:
        codes = ", ".join(str(c) for c in sorted({x.code for x in xids}))
        return f"no fatal Xid since boot (ignored, not node faults: {codes})"
    return "no Xid since boot"


def _check_dcgm(expect: PoolExpectation, out: Outputs) -> str:
    failures, error = parse_dcgm(_text(out.dcgm))
    if error:
        raise _Fail(f"dcgmi diag -r {expect.dcgm_level} could not run: {error}")
    if failures:
        raise _Fail(
            "; ".join(
                f"{f.category} test {f.test!r} failed"
                + (f" on {', '.join(f.entities)}" if f.entities else "")
                + (f": {' | '.join(f.warnings)}" if f.warnings else "")
                for f in failures
            )
        )
    return f"dcgmi diag -r {expect.dcgm_level} passed"


def _check_efa(expect: PoolExpectation, out: Outputs) -> str:
    ports = [p for p in parse_fabric(_text(out.fabric)) if p.efa]
    devices = sorted({p.device for p in ports})
    if len(devices) < expect.efa_devices:
        raise _Fail(f"found {len(devices)} EFA devices, pool {expect.pool} expects "
                    f"{expect.efa_devices}")  # fmt: skip
    down = [f"{p.name} is {p.state}" for p in ports if p.state != "ACTIVE"]
    if down and expect.efa_devices:
        raise _Fail("; ".join(down))
    return f"{len(devices)} EFA devices" + (" active" if devices else "")


def _check_ib(expect: PoolExpectation, out: Outputs) -> str:
    ports = [p for p in parse_fabric(_text(out.fabric)) if not p.efa]
    if expect.ib_ports == 0:
        return "no IB/RoCE ports expected"
    floor = expect.ib_rate_gbps
    good = [
        p for p in ports if p.state == "ACTIVE" and (floor is None or (p.rate_gbps or 0) >= floor)
    ]
    if len(good) >= expect.ib_ports:
        rate = f" at >= {floor} Gb/s" if floor else ""
        return f"{len(good)} ports active{rate}"
    bad = []
    for p in ports:
        if p.state != "ACTIVE":
            bad.append(f"{p.name} is {p.state}")
        elif floor is not None and (p.rate_gbps or 0) < floor:
            bad.append(f"{p.name} runs at {p.rate_gbps or 0:g} Gb/s, expected {floor}")
    detail = "; ".join(bad) or "no other ports"
    raise _Fail(f"{len(good)} of {expect.ib_ports} expected ports usable: {detail}")


def _check_nccl(expect: PoolExpectation, out: Outputs) -> str:
    run = parse_nccl(_text(out.nccl))
    measured = f"bus bandwidth {run.busbw_gbps:g} GB/s at {run.size} B"
    if run.wrong:
        raise _Fail(f"all_reduce_perf found {run.wrong} wrong values ({measured})")
    floor = expect.busbw_floor_gbps
    if floor is None:
        return f"{measured} (no floor for this pool)"
    if run.busbw_gbps < floor:
        raise _Fail(f"{measured} is below the floor of {floor:g} GB/s "
                    f"for {expect.instance_type or expect.pool}")  # fmt: skip
    return f"{measured} >= floor {floor:g} GB/s"


CHECK_FUNCS: Mapping[str, Callable[[PoolExpectation, Outputs], str]] = {
    contract.CHECK_GPU_COUNT: _check_gpu_count,
    contract.CHECK_GPU_MODEL: _check_gpu_model,
    contract.CHECK_ECC: _check_ecc,
    contract.CHECK_XID: _check_xid,
    contract.CHECK_DCGM: _check_dcgm,
    contract.CHECK_EFA: _check_efa,
    contract.CHECK_IB: _check_ib,
    contract.CHECK_NCCL: _check_nccl,
}
# The probe each check reads: its wall time is the check's duration.
CHECK_PROBE: Mapping[str, str] = {
    contract.CHECK_GPU_COUNT: "gpus",
    contract.CHECK_GPU_MODEL: "gpus",
    contract.CHECK_ECC: "gpus",
    contract.CHECK_XID: "kernel_log",
    contract.CHECK_DCGM: "dcgm",
    contract.CHECK_EFA: "fabric",
    contract.CHECK_IB: "fabric",
    contract.CHECK_NCCL: "nccl",
}


def evaluate(expect: PoolExpectation, out: Outputs, *, active: bool) -> Report:
    """Every check that applies, in contract.CHECKS order; a parse error is a failure of that
    check (the tool printed something the node should not)."""
    results = []
    busbw = None
    for check in contract.CHECKS:
        if check in ACTIVE and not active:
            continue
        try:
            message, passed = CHECK_FUNCS[check](expect, out), True
        except _Fail as err:
            message, passed = str(err), False
        except ParseError as err:
            message, passed = f"unreadable output: {err}", False
        results.append(
            CheckResult(check, passed, message, out.seconds.get(CHECK_PROBE[check], 0.0))
        )
    if active and isinstance(out.nccl, str):
        try:
            busbw = parse_nccl(out.nccl).busbw_gbps
        except ParseError:
            busbw = None
    return Report(active=active, results=tuple(results), busbw_gbps=busbw)


def collect(
    probes: Probes, expect: PoolExpectation, *, active: bool, clock: Callable[[], float]
) -> Outputs:
    """Run the probes the checks need (the active ones only when `active`), timing each."""
    seconds: dict[str, float] = {}

    def timed(name: str, call: Callable[[], str]) -> str | ProbeError:
        start = clock()
        try:
            return call()
        except ProbeError as err:
            return err
        finally:
            seconds[name] = max(0.0, clock() - start)

    gpus = timed("gpus", probes.gpus)
    remapped = timed("remapped_rows", probes.remapped_rows)
    kernel_log = timed("kernel_log", probes.kernel_log)
    fabric = timed("fabric", probes.fabric)
    dcgm = nccl = None
    if active:
        dcgm = timed("dcgm", lambda: probes.dcgm(expect.dcgm_level))
        nccl = timed("nccl", lambda: probes.nccl(expect.gpus))
    return Outputs(gpus, remapped, kernel_log, fabric, dcgm, nccl, seconds)


def run_checks(
    probes: Probes, expect: PoolExpectation, *, active: bool, clock: Callable[[], float]
) -> Report:
    return evaluate(expect, collect(probes, expect, active=active, clock=clock), active=active)
