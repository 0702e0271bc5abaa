"""Issue 24 #1: the node agent's CSI node service, end to end over a unix socket.

A real gRPC server (the CSI spec's stubs, generated at build time) on a unix socket, a real
fetch from moto's S3 server, real holds and eviction on a temp cache; only the mount is a
recording stand-in (mounting needs CAP_SYS_ADMIN), except in the last test, which runs the
real `mount --bind` + read-only remount inside a user and mount namespace where `unshare`
allows it. What this does and does not prove: docs/testing.md, "Dataset cache agent".
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.wrappers_pb2 import BoolValue
from trainstack_prewarm import cache, csi_proto
from trainstack_prewarm.agent import CacheAgent, VersionRequest
from trainstack_prewarm.cli import main
from trainstack_prewarm.csi import DRIVER_NAME, RESERVED_WORKERS, serve
from trainstack_prewarm.errors import ExitCode
from trainstack_prewarm.fetch import Fetcher, FetchOptions
from trainstack_prewarm.sources import open_source

from tests.prewarm.conftest import (
    LogCapture,
    S3Faults,
    S3Server,
    make_files,
    read_tree,
    upload,
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
        self, volume_id: str, dataset: str, version: str, source: str, *, timeout: float = 60
    ) -> Path:
        target = self.pods / volume_id / "mount"
        target.parent.mkdir(parents=True, exist_ok=True)  # the kubelet makes the parent
        self.node.NodePublishVolume(
            self.pb2.NodePublishVolumeRequest(
                volume_id=volume_id,
                target_path=str(target),
                readonly=True,
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
    ) -> Node:
        pb2, stubs = csi
        client = s3_server.client()
        faults = S3Faults(client)
        logs = LogCapture()
        root = root or tmp_path / "cache"

        def fill(req: VersionRequest) -> object:
            if gate is not None:
                assert gate.wait(30)
            source = open_source(req.source, s3_client_factory=lambda: client)
            options = FetchOptions(concurrency=4, start_jitter_s=0.0)
            return Fetcher(source, root, req.dataset, req.version, options=options, log=logs).run()

        mounter = mounter or RecordingMounter()
        agent = CacheAgent(
            root,
            fill=fill,
            mounter=mounter,
            allowed_sources=[f"s3://{bucket}/"],
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


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    return probe.returncode == 0


REAL_MOUNT = """
import errno, sys
from pathlib import Path
from trainstack_prewarm.agent import SystemMounter
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
m = SystemMounter()
m.bind_read_only(src, dst)
assert m.is_mounted(dst)
assert (dst / "data.bin").read_bytes() == b"payload"
try:
    (dst / "new").write_bytes(b"x")
except OSError as exc:
    assert exc.errno == errno.EROFS, exc
else:
    raise AssertionError("the bind mount is writable")
m.unmount(dst)
assert not m.is_mounted(dst)
assert not (dst / "data.bin").exists()
print("ok")
"""


@pytest.mark.skipif(not _unshare_works(), reason="no user+mount namespace here (unshare -rm)")
def test_the_real_mounter_binds_read_only_and_unmounts(tmp_path: Path) -> None:
    src, dst = tmp_path / "version", tmp_path / "target"
    src.mkdir()
    dst.mkdir()
    (src / "data.bin").write_bytes(b"payload")
    run = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", REAL_MOUNT, str(src), str(dst)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
