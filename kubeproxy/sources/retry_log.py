"""The line a reflector logs before it retries, worded as client-go's reflector words it:

    "Failed to watch" err="failed to list *v1.Service: GET /api/v1/services: connection refused" type="*v1.Service" retryIn="1.2s"

(client-go: `"Failed to watch" err="failed to list *v1.ServiceCIDR: the server could not find the
requested resource" logger="UnhandledError" reflector="..." type="*v1.ServiceCIDR"`). The request
shows as method and path only: the query (percent-encoded selectors, resourceVersion) is in the
reflector's own name and would make the line hundreds of characters long. `retryIn` is ours:
when the next attempt comes.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubeproxy.cluster.duration import format_go_duration
from kubeproxy.runtime.logs import Structured, kv

MAX_REASON = 200  # characters of the server's message kept in the line


def go_type(kind: str, api_version: str) -> str:
    """client-go's type description: `*v1.Service`, `*v1.EndpointSlice` (the version, not the group)."""
    return f"*{api_version.rpartition('/')[2]}.{kind}"


def _request(error: BaseException) -> tuple[str, str]:
    """(method, URL) of the request that failed, when the error knows it."""
    request: Any = None
    try:
        request = getattr(error, "request", None)
    except RuntimeError:  # httpx's error without a request attached
        request = None
    if request is not None:
        return str(request.method), str(request.url)
    url = getattr(error, "url", None)
    return ("GET", url) if isinstance(url, str) else ("", "")


def _reason(error: BaseException, url: str) -> str:
    text = str(error) or type(error).__name__
    if url and text.startswith(url):
        text = text[len(url) :].lstrip(": ")  # SourceError's text starts with its URL
    elif url:
        text = f"{text} ({type(error).__name__})"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def failed_to_watch(
    kind: str, api_version: str, error: BaseException, retry_in: float, retry_after: float | None = None
) -> Structured:
    """The retry line for `error`, which ended a list or a watch of `kind`."""
    type_ = go_type(kind, api_version)
    method, url = _request(error)
    parts = urlsplit(url)
    verb = "watch" if parse_qs(parts.query).get("watch") in (["true"], ["1"]) else "list"
    where = f"{method} {parts.path}: " if parts.path else ""
    fields: dict[str, Any] = {"err": f"failed to {verb} {type_}: {where}{_reason(error, url)}", "type": type_}
    fields["retryIn"] = format_go_duration(round(retry_in, 1))
    if retry_after is not None:
        fields["retryAfter"] = format_go_duration(retry_after)  # the server asked for it
    return kv("Failed to watch", **fields)
