"""The node model: what THIS node should do for each service port, independent of backend.

Built from the cluster state for one IP family. Mirrors upstream's ServicePort/Endpoint
abstractions (pkg/proxy) closely enough that every backend makes the same decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from kubeproxy.cluster.addresses import AddressText, CheckedIP, CheckedNet
from kubeproxy.cluster.objects import Endpoint, EndpointSlice, Service
from kubeproxy.cluster.twins import twin_of
from kubeproxy.model.options import Family

ServiceKey = tuple[str, str]  # (namespace, name) of a Service


@dataclass(frozen=True, slots=True, order=True)
class ServicePortName:
    namespace: str
    name: str
    port: str
    protocol: str
    # Computed once: every sync looks names up in maps of 10k+ entries and asks each for its
    # Service, several times over; the generated __hash__ would rebuild the field tuple each time.
    service: ServiceKey = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "service", (self.namespace, self.name))
        object.__setattr__(self, "_hash", hash((self.namespace, self.name, self.port, self.protocol)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[ServicePortName], tuple[str, str, str, str]]:
        # String hashes differ between interpreters: a copy or an unpickled name recomputes its own.
        return (ServicePortName, (self.namespace, self.name, self.port, self.protocol))

    def __str__(self) -> str:
        # Upstream's ServicePortName.String(): the protocol is not part of it.
        base = f"{self.namespace}/{self.name}"
        return f"{base}:{self.port}" if self.port else base


@dataclass(frozen=True, slots=True)
class ServicePortInfo:
    name: ServicePortName
    # Addresses only from cluster/addresses.py's gate: renderers write them into rule text.
    cluster_ip: CheckedIP
    port: int
    protocol: str
    node_port: int = 0
    external_ips: tuple[CheckedIP, ...] = ()
    load_balancer_vips: tuple[CheckedIP, ...] = ()
    load_balancer_source_ranges: tuple[CheckedNet, ...] = ()
    health_check_node_port: int = 0
    client_ip_affinity: bool = False
    sticky_max_age_seconds: int = 10800
    internal_policy_local: bool = False
    external_policy_local: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def externally_accessible(self) -> bool:
        return self.node_port != 0 or bool(self.load_balancer_vips) or bool(self.external_ips)

    @property
    def uses_cluster_endpoints(self) -> bool:
        # Even with externalTrafficPolicy Local, external traffic from pods and from the node
        # itself is short-circuited to the cluster endpoints, so those are needed too.
        return not self.internal_policy_local or self.externally_accessible

    @property
    def uses_local_endpoints(self) -> bool:
        return self.internal_policy_local or (self.external_policy_local and self.externally_accessible)


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    ip: AddressText
    port: int
    is_local: bool = False
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()
    # `address`, once something asks for it (see there).
    _address: str | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def address(self) -> str:
        """`ip:port`, brackets for IPv6: upstream's Endpoint.String(), hashed into chain names.

        Made on first use and kept: the iptables renderer reads it several times per endpoint,
        while nftables mode never does (one string per endpoint of the cluster otherwise).
        """
        made = self._address
        if made is None:
            made = address_text(self)
            object.__setattr__(self, "_address", made)
        return made


def address_text(ep: EndpointInfo) -> str:
    """`ep.address` made afresh, not kept (a sort key, a dictionary key for a while)."""
    ip = ep.ip
    return f"[{ip}]:{ep.port}" if ":" in ip else f"{ip}:{ep.port}"


@dataclass(frozen=True)
class NodeView:
    """Everything a renderer needs about the cluster, for one node and one IP family.

    Treated as immutable once built: syncs compare a new view with the previous one.
    """

    services: Mapping[ServicePortName, ServicePortInfo]
    endpoints: Mapping[ServicePortName, list[EndpointInfo]]

    @cached_property
    def total_endpoints(self) -> int:
        return sum(len(self.endpoints.get(name, ())) for name in self.services)

    @cached_property
    def by_service(self) -> Mapping[ServiceKey, frozenset[ServicePortName]]:
        """The keys of `services` and `endpoints` that belong to each Service.

        Lets a sync look at the few Services that changed without scanning them all. Built on
        first use; `ViewBuilder` hands it over ready-made (see `with_index`).
        """
        index: dict[ServiceKey, set[ServicePortName]] = {}
        for names in (self.services, self.endpoints):
            for name in names:
                index.setdefault(name.service, set()).add(name)
        return {key: frozenset(names) for key, names in index.items()}

    def ports_of(self, service: ServiceKey) -> frozenset[ServicePortName]:
        return self.by_service.get(service, frozenset())

    @classmethod
    def with_index(
        cls,
        services: Mapping[ServicePortName, ServicePortInfo],
        endpoints: Mapping[ServicePortName, list[EndpointInfo]],
        by_service: Mapping[ServiceKey, frozenset[ServicePortName]],
    ) -> NodeView:
        """A view whose `by_service` is already known (it must be the one the property computes)."""
        view = cls(services, endpoints)
        view.__dict__["by_service"] = by_service  # where cached_property keeps its value
        return view


def service_ports(services: Iterable[Service], family: Family) -> dict[ServicePortName, ServicePortInfo]:
    out: dict[ServicePortName, ServicePortInfo] = {}
    for svc in services:
        out.update(ports_of_service(svc, family))
    return out


def ports_of_service(svc: Service, family: Family) -> dict[ServicePortName, ServicePortInfo]:
    """One Service's ports on this IP family; none for headless and ExternalName Services."""
    version = _version(family)
    cluster_ip = next((ip for ip in svc.cluster_ips if ip.version == version), None)
    if cluster_ip is None or svc.type == "ExternalName":
        return {}  # headless, ExternalName, or not of this family
    # Upstream's ExternallyAccessible / ExternalPolicyLocal (pkg/api/v1/service): the external
    # policy applies to NodePort and LoadBalancer Services, and to a ClusterIP Service that has
    # externalIPs (its external IPs get Local's rules: only local endpoints, source kept).
    externally_accessible = svc.type in ("NodePort", "LoadBalancer") or (svc.type == "ClusterIP" and bool(svc.external_ips))
    external_local = externally_accessible and svc.external_traffic_policy == "Local"
    # NeedsHealthCheck: only a LoadBalancer's balancer probes the health check node port.
    needs_health_check = svc.type == "LoadBalancer" and external_local
    lb_vips = (
        tuple(i.ip for i in svc.load_balancer_ingress if i.ip is not None and i.ip_mode != "Proxy" and i.ip.version == version)
        if svc.load_balancer_ingress
        else ()
    )
    external_ips = tuple(ip for ip in svc.external_ips if ip.version == version) if svc.external_ips else ()
    ranges = svc.load_balancer_source_ranges
    source_ranges = tuple(c for c in ranges if c.version == version) if ranges else ()
    if any(c.prefixlen == 0 for c in source_ranges):
        # A range of the whole family allows any source: no firewall, as none were given
        # (upstream's newBaseServiceInfo, pkg/proxy/serviceport.go, IsZeroCIDR).
        source_ranges = ()
    health_check_node_port = svc.health_check_node_port if needs_health_check else 0
    affinity = svc.session_affinity == "ClientIP"
    internal_local = svc.internal_traffic_policy == "Local"
    out: dict[ServicePortName, ServicePortInfo] = {}
    for port in svc.ports:
        name = _new_port_name(svc.namespace, svc.name, port.name, port.protocol)
        out[name] = _new_port_info(
            name,
            cluster_ip,
            port.port,
            port.protocol,
            port.node_port,
            external_ips,
            lb_vips,
            source_ranges,
            health_check_node_port,
            affinity,
            svc.affinity_timeout_seconds,
            internal_local,
            external_local,
            svc.annotations,
        )
    return out


