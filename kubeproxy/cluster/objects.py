"""Typed Service, EndpointSlice and Node: the only place that knows Kubernetes JSON field names.

`parse_service`, `parse_endpoint_slice` and `parse_node` take the plain dict an object has in a
manifest or in an API response, apply the API server's defaults (a manifest was never defaulted
by an API server), validate, and return frozen dataclasses. Anything unusable raises
`ObjectError` naming the object and the field.

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

from kubeproxy.cluster.addresses import SPECIAL_FIRST_OCTETS, AddressText, CheckedIP, CheckedIPv4, CheckedNet, ip_text
from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.fields import Fields, object_ref
from kubeproxy.cluster.schema import Item, as_plain
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
# The hints of an endpoint without any, shared: frozenset() makes a new 216-byte object each
# time (CPython 3.11 has no empty singleton), and 100k endpoints kept 2 MiB of them.
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
    # the one upstream uses, and any others. 100k endpoints at 10k services: an IPv4Address,
    # its int and a 1-tuple were 13 MiB; the node view shares this very string.
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

    endpoints = []
    if address_type != "FQDN":
        raw_endpoints = top.items("endpoints")
        if not all(type(item) is dict for item in raw_endpoints):
            top.maps("endpoints")  # names the first item that is not an object
        node_names: set[str] = set()
        if len(raw_endpoints) > MAX_SLICE_ENDPOINTS:
            raise top.error("endpoints", f"{len(raw_endpoints)} endpoints, more than the {MAX_SLICE_ENDPOINTS} allowed")
        for index, item in enumerate(raw_endpoints):
            fast = _plain_endpoint(item, node_names) if address_type == "IPv4" else None
            if fast is not None:
                endpoints.append(fast)
                continue
            ep = top.entry("endpoints", index, item)
            addresses = ep.endpoint_ips("addresses", address_type)
            if not addresses:
                raise ep.error("addresses", "at least one address is required")
            if len(addresses) > MAX_ENDPOINT_ADDRESSES:
                raise ep.error("addresses", f"{len(addresses)} addresses, more than the {MAX_ENDPOINT_ADDRESSES} allowed")
            cond = ep.map("conditions")
            ready = cond.flag("ready")
            serving = cond.flag("serving")
            terminating = cond.flag("terminating")
            node_name = ep.text("nodeName")
            if node_name and node_name not in node_names:  # a slice's endpoints share a few nodes
                ep.check("nodeName", dns1123_subdomain(node_name))
                node_names.add(node_name)
            hints = ep.map("hints") if "hints" in ep.data else None
            endpoints.append(
                Endpoint(
                    ip_text(addresses[0]),
                    tuple([ip_text(ip) for ip in addresses[1:]]),
                    ready=ready is None or ready,
                    serving=serving is None or serving,
                    terminating=bool(terminating),
                    node_name=node_name,
                    # Upstream does not validate `zone`; it is only ever compared, never rendered.
                    zone=ep.text("zone"),
                    zone_hints=_hints(hints, "forZones", label_value) if hints else NO_HINTS,
                    node_hints=_hints(hints, "forNodes", dns1123_subdomain) if hints else NO_HINTS,
                )
            )
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
        endpoints=tuple(endpoints),
        ports=tuple(ports),
    )


_FLAG = frozenset({bool, type(None)})  # the types of a condition: true, false or unset


def _plain_endpoint(raw: Mapping[str, Any], node_names: set[str]) -> Endpoint | None:
    """The endpoint of the shape nearly all have, read without the `Fields` machinery; None for any other.

    10k slices hold 100k endpoints: this path is most of the decode budget. It accepts a subset
    of what the general path accepts (canonical IPv4 addresses of an IPv4 slice, none with a
    first octet that a special-address check looks at, no hints, every field of its expected
    type) and builds the same Endpoint; anything else, valid or not, returns None and
    goes the general way, which also words the error. So it cannot make validation laxer.
    """
    addresses = raw.get("addresses")
    if type(addresses) is not list or not 0 < len(addresses) <= MAX_ENDPOINT_ADDRESSES or "hints" in raw:
        return None
    try:
        # inet_pton: see `addresses.valid_ip` (inlined here, where it runs 100k times).
        # inet_pton takes canonical dotted quads only (no leading zeros), so the text is canonical.
        for text in addresses:
            if inet_pton(AF_INET, text)[0] in SPECIAL_FIRST_OCTETS:
                return None  # perhaps loopback or link-local: the general path decides
    except (OSError, ValueError, TypeError):  # not a str, not canonical IPv4, a NUL or a surrogate
        return None
    cond = raw.get("conditions")
    if cond is None:
        cond = {}
    elif type(cond) is not dict:
        return None
    ready, serving, terminating = cond.get("ready"), cond.get("serving"), cond.get("terminating")
    if type(ready) not in _FLAG or type(serving) not in _FLAG or type(terminating) not in _FLAG:
        return None  # 1, 0 or "yes": the general path names the field
    node_name, zone = raw.get("nodeName"), raw.get("zone")
    node_name = "" if node_name is None else node_name
    zone = "" if zone is None else zone
    if type(node_name) is not str or type(zone) is not str:
        return None
    if node_name and node_name not in node_names:
        if dns1123_subdomain(node_name) is not None:
            return None
        node_names.add(node_name)
    # A few node names are shared by 100k endpoints: one string each, not one per endpoint.
    node_name = intern(node_name)
    # Unset conditions as upstream reads them: ready and serving true, terminating false.
    more = tuple(addresses[1:]) if len(addresses) > 1 else ()
    return _new_endpoint(addresses[0], more, ready is not False, serving is not False, terminating is True, node_name, zone)


# An Endpoint's mutable twin: the same slots, no frozen __setattr__ (see `_endpoint_maker`).
ENDPOINT_TWIN = twin_of(
    Endpoint, ("address", "more_addresses", "ready", "serving", "terminating", "node_name", "zone", "zone_hints", "node_hints")
)


def _endpoint_maker() -> Callable[[AddressText, tuple[AddressText, ...], bool, bool, bool, str, str], Endpoint]:
    """`Endpoint(address, more_addresses, ready, serving, terminating, node_name, zone)` without hints, built faster.

    A frozen dataclass's __init__ assigns each field through `object.__setattr__` (1.3 us; 100k
    endpoints at 10k services). Here a twin class with the same slots and no frozen __setattr__
    is filled by plain attribute stores, then becomes an Endpoint by `__class__` assignment,
    which CPython allows exactly when the two layouts are the same: the same object in 0.4 us.
    """
    twin = ENDPOINT_TWIN
    new, empty = object.__new__, NO_HINTS

    def make(
        address: AddressText, more: tuple[AddressText, ...], is_ready: bool, is_serving: bool, is_terminating: bool, node: str,
        in_zone: str,
    ) -> Endpoint:
        ep: Any = new(twin)  # typed as what it becomes below
        ep.address = address
        ep.more_addresses = more
        ep.ready = is_ready
        ep.serving = is_serving
        ep.terminating = is_terminating
        ep.node_name = node
        ep.zone = in_zone
        ep.zone_hints = empty
        ep.node_hints = empty
        ep.__class__ = Endpoint  # a TypeError at import if the layouts ever differ
        made: Endpoint = ep
        return made

    make(AddressText(""), (), True, True, False, "", "")  # the check above, once, at import
    return make


_new_endpoint = _endpoint_maker()


def _ipv4_maker() -> Callable[[bytes], CheckedIPv4]:
    """`IPv4Address(packed)` for 4 bytes from inet_pton, built without its pure-Python __init__
    (which checks the length and type we already know): a third less time, 100k times at start."""
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
