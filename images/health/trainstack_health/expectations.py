"""What a node of each pool must show: the ConfigMap's expectations.json (format in
contract.py, written by the platform from its instance catalog, trainstack/builders/health.py).

The agent reads the "pools" and "recheckSeconds" keys; "repair" is the repair controller's and
is not checked here. A malformed file is a SetupError naming the file and the field, so the
operator sees what to fix instead of a node that silently never passes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainstack_health import contract
from trainstack_health.errors import SetupError


@dataclass(frozen=True)
class PoolExpectation:
    pool: str
    gpus: int
    gpu_model: str | None = None
    efa_devices: int = 0
    ib_ports: int = 0
    ib_rate_gbps: int | None = None
    busbw_floor_gbps: float | None = None
    dcgm_level: int = contract.DEFAULT_DCGM_LEVEL
    instance_type: str | None = None
    # How long a pending node's check waits for the pool's pre-pulled images (None: no wait).
    prepull_gate_seconds: int | None = None


@dataclass(frozen=True)
class Expectations:
    pools: Mapping[str, PoolExpectation]
    recheck_seconds: int = contract.DEFAULT_RECHECK_S

    def for_pool(self, pool: str | None, *, source: str = "expectations") -> PoolExpectation:
        if not pool:
            raise SetupError(
                f"the node has no {contract.POOL_LABEL} label: the agent runs on the platform's "
                "GPU pools only (the DaemonSet's node selector)"
            )
        if pool not in self.pools:
            known = ", ".join(sorted(self.pools)) or "none"
            raise SetupError(f"{source}: no pool {pool!r} (pools: {known})")
        return self.pools[pool]


def _field(
    where: str, data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, null: bool
) -> Any:
    if key not in data:
        if null:
            return None
        raise SetupError(f"{where}: missing field {key!r}")
    value = data[key]
    if value is None and null:
        return None
    # bool is an int in Python; a JSON true is never a count.
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise SetupError(f"{where}: field {key!r} must be {names}, got {value!r}")
    return value


def _count(where: str, data: Mapping[str, Any], key: str, *, minimum: int, default: int) -> int:
    value = _field(where, data, key, int, null=True)
    if value is None:
        return default
    if value < minimum:
        raise SetupError(f"{where}: field {key!r} must be >= {minimum}, got {value}")
    return int(value)


def parse_pool(where: str, name: str, data: Any) -> PoolExpectation:
    if not isinstance(data, dict):
        raise SetupError(f"{where}: must be an object, got {type(data).__name__}")
    gpus = _field(where, data, "gpus", int, null=False)
    if gpus < 1:
        raise SetupError(f"{where}: field 'gpus' must be >= 1, got {gpus}")
    floor = _field(where, data, "busbwFloorGBps", (int, float), null=True)
    if floor is not None and floor <= 0:
        raise SetupError(f"{where}: field 'busbwFloorGBps' must be > 0 or null, got {floor}")
    rate = _field(where, data, "ibRateGbps", int, null=True)
    if rate is not None and rate <= 0:
        raise SetupError(f"{where}: field 'ibRateGbps' must be > 0 or null, got {rate}")
    level = _count(where, data, "dcgmLevel", minimum=1, default=contract.DEFAULT_DCGM_LEVEL)
    if level > 4:
        raise SetupError(f"{where}: field 'dcgmLevel' must be 1 to 4 (dcgmi diag -r), got {level}")
    return PoolExpectation(
        pool=name,
        gpus=int(gpus),
        gpu_model=_field(where, data, "gpuModel", str, null=True),
        efa_devices=_count(where, data, "efaDevices", minimum=0, default=0),
        ib_ports=_count(where, data, "ibPorts", minimum=0, default=0),
        ib_rate_gbps=rate,
        busbw_floor_gbps=None if floor is None else float(floor),
        dcgm_level=level,
        instance_type=_field(where, data, "instanceType", str, null=True),
        prepull_gate_seconds=_gate(where, data),
    )


def _gate(where: str, data: Mapping[str, Any]) -> int | None:
    value = _field(where, data, "prePullGateSeconds", int, null=True)
    if value is not None and value < 0:
        raise SetupError(f"{where}: field 'prePullGateSeconds' must be >= 0 or null, got {value}")
    return None if not value else int(value)


def parse(text: str, source: str) -> Expectations:
    try:
        data = json.loads(text)
    except ValueError as err:
        raise SetupError(f"{source}: not JSON: {err}") from None
    if not isinstance(data, dict):
        raise SetupError(f"{source}: must be a JSON object")
    pools = data.get("pools")
    if not isinstance(pools, dict):
        raise SetupError(f"{source}: field 'pools' must be an object of pool name -> expectation")
    parsed = {
        name: parse_pool(f"{source}: pools.{name}", name, value) for name, value in pools.items()
    }
    recheck = _count(source, data, "recheckSeconds", minimum=60, default=contract.DEFAULT_RECHECK_S)
    return Expectations(pools=parsed, recheck_seconds=recheck)


def load(path: Path) -> Expectations:
    try:
        text = path.read_text()
    except OSError as err:
        raise SetupError(
            f"cannot read expectations {path}: {err.strerror} (the ConfigMap "
            f"{contract.CONFIGMAP} key expectations.json, mounted at {contract.EXPECTATIONS_PATH})"
        ) from None
    return parse(text, str(path))
