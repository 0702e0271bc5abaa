"""A small Kubernetes REST client: discovery, server-side apply, dry run, impersonation,
status writes and polling. Plain HTTPS (urllib3), so every request is visible here and nothing
is hidden in a client library.

One client for everything that talks to a live cluster: `trainstack explain` and `status`,
the local sandbox (`trainstack.sandbox`) and the e2e scenarios that run on it. `from_kubeconfig`
reads a kubeconfig as kubectl does for the parts trainstack supports: client certificates, a
bearer token (inline or a file), and exec credential plugins (`aws eks get-token`, the
`client.authentication.k8s.io` ExecCredential protocol), which is how EKS kubeconfigs
authenticate (https://kubernetes.io/docs/reference/access-authn-authz/authentication/
#client-go-credential-plugins).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import urllib3
import yaml
from urllib3 import HTTPHeaderDict

FIELD_MANAGER = "trainstack-e2e"
T = TypeVar("T")


class ApiError(Exception):
    """A non-2xx answer: status code, Status reason and the server's message verbatim."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        if isinstance(body, Mapping):
            self.reason = str(body.get("reason", ""))
            self.message = str(body.get("message", body))
        else:
            self.reason, self.message = "", str(body)
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}")


@dataclass(frozen=True)
class Resource:
    group_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, name: str | None = None, namespace: str | None = None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


@dataclass(frozen=True)
class Identity:
    """Who a request acts as (impersonation by the admin, as `kubectl --as` does)."""

    user: str
    groups: tuple[str, ...] = ()


class Unreachable(ConnectionError):
    """No answer from the API server (refused, timed out, TLS failed). urllib3 raises its own
    exception types, not OSError, for these; one OSError here lets every caller report them
    as it reports any other network failure."""


class KubeconfigError(Exception):
    """A kubeconfig trainstack cannot use: the message names the file and what to fix."""


