"""Typed Service, EndpointSlice and Node, and the dict parsers that build them.

`parse_service`, `parse_endpoint_slice` and `parse_node` take the plain dict an object has in a
manifest or in an API response, apply the API server's defaults (a manifest was never defaulted
by an API server), validate, and return frozen dataclasses. Anything unusable raises
`ObjectError` naming the object and the field.

A slice's endpoints have one reading, `read_endpoints`, over the fields `schema.Endpoint`
declares: the struct path (`cluster.typed`) hands it the decoder's structs, `parse_endpoint_slice`
converts its dicts to the same structs first. Only what it refuses is read field by field
(`_endpoints_by_field`), which accepts what the API server accepts or names the bad field.

Validation follows the API server's (see `cluster.validation`): objects from manifest files were
never checked by one, and every name that passes here is safe to put into rule text. Nothing the
API server accepts is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from socket import AF_INET, inet_pton
from sys import intern
from typing import Any

import msgspec

from kubeproxy.cluster.addresses import (
    SPECIAL_FIRST_OCTETS,
    AddressText,
    CheckedIP,
    CheckedIPv4,
    CheckedNet,
    endpoint_ip,
    ip_text,
)
from kubeproxy.cluster.checks import CheckCache
from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.fields import Fields, object_ref
from kubeproxy.cluster.schema import Conditions, Hint, Hints, Item, as_plain
from kubeproxy.cluster.schema import Endpoint as SchemaEndpoint
from kubeproxy.cluster.twins import twin_of
from kubeproxy.cluster.validation import (
    ParseOptions,
    display,
    dns1035_label,
    dns1123_label,
    dns1123_subdomain,
    label_value,
    qualified_name,
    show,
)

PROTOCOLS = ("TCP", "UDP", "SCTP")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
TRAFFIC_POLICIES = ("Cluster", "Local")
AFFINITIES = ("None", "ClientIP")
DEFAULT_AFFINITY_TIMEOUT = 10800  # upstream v1.DefaultClientIPServiceAffinitySeconds

LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_SERVICE_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_HOSTNAME = "kubernetes.io/hostname"

DEFAULT_OPTIONS = ParseOptions()
# Upstream's limits for an EndpointSlice (pkg/apis/discovery/validation).
MAX_SLICE_ENDPOINTS = 1000
MAX_ENDPOINT_ADDRESSES = 100
MAX_SLICE_PORTS = 20000
MAX_ZONE_HINTS = 8
# The hints of an endpoint without any, shared: frozenset() makes a new object each time
# (CPython 3.11 has no empty singleton), and nearly every endpoint has none.
NO_HINTS: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    protocol: str
    port: int
    node_port: int = 0


@dataclass(frozen=True, slots=True)
class LoadBalancerIngress:
    ip: CheckedIP | None
    hostname: str = ""
    # "VIP" (the default) means the node must accept traffic for the IP; "Proxy" means the
    # load balancer proxies to the node, so the node must not capture the IP.
    ip_mode: str = "VIP"


@dataclass(frozen=True, slots=True)
class Service:
    namespace: str
    name: str
    labels: Mapping[str, str]
    type: str
    cluster_ips: tuple[CheckedIP, ...]  # empty for headless ("None") and ExternalName
    ports: tuple[ServicePort, ...]
    external_ips: tuple[CheckedIP, ...] = ()
    load_balancer_source_ranges: tuple[CheckedNet, ...] = ()
    load_balancer_ingress: tuple[LoadBalancerIngress, ...] = ()
    external_traffic_policy: str = "Cluster"
    internal_traffic_policy: str = "Cluster"
    session_affinity: str = "None"
    affinity_timeout_seconds: int = DEFAULT_AFFINITY_TIMEOUT
    health_check_node_port: int = 0
    traffic_distribution: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def headless(self) -> bool:
        return not self.cluster_ips


@dataclass(frozen=True, slots=True)
class EndpointPort:
    name: str
    protocol: str
    port: int


@dataclass(frozen=True, slots=True)
class Endpoint:
    # Its addresses as canonical text (as str() of an ipaddress object writes it): the first,
    # the one upstream uses, and any others. Text rather than ipaddress objects because the
    # node view shares this very string, and an endpoint is held once per cluster endpoint.
    address: AddressText
    more_addresses: tuple[AddressText, ...] = ()
    # Unset conditions follow upstream: ready and serving default to true, terminating to false.
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str = ""
    zone: str = ""
    zone_hints: frozenset[str] = NO_HINTS
    node_hints: frozenset[str] = NO_HINTS

    @property
    def addresses(self) -> tuple[AddressText, ...]:
        return (self.address, *self.more_addresses)


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    namespace: str
    name: str
    service_name: str
    labels: Mapping[str, str]
    address_type: str
    endpoints: tuple[Endpoint, ...]
    ports: tuple[EndpointPort, ...]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: Mapping[str, str]
    addresses: tuple[tuple[str, CheckedIP], ...]  # (type, ip), e.g. ("InternalIP", 192.168.0.2)
    pod_cidrs: tuple[CheckedNet, ...]
    # For /healthz only (a node on its way out fails it); not part of equality, because a
    # change of either does not change a single rule and must not force a full sync.
    deleting: bool = field(default=False, compare=False)
    taints: tuple[str, ...] = field(default=(), compare=False)  # taint keys

    def ips(self) -> list[CheckedIP]:
        """Node IPs in upstream's order of preference: InternalIP first, then ExternalIP."""
        ranked = sorted(
            (a for a in self.addresses if a[0] in ("InternalIP", "ExternalIP")),
            key=lambda a: 0 if a[0] == "InternalIP" else 1,
        )
        return [ip for _, ip in ranked]


