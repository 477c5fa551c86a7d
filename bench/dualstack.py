#!/usr/bin/env python3
"""What dual-stack costs a sync: N dual-stack services x E endpoints per family, single-stack
node (IPv4 lane only) next to a dual-stack node (IPv4 + IPv6 lanes), in one run.

Usage: .venv/bin/python bench/dualstack.py [--sizes 1000,5000] [--endpoints 5] [--fake]

Times the live proxy's first (full) sync, from the moment every object is in. By default in a
network namespace made for each run (root; the host's ruleset is never touched), so the
kernel's load time counts; --fake runs against the package's fake node instead (no root).
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


def cluster(services: int, eps: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [node("192.168.0.2", "fd00::2")]
    for i in range(services):
        name = f"s{i}"
        objs.append(service(name, [f"10.96.{i // 250}.{i % 250 + 1}", f"fd00:96::{i + 1:x}"]))
        n = [i * eps + k for k in range(eps)]
        objs.append(endpoints(name, "IPv4", *(f"10.244.{j // 250 % 250}.{j % 250 + 1}" for j in n)))
        objs.append(endpoints(name, "IPv6", *(f"fd00:10:244::{j + 1:x}" for j in n)))
    return objs


def first_sync(mode: str, cidrs: tuple[str, ...], objs: list[dict[str, Any]], dual: bool, fake: bool) -> float:
    if not dual:
        objs = [node("192.168.0.2"), *objs[1:]]
    if fake:
        return asyncio.run(_first_sync(mode, cidrs, objs, dual, FakeNode().run))
    with netns.netns("kpbench") as ns:
        return asyncio.run(_first_sync(mode, cidrs, objs, dual, ns))


async def _first_sync(mode: str, cidrs: tuple[str, ...], objs: list[dict[str, Any]], dual: bool, run: Any) -> float:
    proxy = LiveProxy(replace(CFG, mode=mode, cluster_cidr=cidrs), "node-1", run_cmd=run)
    source = Source(proxy, objs)
    task = asyncio.create_task(proxy.serve(source))
    await source.wait_synced()  # the objects are in: from here on it is the sync alone
    started = time.perf_counter()
    await asyncio.wait_for(proxy.wait_for_syncs(1), 600)
    elapsed = time.perf_counter() - started
    assert len(proxy.lanes) == (2 if dual else 1) and proxy.failed_syncs == 0
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
            objs = cluster(size, args.endpoints)
            single = first_sync(mode, ("10.244.0.0/16",), objs, dual=False, fake=args.fake)
            dual = first_sync(mode, ("10.244.0.0/16", "fd00:10:244::/48"), objs, dual=True, fake=args.fake)
            print(f"{mode:9} {size:8d} {single:15.2f} {dual:13.2f} {dual / single:6.2f}")


if __name__ == "__main__":
    main()
