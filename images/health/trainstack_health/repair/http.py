"""The repair controller's two HTTP clients besides the Kubernetes API: the cluster owner's
repair hook (mode "hook") and Prometheus's query API (stragglers). Standard library only."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

from trainstack_health.kube import USER_AGENT

HOOK_TIMEOUT_S = 10.0
QUERY_TIMEOUT_S = 30.0


class HttpError(Exception):
    """A request that got no 2xx answer; the message says what came back (or why none)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a 2xx: following it could leave https (or the host the
    cluster owner configured) with the node list in hand."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:  # noqa: ARG002
        return None


def _opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(
        _NoRedirect(), urllib.request.HTTPSHandler(context=context or ssl.create_default_context())
    )


def _send(req: urllib.request.Request, timeout: float, context: ssl.SSLContext | None) -> bytes:
    try:
        with _opener(context).open(req, timeout=timeout) as resp:
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as err:
        detail = err.read()[:200].decode(errors="replace")
        raise HttpError(f"{req.get_method()} {req.full_url}: HTTP {err.code} {detail}") from None
    except (urllib.error.URLError, OSError) as err:
        raise HttpError(f"{req.get_method()} {req.full_url}: {err}") from None


def post_hook(
    url: str,
    payload: Mapping[str, Any],
    *,
    timeout: float = HOOK_TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> None:
    """POST the payload as JSON. Only https (parse_settings refuses anything else, and so does
    this, whoever calls it); the server's certificate is verified against the system's CA
    bundle (tests pass their own CA in `context`, never an unverified one)."""
    if urlsplit(url).scheme != "https":
        raise HttpError(f"refusing to send the repair hook over {url!r}: https only")
    req = urllib.request.Request(
        url,
        data=json.dumps(payload, sort_keys=True).encode(),
        headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
        method="POST",
    )
    _send(req, timeout, context)


def query(
    base_url: str,
    promql: str,
    *,
    timeout: float = QUERY_TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> Any:
    """An instant query, GET <base>/api/v1/query?query=... (prometheus docs/querying/api.md);
    the decoded JSON answer. Prometheus answers 400/422/503 with a JSON body holding
    `error`: that text is in the HttpError."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urlencode({"query": promql})
    req = urllib.request.Request(
        url, headers={"Accept": "application/json", "User-Agent": USER_AGENT}
    )
    body = _send(req, timeout, context)
    try:
        return json.loads(body)
    except ValueError as err:
        raise HttpError(f"GET {url}: not JSON: {err}") from None
