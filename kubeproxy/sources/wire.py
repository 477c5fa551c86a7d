"""What the API server sends, as typed structures: a Status, a list's envelope, a watch frame.

Everything the reflector reads from an answer goes through here, so that a value of the wrong
type (a Status `code` that is a list, an object or `1e400`; a list `metadata` that is a string; a
watch frame that is not an object) is a `WireError` naming where it was found, which the
reflector retries with back-off like any other error, as client-go does when its typed decoder
refuses an answer. The objects themselves stay plain JSON here (or, for a watch-list's initial events, the typed
decoder's structs where they fit its schema: `typed_event`): the cluster model validates them
and rejects a malformed one by name (see `api.py`); only what the reflector needs of each one (its
kind, name, namespace and resourceVersion) is checked, because a list whose items cannot even be
keyed is not one an API server sends.

Go's encoding/json leaves a field at its zero value when the JSON holds `null`: the fields here
take None for it. Integers are bounded as Go's types bound them (a Status code is an int32).

Size bounds (a 5,000-node cluster's real answers are far below each; a hostile one stops there):

- `MAX_FRAME_BYTES`, one watch line: 16 MiB. The API server refuses an object whose request
  body is over 3 MiB, so a real event (the object re-encoded as JSON, in its envelope) is at most
  a few MiB: over 5x headroom.
- `MAX_LIST_BYTES`, the bodies of one list, all its pages together: 512 MiB. The largest real
  list is the EndpointSlices of the largest cluster: ~150k pods, each behind one or two Services,
  is ~250k endpoints at ~400 bytes of JSON each (addresses, conditions, node, zone, targetRef),
  ~100 MB with the slices' own metadata; 10k Services are ~20 MB. 5x headroom over the largest:
  refusing a real list would leave the proxy on stale rules for good, which is worse than what
  a hostile server can make it hold meanwhile (this bound, decoded).
- `MAX_LIST_ITEMS`: 1,000,000 objects. 10k Services, or ~25k EndpointSlices (one per family per
  Service, more for the large ones), are far below it; a body of tiny items (`{}` is 2 bytes) could
  otherwise hold 250M of them within the byte bound.
- `MAX_LIST_PAGES`: 10,000 pages. The reflector asks for no page size, so a real server answers in
  one page; even at client-go's default of 500 items a page, 1M items are 2,000 pages. A server
  whose `continue` token never ends meets this bound with empty pages as well as with full ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from kubeproxy.cluster.schema import Item

_T = TypeVar("_T")

MIB = 1024 * 1024
MAX_FRAME_BYTES = 16 * MIB
MAX_LIST_BYTES = 512 * MIB
MAX_LIST_ITEMS = 1_000_000
MAX_LIST_PAGES = 10_000

Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class WireError(ValueError):
    """An answer that is not what the API server sends: the message says what and where."""


class StatusCause(msgspec.Struct):
    reason: str | None = None
    message: str | None = None
    field: str | None = None


class StatusDetails(msgspec.Struct):
    name: str | None = None
    group: str | None = None
    kind: str | None = None
    uid: str | None = None
    causes: list[StatusCause] | None = None
    retryAfterSeconds: Int32 | None = None


class Status(msgspec.Struct):
    """meta/v1 Status: what an error answer or a watch ERROR event carries."""

    kind: str | None = None
    apiVersion: str | None = None
    status: str | None = None
    message: str | None = None
    reason: str | None = None
    code: Int32 | None = None
    details: StatusDetails | None = None


class ListMeta(msgspec.Struct):
    resourceVersion: str | None = None
    continue_: str | None = msgspec.field(default=None, name="continue")
    remainingItemCount: Int64 | None = None


class ListHead(msgspec.Struct):
    """A list answer without its items."""

    kind: str | None = None
    apiVersion: str | None = None
    metadata: ListMeta | None = None


@dataclass(frozen=True)
class ObjectKey:
    """What the reflector reads of an object: its kind and apiVersion ("" when absent, as in list
    items), namespace ("" when cluster-scoped), name ("" only in a bookmark) and resourceVersion."""

    kind: str
    api_version: str
    namespace: str
    name: str
    resource_version: str


@dataclass(frozen=True)
class Frame:
    """One watch event: its type and its object, a JSON object (a Status when type is ERROR)."""

    type: str
    object: dict[str, Any]


EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


def _typed(value: Any, kind: type[_T], what: str) -> _T:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as e:
        raise WireError(f"{what} is malformed: {e}") from None


def status_of(value: Any, what: str = "the Status") -> Status:
    """`value` (decoded JSON) as a Status; WireError if it is not one."""
    if not isinstance(value, dict):
        raise WireError(f"{what} is not a JSON object")
    return _typed(value, Status, what)


def list_head(body: Any) -> ListHead:
    """A list answer's envelope (the dicts of `body`, items aside); WireError if it is malformed."""
    if not isinstance(body, dict):
        raise WireError("the list is not a JSON object")
    head = {k: v for k, v in body.items() if k != "items"}
    return _typed(head, ListHead, "the list")


