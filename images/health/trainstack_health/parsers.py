"""Pure parsers of the tools' outputs (the formats: checks.py's docstring and
tests/health/fixtures/README.md). A shape the tool does not print is a ParseError, which the
check reading it reports as a failure."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# How nvidia-smi prints a field the GPU or driver does not support.
NA = frozenset({"", "n/a", "[n/a]", "not supported", "[not supported]"})


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    bus_id: str
    uuid: str
    ecc_mode: str
    ecc_uncorrected: int | None
    retired_pending: bool | None


@dataclass(frozen=True)
class Xid:
    bus: str
    code: int
    text: str


@dataclass(frozen=True)
class Port:
    device: str
    port: str
    driver: str
    state: str
    rate_gbps: float | None
    link_layer: str

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def efa(self) -> bool:
        return self.driver == "efa"


class ParseError(ValueError):
    """Output that does not have the tool's documented shape."""


def _optional(value: str) -> str | None:
    return None if value.strip().lower() in NA else value.strip()


def _flag(value: str) -> bool | None:
    v = _optional(value)
    if v is None:
        return None
    if v.lower() in ("yes", "1", "true"):
        return True
    if v.lower() in ("no", "0", "false"):
        return False
    raise ParseError(f"expected Yes/No, got {value!r}")


def _csv_rows(text: str, width: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != width:
            raise ParseError(f"expected {width} fields, got {len(cells)}: {line!r}")
        rows.append(cells)
    return rows


def parse_gpus(text: str) -> list[Gpu]:
    gpus = []
    for index, name, bus, uuid, mode, unc, retired in _csv_rows(text, 7):
        count = _optional(unc)
        if count is not None and not count.isdigit():
            raise ParseError(f"ecc.errors.uncorrected.volatile.total: {unc!r}")
        if not index.isdigit():
            raise ParseError(f"index: {index!r}")
        gpus.append(
            Gpu(
                index=int(index),
                name=name,
                bus_id=bus,
                uuid=uuid,
                ecc_mode=mode,
                ecc_uncorrected=None if count is None else int(count),
                retired_pending=_flag(retired),
            )
        )
    return gpus


def parse_remapped_rows(text: str) -> dict[str, tuple[bool | None, bool | None]]:
    return {
        bus_key(bus): (_flag(pending), _flag(failure))
        for bus, pending, failure in _csv_rows(text, 3)
    }


def bus_key(bus: str) -> str:
    """A PCI address as domain:bus:device in lower case, so nvidia-smi's
    "00000000:53:00.0" and the kernel log's "0000:53:00" compare equal."""
    parts = bus.strip().lower().split(":")
    if len(parts) < 3:
        return bus.strip().lower()
    domain, pbus, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
    try:
        return f"{int(domain, 16):04x}:{int(pbus, 16):02x}:{int(dev, 16):02x}"
    except ValueError:
        return bus.strip().lower()


XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)$")


def parse_xids(text: str) -> list[Xid]:
    """Xid records from a kernel log, with or without the /dev/kmsg record prefix."""
    found = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if m:
            found.append(Xid(bus=bus_key(m.group(1)), code=int(m.group(2)), text=m.group(3)))
    return found


@dataclass(frozen=True)
class DcgmFailure:
    category: str
    test: str
    entities: tuple[str, ...]
    warnings: tuple[str, ...]


def parse_dcgm(text: str) -> tuple[list[DcgmFailure], str | None]:
    """(failed tests, runtime error) of a `dcgmi diag -j` report."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ParseError(f"not JSON: {err}") from None
    diag = data.get("DCGM Diagnostic") if isinstance(data, dict) else None
    if not isinstance(diag, dict):
        raise ParseError('no "DCGM Diagnostic" object')
    failures = []
    for category in diag.get("test_categories") or []:
        for test in category.get("tests") or []:
            failed = [r for r in test.get("results") or [] if r.get("status") == "Fail"]
            summary = (test.get("test_summary") or {}).get("status")
            if not failed and summary != "Fail":
                continue
            entities = tuple(
                f"{r.get('entity_group', 'GPU')} {r.get('entity_id', '?')}" for r in failed
            )
            warnings = tuple(
                str(w.get("warning", "")).strip()
                for r in [*failed, test.get("test_summary") or {}]
                for w in r.get("warnings") or []
            )
            failures.append(
                DcgmFailure(
                    category=str(category.get("category", "")),
                    test=str(test.get("name", "")),
                    entities=entities,
                    warnings=tuple(dict.fromkeys(w for w in warnings if w)),
                )
            )
    error = diag.get("runtime_error")
    return failures, (str(error) if error else None)


RATE_RE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec")
FABRIC_RE = re.compile(r"^(?P<root>.*)/(?P<dev>[^/]+)/ports/(?P<port>\d+)/(?P<attr>\w+):(?P<v>.*)$")
DRIVER_RE = re.compile(r"^(?P<root>.*)/(?P<dev>[^/]+)/device/driver -> (?P<driver>\S+)$")


def parse_fabric(text: str) -> list[Port]:
    drivers: dict[str, str] = {}
    attrs: dict[tuple[str, str], dict[str, str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if m := DRIVER_RE.match(line):
            drivers[m["dev"]] = m["driver"]
        elif m := FABRIC_RE.match(line):
            attrs.setdefault((m["dev"], m["port"]), {})[m["attr"]] = m["v"].strip()
        else:
            raise ParseError(f"unexpected line {line!r}")
    ports = []
    for (dev, port), values in sorted(attrs.items()):
        state = values.get("state", "")
        rate = RATE_RE.match(values.get("rate", ""))
        ports.append(
            Port(
                device=dev,
                port=port,
                driver=drivers.get(dev, "unknown"),
                # "4: ACTIVE" -> "ACTIVE"
                state=state.split(":", 1)[-1].strip() if state else "unknown",
                rate_gbps=float(rate.group(1)) if rate else None,
                link_layer=values.get("link_layer", ""),
            )
        )
    seen = {p.device for p in ports}
    ports += [  # a device with no port directory: present, but no port can be up
        Port(dev, "-", drv, "NO PORTS", None, "") for dev, drv in drivers.items() if dev not in seen
    ]
    return ports


BUSBW_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)", re.M)
OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)", re.M)


@dataclass(frozen=True)
class Nccl:
    size: int  # the largest message size measured (bytes)
    busbw_gbps: float  # its bus bandwidth: the slower of out-of-place and in-place
    avg_busbw_gbps: float  # "# Avg bus bandwidth", over all sizes
    wrong: int  # "# Out of bounds values": elements that failed validation, all sizes


def parse_nccl(text: str) -> Nccl:
    """An all_reduce_perf run. Each result row is `size count type redop root` then time, algbw,
    busbw, #wrong out-of-place and again in-place (src/util.cu `writeResultHeader`); #wrong
    is "N/A" when validation is off. The floor is held against the largest size's bus bandwidth,
    as trainstack_runtime.busbw does: the average is dominated by latency-bound small sizes."""
    avg = BUSBW_RE.search(text)
    if not avg:
        raise ParseError('no "# Avg bus bandwidth" line (did all_reduce_perf finish?)')
    rows = []
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 13 and not line.lstrip().startswith("#") and cells[0].isdigit():
            try:
                rows.append((int(cells[0]), min(float(cells[7]), float(cells[11]))))
            except ValueError:
                raise ParseError(f"unexpected result row {line.strip()!r}") from None
    if not rows:
        raise ParseError("no result rows")
    oob = OOB_RE.search(text)
    size, busbw = max(rows)
    return Nccl(size, busbw, float(avg.group(1)), int(oob.group(1)) if oob else 0)
