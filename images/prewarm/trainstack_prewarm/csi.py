"""CSI Identity and Node services of the cache agent (CSI spec v1.12.0, ephemeral volumes).

The kubelet calls NodePublishVolume for a pod's inline ``csi`` volume of driver
:data:`DRIVER_NAME` before any of the pod's containers start, and NodeUnpublishVolume once
the pod is gone. There is no controller service and no staging (the CSIDriver object says
``attachRequired: false``, ``volumeLifecycleModes: [Ephemeral]``, ``podInfoOnMount: true``).

Errors map onto gRPC codes the kubelet retries with backoff: a fill still under way is
ABORTED ("operation pending", CSI spec, NodePublishVolume errors) and the next call joins
the same fill; a source the agent may not read, bad attributes, or a request for a writable
volume, INVALID_ARGUMENT; a fill that failed, FAILED_PRECONDITION with the fetcher's message
(seen in the pod's events); a mount that failed, INTERNAL.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from trainstack_prewarm import __version__, csi_proto
from trainstack_prewarm.agent import CacheAgent, PublishPending, VersionRequest
from trainstack_prewarm.errors import (
    AgentUnhealthyError,
    LocalCacheError,
    LockTimeoutError,
    PrewarmError,
    SourceError,
    UsageError,
)

DRIVER_NAME = "cache.trainstack.io"
EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"
POD_NAMESPACE_KEY = "csi.storage.k8s.io/pod.namespace"
POD_NAME_KEY = "csi.storage.k8s.io/pod.name"
# NodePublishVolumeRequest.readonly is the pod volume's `csi.readOnly`, false when the pod
# leaves it out (k8s.io/kubernetes v1.37.2 pkg/volume/csi/csi_plugin.go NewMounter:
# `readOnly = *volSrc.ReadOnly` for an inline volume; csi_mounter.go SetUpAt sends it). A
# version is shared by every pod on the node, so the agent publishes read-only or not at all:
# CSI spec v1.12.0, "Error Scheme", "Invalid or unsupported field in the request" is
# INVALID_ARGUMENT ("Caller MUST fix the field before retrying"), which is the fix here. Not
# FAILED_PRECONDITION: NodePublishVolume's table keeps it for an unsupported
# volume_capability or a missing staging path, whose recoveries (ValidateVolumeCapabilities,
# waiting for an unpublish, NodeStageVolume) would not help.
WRITABLE_REFUSED = (
    "readonly is false: the node cache publishes shared dataset versions read-only only; "
    "set `csi.readOnly: true` on the pod's volume (the job renderer does)"
)
# Leave the kubelet's call this much of its deadline to receive our answer.
DEADLINE_MARGIN_S = 5.0
DEFAULT_PUBLISH_WAIT_S = 60.0
# Server threads never given to publishes that wait for a fill: Probe (the liveness check),
# NodeUnpublishVolume and the info calls must answer while a crowd of pods waits for a fetch,
# else the kubelet's liveness probe restarts a busy, healthy agent.
RESERVED_WORKERS = 4
DEFAULT_WORKERS = 16


def _code(exc: PrewarmError) -> grpc.StatusCode:
    if isinstance(exc, PublishPending | LockTimeoutError):
        return grpc.StatusCode.ABORTED
    if isinstance(exc, UsageError | SourceError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, LocalCacheError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.FAILED_PRECONDITION


def servicers(
    agent: CacheAgent,
    node_id: str,
    *,
    publish_wait_s: float = DEFAULT_PUBLISH_WAIT_S,
    max_publishing: int = DEFAULT_WORKERS - RESERVED_WORKERS,
) -> tuple[Any, Any]:
    """(IdentityServicer, NodeServicer) instances bound to ``agent``; at most
    ``max_publishing`` NodePublishVolume calls run at once (the rest: ABORTED, retried)."""
    pb2, stubs = csi_proto.load()
    publishing = threading.BoundedSemaphore(max_publishing)
    identity_base: Any = stubs.IdentityServicer
    node_base: Any = stubs.NodeServicer

    class Identity(identity_base):  # type: ignore[misc]
        def GetPluginInfo(self, _request: Any, _context: Any) -> Any:
            return pb2.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=__version__)

        def GetPluginCapabilities(self, _request: Any, _context: Any) -> Any:
            return pb2.GetPluginCapabilitiesResponse()  # node service only, no controller

        def Probe(self, _request: Any, _context: Any) -> Any:
            return pb2.ProbeResponse()

    class Node(node_base):  # type: ignore[misc]
        def NodeGetInfo(self, _request: Any, _context: Any) -> Any:
            return pb2.NodeGetInfoResponse(node_id=node_id)

        def NodeGetCapabilities(self, _request: Any, _context: Any) -> Any:
            return pb2.NodeGetCapabilitiesResponse()  # no STAGE_UNSTAGE_VOLUME

        def NodePublishVolume(self, request: Any, context: Any) -> Any:
            attrs = dict(request.volume_context)
            if not request.volume_id or not request.target_path:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path")
            if request.volume_capability.WhichOneof("access_type") != "mount":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "only mount volumes")
            if attrs.get(EPHEMERAL_KEY, "true") != "true":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "only ephemeral inline volumes")
            if not request.readonly:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, WRITABLE_REFUSED)
            wait_s = publish_wait_s
            remaining = context.time_remaining()
            if remaining is not None:
                wait_s = min(wait_s, remaining - DEADLINE_MARGIN_S)
            if not publishing.acquire(blocking=False):
                context.abort(
                    grpc.StatusCode.ABORTED,
                    f"{max_publishing} volumes are being published on this node; retrying",
                )
            try:
                req = VersionRequest.from_attributes(attrs)
                agent.publish(request.volume_id, Path(request.target_path), req, wait_s=wait_s)
            except PrewarmError as exc:
                agent.log(
                    "publish_failed",
                    volume=request.volume_id,
                    pod=f"{attrs.get(POD_NAMESPACE_KEY, '?')}/{attrs.get(POD_NAME_KEY, '?')}",
                    kind=type(exc).__name__,
                    error=exc.message,
                )
                context.abort(_code(exc), exc.message)
            except OSError as exc:  # the mount failed (and was undone): the kubelet retries
                agent.log(
                    "publish_failed", volume=request.volume_id, kind="OSError", error=str(exc)
                )
                context.abort(grpc.StatusCode.INTERNAL, f"mount: {exc}")
            finally:
                publishing.release()
            return pb2.NodePublishVolumeResponse()

        def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
            if not request.volume_id or not request.target_path:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path")
            try:
                agent.unpublish(request.volume_id, Path(request.target_path))
            except PrewarmError as exc:
                context.abort(_code(exc), exc.message)
            except OSError as exc:  # umount failed: the kubelet retries
                context.abort(grpc.StatusCode.INTERNAL, f"unmount: {exc}")
            return pb2.NodeUnpublishVolumeResponse()

    return Identity(), Node()


def serve(
    agent: CacheAgent,
    endpoint: str,
    node_id: str,
    *,
    publish_wait_s: float = DEFAULT_PUBLISH_WAIT_S,
    workers: int = DEFAULT_WORKERS,
) -> grpc.Server:
    """Start the CSI server on ``endpoint`` (``unix:///csi/csi.sock`` or a path); returns it."""
    _, stubs = csi_proto.load()
    path = endpoint.removeprefix("unix://")
    Path(path).unlink(missing_ok=True)  # a socket left by the previous agent
    if workers <= RESERVED_WORKERS:
        raise ValueError(f"workers={workers}: more than {RESERVED_WORKERS} needed")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    identity, node = servicers(
        agent, node_id, publish_wait_s=publish_wait_s, max_publishing=workers - RESERVED_WORKERS
    )
    stubs.add_IdentityServicer_to_server(identity, server)
    stubs.add_NodeServicer_to_server(node, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    agent.log("csi_serving", endpoint=f"unix://{path}", driver=DRIVER_NAME, node=node_id)
    return server


def probe(endpoint: str, *, timeout_s: float) -> None:
    """Call Identity.Probe on ``endpoint`` as the kubelet's liveness check would; return if the
    agent answers ready within ``timeout_s``, else raise :class:`AgentUnhealthyError`.

    The same server answers NodePublishVolume, so a hung server fails this where a check of
    the process or the socket file would not. No wait-for-ready: a socket nobody serves fails
    at once (UNAVAILABLE) instead of using up the timeout.
    """
    pb2, stubs = csi_proto.load()
    path = endpoint.removeprefix("unix://")
    with grpc.insecure_channel(f"unix://{path}") as channel:
        try:
            response = stubs.IdentityStub(channel).Probe(pb2.ProbeRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            name = code.name if isinstance(code, grpc.StatusCode) else str(code)
            raise AgentUnhealthyError(
                f"CSI Probe on unix://{path}: {name} after at most {timeout_s:g}s: {exc.details()}"
            ) from None
    # CSI spec, ProbeResponse.ready: "If not present, the caller SHALL assume that the plugin
    # is in a ready state"; false means still initializing.
    if response.HasField("ready") and not response.ready.value:
        raise AgentUnhealthyError(f"CSI Probe on unix://{path}: answered ready=false")
