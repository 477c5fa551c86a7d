"""Services, EndpointSlices, Nodes and ServiceCIDRs from protobuf, into the typed decoder's structs (`schema.py`).

The API server's protobuf encoding of an object carries the same fields as its JSON, by number
instead of by name. The tables below give, for each message kube-proxy reads, the number of each
field and the `schema` struct attribute it fills: a decoded object is the `schema.Item` the JSON
typed decoder gives for the same object, which `cluster/typed.py` (or, through `schema.as_plain`,
the dict parsers) reads as it reads any other. Field numbers are upstream's, from k8s.io/api
v0.37.2 core/v1, discovery/v1 and networking/v1 and k8s.io/apimachinery meta/v1 `generated.proto`.
A ServiceCIDR is outside the typed schema (its JSON is read as plain dicts): its struct is read
only through `schema.as_plain` (`PLAIN_KINDS`).

Protobuf writes a non-pointer Go field even at its zero value ("" or 0), where the JSON encoder
leaves an `omitempty` field out: such a field read as zero is left unset here, so that both
encodings give the same struct; a pointer field (`keep`) is set whenever it is on the wire, as
JSON shows it whenever it is non-nil. A field these tables do not list (managedFields,
ownerReferences, a Node's conditions and images: nothing kube-proxy reads) is skipped by its wire
type. The tables hold no message inside itself, so decoding nests a fixed number of levels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from msgspec import UNSET, Struct, UnsetType

from kubeproxy.cluster import schema as S
from kubeproxy.cluster.protowire import BYTES, VARINT, WIRE_TYPES, ProtoError, fields, signed64, varint

STR, INT, BOOL, MSG, MAP, TIME, INTSTR = range(7)
_WIRE_OF = {STR: BYTES, INT: VARINT, BOOL: VARINT, MSG: BYTES, MAP: BYTES, TIME: BYTES, INTSTR: BYTES}


@dataclass(frozen=True)
class Field:
    attr: str
    kind: int
    message: Message | None = None
    repeated: bool = False
    keep: bool = False  # a Go pointer (or always-written) field: zero values are kept


@dataclass(frozen=True)
class Message:
    name: str
    struct: type[Struct]
    fields: Mapping[int, Field] = field(default_factory=dict)
    # By the field's whole key (number << 3 | wire type), as read off the wire: one lookup.
    plan: Mapping[int, tuple[str, int, Message | None, bool, bool]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        plan = {n << 3 | _WIRE_OF[f.kind]: (f.attr, f.kind, f.message, f.repeated, f.keep) for n, f in self.fields.items()}
        object.__setattr__(self, "plan", plan)


def _f(attr: str, kind: int = STR, message: Message | None = None, *, repeated: bool = False, keep: bool = False) -> Field:
    return Field(attr, kind, message, repeated, keep)


OBJECT_META = Message("ObjectMeta", S.Metadata, {
    1: _f("name"), 2: _f("generateName"), 3: _f("namespace"), 4: _f("selfLink"), 5: _f("uid"),
    6: _f("resourceVersion"), 7: _f("generation", INT), 8: _f("creationTimestamp", TIME),
    9: _f("deletionTimestamp", TIME), 10: _f("deletionGracePeriodSeconds", INT, keep=True),
    11: _f("labels", MAP), 12: _f("annotations", MAP), 14: _f("finalizers", repeated=True),
})  # fmt: skip
LIST_META = Message("ListMeta", S.Metadata, {
    1: _f("selfLink"), 2: _f("resourceVersion"), 3: _f("continue_"), 4: _f("remainingItemCount", INT, keep=True),
})  # fmt: skip

SERVICE_PORT = Message("ServicePort", S.Port, {
    1: _f("name"), 2: _f("protocol"), 6: _f("appProtocol", keep=True), 3: _f("port", INT, keep=True),
    4: _f("targetPort", INTSTR), 5: _f("nodePort", INT),
})  # fmt: skip
CLIENT_IP_CONFIG = Message("ClientIPConfig", S.ClientIPConfig, {1: _f("timeoutSeconds", INT, keep=True)})
SESSION_AFFINITY_CONFIG = Message("SessionAffinityConfig", S.SessionAffinityConfig, {1: _f("clientIP", MSG, CLIENT_IP_CONFIG)})
SERVICE_SPEC = Message("ServiceSpec", S.Spec, {
    1: _f("ports", MSG, SERVICE_PORT, repeated=True), 2: _f("selector", MAP), 3: _f("clusterIP"),
    18: _f("clusterIPs", repeated=True), 4: _f("type"), 5: _f("externalIPs", repeated=True),
    7: _f("sessionAffinity"), 8: _f("loadBalancerIP"), 9: _f("loadBalancerSourceRanges", repeated=True),
    10: _f("externalName"), 11: _f("externalTrafficPolicy"), 12: _f("healthCheckNodePort", INT),
    13: _f("publishNotReadyAddresses", BOOL), 14: _f("sessionAffinityConfig", MSG, SESSION_AFFINITY_CONFIG),
    19: _f("ipFamilies", repeated=True), 17: _f("ipFamilyPolicy", keep=True),
    20: _f("allocateLoadBalancerNodePorts", BOOL, keep=True), 21: _f("loadBalancerClass", keep=True),
    22: _f("internalTrafficPolicy", keep=True), 23: _f("trafficDistribution", keep=True),
})  # fmt: skip
PORT_STATUS = Message(
    "PortStatus", S.IngressPort, {1: _f("port", INT, keep=True), 2: _f("protocol", keep=True), 3: _f("error", keep=True)}
)
LOAD_BALANCER_INGRESS = Message("LoadBalancerIngress", S.Ingress, {
    1: _f("ip"), 2: _f("hostname"), 3: _f("ipMode", keep=True), 4: _f("ports", MSG, PORT_STATUS, repeated=True),
})  # fmt: skip
LOAD_BALANCER_STATUS = Message(
    "LoadBalancerStatus", S.LoadBalancerStatus, {1: _f("ingress", MSG, LOAD_BALANCER_INGRESS, repeated=True)}
)
SERVICE_STATUS = Message("ServiceStatus", S.Status, {1: _f("loadBalancer", MSG, LOAD_BALANCER_STATUS, keep=True)})
SERVICE = Message("Service", S.Item, {
    1: _f("metadata", MSG, OBJECT_META, keep=True), 2: _f("spec", MSG, SERVICE_SPEC, keep=True),
    3: _f("status", MSG, SERVICE_STATUS, keep=True),
})  # fmt: skip

CONDITIONS = Message("EndpointConditions", S.Conditions, {
    1: _f("ready", BOOL, keep=True), 2: _f("serving", BOOL, keep=True), 3: _f("terminating", BOOL, keep=True),
})  # fmt: skip
HINT = Message("ForZone", S.Hint, {1: _f("name", keep=True)})  # ForNode has the same one field
HINTS = Message(
    "EndpointHints", S.Hints, {1: _f("forZones", MSG, HINT, repeated=True), 2: _f("forNodes", MSG, HINT, repeated=True)}
)
ENDPOINT = Message("Endpoint", S.Endpoint, {
    1: _f("addresses", repeated=True), 2: _f("conditions", MSG, CONDITIONS, keep=True), 3: _f("hostname", keep=True),
    6: _f("nodeName", keep=True), 7: _f("zone", keep=True), 8: _f("hints", MSG, HINTS, keep=True),
})  # fmt: skip
ENDPOINT_PORT = Message("EndpointPort", S.Port, {
    1: _f("name", keep=True), 2: _f("protocol", keep=True), 3: _f("port", INT, keep=True), 4: _f("appProtocol", keep=True),
})  # fmt: skip
ENDPOINT_SLICE = Message("EndpointSlice", S.Item, {
    1: _f("metadata", MSG, OBJECT_META, keep=True), 4: _f("addressType", keep=True),
    2: _f("endpoints", MSG, ENDPOINT, repeated=True), 3: _f("ports", MSG, ENDPOINT_PORT, repeated=True),
})  # fmt: skip

TAINT = Message("Taint", S.Taint, {1: _f("key", keep=True), 2: _f("value"), 3: _f("effect", keep=True), 4: _f("timeAdded", TIME)})
NODE_SPEC = Message("NodeSpec", S.Spec, {
    1: _f("podCIDR"), 7: _f("podCIDRs", repeated=True), 3: _f("providerID"), 4: _f("unschedulable", BOOL),
    5: _f("taints", MSG, TAINT, repeated=True),
})  # fmt: skip
NODE_ADDRESS = Message("NodeAddress", S.NodeAddress, {1: _f("type", keep=True), 2: _f("address", keep=True)})
NODE_STATUS = Message("NodeStatus", S.Status, {5: _f("addresses", MSG, NODE_ADDRESS, repeated=True)})
NODE = Message("Node", S.Item, {
    1: _f("metadata", MSG, OBJECT_META, keep=True), 2: _f("spec", MSG, NODE_SPEC, keep=True),
    3: _f("status", MSG, NODE_STATUS, keep=True),
})  # fmt: skip


class ServiceCIDRSpec(Struct, omit_defaults=True):
    """A ServiceCIDR's spec, which `schema.Spec` does not hold: read through `schema.as_plain`."""

    cidrs: list[str] | UnsetType = UNSET


