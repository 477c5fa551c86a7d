"""What the API server sends as `application/vnd.kubernetes.protobuf`: its envelope, a list, a
watch stream's frames and a Status, read into what `wire.py` gives for the same answer in JSON.

The facts (k8s.io/apimachinery v0.37.2, pkg/runtime/serializer/protobuf and pkg/util/framer):

- a whole answer (a list, a Status) is the 4 bytes "k8s\\x00" and a `runtime.Unknown` message:
  typeMeta 1 (apiVersion 1, kind 2), raw 2 (the object's own message), contentEncoding 3,
  contentType 4;
- a watch answer (`;stream=watch`) is frames, each a 4-byte big-endian length and that many
  bytes of a `metav1.WatchEvent` (type 1, object 2: a RawExtension whose raw 1 is an enveloped
  object as above), without the magic bytes before the event itself;
- a List is metadata 1 (ListMeta) and items 2; a Status is metadata 1, status 2, message 3,
  reason 4, details 5 (name 1, group 2, kind 3, causes 4, retryAfterSeconds 5, uid 6) and code 6.

A list's objects become `schema.Item`s (cluster/proto_schema.py), the same structs the JSON typed
decoder gives; everything else becomes the plain dicts the JSON decoder would give, so that the
reflector checks them the same way. Anything else is a `wire.WireError` naming the object where
one can be named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.proto_schema import KINDS, LIST_ITEMS, LIST_META, decode, decode_item, peek_name
from kubeproxy.cluster.protowire import BYTES, ProtoError, fields, signed64
from kubeproxy.cluster.schema import Item, Metadata
from kubeproxy.sources.wire import MAX_LIST_ITEMS, WireError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
FRAME_HEADER = 4


def is_protobuf(body: bytes) -> bool:
    """Whether a body is enveloped protobuf: no JSON text starts with these bytes."""
    return body[:4] == MAGIC


@dataclass(frozen=True)
class Envelope:
    api_version: str
    kind: str
    start: int  # where the object's own message lies in the buffer
    end: int


def envelope(buf: bytes, pos: int = 0, end: int | None = None) -> Envelope:
    """The runtime.Unknown after the magic bytes at buf[pos:end]; WireError if it is not one."""
    end = len(buf) if end is None else end
    if buf[pos : pos + 4] != MAGIC:
        raise WireError(f"not Kubernetes protobuf (it starts {bytes(buf[pos : pos + 8])!r}, not {MAGIC!r})")
    api_version = kind = ""
    raw: tuple[int, int] | None = None
    try:
        for number, wire, start, stop in fields(buf, pos + 4, end):
            if wire != BYTES:
                continue
            if number == 1:
                for sub, sub_wire, s, e in fields(buf, start, stop):
                    if sub_wire == BYTES and sub == 1:
                        api_version = _text(buf, s, e)
                    elif sub_wire == BYTES and sub == 2:
                        kind = _text(buf, s, e)
            elif number == 2:
                raw = (start, stop)
            elif number == 3 and stop > start:
                raise WireError(
                    f"the {kind or 'object'} is encoded as {_text(buf, start, stop)[:40]!r}, which this client does not read"
                )
    except ProtoError as e:
        raise WireError(f"the protobuf envelope is malformed: {e}") from None
    if raw is None:
        raw = (end, end)  # an empty message: every field at its zero value
    return Envelope(api_version, kind, *raw)


def _text(buf: bytes, start: int, stop: int) -> str:
    return buf[start:stop].decode("utf-8", "replace")


def decode_list(body: bytes, kind: str) -> tuple[dict[str, Any], list[Item]]:
    """A list answer of `kind` objects as (its envelope and ListMeta as the JSON decoder's dicts,
    its items as structs whose kind is unset, as a JSON list's items); WireError otherwise."""
    env = envelope(body)
    head: dict[str, Any] = {"kind": env.kind, "apiVersion": env.api_version}
    if env.kind != f"{kind}List":
        return head, []  # the caller refuses another kind's list, by its kind
    items: list[Item] = []
    try:
        with paused_gc(freeze=True):  # as `schema.decode_list`: see cluster.bulk
            _decode_items(body, env, kind, head, items)
    except ProtoError as e:
        raise WireError(f"the {kind}List is malformed protobuf: {e}") from None
    return head, items


def _decode_items(body: bytes, env: Envelope, kind: str, head: dict[str, Any], items: list[Item]) -> None:
    """The list's ListMeta into `head` and its objects onto `items`; ProtoError naming the object."""
    for number, wire, start, stop in fields(body, env.start, env.end):
        if wire != BYTES:
            raise ProtoError(f"{kind}List field {number} is not length-delimited")
        if number == 1:
            head["metadata"] = _plain_meta(decode(body, start, stop, LIST_META))
        elif number == LIST_ITEMS:
            if len(items) == MAX_LIST_ITEMS:  # before a body of tiny items fills the memory
                raise ProtoError(f"the list has over {MAX_LIST_ITEMS} objects, the most taken")
            try:
                items.append(decode_item(body, start, stop, kind))
            except ProtoError as e:
                name = peek_name(body, start, stop)
                raise ProtoError(f"item {len(items)}{f' ({name})' if name else ''}: {e}") from None


def _plain_meta(meta: Metadata) -> dict[str, Any]:
    plain: dict[str, Any] = {}
    if meta.resourceVersion:
        plain["resourceVersion"] = meta.resourceVersion
    if meta.continue_:
        plain["continue"] = meta.continue_
    if isinstance(meta.remainingItemCount, int):
        plain["remainingItemCount"] = meta.remainingItemCount
    return plain


def status(body: bytes, pos: int = 0, end: int | None = None) -> dict[str, Any]:
    """An enveloped meta/v1 Status as the dicts its JSON decodes to; WireError otherwise."""
    return _status(body, envelope(body, pos, end))


def event_status(event: Event) -> dict[str, Any]:
    """An ERROR watch event's Status as the dicts its JSON decodes to; WireError otherwise."""
    return _status(event.body, Envelope(event.api_version, event.kind, event.start, event.end))


def _status(body: bytes, env: Envelope) -> dict[str, Any]:
    # Empty texts and a zero retryAfterSeconds are left out, as JSON's omitempty does.
    plain: dict[str, Any] = {"kind": env.kind, "apiVersion": env.api_version}
    try:
        for number, wire, start, stop in fields(body, env.start, env.end):
            if wire == BYTES and number in _STATUS_TEXTS and stop > start:
                plain[_STATUS_TEXTS[number]] = _text(body, start, stop)
            elif wire == BYTES and number == 5:
                plain["details"] = _details(body, start, stop)
            elif number == 6 and wire == 0:
                plain["code"] = signed64(start)
    except ProtoError as e:
        raise WireError(f"the Status is malformed protobuf: {e}") from None
    return plain


_STATUS_TEXTS = {2: "status", 3: "message", 4: "reason"}
_DETAILS_TEXTS = {1: "name", 2: "group", 3: "kind", 6: "uid"}
_CAUSE_TEXTS = {1: "reason", 2: "message", 3: "field"}


def _details(buf: bytes, pos: int, end: int) -> dict[str, Any]:
    details: dict[str, Any] = {}
    for number, wire, start, stop in fields(buf, pos, end):
        if wire == BYTES and number in _DETAILS_TEXTS and stop > start:
            details[_DETAILS_TEXTS[number]] = _text(buf, start, stop)
        elif wire == BYTES and number == 4:
            cause = {
                _CAUSE_TEXTS[n]: _text(buf, s, e) for n, w, s, e in fields(buf, start, stop) if w == BYTES and n in _CAUSE_TEXTS
            }
            details.setdefault("causes", []).append(cause)
        elif wire == 0 and number == 5 and start:
            details["retryAfterSeconds"] = signed64(start)
    return details


@dataclass(frozen=True)
class Event:
    """One protobuf watch event: its type, and its object as the enveloped kind and bytes."""

    type: str
    api_version: str
    kind: str
    body: bytes
    start: int
    end: int


def watch_event(frame: bytes) -> Event:
    """A watch frame's WatchEvent (the frame without its length); WireError if it is not one."""
    type_ = ""
    raw: tuple[int, int] | None = None
    try:
        for number, wire, start, stop in fields(frame, 0, len(frame)):
            if wire != BYTES:
                continue
            if number == 1:
                type_ = _text(frame, start, stop)
            elif number == 2:
                for sub, sub_wire, s, e in fields(frame, start, stop):
                    if sub == 1 and sub_wire == BYTES:
                        raw = (s, e)
    except ProtoError as e:
        raise WireError(f"the watch event is malformed protobuf: {e}") from None
    if raw is None:
        raise WireError(f"the {type_ or 'watch'} event has no object")
    env = envelope(frame, *raw)
    return Event(type_, env.api_version, env.kind, frame, env.start, env.end)


def event_object(event: Event) -> Item:
    """The object of a watch event of one of KINDS as the typed decoder's struct, its kind and
    apiVersion set; WireError (naming the object if its metadata can be read) otherwise."""
    if event.kind not in KINDS:
        raise WireError(f"the {event.type} event holds a {event.kind[:60]!r}, which this client does not decode")
    try:
        item = decode_item(event.body, event.start, event.end, event.kind)
    except ProtoError as e:
        name = peek_name(event.body, event.start, event.end)
        raise WireError(f"the {event.type} event's {event.kind}{f' {name}' if name else ''} is malformed protobuf: {e}") from None
    item.kind, item.apiVersion = event.kind, event.api_version
    return item


def frame_length(header: bytes | bytearray) -> int:
    """The length a frame's 4-byte big-endian header gives."""
    return int.from_bytes(header[:FRAME_HEADER], "big")
