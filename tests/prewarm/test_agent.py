"""Issue 24 #1: the node agent's CSI node service, end to end over a unix socket.

A real gRPC server (the CSI spec's stubs, generated at build time) on a unix socket, a real
fetch from moto's S3 server, real holds and eviction on a temp cache; only the mount is a
recording stand-in (mounting needs CAP_SYS_ADMIN), except in the last test, which runs the
real `mount --bind` + read-only remount inside a user and mount namespace where `unshare`
allows it. What this does and does not prove: docs/testing.md, "Dataset cache agent".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.wrappers_pb2 import BoolValue
from trainstack_prewarm import cache, csi_proto
from trainstack_prewarm.agent import CacheAgent, SystemMounter, VersionRequest
from trainstack_prewarm.cli import build_agent, build_parser, main
from trainstack_prewarm.csi import DRIVER_NAME, RESERVED_WORKERS, serve
from trainstack_prewarm.errors import ExitCode, SourceError
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.location import open_source
from trainstack_prewarm.sources import ListPage, Source

from tests.prewarm.conftest import (
    LogCapture,
    S3Faults,
    S3Server,
    make_files,
    read_tree,
    unshare_works,
    upload,
    write_tree,
)

NODE = "node-a"


@pytest.fixture(scope="module")
def csi() -> tuple[Any, Any]:
    """The generated CSI modules (`make setup` generates them; else generate them here)."""
    try:
        return csi_proto.load()
    except csi_proto.CsiProtoMissing:
        csi_proto.generate()
        return csi_proto.load()


@dataclass
class RecordingMounter:
    """Records mounts instead of making them (the real one needs CAP_SYS_ADMIN)."""

    mounted: dict[Path, Path] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bind_read_only(self, source: Path, target: Path) -> None:
        with self.lock:
            assert target.is_dir(), "the target directory exists before the mount"
            self.calls.append(("bind-ro", str(target)))
            self.mounted[target] = source

    def unmount(self, target: Path) -> None:
        with self.lock:
            self.calls.append(("umount", str(target)))
            del self.mounted[target]

    def is_mounted(self, target: Path) -> bool:
        with self.lock:
            return target in self.mounted


@dataclass
class Node:
    """One node: its agent, its CSI socket, and the stubs the kubelet would use."""

    agent: CacheAgent
    node: Any
    identity: Any
    pb2: Any
    faults: S3Faults
    mounter: RecordingMounter
    root: Path
    pods: Path
    socket: Path

    def publish(
        self,
        volume_id: str,
        dataset: str,
        version: str,
        source: str,
        *,
        timeout: float = 60,
        readonly: bool = True,
    ) -> Path:
        target = self.pods / volume_id / "mount"
        target.parent.mkdir(parents=True, exist_ok=True)  # the kubelet makes the parent
        self.node.NodePublishVolume(
            self.pb2.NodePublishVolumeRequest(
                volume_id=volume_id,
                target_path=str(target),
                readonly=readonly,
                volume_capability=self.pb2.VolumeCapability(
                    mount=self.pb2.VolumeCapability.MountVolume(),
                    access_mode=self.pb2.VolumeCapability.AccessMode(mode=1),
                ),
                volume_context={
                    "source": source,
                    "dataset": dataset,
                    "version": version,
                    "csi.storage.k8s.io/ephemeral": "true",
                    "csi.storage.k8s.io/pod.namespace": "team-a",
                    "csi.storage.k8s.io/pod.name": volume_id,
                },
            ),
            timeout=timeout,
        )
        return target

    def unpublish(self, volume_id: str) -> None:
        target = self.pods / volume_id / "mount"
        self.node.NodeUnpublishVolume(
            self.pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target)),
            timeout=30,
        )


@pytest.fixture
def make_node(
    csi: tuple[Any, Any], s3_server: S3Server, bucket: str, tmp_path: Path
) -> Iterator[Callable[..., Node]]:
    servers: list[Any] = []
    sockets = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))  # unix paths: 108 bytes max

    def make(
        *,
        gate: threading.Event | None = None,
        root: Path | None = None,
        name: str = "agent",
        mounter: RecordingMounter | None = None,
        workers: int = 16,
        allowed: list[str] | None = None,
        wrap: Callable[[Source], Source] | None = None,
    ) -> Node:
        pb2, stubs = csi
        client = s3_server.client()
        faults = S3Faults(client)
        logs = LogCapture()
        root = root or tmp_path / "cache"
        allowed_sources = allowed if allowed is not None else [f"s3://{bucket}/"]

        def fill(req: VersionRequest) -> object:
            if gate is not None:
                assert gate.wait(30)
            # As the agent opens a source (cli._agent): confined to its allowed prefixes.
            source = open_source(
                req.source, s3_client_factory=lambda: client, within=allowed_sources
            )
            if wrap is not None:
                source = wrap(source)
            options = FetchOptions(concurrency=4, start_jitter_s=0.0)
            return Fetcher(source, root, req.dataset, req.version, options=options, log=logs).run()

        mounter = mounter or RecordingMounter()
        agent = CacheAgent(
            root,
            fill=fill,
            mounter=mounter,
            allowed_sources=allowed_sources,
            log=logs,
        )
        agent.recover()  # as the agent does before it serves
        sock = sockets / f"{name}.sock"
        server = serve(agent, f"unix://{sock}", NODE, workers=workers)
        servers.append(server)
        channel = grpc.insecure_channel(f"unix://{sock}")
        return Node(
            agent,
            stubs.NodeStub(channel),
            stubs.IdentityStub(channel),
            pb2,
            faults,
            mounter,
            root,
            tmp_path / "pods",
            sock,
        )

    yield make
    for server in servers:
        server.stop(grace=None)
    shutil.rmtree(sockets, ignore_errors=True)


def test_identity_and_node_info(make_node: Callable[..., Node]) -> None:
    node = make_node()
    info = node.identity.GetPluginInfo(node.pb2.GetPluginInfoRequest(), timeout=10)
    assert info.name == DRIVER_NAME
    caps = node.node.NodeGetCapabilities(node.pb2.NodeGetCapabilitiesRequest(), timeout=10)
    assert list(caps.capabilities) == []  # no staging: publish does everything
    assert node.node.NodeGetInfo(node.pb2.NodeGetInfoRequest(), timeout=10).node_id == NODE


def test_two_pods_on_one_node_share_one_fetch_and_hold_it_against_an_evictor(
    make_node: Callable[..., Node], s3_server: S3Server, bucket: str
) -> None:
    files = make_files(6, salt="shared")
    upload(s3_server.client(), bucket, "imagenet/v3", files)
    source = f"s3://{bucket}/imagenet/v3/"
    gate = threading.Event()
    node = make_node(gate=gate)

    # Pod A's publish outlasts its call while the fill is held back: ABORTED, the kubelet
    # retries. Its gRPC deadline (6 s) leaves it 1 s of waiting (5 s margin).
    with pytest.raises(grpc.RpcError) as pending:
        node.publish("csi-pod-a", "imagenet", "v3", source, timeout=6)
    assert pending.value.code() == grpc.StatusCode.ABORTED
    assert "still being fetched" in (pending.value.details() or "")

    # Pod B arrives while the fill runs: it joins that fill rather than starting another.
    done_b: list[Path] = []
    b = threading.Thread(target=lambda: done_b.append(node.publish("csi-pod-b", "imagenet",
                                                                   "v3", source)))  # fmt: skip
    b.start()
    logs = node.agent.log
    assert isinstance(logs, LogCapture)
    for _ in range(600):
        if logs.events("fill_joined"):
            break
        threading.Event().wait(0.05)
    assert logs.events("fill_joined"), "pod B joined the fill under way"
    gate.set()
    b.join(timeout=60)
    target_a = node.publish("csi-pod-a", "imagenet", "v3", source)  # the kubelet's retry

    # One fetch for the node: every object read exactly once, one listing.
    keys = sorted(f"imagenet/v3/{k}" for k in files)
    assert sorted(node.faults.gets()) == keys
    assert [op for op, _ in node.faults.requests].count("ListObjectsV2") == 1
    vdir = node.root / "imagenet" / "v3"
    # Both pods have the version directory mounted read-only at their own target.
    assert node.mounter.mounted == {target_a: vdir, done_b[0]: vdir}
    assert read_tree(vdir) == files
    assert node.agent.published() == {"csi-pod-a": vdir, "csi-pod-b": vdir}

    # An evictor cannot take a version any pod has mounted; an older, unmounted one goes.
    upload(s3_server.client(), bucket, "coco/v1", make_files(2, salt="old"))
    node.publish("csi-pod-c", "coco", "v1", f"s3://{bucket}/coco/v1/")
    node.unpublish("csi-pod-c")
    assert cache.evict(node.root, high_water=0) == [node.root / "coco" / "v1"]
    assert vdir.is_dir()
    node.unpublish("csi-pod-a")
    assert cache.evict(node.root, high_water=0) == []  # pod B still has it
    node.unpublish("csi-pod-b")
    node.unpublish("csi-pod-b")  # NodeUnpublishVolume is idempotent
    assert node.mounter.mounted == {}
    assert not target_a.exists()  # the plugin removes the target it published
    assert cache.evict(node.root, high_water=0) == [vdir]


def test_a_publish_answers_within_the_kubelets_deadline_while_a_repair_holds_the_version(
    make_node: Callable[..., Node], s3_server: S3Server, bucket: str
) -> None:
    """Also check of issue 39: after its fill, a publish took the version's hold with the
    agent's own timeout (60 s), past the kubelet's deadline, and mounted once a repair let
    go: a mount the kubelet, whose call had failed, did not know of. Now the hold waits only
    for what is left of the call's budget, the answer is ABORTED in time, nothing is mounted,
    and the kubelet's retry after the repair mounts it."""
    upload(s3_server.client(), bucket, "ds/v1", make_files(2))
    source = f"s3://{bucket}/ds/v1/"
    node = make_node()
    node.publish("csi-pod-a", "ds", "v1", source)  # filled and mounted once
    node.unpublish("csi-pod-a")
    vdir = node.root / "ds" / "v1"
    with cache.hold(vdir, shared=False):  # a repair (or an eviction) has it
        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as held:
            node.publish("csi-pod-b", "ds", "v1", source, timeout=7)  # 2 s of budget
        assert held.value.code() == grpc.StatusCode.ABORTED, held.value.details()
        assert time.monotonic() - began < 7  # answered, not timed out
        time.sleep(1)
        assert node.mounter.mounted == {}
        assert node.agent.published() == {}
    target = node.publish("csi-pod-b", "ds", "v1", source)  # the kubelet's retry
    assert node.mounter.mounted == {target: vdir}


