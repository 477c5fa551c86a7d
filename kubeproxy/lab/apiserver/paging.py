"""Lists in pages (`limit`, `continue`) as kube-apiserver v1.37.2 serves them: a list at
resourceVersion "0" comes whole from the watch cache whatever the limit; any other list with a
`limit` ends with a `continue` token while objects remain, and `remainingItemCount` when no
selector filters it (apiserver pkg/storage/continue.go, pkg/storage/interfaces.go:
ValidateListOptions; pkg/storage/etcd3/errors.go for a token whose version is compacted away).

The token is opaque to clients; like upstream's it is base64url (unpadded) JSON naming its
format, the list's resourceVersion and the key after which the next page starts. This server
keeps no snapshots: a continued page holds the objects as they are now, under the token's version.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from kubeproxy.lab.apiserver.status_errors import ApiError

TOKEN_FORMAT = "meta.k8s.io/v1"
# What upstream says when the version a continue token names has been compacted away; with it
# comes a token to go on at the current version (rv -1), as its etcd3 storage hands out.
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list without "
    "the continue parameter, or use the continue token in this response to retrieve the remainder of the results. "
    "Continuing with the provided token results in an inconsistent list - objects that were created, modified, or "
    "deleted between the time the first chunk was returned and now may show up in the list."
)

Key = tuple[str, str]  # (namespace, name): the store's order, as etcd's keys sort


@dataclass(frozen=True)
class Page:
    """Where a page starts (after `after`, None: the first) and how many objects it holds at most
    (None: all that remain); `rv` is the version a continued list is at (0: not continued)."""

    limit: int | None
    after: Key | None = None
    rv: int = 0


def encode(rv: int, last: Key) -> str:
    start = "/".join(part for part in last if part) + "\x00"
    raw = json.dumps({"v": TOKEN_FORMAT, "rv": rv, "start": start}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _decode(token: str) -> tuple[int, Key]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        body = json.loads(raw)
    except (binascii.Error, ValueError) as e:
        raise ApiError(400, "BadRequest", f"invalid continue token: continue key is not valid: {e}") from None
    if not isinstance(body, dict) or body.get("v") != TOKEN_FORMAT:
        version = body.get("v") if isinstance(body, dict) else None
        raise ApiError(400, "BadRequest", f"invalid continue token: continue key encoded in an unrecognized version {version}")
    rv, start = body.get("rv"), body.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or rv == 0:
        raise ApiError(400, "BadRequest", "invalid continue token: continue key has an invalid resource version: 0")
    if not isinstance(start, str) or not start.strip("\x00/"):
        raise ApiError(400, "BadRequest", "invalid continue token: continue key is empty")
    parts = start.rstrip("\x00").strip("/").split("/")
    return rv, (parts[0], parts[1]) if len(parts) == 2 else ("", parts[-1])


def page_of(query: dict[str, str], compacted_rv: int) -> Page:
    """The page a list's query asks for; 400 for a bad limit or token, 410 Expired for a token
    whose version the history no longer holds."""
    version = query.get("resourceVersion", "")
    raw_limit = query.get("limit", "")
    try:
        limit = int(raw_limit) if raw_limit else 0
    except ValueError:
        raise ApiError(400, "BadRequest", f'invalid limit "{raw_limit}"') from None
    token = query.get("continue", "")
    if not token:
        # The watch cache answers a list at "0" whole: it ignores the limit.
        return Page(limit if limit > 0 and version != "0" else None)
    rv, after = _decode(token)
    if version not in ("", "0"):
        raise ApiError(400, "BadRequest", "specifying resource version is not allowed when using continue")
    if 0 < rv < compacted_rv:
        raise ApiError(410, "Expired", CONTINUE_EXPIRED, metadata={"continue": encode(-1, after)})
    return Page(limit if limit > 0 else None, after, rv)
