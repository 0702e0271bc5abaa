"""Register a finished job's model in an MLflow model registry, over MLflow's REST API.

The standard library only (urllib, json): the runtime image needs no ``mlflow`` package. Checked
against MLflow 3.18.0 (the version tests/runtime/test_registry.py runs a real server of,
tests/runtime/mlflow-constraints.txt); the calls are the REST API's since 2.0
(https://mlflow.org/docs/latest/rest-api.html):

- ``POST /api/2.0/mlflow/registered-models/create`` ``{name}``; a name that exists answers
  400 ``RESOURCE_ALREADY_EXISTS`` (mlflow/server/handlers.py, ``_create_registered_model``;
  the status from mlflow/exceptions.py), which counts as success here.
- ``POST /api/2.0/mlflow/model-versions/create`` ``{name, source, run_id, tags: [{key, value}],
  description}``: the next version of ``name``.
- ``GET /api/2.0/mlflow/model-versions/get?name=&version=``: polled until ``status`` is
  ``READY``; ``FAILED_REGISTRATION`` fails (the ``ModelVersionStatus`` enum, with
  ``status_message``). The SQL store MLflow's own server uses answers ``READY`` at once; others
  (Databricks) go through ``PENDING_REGISTRATION``.

Paths and fields: mlflow/protos/model_registry.proto (``ModelRegistryService``'s
``CreateRegisteredModel``, ``CreateModelVersion``, ``GetModelVersion``), served under
``/api/2.0`` (handlers.py, ``_get_rest_path``). Errors come back as JSON ``{error_code,
message}`` (handlers.py, ``catch_mlflow_exception``).

**The source.** Any ``s3://`` (or other object-store) URI of the consolidated model. MLflow's
server refuses a local ``file:`` source (or a bare path) unless ``run_id`` names a run whose
artifact directory holds it (handlers.py, ``_validate_source_run``:
``INVALID_PARAMETER_VALUE``), so a job registers what it wrote to the team's bucket.

**Tags.** String keys and values. MLflow 3.18 takes keys of at most 250 characters made of
letters, digits, ``_ - . : /`` and spaces that are a normalized relative path
(mlflow/utils/validation.py, ``_validate_model_version_tag``, ``validate_param_and_metric_name``,
``path_not_unique``, ``MAX_MODEL_REGISTRY_TAG_KEY_LENGTH``), and values of at most 100,000
characters (``MAX_MODEL_REGISTRY_TAG_VALUE_LENGTH``); MLflow 2.x took 5,000 (2.22.0's
validation.py) and its ``model_version_tags.value`` column was VARCHAR(5000) until migration
``bda7b8c39065`` (mlflow/store/db_migrations/versions/). A tag that breaks the rules fails
here, before any request, naming the tag; values are held to the 5,000 every server takes. No
truncation: a cut JSON of final metrics would be wrong, not short.

**Credentials**, as MLflow's client reads them (mlflow/environment_variables.py):
``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` send Basic auth, else
``MLFLOW_TRACKING_TOKEN`` a Bearer token; both set, Basic wins, as in mlflow/utils/rest_utils.py
(``http_request``).

**Retries**, a few with exponential backoff, on a failed connection, 5xx and 429 (and 408)
only; never on another 4xx. Creating a version is not idempotent (a repeat is a second
version), so, as MLflow's own client does for such writes (rest_utils.py,
``_non_idempotent_write_retry_kwargs``, ``_UNPROCESSED_REQUEST_RESPONSE_CODES``: "MLflow's own
server can return 503 after it commits a write"), it is repeated only when the server cannot
have processed it: the request was not sent (no connection) or the answer was 408/429.
``timeout_s`` bounds the whole registration, retries and polling included.

Every failure raises :class:`RegistryError`, whose message names the server (without any
credentials in the URI), the endpoint and MLflow's ``error_code`` and ``message``.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import posixpath
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

API_PREFIX = "/api/2.0/mlflow"
CREATE_MODEL = "registered-models/create"
CREATE_VERSION = "model-versions/create"
GET_VERSION = "model-versions/get"

# mlflow/utils/validation.py (3.18.0: key 250, value 100,000; 2.22.0: key 250, value 5,000).
MAX_TAG_KEY_LENGTH = 250
MAX_TAG_VALUE_LENGTH = 5000
_TAG_KEY = re.compile(r"[/\w.\- :]*")  # validate_param_and_metric_name, off Windows

RETRIES = 3  # after the first attempt
BACKOFF_S = 0.5  # 0.5, 1, 2 s between attempts (or the server's Retry-After, up to 10 s)
MAX_RETRY_AFTER_S = 10.0
POLL_S = 0.5  # model-versions/get while PENDING_REGISTRATION, doubling to 5 s

# HTTP statuses after which a request is sent again: the server did not process it (408, 429),
# or, for a request that may safely run twice, it failed on the server's side (5xx).
_UNPROCESSED = frozenset({408, 429})


class RegistryError(Exception):
    """Registration failed. ``error_code`` is MLflow's (``RESOURCE_DOES_NOT_EXIST``, …) where
    the server sent one; ``status`` the HTTP status where there was an answer."""

    def __init__(
        self,
        message: str,
        *,
        server: str,
        endpoint: str | None = None,
        status: int | None = None,
        error_code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.server = server
        self.endpoint = endpoint
        self.status = status
        self.error_code = error_code


@dataclass(frozen=True)
class ModelVersion:
    """A registered version, as MLflow answered it."""

    name: str
    version: str
    source: str
    status: str


def register_model(
    tracking_uri: str,
    name: str,
    source: str,
    tags: Mapping[str, str],
    description: str = "",
    *,
    run_id: str | None = None,
    timeout_s: float = 60.0,
    retries: int = RETRIES,
) -> ModelVersion:
    """Register ``source`` as the next version of the model ``name``, with ``tags``.

    Creates the registered model if it does not exist, then the version, then waits until it
    is ``READY``. Raises :class:`RegistryError` for every failure, including a tag MLflow
    would refuse (checked before the first request).
    """
    client = _Client(tracking_uri, timeout_s=timeout_s, retries=retries)
    check_tags(tags, server=client.server)
    try:
        client.call("POST", CREATE_MODEL, {"name": name}, idempotent=True)
    except RegistryError as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    body: dict[str, Any] = {
        "name": name,
        "source": source,
        "tags": [{"key": k, "value": v} for k, v in tags.items()],
        "description": description,
    }
    if run_id:
        body["run_id"] = run_id
    created = _version(client, CREATE_VERSION, client.call("POST", CREATE_VERSION, body))
    return _wait_ready(client, created)


def check_tags(tags: Mapping[str, str], *, server: str = "") -> None:
    """Raise :class:`RegistryError` for the first tag MLflow would refuse (module docstring)."""
    for key, value in tags.items():
        problem = _tag_problem(key, value)
        if problem:
            raise RegistryError(
                f"{_where(server)}tag {key[:80]!r}: {problem}; nothing was registered",
                server=server,
            )


def _tag_problem(key: object, value: object) -> str | None:
    if not isinstance(key, str) or not isinstance(value, str):
        return f"keys and values must be strings, not {type(key).__name__}: {type(value).__name__}"
    if len(key) > MAX_TAG_KEY_LENGTH:
        return f"the key has {len(key)} characters, MLflow takes at most {MAX_TAG_KEY_LENGTH}"
    norm = posixpath.normpath(key)
    if not _TAG_KEY.fullmatch(key) or norm != key or norm == "." or norm.startswith(("..", "/")):
        return (
            "MLflow takes keys of letters, digits, '_', '-', '.', ':', '/' and spaces that are a "
            "normalized relative path (no empty, '.' or '..' parts, no leading or trailing '/')"
        )
    if len(value) > MAX_TAG_VALUE_LENGTH:
        return (
            f"the value has {len(value)} characters, more than the {MAX_TAG_VALUE_LENGTH} "
            "every MLflow server stores (registry.py explains the limit)"
        )
    return None


def _where(server: str) -> str:
    return f"MLflow at {server}: " if server else ""


def _version(client: _Client, endpoint: str, answer: dict[str, Any]) -> dict[str, Any]:
    version = answer.get("model_version")
    if not isinstance(version, dict) or "version" not in version:
        raise RegistryError(
            f"MLflow at {client.server}: {endpoint}: no model_version in the answer "
            f"{json.dumps(answer)[:300]}",
            server=client.server,
            endpoint=endpoint,
        )
    return version


def _wait_ready(client: _Client, version: dict[str, Any]) -> ModelVersion:
    name, number = str(version.get("name", "")), str(version["version"])
    interval = POLL_S
    while True:
        status = str(version.get("status", "READY"))
        if status == "READY":
            return ModelVersion(name, number, str(version.get("source", "")), status)
        if status == "FAILED_REGISTRATION":
            raise RegistryError(
                f"MLflow at {client.server}: model {name!r} version {number}: "
                f"FAILED_REGISTRATION: {version.get('status_message') or 'no status message'}",
                server=client.server,
                endpoint=GET_VERSION,
                error_code="FAILED_REGISTRATION",
            )
        if client.remaining() < interval:
            raise RegistryError(
                f"MLflow at {client.server}: model {name!r} version {number} still {status} "
                f"after {client.timeout_s:g} s (timeout_s)",
                server=client.server,
                endpoint=GET_VERSION,
            )
        time.sleep(interval)
        interval = min(interval * 2, 5.0)
        query = {"name": name, "version": number}
        version = _version(client, GET_VERSION, client.call("GET", GET_VERSION, query, True))


class _Client:
    """One MLflow server: requests with credentials, retries and a deadline."""

    def __init__(self, tracking_uri: str, *, timeout_s: float, retries: int) -> None:
        parts = urllib.parse.urlsplit(tracking_uri.strip())
        # The URI as the messages show it: no user or password (user:pass@host) in a log line.
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        try:
            netloc += f":{parts.port}" if parts.port else ""
        except ValueError:  # a port that is not a number
            host = ""
        self.server = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        if parts.scheme not in ("http", "https") or not host:
            raise RegistryError(
                f"MLflow tracking URI {self.server or tracking_uri[:80]!r}: an http(s):// URL of "
                "a tracking server is needed (a file store or databricks URI is not one)",
                server=self.server,
            )
        self.base = self.server.rstrip("/") + API_PREFIX
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.deadline = time.monotonic() + timeout_s
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        auth = _auth_header(parts)
        if auth:
            self.headers["Authorization"] = auth

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def call(
        self, method: str, endpoint: str, body: Mapping[str, Any], idempotent: bool = False
    ) -> dict[str, Any]:
        """The JSON answer of one call; retried as the module docstring says."""
        url, data = self.base + "/" + endpoint, None
        if method == "GET":
            url += "?" + urllib.parse.urlencode(body)
        else:
            data = json.dumps(body).encode()
        attempt = 0
        while True:
            attempt += 1
            request = urllib.request.Request(url, data=data, method=method, headers=self.headers)
            outcome = self._send(request, endpoint, idempotent)
            if isinstance(outcome, dict):
                return outcome
            error, retryable, retry_after = outcome
            wait = retry_after if retry_after is not None else BACKOFF_S * 2 ** (attempt - 1)
            if not retryable or attempt > self.retries or self.remaining() < wait:
                if retryable:
                    why = f"gave up after {attempt} attempt{'s' if attempt > 1 else ''}"
                    if attempt <= self.retries:
                        why += f": timeout_s {self.timeout_s:g} s"
                    error.args = (f"{error} ({why})",)
                raise error
            time.sleep(wait)

    def _send(
        self, request: urllib.request.Request, endpoint: str, idempotent: bool
    ) -> dict[str, Any] | tuple[RegistryError, bool, float | None]:
        def fail(text: str, **kw: Any) -> RegistryError:
            return RegistryError(
                f"MLflow at {self.server}: {request.get_method()} {endpoint}: {text}",
                server=self.server,
                endpoint=endpoint,
                **kw,
            )

        timeout = max(1.0, self.remaining())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, _read(err)
            code, message = _mlflow_error(raw)
            retryable = status in _UNPROCESSED or (idempotent and status >= 500)
            after = _retry_after(err.headers.get("Retry-After")) if retryable else None
            if code:
                text = f"{code}: {message}".removesuffix(": ") + f" (HTTP {status})"
            else:
                text = f"HTTP {status} {err.reason}: {message}"
            return fail(text, status=status, error_code=code), retryable, after
        except urllib.error.URLError as err:
            # urllib raises URLError when connecting or sending failed: the server has not
            # processed the request, so any request may be sent again.
            return fail(f"cannot connect: {err.reason}"), True, None
        except (OSError, http.client.HTTPException) as err:
            # Sent, but the answer failed (reset, timeout): it may have been processed.
            return fail(f"no answer: {type(err).__name__}: {err}"), idempotent, None
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            return fail(f"not a JSON answer: {raw[:200]!r}"), False, None
        if not isinstance(answer, dict):
            return fail(f"not a JSON object: {raw[:200]!r}"), False, None
        return answer


def _auth_header(parts: urllib.parse.SplitResult) -> str | None:
    """Basic from MLFLOW_TRACKING_USERNAME/PASSWORD (or the URI's user:password@), else Bearer
    MLFLOW_TRACKING_TOKEN."""
    user = os.environ.get("MLFLOW_TRACKING_USERNAME") or parts.username
    password = os.environ.get("MLFLOW_TRACKING_PASSWORD") or parts.password
    if user and password:
        user, password = urllib.parse.unquote(user), urllib.parse.unquote(password)
        return "Basic " + base64.standard_b64encode(f"{user}:{password}".encode()).decode()
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    return f"Bearer {token}" if token else None


def _read(err: urllib.error.HTTPError) -> bytes:
    try:
        return err.read()
    except (OSError, http.client.HTTPException):
        return b""


def _mlflow_error(raw: bytes) -> tuple[str | None, str]:
    """MLflow's (error_code, message) from an error answer, or (None, the start of the body)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None, raw[:300].decode("utf-8", "replace").strip() or "(empty answer)"
    if isinstance(body, dict) and body.get("error_code"):
        return str(body["error_code"]), str(body.get("message", ""))
    return None, json.dumps(body)[:300]


def _retry_after(value: str | None) -> float | None:
    try:
        return min(max(0.0, float(value)), MAX_RETRY_AFTER_S) if value else None
    except ValueError:
        return None  # an HTTP date: the default backoff instead