def _metadata(top: Fields, namespace: str, name: str, check_name: Callable[[str], str | None]) -> Fields:
    """The metadata reader, after checking the namespace and name as the API server would."""
    meta = top.map("metadata")
    if namespace:
        meta.check("namespace", dns1123_label(namespace))
    meta.check("name", check_name(name))
    return meta


def parse_service(obj: Mapping[str, Any], options: ParseOptions = DEFAULT_OPTIONS) -> Service:
    namespace, name, ref = object_ref("Service", obj)
    top = Fields("Service", ref, obj)
    meta = _metadata(top, namespace, name, dns1123_label if options.relaxed_service_names else dns1035_label)
    spec, status = top.map("spec"), top.map("status")
    svc_type = spec.enum("type", SERVICE_TYPES, "ClusterIP")

    cluster_ips = _cluster_ips(spec, svc_type)
    ports = []
    for p in spec.maps("ports"):
        port_name = p.text("name")
        if port_name:
            p.check("name", dns1123_label(port_name))
        ports.append(
            ServicePort(
                name=port_name,
                protocol=p.enum("protocol", PROTOCOLS, "TCP"),
                port=p.port("port", required=True),
                node_port=_node_port(p, "nodePort", options),
            )
        )
    _check_unique_ports(spec, svc_type, ports)

    affinity = spec.enum("sessionAffinity", AFFINITIES, "None")
    timeout = DEFAULT_AFFINITY_TIMEOUT
    if affinity == "ClientIP":
        client_ip = spec.map("sessionAffinityConfig").map("clientIP")
        timeout = client_ip.integer("timeoutSeconds", DEFAULT_AFFINITY_TIMEOUT)
        if not 0 < timeout <= 86400:
            raise client_ip.error("timeoutSeconds", f"{timeout} is out of range 1-86400")

    ingress = []
    for entry in status.map("loadBalancer").maps("ingress"):
        raw_ip = entry.text("ip")
        ingress.append(
            LoadBalancerIngress(
                ip=entry.ip("ip", raw_ip) if raw_ip else None,
                hostname=entry.text("hostname"),
                ip_mode=entry.enum("ipMode", ("VIP", "Proxy"), "VIP"),
            )
        )

    return Service(
        namespace=namespace,
        name=name,
        labels=meta.labels("labels"),
        annotations=meta.annotations("annotations"),
        type=svc_type,
        cluster_ips=cluster_ips,
        ports=tuple(ports),
        external_ips=tuple(spec.non_special_ips("externalIPs")),
        load_balancer_source_ranges=tuple(spec.cidrs("loadBalancerSourceRanges")),
        load_balancer_ingress=tuple(ingress),
        external_traffic_policy=spec.enum("externalTrafficPolicy", TRAFFIC_POLICIES, "Cluster"),
        internal_traffic_policy=spec.enum("internalTrafficPolicy", TRAFFIC_POLICIES, "Cluster"),
        session_affinity=affinity,
        affinity_timeout_seconds=timeout,
        health_check_node_port=_node_port(spec, "healthCheckNodePort", options),
        traffic_distribution=spec.text("trafficDistribution"),
    )


