#!/usr/bin/env python3
"""Render time and peak memory for N services x 10 endpoints, next to iptables-restore's load time.

Usage: .venv/bin/python bench/render.py [--sizes 1000,10000] [--endpoints 10] [--no-kernel]
Loads happen inside a network namespace created for the run (needs root); the host's
ruleset is never touched. Everything is measured side by side in one run.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubeproxy.backends.iptables.apply import ensure_nfacct_counters, restore
from kubeproxy.backends.iptables.render import render
from kubeproxy.cluster.state import build_state
from kubeproxy.lab import netns
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.model import build_view
from kubeproxy.proxy.options import NFACCT_COUNTERS, node_options


def cluster(services: int, endpoints: int) -> list[dict]:
    objs: list[dict] = []
    for i in range(services):
        name, ip = f"svc-{i}", f"10.96.{i // 250}.{i % 250 + 1}"
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "bench"},
                "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
            }
        )
        eps = [{"addresses": [f"10.{100 + (i * endpoints + e) // 65000}.{(i * endpoints + e) // 250 % 256}.{e % 250 + 1}"],
                "nodeName": f"node-{e % 5}"} for e in range(endpoints)]
        objs.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"name": f"{name}-1", "namespace": "bench", "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "endpoints": eps,
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            }
        )
    return objs


def best_of(runs: int, fn):
    best, result = float("inf"), None
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def load_time(text: str, variant: str, timeout: float) -> float | None:
    """Seconds for iptables-<variant>-restore to load `text` into a fresh namespace; None on timeout."""
    with netns.netns("kpbench") as ns:
        ensure_nfacct_counters(NFACCT_COUNTERS, ns.run)
        start = time.perf_counter()
        try:
            restore(text, ns.run, variant=variant, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return time.perf_counter() - start


def fmt(seconds: float | None, timeout: float) -> str:
    return f"{seconds:.3f}" if seconds is not None else f">{timeout:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--no-kernel", action="store_true")
    parser.add_argument("--restore-timeout", type=float, default=300, help="give up on one load after this many seconds")
    args = parser.parse_args()
    kernel = not args.no_kernel and netns.have_root()

    cfg = ProxyConfig(cluster_cidr=("10.0.0.0/8",))
    opts = node_options(cfg, family="IPv4", hostname="node-0", node=None)
    header = (
        f"{'services':>8} {'endpoints':>9} {'rules':>8} {'parse s':>8} {'render s':>9} {'peak MiB':>9}"
        f" {'nft load s':>11} {'legacy load s':>14} {'render/nft':>11} {'render/legacy':>14}"
    )
    print(header)
    print("-" * len(header))
    for size in (int(s) for s in args.sizes.split(",")):
        objs = cluster(size, args.endpoints)
        parse_s, state = best_of(3, lambda objs=objs: build_state(objs)[0])
        view = build_view(state.services.values(), state.slices.values(), "IPv4", opts.node_name)
        render_s, rendered = best_of(3, lambda view=view: render(view, opts))
        gc.collect()
        tracemalloc.start()
        render(view, opts)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        loads = {v: load_time(rendered.text, v, args.restore_timeout) if kernel else None for v in ("nft", "legacy")}
        rules = rendered.filter_rules + rendered.nat_rules
        cells = [fmt(loads[v], args.restore_timeout) if kernel else "-" for v in ("nft", "legacy")]
        ratios = [f"{render_s / loads[v]:.3f}" if loads[v] else "-" for v in ("nft", "legacy")]
        print(
            f"{size:>8} {size * args.endpoints:>9} {rules:>8} {parse_s:>8.3f} {render_s:>9.3f} {peak:>9.1f}"
            f" {cells[0]:>11} {cells[1]:>14} {ratios[0]:>11} {ratios[1]:>14}"
        )
    if not kernel:
        print("(restore column needs root: it loads the text into a throwaway network namespace)")


if __name__ == "__main__":
    main()