class Kube:
    def __init__(
        self,
        server: str,
        ca: str | None,
        cert: str | None = None,
        key: str | None = None,
        *,
        token: Callable[[], str] | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.pool = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED", ca_certs=ca, cert_file=cert, key_file=key, maxsize=8
        )
        self._token = token
        self._resources: dict[tuple[str, str], Resource] = {}

    @classmethod
    def from_kubeconfig(cls, path: Path | None = None, context: str | None = None) -> Kube:
        """A client for `context` (default: the current one) of the kubeconfig at `path`,
        else $KUBECONFIG's first file, else ~/.kube/config, as kubectl picks it."""
        return _from_kubeconfig(_kubeconfig_path(path), context)

    # -- transport ---------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        as_: Identity | None = None,
        timeout: float = 30,
    ) -> Any:
        headers = HTTPHeaderDict({"Content-Type": content_type, "Accept": "application/json"})
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token()}"
        if as_ is not None:
            headers["Impersonate-User"] = as_.user
            # The API server reads every Impersonate-Group header line; a comma-joined value
            # would be one group with a comma in its name, hence a repeated header.
            for group in as_.groups:
                headers.add("Impersonate-Group", group)
        url = self.server + path
        if params:
            url += "?" + urlencode(params)
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        try:
            response = self.pool.request(
                method, url, body=data, headers=headers, timeout=timeout, retries=False
            )
        except urllib3.exceptions.HTTPError as error:
            raise Unreachable(f"no answer from {self.server} ({error})") from error
        payload: Any
        try:
            payload = json.loads(response.data) if response.data else None
        except ValueError:
            payload = response.data.decode(errors="replace")
        if response.status >= 400:
            raise ApiError(method, path, response.status, payload)
        return payload

    # -- discovery ---------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Resource:
        key = (api_version, kind)
        if key not in self._resources:
            self._discover(api_version)
        if key not in self._resources:
            self._discover(api_version)  # a CRD may have just been established
        try:
            return self._resources[key]
        except KeyError:
            raise LookupError(f"the server serves no {kind} in {api_version}") from None

    def _discover(self, api_version: str) -> None:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            listing = self.request("GET", path)
        except ApiError as error:
            if error.status == 404:
                return
            raise
        for item in listing.get("resources", []):
            if "/" in item["name"]:
                continue  # subresources
            self._resources[(api_version, item["kind"])] = Resource(
                api_version, item["kind"], item["name"], item["namespaced"]
            )

    def forget_discovery(self) -> None:
        self._resources.clear()

    def _path(self, obj: Mapping[str, Any], name: bool = True) -> str:
        meta = obj["metadata"]
        res = self.resource(obj["apiVersion"], obj["kind"])
        return res.path(meta["name"] if name else None, meta.get("namespace"))

    # -- verbs -------------------------------------------------------------------------------

    def apply(
        self,
        obj: Mapping[str, Any],
        *,
        dry_run: bool = False,
        as_: Identity | None = None,
        manager: str = FIELD_MANAGER,
    ) -> Any:
        """Server-side apply (force, one field manager), optionally as a dry run."""
        params = {"fieldManager": manager, "force": "true", "fieldValidation": "Strict"}
        if dry_run:
            params["dryRun"] = "All"
        return self.request(
            "PATCH",
            self._path(obj),
            yaml.safe_dump(dict(obj)),
            params=params,
            content_type="application/apply-patch+yaml",
            as_=as_,
        )

    def create(
        self, obj: Mapping[str, Any], *, as_: Identity | None = None, dry_run: bool = False
    ) -> Any:
        params = {"fieldValidation": "Strict"}
        if dry_run:
            params["dryRun"] = "All"
        return self.request("POST", self._path(obj, name=False), obj, params=params, as_=as_)

    def replace(self, obj: Mapping[str, Any], *, as_: Identity | None = None) -> Any:
        return self.request("PUT", self._path(obj), obj, as_=as_)

    def get(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        as_: Identity | None = None,
    ) -> Any:
        return self.request("GET", self.resource(api_version, kind).path(name, namespace), as_=as_)

    def get_or_none(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Any:
        try:
            return self.get(api_version, kind, name, namespace)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
        as_: Identity | None = None,
    ) -> list[Any]:
        params = {}
        if labels:
            params["labelSelector"] = labels
        if fields:
            params["fieldSelector"] = fields
        path = self.resource(api_version, kind).path(None, namespace)
        return list(self.request("GET", path, params=params, as_=as_)["items"])

    def watch(
        self,
        api_version: str,
        kind: str,
        *,
        resource_version: str = "",
        labels: str | None = None,
        seconds: int = 3600,
    ) -> Iterator[dict[str, Any]]:
        """The watch events (`{"type": ..., "object": ...}`) of every `kind` object, one JSON
        line each as the API server streams them (watch=1; a resourceVersion of "" starts with
        an ADDED event per existing object), until the server ends the watch after `seconds`.
        Events cost the server nothing more per object; a list per second of thousands of pods
        does (the scheduling benchmark's sampling).

        The generator also ends when the server drops the watch: kube-apiserver closes a
        watcher that does not take its events fast enough ("Forcing watcher close due to
        unresponsiveness", storage/cacher/cache_watcher.go), and a busy machine makes any
        client one. A caller that must see every change lists again and watches on from the
        list's resourceVersion, as client-go's reflector does."""
        params = {"watch": "1", "timeoutSeconds": str(seconds), "allowWatchBookmarks": "false"}
        if resource_version:
            params["resourceVersion"] = resource_version
        if labels:
            params["labelSelector"] = labels
        headers = HTTPHeaderDict({"Accept": "application/json"})
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token()}"
        url = f"{self.server}{self.resource(api_version, kind).path()}?{urlencode(params)}"
        try:
            response = self.pool.request(
                "GET",
                url,
                headers=headers,
                preload_content=False,
                timeout=urllib3.Timeout(connect=10, read=seconds + 30),
                retries=False,
            )
        except urllib3.exceptions.HTTPError as error:
            raise Unreachable(f"no answer from {self.server} ({error})") from error
        try:
            if response.status >= 400:
                raise ApiError("GET", url, response.status, response.read().decode())
            pending = b""
            for chunk in response.stream(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.release_conn()

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        grace: int | None = None,
        as_: Identity | None = None,
    ) -> None:
        params = {"propagationPolicy": "Background"}
        if grace is not None:
            params["gracePeriodSeconds"] = str(grace)
        try:
            self.request(
                "DELETE",
                self.resource(api_version, kind).path(name, namespace),
                params=params,
                as_=as_,
            )
        except ApiError as error:
            if error.status != 404:
                raise

    def patch_status(self, obj: Mapping[str, Any], status: Mapping[str, Any]) -> Any:
        return self.request(
            "PATCH",
            self._path(obj) + "/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )

    def patch(
        self, obj: Mapping[str, Any], patch: Mapping[str, Any], *, as_: Identity | None = None
    ) -> Any:
        return self.request(
            "PATCH", self._path(obj), patch, content_type="application/merge-patch+json", as_=as_
        )


def _kubeconfig_path(path: Path | None) -> Path:
    if path is not None:
        return path
    env = os.environ.get("KUBECONFIG", "")
    # kubectl merges every file of $KUBECONFIG; trainstack reads the first, which is where
    # the current context usually lives (and the sandbox writes a single file).
    first = next((p for p in env.split(os.pathsep) if p), None)
    return Path(first) if first else Path.home() / ".kube" / "config"


def _named(entries: Any, name: str, what: str, path: Path) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            body = entry.get(what)
            if isinstance(body, Mapping):
                return dict(body)
    raise KubeconfigError(f"{path}: no {what} named {name!r} (kubectl config view shows them)")


def _file_or_data(
    section: Mapping[str, Any], key: str, folder: Path, scratch: list[Path]
) -> str | None:
    """A path for `key` (a file, relative to the kubeconfig's folder as kubectl resolves it)
    or `key-data` (base64, written to a private temporary file: urllib3 takes paths)."""
    if section.get(f"{key}-data"):
        handle, name = tempfile.mkstemp(prefix="trainstack-kube-", suffix=".pem")
        with os.fdopen(handle, "wb") as out:
            out.write(base64.b64decode(section[f"{key}-data"]))
        scratch.append(Path(name))
        return name
    if section.get(key):
        return str(folder / os.path.expanduser(str(section[key])))
    return None


def _exec_token(spec: Mapping[str, Any], path: Path) -> Callable[[], str]:
    """A token from an exec credential plugin, fetched again when it expires (EKS tokens
    last 15 minutes; `status.expirationTimestamp` says when)."""
    command = [str(spec.get("command", "")), *map(str, spec.get("args") or [])]
    env = dict(os.environ)
    env.update({str(e["name"]): str(e["value"]) for e in spec.get("env") or []})
    cached: dict[str, Any] = {}

    def token() -> str:
        expires = cached.get("expires")
        if cached.get("token") and (expires is None or time.time() < expires - 60):
            return str(cached["token"])
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, check=False, timeout=60
            )
        except OSError as error:
            raise KubeconfigError(
                f"{path}: the credential plugin {command[0]!r} could not run ({error}); "
                "install it or fix the user's exec.command"
            ) from None
        if done.returncode != 0:
            raise KubeconfigError(
                f"{path}: the credential plugin {shlex.join(command)} failed: "
                f"{done.stderr.strip()[-400:]}"
            )
        status = json.loads(done.stdout).get("status", {})
        if not status.get("token"):
            raise KubeconfigError(f"{path}: {command[0]} returned no status.token")
        cached["token"] = status["token"]
        stamp = status.get("expirationTimestamp")
        cached["expires"] = rfc3339_seconds(stamp) if stamp else None
        return str(status["token"])

    return token