def _cluster_ips(spec: Fields, svc_type: str) -> tuple[CheckedIP, ...]:
    if svc_type == "ExternalName":
        return ()
    raw = spec.strs("clusterIPs") or ([spec.text("clusterIP")] if spec.text("clusterIP") else [])
    if not raw or raw[0] in ("None", ""):
        return ()
    key = "clusterIPs" if spec.data.get("clusterIPs") else "clusterIP"
    return tuple(spec.ip(f"{key}[{i}]" if key == "clusterIPs" else key, s) for i, s in enumerate(raw))


def _node_port(fields: Fields, key: str, options: ParseOptions) -> int:
    """A node port, which the API server only allocates from its --service-node-port-range."""
    port = fields.port(key, required=False)
    if port and options.node_port_range is not None:
        low, high = options.node_port_range
        if not low <= port <= high:
            raise fields.error(
                key, f"{port} is outside the node port range {low}-{high} (--service-node-port-range)"
            )
    return port


def _check_unique_ports(spec: Fields, svc_type: str, ports: list[ServicePort]) -> None:
    # As upstream's ValidateService: two entries for the same port (or node port) and protocol
    # would ask for the same rule twice with different endpoints.
    names: set[str] = set()
    numbers: set[tuple[int, str]] = set()
    node_ports: set[tuple[int, str]] = set()
    for i, p in enumerate(ports):
        if len(ports) > 1:
            if not p.name:
                raise spec.error(f"ports[{i}].name", "required when a Service has more than one port")
            if p.name in names:
                raise spec.error(f"ports[{i}].name", f"duplicate port name {show(p.name)}")
            names.add(p.name)
        if (p.port, p.protocol) in numbers:
            raise spec.error(f"ports[{i}]", f"duplicate port {p.port}/{p.protocol}")
        numbers.add((p.port, p.protocol))
        if p.node_port:
            if svc_type == "ClusterIP":
                raise spec.error(f"ports[{i}].nodePort", "may not be used when type is ClusterIP")
            if (p.node_port, p.protocol) in node_ports:
                raise spec.error(f"ports[{i}].nodePort", f"duplicate node port {p.node_port}/{p.protocol}")
            node_ports.add((p.node_port, p.protocol))


