#!/usr/bin/env python3
"""What the object-building shortcuts buy, one row each: the time per call of the plain way and of
the way `cluster/objects.py` (Endpoints) and `model/node_model.py` (the view's names and endpoint
infos) take, and the sizes behind their memory choices.

Usage: .venv/bin/python bench/object_building.py [--endpoints 100000] [--runs 5]

Times are CPU seconds per call, best of `--runs` (a neighbour on the cores inflates wall time,
not CPU time, much less). `read_endpoints` is timed whole (addresses checked, conditions
defaulted, node names shared, the Endpoint built), next to the frozen dataclass's constructor
alone: the reader doing all of it in less than the constructor takes is what building through
the twin class buys; the node model's makers are timed against their classes' constructors.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from ipaddress import IPv4Address
from pathlib import Path
from socket import AF_INET, inet_pton
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubeproxy.cluster.addresses import AddressText
from kubeproxy.cluster.checks import CheckCache
from kubeproxy.cluster.objects import Endpoint, _ipv4, read_endpoints
from kubeproxy.cluster.schema import Endpoint as SchemaEndpoint
from kubeproxy.model.node_model import EndpointInfo, ServicePortName, _new_endpoint_info, _new_port_name


def per_call(runs: int, calls: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoints", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    n = args.endpoints
    texts = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(n)]
    raw = [
        {"addresses": [t], "conditions": {"ready": True}, "nodeName": f"node-{i % 50}", "zone": "z1"} for i, t in enumerate(texts)
    ]
    structs = msgspec.convert(raw, list[SchemaEndpoint])
    slices = [structs[i : i + 10] for i in range(0, n, 10)]
    packed = [inet_pton(AF_INET, t) for t in texts]
    address = [AddressText(t) for t in texts]

    def construct() -> None:
        for a in address:
            Endpoint(a, (), ready=True, serving=True, terminating=False, node_name="node-1", zone="z1")

    def read() -> None:
        checks = CheckCache()
        for s in slices:
            read_endpoints(s, "IPv4", checks)

    def ipaddress_init() -> None:
        for p in packed:
            IPv4Address(p)

    def ipv4_maker() -> None:
        for p in packed:
            _ipv4(p)

    endpoints = [Endpoint(a, node_name="node-1") for a in address]

    def endpoint_info() -> None:
        for a, ep in zip(address, endpoints, strict=True):
            EndpointInfo(a, 8080, False, ep.ready, ep.serving, ep.terminating, ep.zone_hints, ep.node_hints)

    def endpoint_info_maker() -> None:
        for a, ep in zip(address, endpoints, strict=True):
            _new_endpoint_info(a, 8080, False, ep)

    def port_name() -> None:
        for t in texts:
            ServicePortName("default", t, "http", "TCP")

    def port_name_maker() -> None:
        for t in texts:
            _new_port_name("default", t, "http", "TCP")

    rows = [
        ("Endpoint(...), the frozen dataclass's constructor", per_call(args.runs, n, construct)),
        ("read_endpoints, everything, per endpoint (10 a slice)", per_call(args.runs, n, read)),
        ("IPv4Address(4 bytes)", per_call(args.runs, n, ipaddress_init)),
        ("objects._ipv4(4 bytes), same object", per_call(args.runs, n, ipv4_maker)),
        ("EndpointInfo(...), the frozen dataclass's constructor", per_call(args.runs, n, endpoint_info)),
        ("node_model._new_endpoint_info, same object", per_call(args.runs, n, endpoint_info_maker)),
        ("ServicePortName(...), constructor and __post_init__", per_call(args.runs, n, port_name)),
        ("node_model._new_port_name, same object", per_call(args.runs, n, port_name_maker)),
    ]
    print(f"{n} endpoints, CPU time per call (best of {args.runs})")
    for label, seconds in rows:
        print(f"  {label:<56} {seconds * 1e6:6.2f} us")
    sizes = [
        ("frozenset() (a new one each time: CPython 3.11 has no shared empty one)", sys.getsizeof(frozenset())),
        ("a set of one", sys.getsizeof({"a"})),
        ("a tuple of one", sys.getsizeof(("a",))),
        ("IPv4Address + its int", sys.getsizeof(IPv4Address(texts[-1])) + sys.getsizeof(int(IPv4Address(texts[-1])))),
        ("the address as text", sys.getsizeof(texts[-1])),
        ("an endpoint's `ip:port` text (EndpointInfo.address, made on first use)", sys.getsizeof(f"{texts[-1]}:8080")),
    ]
    print("sizes (bytes, sys.getsizeof)")
    for label, size in sizes:
        print(f"  {label:<72} {size:4d}")


if __name__ == "__main__":
    main()