# Frozen dataclasses set each field through `object.__setattr__`, and a view builds a name and a
# port info per service port (bench/object_building.py times both ways). The makers below fill
# a twin class with the same slots by plain attribute stores, then turn it into the real class
# by `__class__` assignment, which CPython allows exactly when the two layouts are the same.
# Each is checked against its class's fields at import and against the constructor by
# tests/model/test_node_model_makers.py.


def _port_name_maker() -> Callable[[str, str, str, str], ServicePortName]:
    """`ServicePortName(namespace, name, port, protocol)`, built faster."""
    twin = twin_of(ServicePortName, {"namespace", "name", "port", "protocol", "service", "_hash"})
    new = object.__new__

    def make(namespace: str, name: str, port: str, protocol: str) -> ServicePortName:
        spn: Any = new(twin)  # typed as what it becomes below
        spn.namespace = namespace
        spn.name = name
        spn.port = port
        spn.protocol = protocol
        # As ServicePortName.__post_init__.
        spn.service = (namespace, name)
        spn._hash = hash((namespace, name, port, protocol))
        spn.__class__ = ServicePortName
        made: ServicePortName = spn
        return made

    make("", "", "", "")  # a TypeError here, at import, if the layouts ever differ
    return make


def _port_info_maker() -> Callable[..., ServicePortInfo]:
    """`ServicePortInfo(<its fields, in order>)`, built faster."""
    fields = (
        "name", "cluster_ip", "port", "protocol", "node_port", "external_ips", "load_balancer_vips",
        "load_balancer_source_ranges", "health_check_node_port", "client_ip_affinity", "sticky_max_age_seconds",
        "internal_policy_local", "external_policy_local", "annotations",
    )  # fmt: skip
    twin = twin_of(ServicePortInfo, set(fields))
    if tuple(ServicePortInfo.__dataclass_fields__) != fields:
        raise TypeError("ServicePortInfo's fields changed order: _port_info_maker takes them in order")
    new = object.__new__

    def make(
        name: ServicePortName,
        cluster_ip: CheckedIP,
        port: int,
        protocol: str,
        node_port: int,
        external_ips: tuple[CheckedIP, ...],
        load_balancer_vips: tuple[CheckedIP, ...],
        load_balancer_source_ranges: tuple[CheckedNet, ...],
        health_check_node_port: int,
        client_ip_affinity: bool,
        sticky_max_age_seconds: int,
        internal_policy_local: bool,
        external_policy_local: bool,
        annotations: Mapping[str, str],
    ) -> ServicePortInfo:
        info: Any = new(twin)  # typed as what it becomes below
        info.name = name
        info.cluster_ip = cluster_ip
        info.port = port
        info.protocol = protocol
        info.node_port = node_port
        info.external_ips = external_ips
        info.load_balancer_vips = load_balancer_vips
        info.load_balancer_source_ranges = load_balancer_source_ranges
        info.health_check_node_port = health_check_node_port
        info.client_ip_affinity = client_ip_affinity
        info.sticky_max_age_seconds = sticky_max_age_seconds
        info.internal_policy_local = internal_policy_local
        info.external_policy_local = external_policy_local
        info.annotations = annotations
        info.__class__ = ServicePortInfo
        made: ServicePortInfo = info
        return made

    return make


