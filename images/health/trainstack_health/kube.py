"""The Kubernetes API calls the node agent and the repair controller make, over HTTPS with the
standard library (as images/deadlines/trainstack_deadlines/kube.py: the bearer token is read
again for each request, since the kubelet rotates it; in a pod the API server comes from
KUBERNETES_SERVICE_HOST/PORT, as client-go's `rest.InClusterConfig`).

`KubeApi` is what the repair controller's pass needs; `Kube` implements it (and the agent's
calls) against a real API server, and tests pass a fake server or object.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from trainstack_health.errors import SetupError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
USER_AGENT = "trainstack-health/0.1.0"
PAGE = 500


class ApiError(Exception):
    """A refused request, or none at all (status 0): what the server said, verbatim."""

    def __init__(self, method: str, path: str, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{method} {path}: {status} {reason}: {message}")


class KubeApi(Protocol):
    """What a pass needs of the API server."""

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]: ...
    def get_node(self, name: str) -> dict[str, Any]: ...
    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]: ...
    def evict(self, namespace: str, name: str) -> None: ...
    def patch_node_metadata(
        self,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> None: ...
    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class Access:
    server: str
    ca_file: Path
    token_file: Path

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] = os.environ) -> Access:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise SetupError(
                "not in a pod (KUBERNETES_SERVICE_HOST/PORT unset): pass --server, "
                "--token-file and --ca-file to run outside the cluster"
            )
        if ":" in host:  # IPv6
            host = f"[{host}]"
        return cls(
            f"https://{host}:{port}", SERVICE_ACCOUNT_DIR / "ca.crt", SERVICE_ACCOUNT_DIR / "token"
        )

    @classmethod
    def from_flags(
        cls, server: str | None, token_file: Path | None, ca_file: Path | None
    ) -> Access:
        """The programs' --server/--token-file/--ca-file: all three, or none (in-cluster)."""
        if server is None:
            if token_file or ca_file:
                raise SetupError("--token-file and --ca-file need --server")
            return cls.in_cluster()
        if not token_file or not ca_file:
            raise SetupError("--server needs --token-file and --ca-file")
        return cls(server, ca_file, token_file)

    def check(self) -> None:
        for what, path in (("CA bundle", self.ca_file), ("token", self.token_file)):
            if not path.is_file():
                raise SetupError(
                    f"{what} {path} does not exist: mount the ServiceAccount token "
                    "(automountServiceAccountToken) or pass --token-file/--ca-file"
                )


class Kube:
    def __init__(self, access: Access, timeout: float = 30.0) -> None:
        access.check()
        self.access = access
        self.timeout = timeout
        self._context = ssl.create_default_context(cafile=str(access.ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.access.server.rstrip("/") + path
        if params:
            url += "?" + urlencode(params)
        token = self.access.token_file.read_text().strip()
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            reason, message = "", raw.decode(errors="replace")
            try:
                status = json.loads(raw)
                reason, message = str(status.get("reason", "")), str(status.get("message", ""))
            except (ValueError, AttributeError):
                pass
            raise ApiError(method, path, err.code, reason, message) from None
        except (urllib.error.URLError, OSError) as err:
            raise ApiError(method, path, 0, "Unreachable", str(err)) from None
        return json.loads(raw) if raw else None

    def _list(self, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        query = {**params, "limit": str(PAGE)}
        while True:
            page = self.request("GET", path, params=query)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query = {**params, "limit": str(PAGE), "continue": token}

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        return self._list("/api/v1/nodes", {"labelSelector": label_selector})

    def get_node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = self.request("GET", f"/api/v1/nodes/{quote(name)}")
        return node

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        # spec.nodeName is a field selector the API server indexes for pods (the kubelet
        # lists its own pods this way; k8s pkg/registry/core/pod/strategy.go PodToSelectableFields).
        return self._list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})

    def evict(self, namespace: str, name: str) -> None:
        """POST a policy/v1 Eviction to the pod's eviction subresource. The API server checks
        the pod's PodDisruptionBudget (429 while it allows no disruption), then deletes the pod
        with the DeleteOptions given, here none, so the pod's own
        terminationGracePeriodSeconds applies: SIGTERM, and the runtime checkpoints (k8s
        pkg/registry/core/pod/storage/eviction.go `EvictionREST.Create`, `checkAndDecrement`)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/eviction"
        self.request("POST", path, body)

    def patch_node_metadata(
        self,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> None:
        """A JSON merge patch (RFC 7386): null removes a key, other keys stay as they are."""
        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        self.request("PATCH", f"/api/v1/nodes/{quote(name)}", {"metadata": meta},
                     content_type="application/merge-patch+json")  # fmt: skip

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/events", event)

    # --- the node agent's calls (H1) -------------------------------------------------------

    def patch_node_json(self, name: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """An RFC 6902 JSON patch of the Node. The agent's patches start with a `test` of
        metadata.resourceVersion: the API server applies the operations in order to the object
        as stored and refuses the whole patch with 422 when an operation fails, a `test`
        included (k8s.io/apiserver v0.37.2 pkg/endpoints/handlers/patch.go
        `jsonPatcher.applyJSPatch`), so a taint list rewritten from a stale read never
        overwrites another writer's change: the agent re-reads and retries."""
        node: dict[str, Any] = self.request(
            "PATCH", f"/api/v1/nodes/{quote(name)}", [dict(op) for op in ops],
            content_type="application/json-patch+json",
        )  # fmt: skip
        return node
