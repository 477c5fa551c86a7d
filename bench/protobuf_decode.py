#!/usr/bin/env python3
"""Protobuf against JSON from upstream's kube-apiserver: bytes on the wire and decode time.

Usage (root, upstream's binaries built by scripts/upstream):

    .venv/bin/python bench/protobuf_decode.py [--sizes 1000,10000] [--endpoints 10] [--runs 5]

Starts upstream's control plane (v1.37.2) on loopback, creates N Services (two ports; no
selector, so that the EndpointSlice controller adds no slices of its own) and N EndpointSlices
(`--endpoints` endpoints each, with conditions, node, zone and a Pod targetRef, as the
EndpointSlice controller writes them) and asks for both lists at one
resourceVersion, once as JSON and once as protobuf. For each it prints the body's bytes and the
time to decode it as the API source does with `typed_lists` (JSON: `schema.decode_list`, msgspec
in C; protobuf: `sources.protobuf.decode_list`, pure Python: a decoder per message compiled from
`proto_schema`'s tables; both pause the collector and freeze what they made, see `cluster.bulk`)
and then to the cluster's objects
(`typed.parse_item`), best and median of `--runs`, CPU time. Then one Service change and one
EndpointSlice change as a watch event, in bytes, each way.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402

from kubeproxy.cluster.checks import CheckCache  # noqa: E402
from kubeproxy.cluster.objects import DEFAULT_OPTIONS  # noqa: E402
from kubeproxy.cluster.schema import Item, decode_list  # noqa: E402
from kubeproxy.cluster.typed import parse_item  # noqa: E402
from kubeproxy.lab.control_plane import ControlPlane, upstream_bin  # noqa: E402
from kubeproxy.sources import protobuf  # noqa: E402

PROTOBUF_ACCEPT = f"{protobuf.MEDIA_TYPE}, application/json"
NS = "bench"
SERVICES = "/api/v1/services"
SLICES = "/apis/discovery.k8s.io/v1/endpointslices"


def service(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"svc-{i}", "namespace": NS, "labels": {"app": f"app-{i}"}},
        "spec": {
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"name": "https", "port": 443, "targetPort": 8443}],
        },
    }


def endpoint_slice(i: int, endpoints: int) -> dict[str, Any]:
    eps = []
    for e in range(endpoints):
        n = i * endpoints + e
        eps.append({
            "addresses": [f"10.{100 + n // 65000}.{n // 250 % 256}.{n % 250 + 1}"],
            "conditions": {"ready": True, "serving": True, "terminating": False},
            "nodeName": f"node-{e % 5}",
            "zone": f"zone-{e % 3}",
            "targetRef": {"kind": "Pod", "namespace": NS, "name": f"app-{i}-{e:05d}", "uid": f"00000000-0000-0000-0000-{n:012d}"},
        })  # fmt: skip
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"svc-{i}-1", "namespace": NS, "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "https", "port": 8443, "protocol": "TCP"}],
    }


def create(api: httpx2.Client, path: str, objects: list[dict[str, Any]]) -> None:
    def post(obj: dict[str, Any]) -> None:
        answer = api.post(path, json=obj, timeout=60)
        if answer.status_code not in (200, 201, 409):
            raise SystemExit(f"POST {path}: {answer.status_code} {answer.text[:300]}")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(post, objects))


def get(api: httpx2.Client, path: str, accept: str, params: dict[str, str]) -> bytes:
    answer = api.get(path, params=params, headers={"Accept": accept, "Accept-Encoding": "identity"}, timeout=120)
    if answer.status_code != 200:
        raise SystemExit(f"GET {path}: {answer.status_code} {answer.text[:300]}")
    return answer.content


def cpu_ms(runs: int, fn: Callable[[], Any]) -> tuple[float, float, Any]:
    times, result = [], None
    for _ in range(runs):
        start = time.process_time()
        result = fn()
        times.append((time.process_time() - start) * 1000)
    return min(times), statistics.median(times), result


def objects(items: list[Item], kind: str) -> int:
    checks = CheckCache()
    made = 0
    for item in items:
        item.kind = kind
        made += parse_item(item, DEFAULT_OPTIONS, checks) is not None
    return made


def measure(api: httpx2.Client, kind: str, path: str, runs: int) -> list[str]:
    rv = str(
        httpx2.Response(200, content=get(api, path, "application/json", {"limit": "1"})).json()["metadata"]["resourceVersion"]
    )
    at = {"resourceVersion": rv, "resourceVersionMatch": "Exact"}
    as_json, as_pb = get(api, path, "application/json", at), get(api, path, PROTOBUF_ACCEPT, at)
    assert protobuf.is_protobuf(as_pb)

    def json_items() -> list[Item]:
        decoded = decode_list(as_json)
        assert decoded is not None, "the JSON list is outside the typed schema"
        return decoded[1]

    def pb_items() -> list[Item]:
        return protobuf.decode_list(as_pb, kind)[1]

    j_best, j_med, j_list = cpu_ms(runs, json_items)
    p_best, p_med, p_list = cpu_ms(runs, pb_items)
    jo_best, jo_med, j_made = cpu_ms(runs, lambda: objects(json_items(), kind))
    po_best, po_med, p_made = cpu_ms(runs, lambda: objects(pb_items(), kind))
    assert len(j_list) == len(p_list) and j_made == p_made == len(j_list), (len(j_list), len(p_list), j_made, p_made)
    n = len(j_list)
    return [
        f"| {kind}List | {n} | {len(as_json):,} | {len(as_pb):,} | {len(as_json) / len(as_pb):.2f}x "
        f"| {j_best:.0f} / {j_med:.0f} | {p_best:.0f} / {p_med:.0f} | {p_med / j_med:.1f}x "
        f"| {jo_best:.0f} / {jo_med:.0f} | {po_best:.0f} / {po_med:.0f} | {po_med / jo_med:.2f}x |"
    ]


def change_event(api: httpx2.Client, path: str, patch_path: str, patch: Any) -> str:
    rv = str(
        httpx2.Response(200, content=get(api, path, "application/json", {"limit": "1"})).json()["metadata"]["resourceVersion"]
    )
    answer = api.patch(patch_path, json=patch, headers={"Content-Type": "application/json-patch+json"})
    if answer.status_code != 200:
        raise SystemExit(f"PATCH {patch_path}: {answer.status_code} {answer.text[:300]}")
    watch = {
        "watch": "true",
        "resourceVersion": rv,
        "timeoutSeconds": "1",
        "fieldSelector": f"metadata.name={patch_path.rsplit('/', 1)[1]}",
    }
    j = get(api, path, "application/json", watch)
    p = get(api, path, PROTOBUF_ACCEPT, watch)
    return f"{len(j):,} | {len(p):,} | {len(j) / len(p):.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    bin_dir = upstream_bin()
    if bin_dir is None:
        sys.exit("upstream's binaries are not built (scripts/upstream)")
    rows = []
    events = []
    with tempfile.TemporaryDirectory(prefix="kp-pbbench-") as tmp, ControlPlane.start(bin_dir, Path(tmp)) as cp:
        cp.api.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        made = 0
        for size in sorted(int(s) for s in args.sizes.split(",")):
            began = time.monotonic()
            create(cp.api, f"/api/v1/namespaces/{NS}/services", [service(i) for i in range(made, size)])
            slices = [endpoint_slice(i, args.endpoints) for i in range(made, size)]
            create(cp.api, f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices", slices)
            made = size
            print(f"# {size} Services and EndpointSlices in {time.monotonic() - began:.0f}s", file=sys.stderr)
            rows += measure(cp.api, "Service", SERVICES, args.runs)
            rows += measure(cp.api, "EndpointSlice", SLICES, args.runs)
        port_patch = [{"op": "replace", "path": "/spec/ports/0/port", "value": 81}]
        events.append(
            f"| a Service's port | {change_event(cp.api, SERVICES, f'/api/v1/namespaces/{NS}/services/svc-0', port_patch)} |"
        )
        ready_patch = [{"op": "replace", "path": "/endpoints/0/conditions/ready", "value": False}]
        slice_path = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/svc-0-1"
        events.append(f"| an endpoint's readiness | {change_event(cp.api, SLICES, slice_path, ready_patch)} |")
    print(
        f"Lists from kube-apiserver v1.37.2 ({args.endpoints} endpoints a slice); decode CPU ms, best / median of {args.runs}:\n"
    )
    print("| list | objects | JSON bytes | protobuf bytes | JSON/protobuf | JSON decode | protobuf decode | protobuf/JSON "
          "| JSON to objects | protobuf to objects | protobuf/JSON |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    print("\nOne change as a watch event (bytes of the watch answer: one event, JSON line or protobuf frame):\n")
    print("| change | JSON | protobuf | JSON/protobuf |\n| --- | ---: | ---: | ---: |")
    print("\n".join(events))


if __name__ == "__main__":
    main()
