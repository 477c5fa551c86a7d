"""Service, EndpointSlice and Node built straight from the typed decoder's structs.

`parse_item` reads a `schema.Item` by attribute: msgspec has already checked every field's type
(a port is an int, a label value a str, no unknown field), so what is left is the API server's
value checks, the defaults and the objects. It accepts a subset of what the dict parsers in
`cluster.objects` accept and builds the same objects; for anything else (any problem at all, an
unusual shape) it returns None and the caller hands the object, as plain dicts, to those parsers,
which decide and word the error. So it can only skip work, never accept or refuse differently:
tests/cluster/test_typed_path.py runs both paths over valid worlds and every hostile case.

`as_item` gives a plain dict (a watch event, a YAML document) the same route: msgspec checks it
against the schema in C (`msgspec.convert`), or it keeps the dict path.

Strings that repeat across objects (namespaces, node names, zones, port names, protocols) are
interned, and repeated checks of them are cached per state (`CheckCache`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from socket import AF_INET, inet_pton
from sys import intern
from typing import Any

import msgspec

from kubeproxy.cluster.addresses import (
    CheckedIP,
    CheckedNet,
    non_special_ip,
    source_range,
    valid_ip,
)
from kubeproxy.cluster.checks import CheckCache
from kubeproxy.cluster.fields import Fields
from kubeproxy.cluster.objects import (
    AFFINITIES,
    DEFAULT_AFFINITY_TIMEOUT,
    LABEL_SERVICE_NAME,
    MAX_SLICE_PORTS,
    PROTOCOLS,
    SERVICE_TYPES,
    TRAFFIC_POLICIES,
    EndpointPort,
    EndpointSlice,
    LoadBalancerIngress,
    Node,
    Service,
    ServicePort,
    _check_unique_ports,
    _ipv4,
    read_endpoints,
)
from kubeproxy.cluster.schema import Item, Metadata, Spec, Status, as_plain
from kubeproxy.cluster.twins import maker
from kubeproxy.cluster.validation import (
    ANNOTATIONS_MAX_BYTES,
    ParseOptions,
    dns1035_label,
    dns1123_label,
    dns1123_subdomain,
    label_value,
    qualified_name,
)

# Allowed values mapped to themselves: one lookup checks a value and gives the shared constant.
_PROTOCOL = {p: p for p in PROTOCOLS}
_SERVICE_TYPE = {t: t for t in SERVICE_TYPES}
_TRAFFIC_POLICY = {p: p for p in TRAFFIC_POLICIES}
_AFFINITY = {a: a for a in AFFINITIES}
_ADDRESS_TYPE = {t: t for t in ("IPv4", "IPv6", "FQDN")}
_IP_MODE = {m: m for m in ("VIP", "Proxy")}
_NODE_IP_TYPES = ("InternalIP", "ExternalIP")
_NO_SPEC, _NO_STATUS = Spec(), Status()  # never written: what an absent spec or status reads as
# The same objects as the classes make, faster (see cluster/twins.py).
_service_object = maker(
    Service, {"namespace": "n", "name": "s", "labels": {}, "type": "ClusterIP", "cluster_ips": (), "ports": ()}
)
_service_port = maker(ServicePort, {"name": "http", "protocol": "TCP", "port": 80, "node_port": 0})
_slice_object = maker(
    EndpointSlice,
    {"namespace": "n", "name": "s", "service_name": "s", "labels": {}, "address_type": "IPv4", "endpoints": (), "ports": ()},
)
_endpoint_port = maker(EndpointPort, {"name": "http", "protocol": "TCP", "port": 80})
# Only to reuse `_check_unique_ports`, whose message is never shown from here (any error -> None).
_ANY_SPEC = Fields("Service", "", {}, "spec")


class _Skip(Exception):
    """Internal: this object is not for the struct path."""


Parsed = Service | EndpointSlice | Node


def as_item(obj: Any) -> Item | None:
    """`obj` (plain dicts) as the schema's struct, or None if it holds anything the schema does not describe."""
    if type(obj) is not dict:
        return None
    try:
        item: Item = msgspec.convert(obj, Item)
    except (msgspec.ValidationError, RecursionError):
        return None
    # `convert` is laxer than JSON in places (a tuple or a set for a list, from a Python caller
    # or a YAML `!!set`), where the dict parsers refuse: only an item whose dicts are `obj`
    # again takes the struct path. Plain-data comparison in C; YAML has already bounded the size.
    return item if as_plain(item) == obj else None


