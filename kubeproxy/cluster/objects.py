"""Typed Service, EndpointSlice and Node: the only place that knows Kubernetes JSON field names.

`parse_service`, `parse_endpoint_slice` and `parse_node` take the plain dict an object has in a
manifest or in an API response, apply the API server's defaults (a manifest was never defaulted
by an API server), validate, and return frozen dataclasses. Anything unusable raises
`ObjectError` naming the object and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.fields import Fields, IPAddress, IPNetwork, object_ref

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


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    protocol: str
    port: int
    node_port: int = 0


@dataclass(frozen=True, slots=True)
class LoadBalancerIngress:
    ip: IPAddress | None
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
    cluster_ips: tuple[IPAddress, ...]  # empty for headless ("None") and ExternalName
    ports: tuple[ServicePort, ...]
    external_ips: tuple[IPAddress, ...] = ()
    load_balancer_source_ranges: tuple[IPNetwork, ...] = ()
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
    addresses: tuple[IPAddress, ...]
    # Unset conditions follow upstream: ready and serving default to true, terminating to false.
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str = ""
    zone: str = ""
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()


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
    addresses: tuple[tuple[str, IPAddress], ...]  # (type, ip), e.g. ("InternalIP", 192.168.0.2)
    pod_cidrs: tuple[IPNetwork, ...]
    # For /healthz only (a node on its way out fails it); not part of equality, because a
    # change of either does not change a single rule and must not force a full sync.
    deleting: bool = field(default=False, compare=False)
    taints: tuple[str, ...] = field(default=(), compare=False)  # taint keys

    def ips(self) -> list[IPAddress]:
        """Node IPs in upstream's order of preference: InternalIP first, then ExternalIP."""
        ranked = sorted(
            (a for a in self.addresses if a[0] in ("InternalIP", "ExternalIP")),
            key=lambda a: 0 if a[0] == "InternalIP" else 1,
        )
        return [ip for _, ip in ranked]


def parse_service(obj: Mapping[str, Any]) -> Service:
    namespace, name, ref = object_ref("Service", obj)
    top = Fields("Service", ref, obj)
    meta, spec, status = top.map("metadata"), top.map("spec"), top.map("status")
    svc_type = spec.enum("type", SERVICE_TYPES, "ClusterIP")

    cluster_ips = _cluster_ips(spec, svc_type)
    ports = []
    for p in spec.maps("ports"):
        ports.append(
            ServicePort(
                name=p.str("name"),
                protocol=p.enum("protocol", PROTOCOLS, "TCP"),
                port=p.port("port", required=True),
                node_port=p.port("nodePort", required=False),
            )
        )
    _check_unique_port_names(spec, ports)

    affinity = spec.enum("sessionAffinity", AFFINITIES, "None")
    timeout = DEFAULT_AFFINITY_TIMEOUT
    if affinity == "ClientIP":
        client_ip = spec.map("sessionAffinityConfig").map("clientIP")
        timeout = client_ip.int("timeoutSeconds", DEFAULT_AFFINITY_TIMEOUT)
        if not 0 < timeout <= 86400:
            raise client_ip.error("timeoutSeconds", f"{timeout} is out of range 1-86400")

    ingress = []
    for entry in status.map("loadBalancer").maps("ingress"):
        raw_ip = entry.str("ip")
        ingress.append(
            LoadBalancerIngress(
                ip=entry.ip("ip", raw_ip) if raw_ip else None,
                hostname=entry.str("hostname"),
                ip_mode=entry.enum("ipMode", ("VIP", "Proxy"), "VIP"),
            )
        )

    return Service(
        namespace=namespace,
        name=name,
        labels=meta.str_map("labels"),
        annotations=meta.str_map("annotations"),
        type=svc_type,
        cluster_ips=cluster_ips,
        ports=tuple(ports),
        external_ips=tuple(spec.ips("externalIPs")),
        load_balancer_source_ranges=tuple(spec.cidrs("loadBalancerSourceRanges")),
        load_balancer_ingress=tuple(ingress),
        external_traffic_policy=spec.enum("externalTrafficPolicy", TRAFFIC_POLICIES, "Cluster"),
        internal_traffic_policy=spec.enum("internalTrafficPolicy", TRAFFIC_POLICIES, "Cluster"),
        session_affinity=affinity,
        affinity_timeout_seconds=timeout,
        health_check_node_port=spec.port("healthCheckNodePort", required=False),
        traffic_distribution=spec.str("trafficDistribution"),
    )


