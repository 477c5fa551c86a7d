"""Services, EndpointSlices, Nodes and ServiceCIDRs from protobuf, into the typed decoder's structs (`schema.py`).

The API server's protobuf encoding of an object carries the same fields as its JSON, by number
instead of by name. The tables below give, for each message kube-proxy reads, the number of each
field and the `schema` struct attribute it fills: a decoded object is the `schema.Item` the JSON
typed decoder gives for the same object, which `cluster/typed.py` (or, through `schema.as_plain`,
the dict parsers) reads as it reads any other. Field numbers are upstream's, from k8s.io/api
v0.37.2 core/v1, discovery/v1 and networking/v1 and k8s.io/apimachinery meta/v1 `generated.proto`.
A ServiceCIDR is outside the typed schema (its JSON is read as plain dicts): its struct is read
only through `schema.as_plain` (`PLAIN_KINDS`).

Each table is a `proto_message.Message`, whose decoder is compiled from it when it is made;
what a zero value, an unlisted field and a field of the wrong wire type give is said there. A
field these tables do not list (managedFields, ownerReferences, an endpoint's targetRef, a
Node's conditions and images: nothing kube-proxy reads) is skipped by its wire type, unread. The
tables hold no message inside itself, so decoding nests a fixed number of levels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec import UNSET, Struct, UnsetType

from kubeproxy.cluster import schema as S
from kubeproxy.cluster.proto_message import BOOL as BOOL
from kubeproxy.cluster.proto_message import INT as INT
from kubeproxy.cluster.proto_message import INTSTR as INTSTR
from kubeproxy.cluster.proto_message import MAP as MAP
from kubeproxy.cluster.proto_message import MSG as MSG
from kubeproxy.cluster.proto_message import STR as STR
from kubeproxy.cluster.proto_message import TIME as TIME
from kubeproxy.cluster.proto_message import Field as Field
from kubeproxy.cluster.proto_message import Message as Message
from kubeproxy.cluster.protowire import BYTES, ProtoError, fields


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
    """The message in buf[pos:end] as `message.struct`; ProtoError naming the field that is wrong."""
    return message.decoder(buf, pos, end)


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