_new_port_name = _port_name_maker()
_new_port_info = _port_info_maker()


def _version(family: Family) -> int:
    # Compared per Service port: an int comparison is several times cheaper than asking the
    # Family enum of every address.
    return 6 if family == Family.IPV6 else 4  # `==`: callers may still hand in the plain string


def endpoints_map(slices: Iterable[EndpointSlice], family: Family, node_name: str) -> dict[ServicePortName, list[EndpointInfo]]:
    """Endpoints per service port: deduplicated by ip:port across slices, sorted as upstream does."""
    by_port: dict[ServicePortName, list[EndpointInfo]] = {}
    v6 = family == Family.IPV6  # `==`: callers may still hand in the plain string
    new_info = _new_endpoint_info
    for eps in slices:
        if eps.address_type != family or not eps.ports:
            continue
        # Each endpoint's locality once per slice, not once per port. Its address is the
        # slice's own canonical text (cluster/objects.py), shared, not copied.
        members = [
            (ip, bool(node_name) and ep.node_name == node_name, ep)
            for ep in eps.endpoints
            if (":" in (ip := ep.address)) is v6
        ]
        if not members:
            continue
        for port in eps.ports:
            name = _new_port_name(eps.namespace, eps.service_name, port.name, port.protocol)
            number = port.port
            made = [new_info(text, number, is_local, ep) for text, is_local, ep in members]
            bucket = by_port.get(name)
            if bucket is None:
                by_port[name] = made
            else:
                bucket += made
    return {name: _unique(infos) for name, infos in by_port.items()}


