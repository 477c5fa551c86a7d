"""Building blocks for nftables tests: cluster objects as dicts, views, options, canonical listings."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from kubeproxy.cluster.state import build_state
from kubeproxy.model.node_model import NodeView, build_view
from kubeproxy.model.options import Family, NodeOptions
from kubeproxy.model.proxy_config import LocalDetector

NODE = "test-node"


def service(ns: str, name: str, ip: str, *ports: Mapping[str, Any], **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", None)
    status = spec.pop("status", None)
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": ns, "name": name, **({"annotations": annotations} if annotations else {})},
        "spec": {"clusterIP": ip, "ports": [dict(p) for p in ports], **spec},
    }
    if status:
        obj["status"] = status
    return obj


def port(name: str, number: int, protocol: str = "TCP", **extra: Any) -> dict[str, Any]:
    return {"name": name, "port": number, "protocol": protocol, **extra}


def endpoint(ip: str, node: str | None = None, **conditions: Any) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [ip]}
    if node:
        ep["nodeName"] = node
    if conditions:
        hints = conditions.pop("zone_hints", None)
        if conditions:
            ep["conditions"] = conditions
        if hints:
            ep["hints"] = {"forZones": [{"name": z} for z in hints]}
    return ep


def slice_(
    ns: str, svc: str, endpoints: Iterable[dict[str, Any]], *ports: tuple[str, int, str], n: int = 1, family: str = "IPv4"
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": f"{svc}-{n}", "labels": {"kubernetes.io/service-name": svc}},
        "addressType": family,
        "endpoints": list(endpoints),
        "ports": [{"name": p[0], "port": p[1], "protocol": p[2]} for p in ports],
    }


def view(objects: Iterable[Mapping[str, Any]], family: Family = Family.IPV4, node: str = NODE) -> NodeView:
    state, warnings = build_state(objects)
    assert not warnings, warnings
    return build_view(state.services.values(), state.slices.values(), family, node)


def options(**changes: Any) -> NodeOptions:
    base = NodeOptions(
        node_name=NODE,
        node_ip="192.168.0.2",
        family=Family.IPV4,
        masquerade_mark="0x4000",
        local_detector=LocalDetector("ClusterCIDR", ("10.0.0.0/8",)),
        localhost_nodeports=False,
        nfacct_counters=(),
    )
    return dataclasses.replace(base, **changes)


def options6(**changes: Any) -> NodeOptions:
    detector = LocalDetector("ClusterCIDR", ("fd00:10::/64",))
    return options(family=Family.IPV6, node_ip="2001:db8::1", local_detector=detector, **changes)


def canonical(listing_json: str, table: str = "kube-proxy") -> dict[str, Any]:
    """`nft -j list table` without handles, elements as sorted lists: two equal tables compare equal."""
    out: dict[str, Any] = {"chains": {}, "sets": {}, "objects": {}}
    for obj in json.loads(listing_json)["nftables"]:
        ((kind, body),) = obj.items()
        if kind == "metainfo" or body.get("table", table) != table:
            continue
        body = {k: v for k, v in body.items() if k != "handle"}
        if kind == "chain":
            out["chains"].setdefault(body["name"], {"def": None, "rules": []})["def"] = body
        elif kind == "rule":
            out["chains"].setdefault(body["chain"], {"def": None, "rules": []})["rules"].append(
                json.dumps(body["expr"], sort_keys=True) + json.dumps(body.get("comment"))
            )
        elif kind in ("set", "map"):
            elems = body.pop("elem", [])
            out["sets"][body["name"]] = {"def": body, "elem": sorted(json.dumps(e, sort_keys=True) for e in elems)}
        elif kind == "ct timeout":
            out["objects"][body["name"]] = body
    return out
