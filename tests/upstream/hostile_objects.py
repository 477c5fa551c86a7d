"""Hostile but valid objects for the side-by-side tests (test_side_by_side_hostile.py in iptables
mode, test_side_by_side_nftables_hostile.py in nftables mode): objects the real API server accepts
(kubectl decides, not the test) but that are odd in size, range or shape."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
FAMILIES = ("IPv4", "IPv6")
WEB = {"app": "web"}
# Hand-made endpoints lie outside the pod ranges, so the bed's freshness check leaves them alone.
GHOST = "10.250.0.{}"
GHOST6 = "fd00:250::{:x}"
MANAGER = {"endpointslice.kubernetes.io/managed-by": "hostile.lab.kubeproxy"}


def service(name: str, ports: list[JSON], *, selector: bool = True, labels: JSON | None = None, **spec: Any) -> JSON:
    body: JSON = {"ports": ports, **spec}
    if selector:
        body["selector"] = WEB
    meta: JSON = {"name": name, **({"labels": labels} if labels else {})}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": body}


def port(name: str, number: int, target: int | str = 8080, protocol: str = "TCP", **extra: Any) -> JSON:
    return {"name": name, "port": number, "targetPort": target, "protocol": protocol, **extra}


def endpoint_slice(name: str, service_name: str | None, endpoints: list[JSON], ports: list[JSON], family: str = "IPv4") -> JSON:
    labels = dict(MANAGER)
    if service_name is not None:
        labels["kubernetes.io/service-name"] = service_name
    meta = {"name": name, "labels": labels}
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta, "addressType": family,
            "endpoints": endpoints, "ports": ports}  # fmt: skip


def ep(address: str, ready: bool | None = True, **extra: Any) -> JSON:
    out: JSON = {"addresses": [address], **extra}
    if ready is not None:
        out["conditions"] = {"ready": ready, "serving": ready, "terminating": False}
    return out


def slice_port(name: str | None, number: int | None, protocol: str = "TCP") -> JSON:
    out: JSON = {"protocol": protocol}
    if name is not None:
        out["name"] = name
    if number is not None:
        out["port"] = number
    return out


@dataclass(frozen=True)
class Hostile:
    what: str
    objects: list[JSON]
    touched: Collection[str] = ("IPv4",)  # the families whose sync it causes in upstream ([]: none or unsure)
    selecting: dict[str, tuple[str, ...]] = field(default_factory=dict)  # its Services that select the web pods


def hostiles() -> list[Hostile]:
    long_name = "l" + "o" * 61 + "g"  # 63 characters, the most a Service name may have
    dual: JSON = {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}
    return [
        Hostile("63-character names", [service(long_name, [port("p" * 15, 80, "http")])], selecting={long_name: ("IPv4",)}),
        Hostile("100 ports on one Service", [service("hundred", [port(f"p{i}", 1000 + i) for i in range(100)])],
                selecting={"hundred": ("IPv4",)}),
        Hostile("many externalIPs, both families", [service(
            "many-ext", [port("http", 80)], externalIPs=[f"198.51.100.{i}" for i in range(1, 65)]
            + [f"2001:db8:e::{i:x}" for i in range(1, 33)], **dual)], FAMILIES, {"many-ext": FAMILIES}),
        Hostile("affinity timeouts 1 and 86400", [
            service(f"aff-{t}", [port("http", 80)], sessionAffinity="ClientIP",
                    sessionAffinityConfig={"clientIP": {"timeoutSeconds": t}}) for t in (1, 86400)],
                selecting={"aff-1": ("IPv4",), "aff-86400": ("IPv4",)}),
        Hostile("port 65535, nodePort 32767", [service("edge-ports", [port("top", 65535, 65535, nodePort=32767),
                                                                   port("low", 1, 1, nodePort=30000)], type="NodePort")],
                selecting={"edge-ports": ("IPv4",)}),
        Hostile("one port number on TCP, UDP and SCTP", [service(
            "three-protos", [port("t", 53, "http"), port("u", 53, "dns", "UDP"), port("s", 53, "sctp", "SCTP")],
            type="NodePort")],
            selecting={"three-protos": ("IPv4",)}),
        Hostile("a selector-less Service whose slices name ports it lacks", [
            service("ghost-ports", [port("p80", 80, 80)], selector=False),
            endpoint_slice("ghost-ports-a", "ghost-ports", [ep(GHOST.format(1))], [slice_port("other", 9000)]),
            endpoint_slice("ghost-ports-b", "ghost-ports", [ep(GHOST.format(2))], [slice_port("p80", 80), slice_port("p81", 81)]),
        ]),
        Hostile("the same endpoints in two slices", [
            service("dup", [port("p", 80, 80)], selector=False),
            *[endpoint_slice(f"dup-{n}", "dup", [ep(GHOST.format(3)), ep(GHOST.format(4))], [slice_port("p", 80)]) for n in "ab"],
        ]),
        Hostile("endpoint hostnames, hints to zones that do not exist", [
            service("hinted", [port("p", 80, 80)], selector=False, trafficDistribution="PreferClose"),
            endpoint_slice("hinted-a", "hinted", [
                ep(GHOST.format(5), hostname="db-0", zone="zone-nowhere", hints={"forZones": [{"name": "zone-nowhere"}]}),
                ep(GHOST.format(6), hostname="db-1", nodeName="node-nowhere", hints={"forZones": [{"name": "zone-x"}]}),
            ], [slice_port("p", 80)]),
        ]),
        Hostile("hints for the nodes' zone on some endpoints only", [
            service("half-hinted", [port("p", 80, 80)], selector=False),
            endpoint_slice("half-hinted-a", "half-hinted", [
                ep(GHOST.format(7), hints={"forZones": [{"name": "zone-a"}]}), ep(GHOST.format(8))], [slice_port("p", 80)]),
        ]),
        Hostile("Endpoints mirrored into a slice for a selector-less Service", [
            service("mirrored", [port("p", 80, 80), port("q", 81, 81)], selector=False),
            {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "mirrored"}, "subsets": [
                {"addresses": [{"ip": GHOST.format(9)}, {"ip": GHOST.format(10), "hostname": "m-1"}],
                 "notReadyAddresses": [{"ip": GHOST.format(11)}],
                 "ports": [{"name": "p", "port": 80, "protocol": "TCP"}, {"name": "q", "port": 81, "protocol": "TCP"}]}]},
        ]),
        Hostile("an IPv6 slice and an FQDN slice for an IPv4 Service", [
            service("wrong-family", [port("p", 80, 80)], selector=False),
            endpoint_slice("wrong-family-6", "wrong-family", [ep(GHOST6.format(1))], [slice_port("p", 80)], "IPv6"),
            endpoint_slice("wrong-family-fqdn", "wrong-family", [ep("db.example.com")], [slice_port("p", 80)], "FQDN"),
        ], ()),
        Hostile("a slice naming no Service, a slice port without name or number, endpoints without conditions", [
            service("loose", [port("", 80, 80)], selector=False),
            endpoint_slice("orphan", None, [ep(GHOST.format(12))], [slice_port("p", 80)]),
            endpoint_slice("loose-a", "loose", [ep(GHOST.format(13), ready=None)], [slice_port(None, None)]),
            endpoint_slice("loose-b", "loose", [ep(GHOST.format(14), ready=None)], [slice_port(None, 80)]),
        ], ()),
        Hostile("a Service for another proxy (service-proxy-name)", [
            service("not-ours", [port("http", 80)], labels={"service.kubernetes.io/service-proxy-name": "other"})], ()),
        Hostile("a dual-stack LoadBalancer whose source ranges hold 0.0.0.0/0", [{
            **service("lb-any", [port("http", 80)], type="LoadBalancer", **dual,
                      loadBalancerSourceRanges=["0.0.0.0/0", "10.0.0.0/8", "2001:db8:5::/64"]),
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.97"}, {"ip": "2001:db8:f::97"}]}},
        }], FAMILIES, {"lb-any": FAMILIES}),
        Hostile("a LoadBalancer whose ingress has a hostname and an ipMode Proxy, 40 source ranges", [{
            **service("lb-host", [port("http", 80)], type="LoadBalancer",
                      loadBalancerSourceRanges=[f"100.64.{i}.0/24" for i in range(40)]),
            "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example.com"}, {"ip": "203.0.113.99", "ipMode": "Proxy"},
                                                {"ip": "203.0.113.98"}]}},
        }], selecting={"lb-host": ("IPv4",)}),
        Hostile("an ExternalName that looks like an address", [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext-addr"},
             "spec": {"type": "ExternalName", "externalName": "10.96.0.10", "ports": [port("p", 80, 80)]}}], ()),
    ]  # fmt: skip