def parse_endpoint_slice(obj: Mapping[str, Any], options: ParseOptions = DEFAULT_OPTIONS) -> EndpointSlice:
    namespace, name, ref = object_ref("EndpointSlice", obj)
    top = Fields("EndpointSlice", ref, obj)
    meta = _metadata(top, namespace, name, dns1123_subdomain)
    labels = meta.labels("labels")
    meta.annotations("annotations")
    service_name = labels.get(LABEL_SERVICE_NAME, "")
    if not service_name:
        raise meta.error(f"labels[{LABEL_SERVICE_NAME}]", "required label is missing")
    address_type = top.enum("addressType", ("IPv4", "IPv6", "FQDN"), "")
    if not address_type:
        raise top.error("addressType", "required field is missing")

    endpoints: tuple[Endpoint, ...] = ()
    if address_type != "FQDN":
        raw_endpoints = top.items("endpoints")
        try:
            endpoints = read_endpoints(_endpoint_structs(raw_endpoints), address_type, CheckCache())
        except (ValueError, OSError, TypeError, RecursionError):
            endpoints = _endpoints_by_field(top, raw_endpoints, address_type)
    raw_ports = top.maps("ports")
    if len(raw_ports) > MAX_SLICE_PORTS:
        raise top.error("ports", f"{len(raw_ports)} ports, more than the {MAX_SLICE_PORTS} allowed")
    ports = []
    port_names: set[str] = set()
    for p in raw_ports:
        port_name = p.text("name")
        if port_name:  # empty is allowed: the port of a Service with one unnamed port
            p.check("name", dns1123_label(port_name))
        if port_name in port_names:
            raise p.error("name", f"duplicate port name {show(port_name)}")
        port_names.add(port_name)
        # An EndpointSlice port without a number means "all ports", which kube-proxy ignores.
        number = p.port("port", required=False)
        if number:
            ports.append(EndpointPort(port_name, p.enum("protocol", PROTOCOLS, "TCP"), number))
    return EndpointSlice(
        namespace=namespace,
        name=name,
        service_name=service_name,
        labels=labels,
        address_type=address_type,
        endpoints=endpoints,
        ports=tuple(ports),
    )


# An Endpoint's mutable twin: the same slots, no frozen __setattr__ (see `read_endpoints`).
_ENDPOINT_TWIN = twin_of(
    Endpoint, ("address", "more_addresses", "ready", "serving", "terminating", "node_name", "zone", "zone_hints", "node_hints")
)
_ENDPOINT_LIST = list[SchemaEndpoint]


class EndpointRefused(ValueError):
    """An endpoint `read_endpoints` leaves to `_endpoints_by_field`, which accepts it or words why not."""


def _endpoint_structs(raw: list[Any]) -> list[SchemaEndpoint]:
    """A slice's endpoints (plain dicts) as the schema's structs, which `read_endpoints` takes.

    `convert` is laxer than JSON in places (a tuple for a list): only structs that are `raw`
    again are kept, as `typed.as_item` keeps whole objects."""
    structs = msgspec.convert(raw, _ENDPOINT_LIST)
    if msgspec.to_builtins(structs) != raw:
        raise EndpointRefused("not plain JSON data")
    return structs


def read_endpoints(raw: list[SchemaEndpoint] | Any, address_type: str, checks: CheckCache) -> tuple[Endpoint, ...]:
    """A slice's endpoints, read from the schema's structs: the one reading both decoders use
    (the struct path directly, the dict path after `_endpoint_structs`).

    Raises ValueError (EndpointRefused, a bad address) for anything unusual or invalid; the
    dict path then reads the endpoints field by field (`_endpoints_by_field`), which words the
    problem. msgspec has checked every field's type.
    """
    if not raw:
        return ()
    if len(raw) > MAX_SLICE_ENDPOINTS:
        raise EndpointRefused("too many endpoints")
    node_names = checks.passed(dns1123_subdomain)
    # Bound to locals and the Endpoint built inline: this loop runs once per endpoint of the cluster.
    canonical, pton = checks.canonical, inet_pton
    new, twin, endpoint_class = object.__new__, _ENDPOINT_TWIN, Endpoint
    empty = NO_HINTS
    special, ipv4 = SPECIAL_FIRST_OCTETS, address_type == "IPv4"
    endpoints = []
    for ep in raw:
        # Any: the texts below become AddressText only once inet_pton (or the gate) took them.
        addresses: Any = ep.addresses
        if not addresses:
            raise EndpointRefused("no address")
        count = len(addresses)
        if count > MAX_ENDPOINT_ADDRESSES:
            raise EndpointRefused("too many addresses")
        # Canonical IPv4 (inet_pton takes no other spelling) of an IPv4 slice is kept as it came,
        # unless its first octet is one a special-address check looks at.
        try:
            if not ipv4:
                raise OSError
            first: AddressText = addresses[0]
            if pton(AF_INET, first)[0] in special:
                raise OSError
            more: tuple[AddressText, ...] = ()
            if count > 1:
                for text in addresses:
                    if pton(AF_INET, text)[0] in special:
                        raise OSError
                more = tuple(addresses[1:])
        except (OSError, ValueError):
            first, *others = [ip_text(endpoint_ip(text, address_type)) for text in addresses]
            more = tuple(others)
        cond = ep.conditions
        # Unset conditions as upstream reads them: ready and serving true, terminating false.
        if cond:
            ready, serving, terminating = cond.ready is not False, cond.serving is not False, cond.terminating is True
        else:
            ready, serving, terminating = True, True, False
        node_name = ep.nodeName
        if node_name:
            # A slice's endpoints share a few nodes: each name checked once and kept as one string.
            node_name = node_names.get(node_name) or canonical(dns1123_subdomain, node_name)
            if node_name is None:
                raise EndpointRefused("node name")
        else:
            node_name = ""
        zone = ep.zone
        zone = intern(zone) if zone else ""  # not validated (upstream does not): only compared
        hints = ep.hints
        if hints is None or hints is msgspec.UNSET:
            # The frozen dataclass's __init__ assigns each slot through object.__setattr__; the
            # twin with the same slots takes plain stores, then becomes an Endpoint by
            # `__class__` assignment (CPython allows it exactly when the layouts are the same).
            made: Any = new(twin)
            made.address = first
            made.more_addresses = more
            made.ready = ready
            made.serving = serving
            made.terminating = terminating
            made.node_name = node_name
            made.zone = zone
            made.zone_hints = empty
            made.node_hints = empty
            made.__class__ = endpoint_class
            endpoints.append(made)
        else:
            endpoints.append(
                Endpoint(
                    first,
                    more,
                    ready=ready,
                    serving=serving,
                    terminating=terminating,
                    node_name=node_name,
                    zone=zone,
                    zone_hints=_hint_names(hints.forZones, label_value),
                    node_hints=_hint_names(hints.forNodes, dns1123_subdomain),
                )
            )
    return tuple(endpoints)


