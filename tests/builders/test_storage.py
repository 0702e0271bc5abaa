"""Issue 15 #2: the NVMe cache class publishes dedicated directories, never the array.

Upstream behaviour these tests encode (read at the versions the platform uses):

- amazon-eks-ami v20260724, templates/al2023/runtime/bin/setup-local-disks: `raid0` mounts
  the array at `/mnt/k8s-disks/0` and bind-mounts `/var/lib/kubelet`, `/var/lib/containerd`,
  `/var/lib/soci-snapshotter-grpc` and `/var/log/pods` from `<array>/<basename>`. nodeadm runs
  it in its *run* phase (nodeadm/cmd/nodeadm/init/init.go: `NewLocalDiskAspect` among the run
  aspects), from nodeadm-run.service, which is ordered `After=cloud-final.service`
  (templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-run.service): user-data shell
  parts run *before* the array exists, and nodeadm then (re)starts kubelet
  (nodeadm/internal/kubelet/daemon.go EnsureRunning -> RestartUnit, mode "replace").
- sig-storage-local-static-provisioner v2.8.0 (chart 2.8.0): discovery makes one PV per entry
  of the class's directory that is a mount point in /proc/mounts, and skips the others
  (pkg/discovery/discovery.go discoverVolumesAtPath; pkg/util/volume_util_linux.go
  IsLikelyMountPoint); with reclaimPolicy Delete it removes everything under a released PV's
  path (pkg/deleter/deleter.go cleanFilePV -> pkg/util/volume_util.go DeleteContents). The
  chart mounts hostDir with mountPropagation HostToContainer
  (helm/provisioner/templates/daemonset_linux.yaml).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import posixpath
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from trainstack.builders import pools
from trainstack.builders.storage import local_provisioner_values
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


def test_the_discovery_directory_is_not_the_array(dev: PlatformConfig) -> None:
    (cls,) = local_provisioner_values(dev)["classes"]
    host_dir = cls["hostDir"]
    assert host_dir not in ("/mnt/k8s-disks", "/mnt/k8s-disks/", ARRAY)
    # Neither inside the array nor above it: the array root is never one of its entries.
    assert not within(host_dir, "/mnt/k8s-disks")
    assert not within("/mnt/k8s-disks", host_dir)
    assert cls.get("mountDir", host_dir) == host_dir
    assert cls["storageClass"]["reclaimPolicy"] == "Delete"  # so cleaning must be confined


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


@pytest.mark.parametrize("count", [1, 3, 8])
def test_user_data_creates_n_directories_and_bind_mounts_them(
    dev: PlatformConfig, tmp_path: Path, count: int
) -> None:
    cache = dataclasses.replace(cache_of(dev), volumes_per_node=count)
    user_data = pools.node_user_data(pool_with_raid0(dev), cache)
    calls = run_with_shims(node_script(user_data), tmp_path, array_mounted=True)
    binds = bind_mounts(calls)
    assert len(binds) == count
    sources = [s for s, _ in binds]
    targets = [t for _, t in binds]
    assert len(set(sources)) == count
    assert len(set(targets)) == count
    assert {posixpath.dirname(t) for t in targets} == {cache.host_dir}
    for source in sources:
        assert within(source, ARRAY)
        assert source != ARRAY
    created = [c[-1] for c in calls if c[0] in ("install", "mkdir")]
    assert set(sources) <= set(created)  # each source directory is created before its mount
    owners = [c for c in calls if c[0] == "install" and c[-1] in sources]
    assert owners
    assert all(c[c.index("-o") : c.index("-o") + 2] == ["-o", "10001"] for c in owners)


def test_no_array_no_cache_volumes(dev: PlatformConfig, tmp_path: Path) -> None:
    """If nodeadm made no array (no instance store found), nothing is created or mounted:
    the directories would otherwise land on the root volume."""
    user_data = pools.node_user_data(pool_with_raid0(dev), cache_of(dev))
    calls = run_with_shims(node_script(user_data), tmp_path, array_mounted=False)
    assert calls == []


def test_reclaim_deletion_can_only_touch_the_cache_directories(
    dev: PlatformConfig, tmp_path: Path
) -> None:
    """What the provisioner would discover under hostDir, and so delete on reclaim, is
    exactly the bind-mounted cache directories: not the array, not nodeadm's state."""
    cache = cache_of(dev)
    (cls,) = local_provisioner_values(dev)["classes"]
    user_data = pools.node_user_data(pool_with_raid0(dev), cache)
    calls = run_with_shims(node_script(user_data), tmp_path, array_mounted=True)
    binds = {t: s for s, t in bind_mounts(calls)}
    # Every entry the node gets under the discovery directory is one of those mount points.
    entries = {
        c[-1]
        for c in calls
        if c[0] in ("install", "mkdir") and posixpath.dirname(c[-1]) == cls["hostDir"]
    }
    assert entries == set(binds)
    pattern = cls.get("namePattern", "*")
    discovered = [
        t
        for t in binds
        if any(fnmatch.fnmatch(posixpath.basename(t), p) for p in pattern.split(","))
    ]
    assert sorted(discovered) == sorted(binds)
    # DeleteContents(PV path) removes what is under the mount point, i.e. under its source.
    deletable = [binds[t] for t in discovered]
    nodeadm = [posixpath.join(ARRAY, d) for d in NODEADM_ON_ARRAY]
    for source in deletable:
        assert source != ARRAY
        assert not any(within(n, source) or within(source, n) for n in nodeadm), source
    for a in deletable:
        assert not any(a != b and (within(a, b) or within(b, a)) for b in deletable)


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


def test_default_count_gives_a_volume_per_gpu_on_8_gpu_nodes(dev: PlatformConfig) -> None:
    assert cache_of(dev).volumes_per_node == 8


def test_existing_clusters_discover_the_operators_directory() -> None:
    cfg = platform("onprem")
    (cls,) = local_provisioner_values(cfg)["classes"]
    assert cls["hostDir"] == "/mnt/nvme"
    assert "namePattern" not in cls  # every mount point the operator prepared is a volume


def test_scripts_parse(dev: PlatformConfig) -> None:
    user_data = pools.node_user_data(pool_with_raid0(dev), cache_of(dev))
    for script in (node_script(user_data), shell_part(user_data, pools.CACHE_SETUP_SCRIPT)):
        check = subprocess.run(["/bin/bash", "-n"], input=script, text=True, check=False)
        assert check.returncode == 0