def test_a_restarted_agent_retakes_the_holds_of_mounted_volumes(
    make_node: Callable[..., Node], s3_server: S3Server, bucket: str
) -> None:
    upload(s3_server.client(), bucket, "ds/v1", make_files(3))
    first = make_node(name="first")
    first.publish("csi-pod-a", "ds", "v1", f"s3://{bucket}/ds/v1/")
    # The agent's process ends (upgrade, crash): its flocks go with it, the mount stays.
    for published in list(first.agent._published.values()):
        published.holding.close()
    vdir = first.root / "ds" / "v1"
    # The new agent sees the node's mount table (here: the same recording mounter).
    second = make_node(name="second", root=first.root, mounter=first.mounter)
    assert second.agent.published() == {"csi-pod-a": vdir}
    assert cache.evict(first.root, high_water=0) == []
    second.unpublish("csi-pod-a")
    assert cache.evict(first.root, high_water=0) == [vdir]
    assert len(second.faults.gets()) == 0  # the new agent fetched nothing


def test_a_source_outside_the_platforms_prefixes_is_refused(
    make_node: Callable[..., Node],
) -> None:
    node = make_node()
    with pytest.raises(grpc.RpcError) as refused:
        node.publish("csi-pod-x", "ds", "v1", "s3://someone-elses-bucket/ds/v1/")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not under an allowed prefix" in (refused.value.details() or "")
    assert node.faults.requests == []
    assert node.mounter.calls == []


