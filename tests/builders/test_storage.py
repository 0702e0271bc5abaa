"""Issue 15 #2, issue 24 #1: the node cache agent gets a dedicated directory, never the array.

Upstream behaviour these tests encode (read at the versions the platform uses):

- amazon-eks-ami v20260724, templates/al2023/runtime/bin/setup-local-disks: `raid0` mounts
  the array at `/mnt/k8s-disks/0` and bind-mounts `/var/lib/kubelet`, `/var/lib/containerd`,
  `/var/lib/soci-snapshotter-grpc` and `/var/log/pods` from `<array>/<basename>`. nodeadm runs
  it in its *run* phase (nodeadm/cmd/nodeadm/init/init.go: `NewLocalDiskAspect` among the run
  aspects), from nodeadm-run.service, which is ordered `After=cloud-final.service`
  (templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-run.service): user-data shell
  parts run *before* the array exists, and nodeadm then (re)starts kubelet
  (nodeadm/internal/kubelet/daemon.go EnsureRunning -> RestartUnit, mode "replace").
- The cache agent (builders/cache.py) evicts what is under its hostPath (hostDir): so hostDir
  must be the cache's own directory, never the array or nodeadm's state.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from trainstack.builders import cache as cache_b
from trainstack.builders import pools
from trainstack.config import PlatformConfig, load_stack_file
from trainstack.config.model import NvmeCache

ROOT = Path(__file__).resolve().parent.parent.parent
ARRAY = "/mnt/k8s-disks/0"  # setup-local-disks: array_mount_point="${MNT_DIR}/0"
NODEADM_ON_ARRAY = ("kubelet", "containerd", "soci-snapshotter-grpc", "pods")


def platform(stack: str) -> PlatformConfig:
    cfg = load_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    assert isinstance(cfg, PlatformConfig)
    return cfg


@pytest.fixture(scope="module")
def dev() -> PlatformConfig:
    return platform("dev")


def cache_of(cfg: PlatformConfig) -> NvmeCache:
    assert cfg.storage.nvme_cache is not None
    return cfg.storage.nvme_cache


def within(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def agent_cache_dir(cfg: PlatformConfig) -> str:
    volumes = cache_b.daemonset(cfg)["spec"]["template"]["spec"]["volumes"]
    (cache,) = (v for v in volumes if v["name"] == "cache")
    assert cache["hostPath"]["type"] == "Directory"  # never created on the root volume
    path: str = cache["hostPath"]["path"]
    return path


def test_the_agents_directory_is_not_the_array(dev: PlatformConfig) -> None:
    host_dir = agent_cache_dir(dev)
    assert host_dir not in ("/mnt/k8s-disks", "/mnt/k8s-disks/", ARRAY)
    # Neither inside the array nor above it: the array root is never under the agent.
    assert not within(host_dir, "/mnt/k8s-disks")
    assert not within("/mnt/k8s-disks", host_dir)


def pool_with_raid0(cfg: PlatformConfig) -> pools.GpuPool:
    return next(p for p in cfg.gpu_pools if p.aws is not None and p.aws.instance_store_raid0)


def shell_part(user_data: str, marker: str) -> str:
    """The text/x-shellscript MIME part containing `marker`."""
    parts = re.split(r"^--TRAINSTACK-BOUNDARY.*$", user_data, flags=re.MULTILINE)
    found = [p for p in parts if "Content-Type: text/x-shellscript" in p and marker in p]
    assert len(found) == 1, user_data
    return found[0].split("\n\n", 1)[1]


def node_script(user_data: str) -> str:
    """The script the user data installs for systemd to run on every boot."""
    part = shell_part(user_data, pools.CACHE_SETUP_SCRIPT)
    match = re.search(
        rf"cat > {re.escape(pools.CACHE_SETUP_SCRIPT)} <<'(\w+)'\n(.*?)\n\1\n", part, re.DOTALL
    )
    assert match, part
    return match.group(2) + "\n"


def run_with_shims(script: str, tmp_path: Path, *, array_mounted: bool) -> list[list[str]]:
    """Run the node script with mountpoint/mount/mkdir/install/chown replaced by loggers.

    Nothing on this machine is touched; the log is the sequence of filesystem changes the
    script would make on a node.
    """
    shims = tmp_path / "shims"
    shims.mkdir()
    log = tmp_path / "calls"
    for name in ("mount", "mkdir", "install", "chown", "chmod", "rm", "ln", "cp", "mv"):
        shim = shims / name
        shim.write_text(
            f'#!/bin/sh\nprintf "%s\\0" {name} "$@" >> "{log}"; printf "\\n" >> "{log}"\n'
        )
        shim.chmod(0o755)
    mounted = f'[ "$2" = "{ARRAY}" ] && exit 0' if array_mounted else ""
    (shims / "mountpoint").write_text(f"#!/bin/sh\n{mounted}\nexit 1\n")
    (shims / "mountpoint").chmod(0o755)
    path = tmp_path / "script.sh"
    path.write_text(script)
    proc = subprocess.run(
        ["/bin/bash", str(path)],
        env={"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines()] if log.exists() else []
    if not array_mounted:
        assert proc.returncode != 0, "must fail, and publish nothing, without the array"
    else:
        assert proc.returncode == 0, proc.stderr
    return calls


def bind_mounts(calls: list[list[str]]) -> list[tuple[str, str]]:
    result = []
    for call in calls:
        if call[0] == "mount":
            assert call[1:2] == ["--bind"], call
            result.append((call[2], call[3]))
    return result


def test_user_data_bind_mounts_one_cache_directory_of_the_array(
    dev: PlatformConfig, tmp_path: Path
) -> None:
    cache = cache_of(dev)
    user_data = pools.node_user_data(pool_with_raid0(dev), cache)
    calls = run_with_shims(node_script(user_data), tmp_path, array_mounted=True)
    ((source, target),) = bind_mounts(calls)
    assert target == cache.host_dir == agent_cache_dir(dev)
    assert within(source, ARRAY)
    assert source != ARRAY
    nodeadm = [posixpath.join(ARRAY, d) for d in NODEADM_ON_ARRAY]
    assert not any(within(n, source) or within(source, n) for n in nodeadm)
    created = [c for c in calls if c[0] in ("install", "mkdir")]
    assert [c[-1] for c in created] == [source, target]  # made before the mount
    assert created[0][created[0].index("-o") : created[0].index("-o") + 2] == ["-o", "0"]


def test_no_array_no_cache_directory(dev: PlatformConfig, tmp_path: Path) -> None:
    """If nodeadm made no array (no instance store found), nothing is created or mounted:
    the directory would otherwise land on the root volume."""
    user_data = pools.node_user_data(pool_with_raid0(dev), cache_of(dev))
    calls = run_with_shims(node_script(user_data), tmp_path, array_mounted=False)
    assert calls == []


def test_the_unit_runs_after_the_array_and_before_kubelet(dev: PlatformConfig) -> None:
    user_data = pools.node_user_data(pool_with_raid0(dev), cache_of(dev))
    part = shell_part(user_data, pools.CACHE_SETUP_SCRIPT)
    unit = re.search(r"cat > /etc/systemd/system/(\S+) <<'(\w+)'\n(.*?)\n\2\n", part, re.DOTALL)
    assert unit, part
    name, _, body = unit.groups()
    lines = [line.strip() for line in body.splitlines()]
    assert f"RequiresMountsFor={ARRAY}" in lines
    assert "Before=kubelet.service" in lines
    assert "WantedBy=kubelet.service" in lines
    assert f"ExecStart={pools.CACHE_SETUP_SCRIPT}" in lines
    assert "Type=oneshot" in lines
    assert "RemainAfterExit=yes" in lines
    commands = [shlex.split(line) for line in part.splitlines() if line.startswith("systemctl")]
    assert ["systemctl", "enable", name] in commands


def test_user_data_without_cache_or_without_raid0(dev: PlatformConfig) -> None:
    pool = pool_with_raid0(dev)
    assert pools.CACHE_SETUP_SCRIPT not in pools.node_user_data(pool, None)
    assert pool.aws is not None
    no_store = dataclasses.replace(
        pool, aws=dataclasses.replace(pool.aws, instance_store_raid0=False)
    )
    assert pools.CACHE_SETUP_SCRIPT not in pools.node_user_data(no_store, cache_of(dev))


def test_existing_clusters_use_the_operators_directory() -> None:
    assert agent_cache_dir(platform("onprem")) == "/mnt/nvme"


def test_scripts_parse(dev: PlatformConfig) -> None:
    user_data = pools.node_user_data(pool_with_raid0(dev), cache_of(dev))
    for script in (node_script(user_data), shell_part(user_data, pools.CACHE_SETUP_SCRIPT)):
        check = subprocess.run(["/bin/bash", "-n"], input=script, text=True, check=False)
        assert check.returncode == 0
