"""Issue 47: the values trainstack gives the GPU operator and the device plugin for fractional
GPUs use only keys of the pinned charts, and the device plugin's time-slicing config only
fields of its config API. Read from clones named by TRAINSTACK_GPU_OPERATOR_REPO and
TRAINSTACK_DEVICE_PLUGIN_REPO (read, never copied here); skipped without them.

- NVIDIA/gpu-operator v26.3.0 deployments/gpu-operator/values.yaml: mig.strategy,
  migManager.enabled, dcgmExporter.enabled, daemonsets.tolerations, devicePlugin.config.
- NVIDIA/k8s-device-plugin v0.18.2 deployments/helm/nvidia-device-plugin/values.yaml: config.map,
  config.default; api/config/v1 (config.go, sharing.go, replicas.go): the config file's fields,
  parsed with sigs.k8s.io/yaml (JSON is YAML).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.config.test_capacity import platform, team
from tests.config.test_gpu_sharing import load, sliced_pool
from trainstack.builders import device_plugins, pools

REPOS = {
    "gpu-operator": ("TRAINSTACK_GPU_OPERATOR_REPO", "/work/.mirror/NVIDIA+gpu-operator/repo"),
    "device-plugin": (
        "TRAINSTACK_DEVICE_PLUGIN_REPO",
        "/work/.mirror/NVIDIA+k8s-device-plugin/repo",
    ),
}


def upstream(which: str, path: str) -> str:
    variable, default = REPOS[which]
    repo = Path(os.environ.get(variable, default))
    if not repo.exists():
        pytest.skip(f"no {which} clone at {repo}; set {variable}")
    shown = subprocess.run(
        ["git", f"--git-dir={repo}", "show", path], capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        pytest.skip(f"{repo} lacks {path}: {shown.stderr.strip()}")
    return shown.stdout


def unknown_keys(ours: Any, theirs: Any, where: str = "") -> list[str]:
    """Keys of `ours` (nested mappings) that the chart's values do not have. Below a key whose
    chart value is empty ({} or a list), anything goes (a free map or list)."""
    if not isinstance(ours, dict) or not isinstance(theirs, dict) or not theirs:
        return []
    found = []
    for key, value in ours.items():
        if key not in theirs:
            found.append(f"{where}{key}")
        else:
            found += unknown_keys(value, theirs[key], f"{where}{key}.")
    return found


def both_kinds() -> Any:
    return load(
        platform(
            [
                sliced_pool("mig", {"mig": {"layout": "all-1g.10gb"}}),
                sliced_pool("shared", {"timeSlicing": {"replicas": 4}}),
            ],
            [team("a", 0, ["mig"]), team("b", 0, ["shared"])],
            gpu={"devicePlugin": "gpu-operator"},
        )
    )


def test_gpu_operator_values_are_the_charts() -> None:
    chart = yaml.safe_load(upstream("gpu-operator", "v26.3.0:deployments/gpu-operator/values.yaml"))
    ours = device_plugins.gpu_operator_values(both_kinds())
    assert {"mig", "migManager", "dcgmExporter"} <= set(ours)
    assert unknown_keys(ours, chart) == []
    assert chart["mig"]["strategy"] == "single"  # why trainstack sets mixed
    assert chart["dcgmExporter"]["enabled"] is True  # why trainstack turns it off
    config = ours["devicePlugin"]["config"]
    assert set(config) == set(chart["devicePlugin"]["config"])  # create, name, default, data


def test_device_plugin_values_are_the_charts() -> None:
    chart = yaml.safe_load(
        upstream("device-plugin", "v0.18.2:deployments/helm/nvidia-device-plugin/values.yaml")
    )
    cfg = both_kinds()
    ours = device_plugins.nvidia_device_plugin_values(cfg)
    assert unknown_keys(ours, chart) == []
    assert set(ours["config"]) <= set(chart["config"])


def _json_fields(source: str) -> set[str]:
    return set(re.findall(r'json:"([A-Za-z]+)', source))


def test_time_slicing_config_uses_the_plugins_config_fields() -> None:
    fields = set()
    for name in ("config.go", "sharing.go", "replicas.go"):
        fields |= _json_fields(upstream("device-plugin", f"v0.18.2:api/config/v1/{name}"))
    cfg = both_kinds()
    configs = device_plugins.device_plugin_configs(cfg)
    shared = cfg.pool("shared")
    assert shared is not None
    chosen = pools.sharing_node_labels(shared)[pools.DEVICE_PLUGIN_CONFIG_LABEL]
    doc = yaml.safe_load(configs[chosen])  # what sigs.k8s.io/yaml reads
    assert doc == json.loads(configs[chosen])

    def keys(value: Any) -> set[str]:
        if isinstance(value, dict):
            return set(value) | {k for v in value.values() for k in keys(v)}
        if isinstance(value, list):
            return {k for v in value for k in keys(v)}
        return set()

    assert keys(doc) <= fields, keys(doc) - fields
    assert doc["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert yaml.safe_load(configs["default"]) == {"version": "v1"}