def rfc3339_seconds(stamp: str) -> float:
    """An RFC 3339 time as the API writes it (`2026-12-06T03:29:43Z`) in Unix seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _from_kubeconfig(path: Path, context: str | None) -> Kube:
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise KubeconfigError(
            f"{path}: no kubeconfig there; pass --kubeconfig, set KUBECONFIG, or write one "
            "(`aws eks update-kubeconfig`, or `trainstack sandbox up` for a local cluster)"
        ) from None
    except yaml.YAMLError as error:
        raise KubeconfigError(f"{path}: not YAML: {error}") from None
    if not isinstance(config, Mapping):
        raise KubeconfigError(f"{path}: not a kubeconfig (a mapping with clusters, users)")
    name = context or config.get("current-context")
    if not name:
        raise KubeconfigError(f"{path}: no current-context; pass --context")
    ctx = _named(config.get("contexts"), str(name), "context", path)
    cluster = _named(config.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user = _named(config.get("users"), str(ctx.get("user")), "user", path)
    folder = path.resolve().parent
    scratch: list[Path] = []
    if not cluster.get("server"):
        raise KubeconfigError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    if cluster.get("insecure-skip-tls-verify"):
        raise KubeconfigError(
            f"{path}: cluster {ctx.get('cluster')!r} skips TLS verification; trainstack "
            "only talks to API servers it can verify (set certificate-authority)"
        )
    ca = _file_or_data(cluster, "certificate-authority", folder, scratch)
    cert = _file_or_data(user, "client-certificate", folder, scratch)
    key = _file_or_data(user, "client-key", folder, scratch)
    token: Callable[[], str] | None = None
    if user.get("token"):
        value = str(user["token"])
        token = lambda: value  # noqa: E731
    elif user.get("tokenFile"):
        token_file = folder / str(user["tokenFile"])
        token = lambda: token_file.read_text(encoding="utf-8").strip()  # noqa: E731
    elif isinstance(user.get("exec"), Mapping):
        token = _exec_token(user["exec"], path)
    elif cert is None:
        raise KubeconfigError(
            f"{path}: user {ctx.get('user')!r} has no client certificate, token or exec "
            "plugin trainstack can use (auth-provider plugins are not supported)"
        )
    # urllib3 reads the PEM files when a connection needs them, not before: the copies of
    # inline data live until the interpreter exits.
    for scratch_file in scratch:
        atexit.register(_remove, scratch_file)
    return Kube(str(cluster["server"]), ca, cert, key, token=token)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float = 60,
    interval: float = 0.25,
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except ApiError as error:
            last = error
        else:
            last = value
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last}")
        time.sleep(interval)


def becomes(condition: Callable[[], Any], seconds: float) -> bool:
    """Whether `condition` holds within `seconds` (for checks that may rightly stay false)."""
    try:
        wait_for("the condition", lambda: condition() or None, timeout=seconds)
    except TimeoutError:
        return False
    return True


def holds_everything(sent: Any, live: Any, path: str = "", *, builtin: bool = False) -> list[str]:
    """Paths where the live object lost or changed a value that was sent (defaults allowed).

    The API server prunes fields a structural schema does not declare, silently; comparing
    what was sent with what came back is the only way to see that. A zero value of a Go
    `omitempty` field is the field unset and is not echoed back (a PV's `storageClassName:
    ""`, a PriorityClass's `globalDefault: false`), see `_unset`.
    """
    if isinstance(sent, Mapping):
        if not isinstance(live, Mapping):
            return [f"{path or '.'}: sent a map, live has {type(live).__name__}"]
        problems: list[str] = []
        for key, value in sent.items():
            if key not in live:
                if not _unset(value, builtin=builtin):
                    problems.append(f"{path}.{key}: dropped by the server")
            else:
                problems += holds_everything(value, live[key], f"{path}.{key}", builtin=builtin)
        return problems
    if isinstance(sent, list):
        if not isinstance(live, list) or len(live) != len(sent):
            return [f"{path}: sent {sent!r}, live {live!r}"]
        problems = []
        for index, (a, b) in enumerate(zip(sent, live, strict=True)):
            problems += holds_everything(a, b, f"{path}[{index}]", builtin=builtin)
        return problems
    if not _same_scalar(sent, live):
        return [f"{path}: sent {sent!r}, live {live!r}"]
    return []


def _unset(value: Any, *, builtin: bool) -> bool:
    """An empty value means the field unset, whoever drops it (Volcano's mutating webhook
    re-encodes a Job through Go structs, so `args: []` does not come back); `false` and `0`
    mean unset only for built-in kinds' omitempty fields."""
    if value is None or value in ("", {}, []):
        return True
    return builtin and value in (False, 0)


def _same_scalar(sent: Any, live: Any) -> bool:
    if sent == live:
        return True
    # Quantities come back canonicalised ("1Gi" stays, "1000m" becomes "1"); ints sent as
    # strings in int-or-string fields stay strings. Compare canonical quantities.
    if isinstance(sent, (int, str)) and isinstance(live, (int, str)):
        try:
            return quantity(sent) == quantity(live)
        except ValueError:
            return False
    return False


_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "E": 1e18,
}  # fmt: skip


def quantity(value: int | float | str) -> float:
    """A Kubernetes quantity as a number (binary and decimal suffixes)."""
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIX[suffix]
    return float(text)


def documents(paths: Iterable[str]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            docs.extend(d for d in yaml.safe_load_all(f) if d)
    return docs