SERVICE_CIDR = Message("ServiceCIDR", S.Item, {
    1: _f("metadata", MSG, OBJECT_META, keep=True),
    2: _f("spec", MSG, Message("ServiceCIDRSpec", ServiceCIDRSpec, {1: _f("cidrs", repeated=True)}), keep=True),
})  # fmt: skip

# The kinds whose objects decode into `schema.Item`, by kind.
KINDS: Mapping[str, Message] = {"Service": SERVICE, "EndpointSlice": ENDPOINT_SLICE, "Node": NODE, "ServiceCIDR": SERVICE_CIDR}
# Of those, the kinds outside the typed schema: delivered as plain dicts (`schema.as_plain`), as
# their JSON is.
PLAIN_KINDS = frozenset({"ServiceCIDR"})
LIST_ITEMS = 2  # a List's `items` (its `metadata` is 1, a ListMeta)


def decode(buf: bytes, pos: int, end: int, message: Message) -> Any:
    """The message in buf[pos:end] as `message.struct`; ProtoError naming the field that is wrong.
    Run once per field of every listed object (~60 per EndpointSlice): the common cases (a
    one-byte key, a length under 128) are read inline."""
    values: dict[str, Any] = {}
    plan = message.plan
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = varint(buf, pos, end)
        step = plan.get(key)
        if step is None:
            number, wire = key >> 3, key & 7
            known = message.fields.get(number)
            if known is not None:  # as Go's unmarshalling: a known field of another wire type is an error
                expected = WIRE_TYPES[_WIRE_OF[known.kind]]
                raise ProtoError(
                    f"{message.name}.{known.attr.rstrip('_')} has wire type {WIRE_TYPES.get(wire, wire)}, not {expected}"
                )
            pos = _skip(buf, pos, end, number, wire)
            continue
        attr, kind, sub, repeated, keep = step
        if kind in (INT, BOOL):  # a varint
            raw = buf[pos] if pos < end else 0x80
            if raw < 0x80:
                pos += 1
            else:
                raw, pos = varint(buf, pos, end)
            value: Any = (raw - (1 << 64) if raw >= 1 << 63 else raw) if kind == INT else raw != 0
            if not (value or keep):
                continue
        else:
            size = buf[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = varint(buf, pos, end)
            stop = pos + size
            if stop > end:
                raise ProtoError(f"{message.name}.{attr.rstrip('_')}: {size} bytes run past the end of the {message.name}")
            if kind == STR:
                # Invalid UTF-8 as Go's JSON encoder writes it (each bad byte U+FFFD): the same text both ways.
                value = buf[pos:stop].decode("utf-8", "replace")
            else:
                try:
                    value = decode(buf, pos, stop, sub) if sub is not None else _value(buf, pos, stop, kind)
                except ProtoError as e:
                    raise ProtoError(f"{message.name}.{attr.rstrip('_')}: {e}") from None
            pos = stop
            if not (value or keep or repeated or kind == MSG) or value is None:
                continue
        if repeated:
            found = values.get(attr)
            if found is None:
                values[attr] = [value]
            else:
                found.append(value)
        elif kind == MAP:
            found = values.get(attr)
            if found is None:
                values[attr] = {value[0]: value[1]}
            else:
                found[value[0]] = value[1]
        else:
            values[attr] = value
    return message.struct(**values)


def _value(buf: bytes, pos: int, end: int, kind: int) -> Any:
    if kind == MAP:
        return _entry(buf, pos, end)
    if kind == TIME:
        return _time(buf, pos, end)
    return _int_or_string(buf, pos, end)


def _entry(buf: bytes, pos: int, end: int) -> tuple[str, str]:
    """A map<string, string> entry (key 1, value 2): absent parts are "", as Go reads them."""
    key = value = ""
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number in (1, 2) and wire == BYTES:
            size = buf[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = varint(buf, pos, end)
            if pos + size > end:
                raise ProtoError("a map entry's text runs past the entry")
            text = buf[pos : pos + size].decode("utf-8", "replace")
            pos += size
            if number == 1:
                key = text
            else:
                value = text
        else:
            pos = _skip(buf, pos, end, number, wire)
    return key, value


# Go's time.Time range as metav1.Time writes it in JSON (RFC 3339, years 0000-9999).
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799


def _time(buf: bytes, pos: int, end: int) -> str | None:
    """metav1.Time (seconds 1, nanos 2) as its JSON text: RFC 3339 in seconds, UTC; None for the
    zero time, which JSON writes as null."""
    if pos == end:
        return None
    seconds = 0
    while pos < end:
        tag, pos = varint(buf, pos, end)
        if tag == 0x08:  # seconds, a varint
            raw, pos = varint(buf, pos, end)
            seconds = signed64(raw)
        else:
            pos = _skip(buf, pos, end, tag >> 3, tag & 7)
    if seconds == _MIN_SECONDS:
        return None
    return _rfc3339(seconds)


@lru_cache(maxsize=1024)
def _rfc3339(seconds: int) -> str:
    """Cached: the objects of a list were mostly made within the same few seconds."""
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        raise ProtoError(f"a time of {seconds} seconds is outside the years 1-9999")
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(buf: bytes, pos: int, end: int) -> int | str:
    """IntOrString (type 1: 0 int, 1 string; intVal 2; strVal 3) as JSON writes it: a number or a text."""
    is_text, value, text = 0, 0, ""
    while pos < end:
        tag, pos = varint(buf, pos, end)
        if tag in (0x08, 0x10):  # type, intVal: varints
            raw, pos = varint(buf, pos, end)
            if tag == 0x08:
                is_text = raw
            else:
                value = signed64(raw)
        elif tag == 0x1A:  # strVal: length-delimited
            size, pos = varint(buf, pos, end)
            if pos + size > end:
                raise ProtoError("IntOrString.strVal runs past its message")
            text = buf[pos : pos + size].decode("utf-8", "replace")
            pos += size
        else:
            pos = _skip(buf, pos, end, tag >> 3, tag & 7)
    if is_text == 1:
        return text
    if not -(2**31) <= value < 2**31:
        raise ProtoError(f"IntOrString.intVal {value} is not an int32")
    return value


def _skip(buf: bytes, pos: int, end: int, number: int, wire: int) -> int:
    """The offset after a field this table does not read."""
    if number == 0:
        raise ProtoError(f"field number 0 at offset {pos}")
    if wire == VARINT:
        return varint(buf, pos, end)[1]
    if wire == BYTES:
        size, pos = varint(buf, pos, end)
        stop = pos + size
    elif wire == 1:
        stop = pos + 8
    elif wire == 5:
        stop = pos + 4
    else:
        raise ProtoError(f"field {number} has wire type {wire}, which no Kubernetes message uses")
    if stop > end:
        raise ProtoError(f"field {number} runs past the end of its message")
    return stop


def decode_item(buf: bytes, pos: int, end: int, kind: str) -> S.Item:
    """One object of `kind` (a key of KINDS) as the typed decoder's struct, its kind not set."""
    item: S.Item = decode(buf, pos, end, KINDS[kind])
    return item


def peek_name(buf: bytes, pos: int, end: int) -> str:
    """The "namespace/name" (or "name") of an object whose decoding failed, if its metadata can be
    read; "" otherwise. Never raises: it only words an error."""
    try:
        for number, wire, start, stop in fields(buf, pos, end):
            if number == 1 and wire == BYTES:
                meta = decode(buf, start, stop, OBJECT_META)
                name = meta.name if isinstance(meta.name, str) else ""
                namespace = meta.namespace if isinstance(meta.namespace, str) else ""
                return f"{namespace}/{name}" if namespace and name else name
    except ProtoError:
        pass
    return ""
