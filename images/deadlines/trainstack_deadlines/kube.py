"""The few Kubernetes API calls the enforcer makes, over HTTPS with the standard library.

In a pod it authenticates as its ServiceAccount: the projected token and CA under
/var/run/secrets/kubernetes.io/serviceaccount and the API server from KUBERNETES_SERVICE_HOST
and KUBERNETES_SERVICE_PORT, as client-go's `rest.InClusterConfig` does. The token is read
again for every request, since the kubelet rotates it.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from trainstack_deadlines.errors import SetupError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
USER_AGENT = "trainstack-deadlines/0.1.0"
PAGE = 500


class ApiError(Exception):
    """A refused request, or none at all (status 0): what the server said, verbatim."""

    def __init__(self, method: str, path: str, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{method} {path}: {status} {reason}: {message}")


@dataclass(frozen=True)
class Access:
    """Where the API server is and who this program is to it."""

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

    def check(self) -> None:
        """Fail early, naming the file, if the credentials are not there."""
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

    def list(self, path: str) -> list[dict[str, Any]]:
        """Every item of a collection, page by page."""
        items: list[dict[str, Any]] = []
        params = {"limit": str(PAGE)}
        while True:
            page = self.request("GET", path, params=params)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params = {"limit": str(PAGE), "continue": token}

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def create(self, path: str, obj: Mapping[str, Any]) -> Any:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")