def parse_item(item: Item, options: ParseOptions, checks: CheckCache) -> Parsed | None:
    """The object `item` describes, or None: not a kind of ours, or anything this path leaves to
    the dict parsers (which then accept it the same way or word why not)."""
    kind = item.kind
    try:
        if kind == "Service":
            return _service(item, options, checks)
        if kind == "EndpointSlice":
            return _slice(item, checks)
        if kind == "Node":
            return _node(item, checks)
    except (_Skip, ValueError, OSError, TypeError):
        # ValueError covers ObjectError (from `_check_unique_ports`), a bad IP or CIDR, and
        # inet_pton's NUL and surrogate refusals; OSError is inet_pton's "not IPv4".
        return None
    return None


def _named(item: Item, check_name: Callable[[str], str | None]) -> tuple[str, Metadata]:
    """(name, metadata): metadata present and a name `check_name` accepts."""
    meta = item.metadata
    if type(meta) is not Metadata:
        raise _Skip
    name = meta.name
    if type(name) is not str or not name or check_name(name) is not None:
        raise _Skip
    return name, meta


def _metadata(item: Item, check_name: Callable[[str], str | None], checks: CheckCache) -> tuple[str, str, Metadata]:
    """(namespace, name, metadata), checked as `objects._metadata` checks them."""
    name, meta = _named(item, check_name)
    namespace = checks.canonical(dns1123_label, meta.namespace or "default")
    if namespace is None:
        raise _Skip
    return namespace, name, meta


# What an object without labels or annotations keeps: one shared empty mapping, never written to
# (the objects' fields are read-only Mappings), instead of two empty dicts per Service.
_NONE: Mapping[str, str] = {}


def _labels(labels: dict[str, str] | Any, checks: CheckCache) -> Mapping[str, str]:
    if not labels:
        return _NONE
    out = {}
    for key, value in labels.items():
        shared = checks.canonical(qualified_name, key)  # every slice has a `kubernetes.io/service-name`: one string
        if shared is None or (value and label_value(value) is not None):
            raise _Skip
        out[shared] = value
    return out


def _annotations(annotations: dict[str, str] | Any, checks: CheckCache) -> Mapping[str, str]:
    if not annotations:
        return _NONE
    size = 0
    for key, value in annotations.items():
        # Upstream checks the lowercased key (see `Fields.annotations`).
        if not checks.passes(qualified_name, key.lower()):
            raise _Skip
        size += len(key) + len(value)
    if size > ANNOTATIONS_MAX_BYTES:
        raise _Skip
    return dict(annotations)


def _ip(text: str) -> CheckedIP:
    """`addresses.valid_ip(text)`, with the canonical IPv4 case built directly (as `objects.read_endpoints` reads addresses)."""
    try:
        return _ipv4(inet_pton(AF_INET, text))
    except (OSError, ValueError):
        return valid_ip(text)  # ValueError if not an IP: the dict path words it


def _port(value: int | Any, *, required: bool) -> int:
    """`Fields.port`: unset is 0 (or a problem if required), else 1-65535."""
    if value is None or value is msgspec.UNSET:
        if required:
            raise _Skip
        return 0
    if not 1 <= value <= 65535:
        raise _Skip
    return int(value)


def _node_port(value: int | Any, options: ParseOptions) -> int:
    port = _port(value, required=False)
    if port and options.node_port_range is not None:
        low, high = options.node_port_range
        if not low <= port <= high:
            raise _Skip
    return port


def _port_name(value: str | Any, checks: CheckCache) -> str:
    if not value:
        return ""
    name = checks.canonical(dns1123_label, value)
    if name is None:
        raise _Skip
    return name


def _enum(value: str | Any, allowed: dict[str, str], default: str) -> str:
    if not value:
        return default
    found = allowed.get(value)
    if found is None:
        raise _Skip
    return found