def _hint_names(entries: list[Hint] | Any, check: Callable[[str], str | None]) -> frozenset[str]:
    if not entries:
        return NO_HINTS
    if len(entries) > MAX_ZONE_HINTS:
        raise EndpointRefused("too many hints")
    names = set()
    for entry in entries:
        hint = entry.name or ""
        if hint and check(hint) is not None:
            raise EndpointRefused("hint name")
        names.add(hint)
    return frozenset(names) if names else NO_HINTS


def _endpoints_by_field(top: Fields, raw_endpoints: list[Any], address_type: str) -> tuple[Endpoint, ...]:
    """The endpoints `read_endpoints` refused, checked field by field: an ObjectError names the
    first field the API server would refuse; what passes (an unknown field, a value msgspec
    types more strictly) is handed to `read_endpoints` as the structs it reads."""
    if not all(type(item) is dict for item in raw_endpoints):
        top.maps("endpoints")  # names the first item that is not an object
    if len(raw_endpoints) > MAX_SLICE_ENDPOINTS:
        raise top.error("endpoints", f"{len(raw_endpoints)} endpoints, more than the {MAX_SLICE_ENDPOINTS} allowed")
    node_names: set[str] = set()
    structs = []
    for index, item in enumerate(raw_endpoints):
        ep = top.entry("endpoints", index, item)
        addresses = ep.endpoint_ips("addresses", address_type)
        if not addresses:
            raise ep.error("addresses", "at least one address is required")
        if len(addresses) > MAX_ENDPOINT_ADDRESSES:
            raise ep.error("addresses", f"{len(addresses)} addresses, more than the {MAX_ENDPOINT_ADDRESSES} allowed")
        cond = ep.map("conditions")
        conditions = Conditions(ready=cond.flag("ready"), serving=cond.flag("serving"), terminating=cond.flag("terminating"))
        node_name = ep.text("nodeName")
        if node_name and node_name not in node_names:  # a slice's endpoints share a few nodes
            ep.check("nodeName", dns1123_subdomain(node_name))
            node_names.add(node_name)
        hints = ep.map("hints") if "hints" in ep.data else None
        structs.append(
            SchemaEndpoint(
                addresses=[ip_text(ip) for ip in addresses],
                conditions=conditions,
                nodeName=node_name,
                # Upstream does not validate `zone`; it is only ever compared, never rendered.
                zone=ep.text("zone"),
                hints=Hints(
                    forZones=[Hint(name) for name in _hints(hints, "forZones", label_value)],
                    forNodes=[Hint(name) for name in _hints(hints, "forNodes", dns1123_subdomain)],
                )
                if hints
                else None,
            )
        )
    try:
        return read_endpoints(structs, address_type, CheckCache())
    except ValueError as exc:  # the checks above and the reader's disagree: say so, never pass it
        raise top.error("endpoints", f"refused ({exc})") from exc