def _unique(infos: list[EndpointInfo]) -> list[EndpointInfo]:
    """`infos` sorted by address as upstream sorts them, each ip:port once.

    Overlapping slices may list an endpoint twice: the last local copy wins, else the first
    copy. The sort is stable, so copies stay in the order the slices gave them.
    """
    infos.sort(key=address_text)  # the keys are freed with the sort: the view keeps no address text
    out: list[EndpointInfo] = []
    last: EndpointInfo | None = None
    for info in infos:
        if last is not None and info.ip == last.ip and info.port == last.port:
            if info.is_local:
                out[-1] = last = info
            continue
        out.append(info)
        last = info
    return out


def _endpoint_info_maker() -> Callable[[AddressText, int, bool, Endpoint], EndpointInfo]:
    """`EndpointInfo(ip, port, is_local, <ep's conditions and hints>)`, built faster.

    A frozen dataclass's __init__ sets each field through `object.__setattr__`, once per endpoint
    of the cluster (bench/object_building.py times both ways). Here a twin class with the same
    slots and no frozen __setattr__ is filled by plain attribute stores, then becomes an
    EndpointInfo by `__class__` assignment, which CPython allows exactly when the two layouts are
    the same (as cluster/objects.py builds Endpoints).
    """
    fields = {"ip", "port", "is_local", "ready", "serving", "terminating", "zone_hints", "node_hints", "_address"}
    twin = twin_of(EndpointInfo, fields)
    new = object.__new__

    def make(ip: AddressText, port: int, is_local: bool, ep: Endpoint) -> EndpointInfo:
        info: Any = new(twin)  # typed as what it becomes below
        info.ip = ip
        info.port = port
        info.is_local = is_local
        info.ready = ep.ready
        info.serving = ep.serving
        info.terminating = ep.terminating
        info.zone_hints = ep.zone_hints
        info.node_hints = ep.node_hints
        info._address = None  # made on first use (EndpointInfo.address)
        info.__class__ = EndpointInfo
        made: EndpointInfo = info
        return made

    make(AddressText(""), 0, False, Endpoint(AddressText("")))  # a TypeError here, at import, if the layouts ever differ
    return make


_new_endpoint_info = _endpoint_info_maker()


def build_view(services: Iterable[Service], slices: Iterable[EndpointSlice], family: Family, node_name: str) -> NodeView:
    ports = service_ports(services, family)
    return NodeView(ports, renamed({name: name for name in ports}, endpoints_map(slices, family, node_name)))


V = TypeVar("V")


def renamed(known: dict[ServicePortName, ServicePortName], entries: Mapping[ServicePortName, V]) -> dict[ServicePortName, V]:
    """`entries` keyed by the name objects in `known` (names not in it are added to it).

    Built apart, the services and endpoints maps hold equal but distinct name objects; sharing
    them lets a port's endpoints be found by identity instead of by ServicePortName.__eq__, a
    Python call per lookup.
    """
    return {known.setdefault(name, name): value for name, value in entries.items()}