def _service(item: Item, options: ParseOptions, checks: CheckCache) -> Service:
    namespace, name, meta = _metadata(item, dns1123_label if options.relaxed_service_names else dns1035_label, checks)
    spec = item.spec or _NO_SPEC
    svc_type = _enum(spec.type, _SERVICE_TYPE, "ClusterIP")
    cluster_ips: tuple[CheckedIP, ...] = ()
    if svc_type != "ExternalName":
        raw = spec.clusterIPs or ([spec.clusterIP] if spec.clusterIP else [])
        if raw and raw[0] not in ("None", ""):
            cluster_ips = tuple([_ip(text) for text in raw])
    ports = []
    for p in spec.ports or ():
        port_name = _port_name(p.name, checks)
        protocol = _enum(p.protocol, _PROTOCOL, "TCP")
        ports.append(_service_port(port_name, protocol, _port(p.port, required=True), _node_port(p.nodePort, options)))
    if len(ports) > 1 or (ports and ports[0].node_port):  # one port without a node port cannot clash
        _check_unique_ports(_ANY_SPEC, svc_type, ports)

    affinity = _enum(spec.sessionAffinity, _AFFINITY, "None")
    timeout = DEFAULT_AFFINITY_TIMEOUT
    if affinity == "ClientIP":
        config = spec.sessionAffinityConfig
        client_ip = config.clientIP if config else None
        seconds = client_ip.timeoutSeconds if client_ip else None
        timeout = DEFAULT_AFFINITY_TIMEOUT if seconds is None or seconds is msgspec.UNSET else seconds
        if not 0 < timeout <= 86400:
            raise _Skip

    status = item.status or _NO_STATUS
    balancer = status.loadBalancer
    ingress = tuple(
        [
            LoadBalancerIngress(
                ip=_ip(entry.ip) if entry.ip else None,
                hostname=entry.hostname or "",
                ip_mode=_enum(entry.ipMode, _IP_MODE, "VIP"),
            )
            for entry in (balancer.ingress or () if balancer else ())
        ]
    )
    return _service_object(
        namespace=namespace,
        name=name,
        labels=_labels(meta.labels, checks),
        annotations=_annotations(meta.annotations, checks),
        type=svc_type,
        cluster_ips=cluster_ips,
        ports=tuple(ports),
        external_ips=tuple([non_special_ip(text) for text in spec.externalIPs or ()]),
        load_balancer_source_ranges=_cidrs(spec.loadBalancerSourceRanges),
        load_balancer_ingress=ingress,
        external_traffic_policy=_enum(spec.externalTrafficPolicy, _TRAFFIC_POLICY, "Cluster"),
        internal_traffic_policy=_enum(spec.internalTrafficPolicy, _TRAFFIC_POLICY, "Cluster"),
        session_affinity=affinity,
        affinity_timeout_seconds=timeout,
        health_check_node_port=_node_port(spec.healthCheckNodePort, options),
        traffic_distribution=spec.trafficDistribution or "",
    )


def _cidrs(texts: list[str] | Any) -> tuple[CheckedNet, ...]:
    return tuple([source_range(text) for text in texts or ()])  # ValueError: the dict path words it


def _slice(item: Item, checks: CheckCache) -> EndpointSlice:
    namespace, name, meta = _metadata(item, dns1123_subdomain, checks)
    labels = _labels(meta.labels, checks)
    _annotations(meta.annotations, checks)
    service_name = labels.get(LABEL_SERVICE_NAME, "")
    if not service_name:
        raise _Skip
    address_type = _enum(item.addressType, _ADDRESS_TYPE, "")
    if not address_type:
        raise _Skip
    endpoints = read_endpoints(item.endpoints, address_type, checks) if address_type != "FQDN" else ()
    raw_ports = item.ports or ()
    if len(raw_ports) > MAX_SLICE_PORTS:
        raise _Skip
    ports = []
    port_names: set[str] = set()
    for p in raw_ports:
        port_name = _port_name(p.name, checks)
        if port_name in port_names:
            raise _Skip
        port_names.add(port_name)
        # A port without a number means "all ports", which kube-proxy ignores (its protocol unread).
        number = _port(p.port, required=False)
        if number:
            ports.append(_endpoint_port(port_name, _enum(p.protocol, _PROTOCOL, "TCP"), number))
    return _slice_object(
        namespace=namespace,
        name=name,
        service_name=service_name,
        labels=labels,
        address_type=address_type,
        endpoints=endpoints,
        ports=tuple(ports),
    )


def _node(item: Item, checks: CheckCache) -> Node:
    # A Node has no namespace: `object_ref(namespaced=False)` reads none, so none is checked.
    name, meta = _named(item, dns1123_subdomain)
    spec, status = item.spec or _NO_SPEC, item.status or _NO_STATUS
    addresses = []
    for a in status.addresses or ():
        kind = a.type
        if not kind:
            raise _Skip
        if kind in _NODE_IP_TYPES:
            if not a.address:
                raise _Skip
            addresses.append((intern(kind), _ip(a.address)))
    pod_cidrs = _cidrs(spec.podCIDRs) or ((source_range(spec.podCIDR),) if spec.podCIDR else ())
    taints = []
    for taint in spec.taints or ():
        key = taint.key
        if not key or not checks.passes(qualified_name, key):
            raise _Skip
        taints.append(key)
    return Node(
        name=name,
        labels=_labels(meta.labels, checks),
        addresses=tuple(addresses),
        pod_cidrs=pod_cidrs,
        deleting=bool(meta.deletionTimestamp),
        taints=tuple(taints),
    )
