"""Issue 37: a pod sees only the GPUs it was allocated, not every GPU of its node.

Upstream behaviour these tests encode (read at the versions the platform uses; docs/security.md):

- amazon-eks-ami v20260724 (nodeadm `runtime_config_nvidia.go`, containerd
  `config2.template.toml`): `nvidia` is containerd's default runtime on GPU instances, and the
  AMI leaves the container toolkit's package defaults (`accept-nvidia-visible-devices-envvar-
  when-unprivileged = true`, `...-as-volume-mounts = false`), so an unprivileged container whose
  image or spec sets NVIDIA_VISIBLE_DEVICES=all gets every GPU of the node.
- nvidia-container-toolkit v1.19.1: both settings are top-level keys of
  /etc/nvidia-container-runtime/config.toml, read at every container create (no restart),
  and `nvidia-ctk config --in-place --set key=value` writes them.
- NVIDIA/k8s-device-plugin v0.18.2 values.yaml: `deviceListStrategy: volume-mounts` hands each
  allocated GPU as a mount under /var/run/nvidia-container-devices/<UUID>
  (`deviceIDStrategy: uuid`), which the toolkit then honours instead of the variable.
- gpu-operator v26.3.0: `devicePlugin.env` DEVICE_LIST_STRATEGY; its toolkit is off here (the
  AMI's), so the node's user data sets the toolkit on that path too.

The kernel and runtime side cannot run here (no GPU, no containerd): these pin what the
platform renders for them.
"""

from __future__ import annotations

import dataclasses
import email
import shlex
from pathlib import Path
from typing import Any

import pytest

from trainstack.builders import device_plugins, pools
from trainstack.config import PlatformConfig, load_stack_file

ROOT = Path(__file__).resolve().parent.parent.parent
NVIDIA_CTK = (
    "nvidia-ctk config --in-place "
    "--set accept-nvidia-visible-devices-as-volume-mounts=true "
    "--set accept-nvidia-visible-devices-envvar-when-unprivileged=false"
)


def platform(stack: str, **gpu: Any) -> PlatformConfig:
    cfg = load_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    assert isinstance(cfg, PlatformConfig)
    return dataclasses.replace(cfg, **gpu)


def shell_parts(user_data: str) -> list[str]:
    message = email.message_from_string(user_data)
    return [
        str(part.get_payload())
        for part in message.walk()
        if part.get_content_type() == "text/x-shellscript"
    ]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_aws_gpu_node_refuses_the_variable_from_unprivileged_containers(stack: str) -> None:
    cfg = platform(stack)
    assert cfg.gpu_device_list_strategy == "volume-mounts"  # the default on aws
    for pool in cfg.gpu_pools:
        user_data = pools.node_user_data(pool, cfg.storage.nvme_cache)
        scripts = shell_parts(user_data)
        isolation = [s for s in scripts if "nvidia-ctk" in s]
        assert len(isolation) == 1, pool.name
        assert NVIDIA_CTK in isolation[0].splitlines()
        assert "set -euo pipefail" in isolation[0]  # a node that cannot set it does not join
        shlex.split(isolation[0].splitlines()[-1])  # well-formed shell


def test_the_device_plugin_hands_gpus_as_mounts_by_uuid() -> None:
    values = device_plugins.nvidia_device_plugin_values(platform("dev"))
    assert values["deviceListStrategy"] == "volume-mounts"
    assert values["deviceIDStrategy"] == "uuid"
    operator = device_plugins.gpu_operator_values(platform("dev", gpu_device_plugin="gpu-operator"))
    assert operator["devicePlugin"]["env"] == [
        {"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"}
    ]
    assert operator["toolkit"] == {"enabled": False}  # the node's, set by its user data


def test_envvar_leaves_node_and_plugin_as_upstream_ships_them() -> None:
    """Both change together or not at all: a toolkit that ignores the variable under a plugin
    that passes GPUs by it would leave GPU pods without their GPUs, silently."""
    cfg = platform("dev", gpu_device_list_strategy="envvar")
    for pool in cfg.gpu_pools:
        user_data = pools.node_user_data(pool, cfg.storage.nvme_cache, isolate_gpus=False)
        assert "nvidia-ctk" not in user_data
    assert "deviceListStrategy" not in device_plugins.nvidia_device_plugin_values(cfg)
    assert "devicePlugin" not in device_plugins.gpu_operator_values(cfg)


def test_existing_clusters_opt_in() -> None:
    """The owners' nodes: trainstack cannot set their toolkit, so the plugin keeps its default
    unless the stack says the nodes are set (docs/security.md, Known gaps)."""
    cfg = platform("onprem")
    assert cfg.gpu_device_list_strategy == "envvar"
    assert "deviceListStrategy" not in device_plugins.nvidia_device_plugin_values(cfg)
    opted = dataclasses.replace(cfg, gpu_device_list_strategy="volume-mounts")
    assert (
        device_plugins.nvidia_device_plugin_values(opted)["deviceListStrategy"] == "volume-mounts"
    )