def test_a_writable_publish_is_refused_before_anything_is_fetched(
    make_node: Callable[..., Node], s3_server: S3Server, bucket: str
) -> None:
    """The kubelet sends `readonly` = the inline volume's `csi.readOnly`, false where the pod
    leaves it out (k8s.io/kubernetes v1.37.2 pkg/volume/csi/csi_plugin.go NewMounter,
    `readOnly = *volSrc.ReadOnly`; csi_mounter.go SetUpAt passes it to NodePublishVolume).
    The agent publishes only shared, read-only versions, so it refuses the request (CSI spec
    v1.12.0, "Error Scheme": a field the plugin does not allow is INVALID_ARGUMENT, and the
    caller must fix it) rather than publish read-only what was asked for writable."""
    upload(s3_server.client(), bucket, "ds/v4", make_files(2))
    node = make_node()
    with pytest.raises(grpc.RpcError) as refused:
        node.publish("csi-pod-w", "ds", "v4", f"s3://{bucket}/ds/v4/", readonly=False)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "csi.readOnly: true" in (refused.value.details() or "")
    assert node.faults.requests == []  # refused before any fill
    assert node.mounter.calls == []
    node.publish("csi-pod-w", "ds", "v4", f"s3://{bucket}/ds/v4/")  # fixed: published


