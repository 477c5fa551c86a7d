#!/usr/bin/env python3
"""What dual-stack costs a sync: N Services x E endpoints, single-stack IPv4 Services next to
dual-stack ones (each with an EndpointSlice per family), on a dual-stack node, in one run.

Usage: .venv/bin/python bench/dualstack.py [--sizes 1000,5000] [--endpoints 5] [--fake]

Both runs have both family lanes, as every node does whose kernel has both families (upstream's
platformCheckSupported): what differs is the IPv6 half of the objects. Times the live proxy's
first (full) sync, from the moment every object is in. By default in a network namespace made
for each run (root; the host's ruleset is never touched), so the kernel's load time counts;
--fake runs against the package's fake node instead (no root).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.lab import netns
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from tests.live.served import Source
from tests.proxy.test_dualstack import endpoints, node, service

CFG = ProxyConfig(min_sync_period=0.0, sync_period=300.0, healthz_bind_address="", metrics_bind_address="")


def cluster(services: int, eps: int, dual: bool) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [node("192.168.0.2", "fd00::2")]
    for i in range(services):
        name = f"s{i}"
        ips = [f"10.96.{i // 250}.{i % 250 + 1}", f"fd00:96::{i + 1:x}"]
        objs.append(service(name, ips if dual else ips[:1]))
        n = [i * eps + k for k in range(eps)]
        objs.append(endpoints(name, "IPv4", *(f"10.244.{j // 250 % 250}.{j % 250 + 1}" for j in n)))
        if dual:
            objs.append(endpoints(name, "IPv6", *(f"fd00:10:244::{j + 1:x}" for j in n)))
    return objs


def first_sync(mode: str, objs: list[dict[str, Any]], fake: bool) -> float:
    if fake:
        return asyncio.run(_first_sync(mode, objs, FakeNode().run))
    with netns.netns("kpbench") as ns:
        return asyncio.run(_first_sync(mode, objs, ns))


async def _first_sync(mode: str, objs: list[dict[str, Any]], run: Any) -> float:
    proxy = LiveProxy(replace(CFG, mode=mode, cluster_cidr=("10.244.0.0/16", "fd00:10:244::/48")), "node-1", run_cmd=run)
    source = Source(proxy, objs)
    task = asyncio.create_task(proxy.serve(source))
    await source.wait_synced()  # the objects are in: from here on it is the sync alone
    started = time.perf_counter()
    await asyncio.wait_for(proxy.wait_for_syncs(1), 600)
    elapsed = time.perf_counter() - started
    assert len(proxy.lanes) == 2 and proxy.failed_syncs == 0
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--endpoints", type=int, default=5)
    parser.add_argument("--fake", action="store_true", help="the fake node instead of a namespace (no root)")
    args = parser.parse_args()
    print("fake node" if args.fake else "kernel (network namespace)")
    print(f"{'mode':9} {'services':>8} {'single-stack s':>15} {'dual-stack s':>13} {'ratio':>6}")
    for mode in ("iptables", "nftables"):
        for size in (int(s) for s in args.sizes.split(",")):
            single = first_sync(mode, cluster(size, args.endpoints, dual=False), args.fake)
            dual = first_sync(mode, cluster(size, args.endpoints, dual=True), args.fake)
            print(f"{mode:9} {size:8d} {single:15.2f} {dual:13.2f} {dual / single:6.2f}")


if __name__ == "__main__":
    main()