def _text(value: Any, what: str) -> str:
    """A string field: absent or null is "" (as Go decodes them), any other type is an error."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WireError(f"{what} is a {type(value).__name__}, not a string")
    return value


def object_key(obj: Any, what: str, *, named: bool = True) -> ObjectKey:
    """An object's kind and key fields; WireError if the object or any of them has the wrong type,
    or (when `named`) it has no name. Read by hand, not by msgspec: it runs on every listed object."""
    if not isinstance(obj, dict):
        raise WireError(f"{what} is not a JSON object")
    meta = obj.get("metadata")
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        raise WireError(f"{what}: metadata is not a JSON object")
    key = ObjectKey(
        _text(obj.get("kind"), f"{what}: kind"),
        _text(obj.get("apiVersion"), f"{what}: apiVersion"),
        _text(meta.get("namespace"), f"{what}: metadata.namespace"),
        _text(meta.get("name"), f"{what}: metadata.name"),
        _text(meta.get("resourceVersion"), f"{what}: metadata.resourceVersion"),
    )
    if named and not key.name:
        raise WireError(f"{what} has no metadata.name")
    return key


def decode_json(data: bytes) -> Any:
    """JSON text as Python values: msgspec, or where it refuses (NaN, 1e400, a lone surrogate
    escape) the json module, so that the result is what the json module gives. WireError if it
    is not JSON at all."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        pass
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise WireError(f"not JSON ({type(e).__name__}: {str(e)[:120]})") from None


def frame_of(line: bytes) -> Frame:
    """One watch line as a Frame; WireError if it is not a watch event."""
    event = decode_json(line)
    if not isinstance(event, dict):
        raise WireError("the watch event is not a JSON object")
    type_, obj = event.get("type"), event.get("object")
    if not isinstance(type_, str) or type_ not in EVENT_TYPES:
        raise WireError(f"the watch event's type {str(type_)[:40]!r} is not one of {', '.join(sorted(EVENT_TYPES))}")
    if not isinstance(obj, dict):
        raise WireError(f"the {type_} event's object is not a JSON object")
    return Frame(type_, obj)


class TypedEvent(msgspec.Struct, forbid_unknown_fields=True):
    """A watch line whose object fits the typed decoder's schema (`schema.Item`)."""

    type: str
    object: Item


_TYPED_EVENT = msgspec.json.Decoder(TypedEvent)


def typed_event(line: bytes) -> TypedEvent | None:
    """One watch line as a TypedEvent, or None when it holds anything outside the schema (another
    field, a value of another type, not JSON): `frame_of` and `object_key` then read it and word
    what is wrong. So this path only skips work: a line it takes, they take the same way, and the
    schema bounds its nesting by construction. The caller still checks the type and key fields
    that `frame_of` and `object_key` check (see `Reflector._typed_initial`)."""
    try:
        return _TYPED_EVENT.decode(line)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None


def retry_after(status_code: int, header: str | None) -> int | None:
    """The seconds a `Retry-After` header asks for, where client-go obeys it (rest/with_retry.go
    `checkWait`: a 429 or any status from 500 up) and as it reads it (strconv.Atoi: an optional
    sign and ASCII digits, within int64; an HTTP date is not read); else None."""
    if header is None or not (status_code == 429 or status_code >= 500):
        return None
    text = header.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None