def test_a_failed_fill_is_reported_and_the_next_publish_tries_again(
    make_node: Callable[..., Node], s3_server: S3Server, bucket: str
) -> None:
    upload(s3_server.client(), bucket, "ds/v2", make_files(2))
    node = make_node()
    node.faults.error("AccessDenied", 403, op="ListObjectsV2", times=1)
    with pytest.raises(grpc.RpcError) as failed:
        node.publish("csi-pod-a", "ds", "v2", f"s3://{bucket}/ds/v2/")
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # SourceError: exit 4
    assert node.mounter.calls == []
    node.publish("csi-pod-a", "ds", "v2", f"s3://{bucket}/ds/v2/")
    assert node.agent.fills_started == 2


def test_a_publish_checks_marker_and_sizes_without_reading_the_dataset(
    make_node: Callable[..., Node],
    s3_server: S3Server,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 39 #2: every pod start publishes, so a publish that hashed the version would read
    all of it per pod (a 1 TB version: minutes, past the kubelet's CSI deadline, N times at
    once for N pods). The fill hashes every byte on the way in before it writes the marker;
    a publish checks the marker and the sizes, as docs/prewarm.md says."""
    files = make_files(4, salt="big")
    upload(s3_server.client(), bucket, "ds/v5", files)
    node = make_node()
    node.publish("csi-pod-a", "ds", "v5", f"s3://{bucket}/ds/v5/")  # fills (and hashes) it
    hashed: list[Path] = []
    real_hash = cache.hash_file

    def counting(path: Path) -> tuple[int, str]:
        hashed.append(path)
        return real_hash(path)

    monkeypatch.setattr(cache, "hash_file", counting)
    node.publish("csi-pod-b", "ds", "v5", f"s3://{bucket}/ds/v5/")
    assert hashed == [], "a publish of a complete version reads none of its files"
    # Sizes are still checked: once no pod holds it, a truncated file is found by the next
    # publish's fill and fetched again (a repair waits for the holds to end).
    node.unpublish("csi-pod-a")
    node.unpublish("csi-pod-b")
    vdir = node.root / "ds" / "v5"
    victim = sorted(files)[0]
    os.truncate(vdir / victim, 10)
    node.publish("csi-pod-c", "ds", "v5", f"s3://{bucket}/ds/v5/")
    assert (vdir / victim).read_bytes() == files[victim]


# ---- directory sources: a shared file system that other people can write -------------------

SECRET = b"-----BEGIN PRIVATE KEY----- not the dataset's"


@pytest.fixture
def shared_fs(tmp_path: Path) -> Path:
    """A Lustre-like tree: the allowed source root `sets/`, a sibling `setsX/`, and what
    the agent (privileged, root) can read but no team may: `secret/`."""
    fs = tmp_path / "fsx"
    write_tree(fs / "sets" / "ds" / "v1", {"a.bin": b"dataset", "sub/b.bin": b"more"})
    write_tree(fs / "setsX" / "ds" / "v1", {"key.pem": SECRET})
    write_tree(fs / "secret" / "v1", {"key.pem": SECRET, "sub/b.bin": SECRET})
    return fs


def _cache_holds_no_secret(root: Path) -> None:
    """Nothing outside the source was read into the cache: no file (temp files included)."""
    if not root.exists():
        return
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET not in path.read_bytes(), f"{path} holds bytes from outside the source"


@pytest.mark.parametrize(
    ("allowed", "source"),
    [
        ("{fs}/sets/", "{fs}/sets/../secret/v1/"),  # traversal out of the root
        ("{fs}/sets/", "{fs}/sets/ds/./../../secret/v1/"),
        ("{fs}/sets/", "{fs}/sets//ds/v1/"),  # not normalised: an empty segment
        ("{fs}/sets", "{fs}/setsX/ds/v1/"),  # a sibling sharing the prefix's characters
    ],
    ids=["dotdot", "dot-dotdot", "empty-segment", "sibling"],
)
def test_a_directory_source_outside_its_root_is_refused_before_any_read(
    make_node: Callable[..., Node], shared_fs: Path, allowed: str, source: str
) -> None:
    node = make_node(allowed=[allowed.format(fs=shared_fs)])
    with pytest.raises(grpc.RpcError) as refused:
        node.publish("csi-pod-t", "ds", "v1", source.format(fs=shared_fs))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert node.agent.fills_started == 0
    assert node.mounter.calls == []
    _cache_holds_no_secret(node.root)


def test_a_directory_source_under_its_root_is_fetched(
    make_node: Callable[..., Node], shared_fs: Path
) -> None:
    node = make_node(allowed=[f"{shared_fs}/sets/"])
    node.publish("csi-pod-d", "ds", "v1", f"{shared_fs}/sets/ds/v1/")
    assert read_tree(node.root / "ds" / "v1") == {"a.bin": b"dataset", "sub/b.bin": b"more"}


def _plant(fs: Path, how: str) -> str:
    """Someone who can write the shared file system plants a link; returns the version."""
    version = fs / "sets" / "ds" / "v2"
    write_tree(version, {"a.bin": b"dataset"})
    if how == "file-link":
        (version / "leak.pem").symlink_to(fs / "secret" / "v1" / "key.pem")
    elif how == "dir-link":
        (version / "more").symlink_to(fs / "secret" / "v1")
    elif how == "deep-link":
        write_tree(version / "x" / "y", {"ok.bin": b"ok"})
        (version / "x" / "y" / "z").symlink_to(fs / "secret")
    else:  # the version directory itself
        shutil.rmtree(version)
        version.symlink_to(fs / "secret" / "v1")
    return f"{fs}/sets/ds/v2/"


@pytest.mark.parametrize("how", ["file-link", "dir-link", "deep-link", "version-link"])
def test_a_symlink_planted_in_a_directory_source_is_refused(
    make_node: Callable[..., Node], shared_fs: Path, how: str
) -> None:
    """The agent reads as root; a link in a source others can write must never make it copy
    a file from outside the source (the other teams would read it through the cache)."""
    source = _plant(shared_fs, how)
    node = make_node(allowed=[f"{shared_fs}/sets/"])
    with pytest.raises(grpc.RpcError) as refused:
        node.publish("csi-pod-l", "ds", "v2", source)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "symbolic link" in (refused.value.details() or "")
    assert node.mounter.calls == []
    _cache_holds_no_secret(node.root)


@dataclass
class SwapAfterListing:
    """Lists the real source, then swaps a listed path for a link to a look-alike outside
    it (same sizes and mtimes, so the listing's identities still match): a race between the
    agent's listing and its reads, won by the writer."""

    inner: Source
    victim: Path  # a file, or a directory holding files
    decoy: Path  # the same, outside the source

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list_page(self, token: str | None) -> ListPage:
        page = self.inner.list_page(token)
        pairs = [(self.victim, self.decoy)]
        if self.victim.is_dir():
            pairs = [(f, self.decoy / f.name) for f in self.victim.iterdir()]
        for real, fake in pairs:
            st = real.stat()
            os.utime(fake, ns=(st.st_atime_ns, st.st_mtime_ns))
        shutil.rmtree(self.victim) if self.victim.is_dir() else self.victim.unlink()
        self.victim.symlink_to(self.decoy)
        return page


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_path_swapped_for_a_link_between_listing_and_reading_is_refused(
    make_node: Callable[..., Node], shared_fs: Path, what: str
) -> None:
    version, outside = shared_fs / "sets" / "ds" / "v3", shared_fs / "secret" / "look-alike"
    body = b"d" * len(SECRET)  # the decoys have the listed sizes: only the link differs
    write_tree(version, {"a.bin": body, "sub/b.bin": body})
    write_tree(outside, {"a.bin": SECRET, "sub/b.bin": SECRET})
    victim = version / ("a.bin" if what == "file" else "sub")
    decoy = outside / victim.name
    node = make_node(
        allowed=[f"{shared_fs}/sets/"],
        wrap=lambda inner: SwapAfterListing(inner, victim, decoy),
    )
    with pytest.raises(grpc.RpcError) as refused:
        node.publish("csi-pod-s", "ds", "v3", f"{version}/")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "symbolic link" in (refused.value.details() or "")
    assert node.mounter.calls == []
    _cache_holds_no_secret(node.root)


def test_the_agent_the_cli_builds_reads_directory_sources_beneath_their_root(
    shared_fs: Path, tmp_path: Path
) -> None:
    """`trainstack-prewarm agent`'s own wiring (cli.build_agent), not the harness's: its
    fills open sources within --allow-source, following no link; its mounter stages under
    the cache's .agent directory."""
    args = build_parser().parse_args(
        ["agent", "--cache", str(tmp_path / "cache"), "--allow-source", f"{shared_fs}/sets/",
         "--start-jitter", "0"]
    )  # fmt: skip
    default = build_agent(args, LogCapture())
    assert isinstance(default.mounter, SystemMounter)
    assert default.mounter.staging == tmp_path / "cache" / ".agent" / "staging"
    default.close()
    agent = build_agent(args, LogCapture(), mounter=RecordingMounter())
    target = tmp_path / "pods" / "p" / "mount"
    ok = VersionRequest(f"{shared_fs}/sets/ds/v1/", "ds", "v1")
    assert agent.publish("csi-ok", target, ok, wait_s=30) == tmp_path / "cache" / "ds" / "v1"
    linked = VersionRequest(_plant(shared_fs, "file-link"), "ds", "v2")
    with pytest.raises(SourceError, match="symbolic link"):
        agent.publish("csi-link", target.with_name("other"), linked, wait_s=30)
    agent.close()
    _cache_holds_no_secret(tmp_path / "cache")


def probe_cli(sock: Path, timeout: float = 5) -> subprocess.CompletedProcess[str]:
    """The DaemonSet's liveness command (builders/cache.py), as the kubelet execs it."""
    cmd = ["probe", "--csi-endpoint", f"unix://{sock}", "--timeout", str(timeout)]
    return subprocess.run(
        [sys.executable, "-m", "trainstack_prewarm", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_liveness_probe_passes_on_a_serving_agent_and_fails_without_one(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(name="probed")
    ok = probe_cli(node.socket)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "", "")  # silent every period

    gone = node.socket.with_name("nobody.sock")  # no agent serving: fails at once
    failed = probe_cli(gone)
    assert failed.returncode == ExitCode.UNHEALTHY
    (error,) = [json.loads(line) for line in failed.stderr.splitlines()]
    assert error["event"] == "error"
    assert error["kind"] == "AgentUnhealthyError"
    assert error["error"].startswith(f"CSI Probe on unix://{gone}: UNAVAILABLE")


def test_pods_waiting_for_a_fill_leave_the_liveness_probe_a_thread(
    make_node: Callable[..., Node], s3_server: S3Server, bucket: str
) -> None:
    """Publishes wait up to a minute for a fill on the server's threads; had they taken every
    thread, Probe would time out and the kubelet would restart a busy, healthy agent."""
    upload(s3_server.client(), bucket, "big/v1", make_files(2, salt="busy"))
    source = f"s3://{bucket}/big/v1/"
    gate = threading.Event()
    node = make_node(gate=gate, workers=RESERVED_WORKERS + 1, name="busy")  # one publisher
    done: list[Path] = []
    first = threading.Thread(target=lambda: done.append(node.publish("csi-a", "big", "v1", source)))
    first.start()
    try:
        logs = node.agent.log
        assert isinstance(logs, LogCapture)
        for _ in range(600):  # the first publish is waiting for the held fill
            if logs.events("fill_started") or logs.events("fill_joined"):
                break
            threading.Event().wait(0.05)
        with pytest.raises(grpc.RpcError) as busy:
            node.publish("csi-b", "big", "v1", source, timeout=10)
        assert busy.value.code() == grpc.StatusCode.ABORTED  # the kubelet retries it
        assert "being published on this node" in (busy.value.details() or "")
        assert probe_cli(node.socket).returncode == 0
    finally:
        gate.set()
        first.join(timeout=60)
    assert done
    node.publish("csi-b", "big", "v1", source)  # the retry, once a thread is free


@pytest.fixture
def identity_server(csi: tuple[Any, Any]) -> Iterator[Callable[[Callable[[], Any]], Path]]:
    """A CSI Identity server on a unix socket whose Probe runs ``answer``: a wedged or
    initializing agent, which the real one cannot be made to be on demand."""
    _, stubs = csi
    servers: list[Any] = []
    sockets = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))

    def start(answer: Callable[[], Any]) -> Path:
        class Identity(stubs.IdentityServicer):  # type: ignore[misc]
            def Probe(self, _request: Any, _context: Any) -> Any:
                return answer()

        sock = sockets / f"{len(servers)}.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        stubs.add_IdentityServicer_to_server(Identity(), server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        servers.append(server)
        return sock

    yield start
    for server in servers:
        server.stop(grace=None)
    shutil.rmtree(sockets, ignore_errors=True)


def test_the_liveness_probe_fails_on_a_hung_or_unready_agent_and_follows_the_spec_on_ready(
    csi: tuple[Any, Any], identity_server: Callable[[Callable[[], Any]], Path]
) -> None:
    pb2, _ = csi
    release = threading.Event()
    hung = identity_server(lambda: release.wait(30) and pb2.ProbeResponse())
    unready = identity_server(lambda: pb2.ProbeResponse(ready=BoolValue(value=False)))
    ready = identity_server(lambda: pb2.ProbeResponse(ready=BoolValue(value=True)))
    try:
        logs = LogCapture()
        argv = ["probe", "--csi-endpoint", f"unix://{hung}", "--timeout", "0.5"]
        assert main(argv, log=logs) == ExitCode.UNHEALTHY
        (error,) = logs.events("error")
        assert "DEADLINE_EXCEEDED after at most 0.5s" in error["error"]
    finally:
        release.set()

    logs = LogCapture()
    assert main(["probe", "--csi-endpoint", f"unix://{unready}"], log=logs) == ExitCode.UNHEALTHY
    assert logs.events("error")[0]["error"].endswith("answered ready=false")
    # "If not present, the caller SHALL assume that the plugin is in a ready state" (the
    # agent's own answer, above); true is ready too.
    assert main(["probe", "--csi-endpoint", f"unix://{ready}"], log=LogCapture()) == ExitCode.OK
    assert main(["probe", "--timeout", "0"], log=LogCapture()) == ExitCode.USAGE


REAL_MOUNT = """
import errno, subprocess, sys
from pathlib import Path
from trainstack_prewarm.agent import SystemMounter, mount_points, _run_mount
src, dst, staging = map(Path, sys.argv[1:4])

def staged():
    return [p for p in mount_points() if p.startswith(str(staging) + "/")]

(staging / "bind-left-by-a-killed-agent").mkdir(parents=True)
m = SystemMounter(staging=staging)
m.bind_read_only(src, dst)
assert m.is_mounted(dst)
assert (dst / "data.bin").read_bytes() == b"payload"
try:
    (dst / "new").write_bytes(b"x")
except OSError as exc:
    assert exc.errno == errno.EROFS, exc
else:
    raise AssertionError("the bind mount is writable")
(src / "repair").write_bytes(b"x")  # the cache itself stays writable for the agent
assert staged() == [] and list(staging.iterdir()) == [], "no staging mount or directory left"
m.unmount(dst)
assert not m.is_mounted(dst)
assert not (dst / "data.bin").exists()

# A step that fails leaves nothing mounted and no staging directory behind.
for failing in ("remount,bind,ro", "--bind " + str(staging), "umount " + str(staging)):
    def run(argv, failing=failing):
        if failing in " ".join(argv):
            raise OSError(f"{argv}: injected failure")
        _run_mount(argv)
    try:
        SystemMounter(staging=staging, run=run).bind_read_only(src, dst)
    except OSError as exc:
        assert "injected" in str(exc), exc
    else:
        raise AssertionError(f"{failing}: no error")
    assert not m.is_mounted(dst), failing
    assert staged() == [] and list(staging.iterdir()) == [], failing
print("ok")
"""


@pytest.mark.skipif(not unshare_works(), reason="no user+mount namespace here (unshare -rm)")
def test_the_real_mounter_binds_read_only_and_unmounts(tmp_path: Path) -> None:
    src, dst = tmp_path / "version", tmp_path / "target"
    src.mkdir()
    dst.mkdir()
    (src / "data.bin").write_bytes(b"payload")
    staging = tmp_path / ".agent" / "staging"
    run = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", REAL_MOUNT, str(src), str(dst), str(staging)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


# The agent container (mountPropagation: Bidirectional on the kubelet's pods directory): a
# mount namespace of its own whose copy of the pods directory is a peer of the host's, so a
# mount the agent makes there is copied to the host (and from there into the pod).
PUBLISHING_AGENT = """
import sys
from pathlib import Path
from trainstack_prewarm.agent import SystemMounter
vdir, target, staging = map(Path, sys.argv[1:4])
m = SystemMounter(staging=staging)
m.bind_read_only(vdir, target)
print("published", flush=True)
sys.stdin.readline()  # the pod is gone: NodeUnpublishVolume
m.unmount(target)
print("unpublished", flush=True)
"""

# The node: a mount namespace where the kubelet's pods directory is a shared mount (systemd
# makes every mount shared, so it is on a real node), the agent's namespace a peer of it.
NODE_HOST = """
import errno, subprocess, sys
from pathlib import Path
from trainstack_prewarm.agent import mount_points
agent_script, vdir, pods, staging = sys.argv[1], *map(Path, sys.argv[2:5])

def run(*argv):
    subprocess.run(argv, check=True, capture_output=True)

def refuses_writes(where, what):
    try:
        (where / "planted").write_bytes(b"x")
    except OSError as exc:
        assert exc.errno == errno.EROFS, f"{what}: {exc}"
    else:
        raise AssertionError(f"{what} can write into the published version")

run("mount", "--bind", str(pods), str(pods))
run("mount", "--make-shared", str(pods))
target = pods / "pod-uid" / "volumes" / "mount"
target.mkdir(parents=True)
agent = subprocess.Popen(
    ["unshare", "-m", "--propagation", "unchanged", sys.executable, "-c", agent_script,
     str(vdir), str(target), str(staging)],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
)
try:
    assert agent.stdout.readline().strip() == "published"
    assert str(target) in mount_points(), "the agent's mount reached the host"
    assert (target / "data.bin").read_bytes() == b"payload"
    refuses_writes(target, "the host")
    # The container runtime binds the target into the pod's container; the volumeMount's
    # readOnly aside, the bind copies the mount's read-only flag.
    container = pods / "pod-uid" / "container-view"
    container.mkdir()
    run("mount", "--bind", str(target), str(container))
    assert (container / "data.bin").read_bytes() == b"payload"
    refuses_writes(container, "the pod")
    run("umount", str(container))
    # No staging mount of the agent's reached the host.
    assert not [p for p in mount_points() if p.startswith(str(staging) + "/")]
    agent.stdin.write("\\n")
    agent.stdin.flush()
    assert agent.stdout.readline().strip() == "unpublished"
finally:
    agent.stdin.close()
    agent.wait(timeout=30)
assert agent.returncode == 0
assert str(target) not in mount_points(), "the agent's unmount reached the host"
assert not (vdir / "planted").exists()
print("ok")
"""


@pytest.mark.skipif(not unshare_works(), reason="no user+mount namespace here (unshare -rm)")
def test_the_published_version_is_read_only_on_the_host_and_in_the_pod(tmp_path: Path) -> None:
    """The mount propagates to the host as the agent made it: the remount that made it
    read-only must happen before it reaches the shared pods directory, since a remount
    changes the flags of one mount and propagates nothing (Linux fs/namespace.c,
    do_reconfigure_mnt), while every copy of a mount, by propagation or by a bind, takes the
    flags of the mount it copies (clone_mnt)."""
    vdir, pods = tmp_path / "cache" / "ds" / "v1", tmp_path / "kubelet-pods"
    vdir.mkdir(parents=True)
    pods.mkdir()
    (vdir / "data.bin").write_bytes(b"payload")
    staging = tmp_path / "cache" / ".agent" / "staging"
    run = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", NODE_HOST, PUBLISHING_AGENT,
         str(vdir), str(pods), str(staging)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
