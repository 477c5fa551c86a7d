"""Plain Service / EndpointSlice / Node dicts for test beds, as `kubectl get -o yaml` would show them.

The builders only spell objects; they do not validate (the proxy under test does that). Each
returns a fresh dict, so a test may tweak a field before writing it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Port:
    """One service port and the pod port behind it."""

    name: str
    port: int
    target: int
    protocol: str = "TCP"
    node_port: int = 0


@dataclass(frozen=True, slots=True)
class Backend:
    """One endpoint of a slice: an IP, the node it runs on, and its conditions."""

    ip: str
    node_name: str
    ready: bool = True
    serving: bool = True
    terminating: bool = False


def service(
    name: str,
    cluster_ip: str,
    ports: Sequence[Port],
    *,
    namespace: str = "default",
    type: str = "ClusterIP",
    external_ips: Sequence[str] = (),
    load_balancer_ips: Sequence[str] = (),
    source_ranges: Sequence[str] = (),
    external_traffic_policy: str = "",
    internal_traffic_policy: str = "",
    affinity_timeout: int | None = None,
    health_check_node_port: int = 0,
    labels: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> JSON:
    """A Service; `affinity_timeout` set means sessionAffinity ClientIP with that many seconds.

    An empty `cluster_ip` leaves the field out (the API server would allocate one); `spec` adds or
    replaces spec fields the keywords do not cover, as given (tests of bad input use it too).
    """
    body: JSON = {"type": type, "clusterIP": cluster_ip, "ports": [_service_port(p) for p in ports]}
    if not cluster_ip:
        del body["clusterIP"]
    if external_ips:
        body["externalIPs"] = list(external_ips)
    if source_ranges:
        body["loadBalancerSourceRanges"] = list(source_ranges)
    if external_traffic_policy:
        body["externalTrafficPolicy"] = external_traffic_policy
    if internal_traffic_policy:
        body["internalTrafficPolicy"] = internal_traffic_policy
    if affinity_timeout is not None:
        body["sessionAffinity"] = "ClientIP"
        body["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": affinity_timeout}}
    if health_check_node_port:
        body["healthCheckNodePort"] = health_check_node_port
    body.update(spec or {})
    obj: JSON = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, namespace, labels), "spec": body}
    if load_balancer_ips:
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in load_balancer_ips]}}
    return obj


def _meta(name: str, namespace: str | None, labels: Mapping[str, str] | None) -> JSON:
    meta: JSON = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = dict(labels)
    return meta


def _service_port(p: Port) -> JSON:
    out: JSON = {"name": p.name, "protocol": p.protocol, "port": p.port, "targetPort": p.target}
    if not p.name:
        del out["name"]
    if p.node_port:
        out["nodePort"] = p.node_port
    return out


def endpoint_slice(
    service_name: str,
    backends: Sequence[Backend],
    ports: Sequence[Port],
    *,
    namespace: str = "default",
    name: str = "",
    address_type: str = "IPv4",
) -> JSON:
    """The EndpointSlice of `service_name` (named `<service>-eps` unless `name` is given).
    A backend without a node name has no `nodeName` (a remote or unscheduled endpoint)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": _meta(name or f"{service_name}-eps", namespace, {"kubernetes.io/service-name": service_name}),
        "addressType": address_type,
        "endpoints": [_endpoint(b) for b in backends],
        "ports": [{"name": p.name, "protocol": p.protocol, "port": p.target} for p in ports],
    }


def _endpoint(b: Backend) -> JSON:
    out: JSON = {
        "addresses": [b.ip],
        "nodeName": b.node_name,
        "conditions": {"ready": b.ready, "serving": b.serving, "terminating": b.terminating},
    }
    if not b.node_name:
        del out["nodeName"]
    return out


def node(name: str, internal_ip: str, pod_cidr: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": internal_ip}, {"type": "Hostname", "address": name}]},
    }


def expected_endpoints(objs: Sequence[JSON]) -> dict[str, set[str]]:
    """What a proxy should DNAT to, per service port (`ns/name:port`, as upstream's rule comments
    name it): the `ip:targetPort`s of the ready endpoints, or of the serving-terminating ones when
    nothing is ready; an empty set for a port without endpoints. For objects these builders made.
    """
    slices: dict[tuple[str, str], list[JSON]] = {}
    for obj in objs:
        if obj.get("kind") == "EndpointSlice":
            meta = obj["metadata"]
            key = (meta["namespace"], meta["labels"]["kubernetes.io/service-name"])
            slices.setdefault(key, []).append(obj)
    out: dict[str, set[str]] = {}
    for obj in objs:
        if obj.get("kind") != "Service":
            continue
        meta = obj["metadata"]
        for port in obj["spec"]["ports"]:
            name = f"{meta['namespace']}/{meta['name']}" + (f":{port['name']}" if port.get("name") else "")
            ready, fallback = set(), set()
            for eps in slices.get((meta["namespace"], meta["name"]), []):
                targets = [p["port"] for p in eps["ports"] if p.get("name", "") == port.get("name", "")]
                for ep in eps["endpoints"]:
                    cond = ep.get("conditions", {})
                    addrs = {f"{ip}:{t}" for ip in ep["addresses"] for t in targets}
                    if cond.get("ready", True):
                        ready |= addrs
                    elif cond.get("serving", True) and cond.get("terminating", False):
                        fallback |= addrs
            out[name] = ready or fallback
    return out