def _ipv4_maker() -> Callable[[bytes], CheckedIPv4]:
    """`IPv4Address(packed)` for 4 bytes from inet_pton, built without its pure-Python __init__
    (which checks the length and type we already know): it runs once per address at start."""
    set_ip, new, from_bytes = IPv4Address._ip.__set__, object.__new__, int.from_bytes  # type: ignore[attr-defined]

    def make(packed: bytes) -> CheckedIPv4:
        # Only ever given inet_pton's 4 bytes: a canonical IPv4 address passes the gate as is.
        ip: IPv4Address = new(IPv4Address)
        set_ip(ip, from_bytes(packed))
        return CheckedIPv4(ip)

    return make


_ipv4 = _ipv4_maker()


def _hints(hints: Fields, key: str, check: Callable[[str], str | None]) -> frozenset[str]:
    entries = hints.maps(key)
    if len(entries) > MAX_ZONE_HINTS:
        raise hints.error(key, f"{len(entries)} hints, more than the {MAX_ZONE_HINTS} allowed")
    names = set()
    for entry in entries:
        hint = entry.text("name")
        entry.check("name", check(hint) if hint else None)
        names.add(hint)
    return frozenset(names) if names else NO_HINTS


def parse_node(obj: Mapping[str, Any], options: ParseOptions = DEFAULT_OPTIONS) -> Node:
    _, name, ref = object_ref("Node", obj, namespaced=False)
    top = Fields("Node", ref, obj)
    meta = _metadata(top, "", name, dns1123_subdomain)
    spec, status = top.map("spec"), top.map("status")
    addresses = []
    for a in status.maps("addresses"):
        kind = a.required_str("type")
        if kind in ("InternalIP", "ExternalIP"):
            addresses.append((kind, a.ip("address", a.required_str("address"))))
    pod_cidrs = spec.cidrs("podCIDRs") or (spec.cidrs_of_one("podCIDR") if spec.text("podCIDR") else [])
    return Node(
        name=name,
        labels=meta.labels("labels"),
        addresses=tuple(addresses),
        pod_cidrs=tuple(pod_cidrs),
        deleting=bool(meta.text("deletionTimestamp")),
        taints=tuple(_taint_key(t) for t in spec.maps("taints")),
    )


def _taint_key(taint: Fields) -> str:
    key = taint.required_str("key")
    taint.check("key", qualified_name(key))
    return key


def is_ignored_by_labels(labels: Mapping[str, str]) -> str | None:
    """Why kube-proxy's informers never see an object with these labels, or None."""
    if LABEL_SERVICE_PROXY_NAME in labels:
        return f"labelled {LABEL_SERVICE_PROXY_NAME}={labels[LABEL_SERVICE_PROXY_NAME]} (another proxy owns it)"
    if LABEL_HEADLESS in labels:
        return f"labelled {LABEL_HEADLESS}"
    return None


def kind_of(obj: Mapping[str, Any] | Item) -> str:
    """The object's kind (plain dicts or a `schema.Item`); ObjectError if it has none."""
    if isinstance(obj, Item):
        if isinstance(obj.kind, str) and obj.kind:
            return obj.kind
        obj = as_plain(obj)  # the dict reading below words the problem
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        raise ObjectError("object", display(name) if isinstance(name, str) and name else "<unnamed>", "kind", "missing")
    return kind