def _cluster_ips(spec: Fields, svc_type: str) -> tuple[IPAddress, ...]:
    if svc_type == "ExternalName":
        return ()
    raw = spec.strs("clusterIPs") or ([spec.str("clusterIP")] if spec.str("clusterIP") else [])
    if not raw or raw[0] in ("None", ""):
        return ()
    key = "clusterIPs" if spec.data.get("clusterIPs") else "clusterIP"
    return tuple(spec.ip(f"{key}[{i}]" if key == "clusterIPs" else key, s) for i, s in enumerate(raw))


def _check_unique_port_names(spec: Fields, ports: list[ServicePort]) -> None:
    if len(ports) > 1:
        seen: set[str] = set()
        for i, p in enumerate(ports):
            if not p.name:
                raise spec.error(f"ports[{i}].name", "required when a Service has more than one port")
            if p.name in seen:
                raise spec.error(f"ports[{i}].name", f"duplicate port name {p.name!r}")
            seen.add(p.name)


def parse_endpoint_slice(obj: Mapping[str, Any]) -> EndpointSlice:
    namespace, name, ref = object_ref("EndpointSlice", obj)
    top = Fields("EndpointSlice", ref, obj)
    meta = top.map("metadata")
    labels = meta.str_map("labels")
    service_name = labels.get(LABEL_SERVICE_NAME, "")
    if not service_name:
        raise meta.error(f"labels[{LABEL_SERVICE_NAME}]", "required label is missing")
    address_type = top.enum("addressType", ("IPv4", "IPv6", "FQDN"), "")
    if not address_type:
        raise top.error("addressType", "required field is missing")

    endpoints = []
    if address_type != "FQDN":
        for ep in top.maps("endpoints"):
            addresses = ep.ips("addresses")
            if not addresses:
                raise ep.error("addresses", "at least one address is required")
            cond = ep.map("conditions")
            ready = cond.bool("ready")
            serving = cond.bool("serving")
            terminating = cond.bool("terminating")
            hints = ep.map("hints")
            endpoints.append(
                Endpoint(
                    addresses=tuple(addresses),
                    ready=ready is None or ready,
                    serving=serving is None or serving,
                    terminating=bool(terminating),
                    node_name=ep.str("nodeName"),
                    zone=ep.str("zone"),
                    zone_hints=frozenset(z.required_str("name") for z in hints.maps("forZones")),
                    node_hints=frozenset(n.required_str("name") for n in hints.maps("forNodes")),
                )
            )
    ports = []
    for p in top.maps("ports"):
        # An EndpointSlice port without a number means "all ports", which kube-proxy ignores.
        number = p.port("port", required=False)
        if number:
            ports.append(EndpointPort(p.str("name"), p.enum("protocol", PROTOCOLS, "TCP"), number))
    return EndpointSlice(
        namespace=namespace,
        name=name,
        service_name=service_name,
        labels=labels,
        address_type=address_type,
        endpoints=tuple(endpoints),
        ports=tuple(ports),
    )


def parse_node(obj: Mapping[str, Any]) -> Node:
    _, name, ref = object_ref("Node", obj, namespaced=False)
    top = Fields("Node", ref, obj)
    spec, status = top.map("spec"), top.map("status")
    addresses = []
    for a in status.maps("addresses"):
        kind = a.required_str("type")
        if kind in ("InternalIP", "ExternalIP"):
            addresses.append((kind, a.ip("address", a.required_str("address"))))
    pod_cidrs = spec.cidrs("podCIDRs") or (spec.cidrs_of_one("podCIDR") if spec.str("podCIDR") else [])
    return Node(
        name=name,
        labels=top.map("metadata").str_map("labels"),
        addresses=tuple(addresses),
        pod_cidrs=tuple(pod_cidrs),
        deleting=bool(top.map("metadata").str("deletionTimestamp")),
        taints=tuple(t.required_str("key") for t in spec.maps("taints")),
    )


def is_ignored_by_labels(labels: Mapping[str, str]) -> str | None:
    """Why kube-proxy's informers never see an object with these labels, or None."""
    if LABEL_SERVICE_PROXY_NAME in labels:
        return f"labelled {LABEL_SERVICE_PROXY_NAME}={labels[LABEL_SERVICE_PROXY_NAME]} (another proxy owns it)"
    if LABEL_HEADLESS in labels:
        return f"labelled {LABEL_HEADLESS}"
    return None


def kind_of(obj: Mapping[str, Any]) -> str:
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ObjectError("object", str(obj.get("metadata", {}).get("name", "<unnamed>")), "kind", "missing")
    return kind
