#!/usr/bin/env python3
"""Render time and peak memory for N services x 10 endpoints, next to iptables-restore's load time.

Usage: .venv/bin/python bench/render.py [--sizes 1000,10000] [--endpoints 10] [--runs 3] [--no-kernel]
                                        [--baseline DIR]

Columns (medians of --runs; CPU time is user+sys of this process, which a neighbour competing
for the cores does not inflate as it does the wall clock):
- parse: turning the raw objects into typed ones (`build_state`), the API or file source's cost;
- render: the pure function, a full sync from scratch (`render(view, opts)`), wall and CPU;
- peak MiB: tracemalloc's peak during one full render;
- partial ms: one service's endpoint replaced at a time, rendered as the live proxy does it (a
  `RenderCache` warmed by a full render, `changed_services` = that service), CPU;
- load: `iptables-{nft,legacy}-restore` of the full text into a fresh network namespace (root
  only; the host's ruleset is never touched), and render/load.

`--baseline DIR` (another version's tree, e.g. `git archive HEAD | tar -x -C /tmp/base`) measures
that tree's renderer with this script, in child processes alternating with this tree's, and
prints both and their ratio (no kernel loads: the text is the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The tree whose kubeproxy is measured: this one, or a baseline's when run as its child.
sys.path.insert(0, os.environ.get("KP_BENCH_TREE") or str(ROOT))

from kubeproxy.backends.iptables.apply import ensure_nfacct_counters, restore  # noqa: E402
from kubeproxy.backends.iptables.cache import RenderCache  # noqa: E402
from kubeproxy.backends.iptables.render import render  # noqa: E402
from kubeproxy.cluster.addresses import AddressText  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.model.node_model import NodeView, build_view  # noqa: E402
from kubeproxy.model.options import NFACCT_COUNTERS, Family, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402


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
        eps = [
            {
                "addresses": [f"10.{100 + (i * endpoints + e) // 65000}.{(i * endpoints + e) // 250 % 256}.{e % 250 + 1}"],
                "nodeName": f"node-{e % 5}",
            }
            for e in range(endpoints)
        ]
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


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(runs: int, fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Median wall and CPU seconds of `runs` calls, and the last result."""
    walls, cpus, result = [], [], None
    for _ in range(runs):
        result = None
        gc.collect()
        cpu, start = _cpu(), time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def one_change(view: NodeView, step: int) -> tuple[NodeView, tuple[str, str]]:
    """`view` with one service port's last endpoint moved to another address, and that Service."""
    ports = sorted(view.services)
    name = ports[(step * 7919) % len(ports)]  # spread over the name order
    endpoints = list(view.endpoints.get(name, []))
    if endpoints:
        endpoints[-1] = dataclasses.replace(endpoints[-1], ip=AddressText(f"10.250.{step // 250 % 250}.{step % 250 + 1}"))
    return NodeView(view.services, {**view.endpoints, name: endpoints}), name.service


def measure(size: int, endpoints: int, runs: int) -> dict[str, Any]:
    """Everything but the kernel loads, for one size, with the kubeproxy on sys.path."""
    cfg = ProxyConfig(cluster_cidr=("10.0.0.0/8",))
    opts = node_options(cfg, family=Family.IPV4, hostname="node-0", node=None)
    objs = cluster(size, endpoints)
    _, parse_cpu, state = timed(runs, lambda: build_state(objs)[0])
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, opts.node_name)
    render_wall, render_cpu, rendered = timed(runs, lambda: render(view, opts))
    rules = rendered.filter_rules + rendered.nat_rules
    del rendered
    gc.collect()
    tracemalloc.start()
    render(view, opts)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    cache = RenderCache()
    render(view, opts, cache=cache)
    changes = [one_change(view, step) for step in range(max(runs, 5))]
    partial_cpus = []
    for changed, service in changes:
        gc.collect()
        cpu = _cpu()
        render(changed, opts, changed_services={service}, cache=cache)
        partial_cpus.append(_cpu() - cpu)
    return {
        "rules": rules,
        "parse_cpu": parse_cpu,
        "render_wall": render_wall,
        "render_cpu": render_cpu,
        "peak": peak,
        "partial_cpu": statistics.median(partial_cpus),
        "view": view,
        "opts": opts,
    }


def load_time(text: str, variant: str, timeout: float) -> float | None:
    """Seconds for iptables-<variant>-restore to load `text` into a fresh namespace; None on timeout."""
    with netns.netns("kpbench") as ns:
        ensure_nfacct_counters(NFACCT_COUNTERS, ns)
        start = time.perf_counter()
        try:
            restore(text, ns, variant=variant, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return time.perf_counter() - start


def fmt(seconds: float | None, timeout: float) -> str:
    return f"{seconds:.3f}" if seconds is not None else f">{timeout:.0f}"


def child(tree: Path, size: int, endpoints: int, runs: int) -> dict[str, Any]:
    """measure() with `tree`'s kubeproxy, in a fresh process."""
    env = {**os.environ, "KP_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)}
    argv = [sys.executable, __file__, "--measure", str(size), "--endpoints", str(endpoints), "--runs", str(runs)]
    out = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def compare(baseline: Path, sizes: list[int], endpoints: int, runs: int) -> None:
    trees = {"baseline": baseline.resolve(), "this tree": ROOT}
    header = f"{'services':>8} {'tree':>10} {'render wall s':>13} {'render cpu s':>12} {'peak MiB':>9} {'partial cpu ms':>14}"
    print(header)
    print("-" * len(header))
    keys = ("render_wall", "render_cpu", "peak", "partial_cpu")
    for size in sizes:
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for _ in range(runs):  # the trees alternate, so that both see the same neighbours
            for name, tree in trees.items():
                results[name].append(child(tree, size, endpoints, 3))
        medians = {name: {k: statistics.median(r[k] for r in results[name]) for k in keys} for name in trees}
        for name in trees:
            m = medians[name]
            print(
                f"{size:>8} {name:>10} {m['render_wall']:>13.3f} {m['render_cpu']:>12.3f} {m['peak']:>9.1f}"
                f" {m['partial_cpu'] * 1000:>14.1f}"
            )
        ratio = {k: medians["this tree"][k] / medians["baseline"][k] for k in keys}
        print(
            f"{size:>8} {'ratio':>10} {ratio['render_wall']:>12.2f}x {ratio['render_cpu']:>11.2f}x {ratio['peak']:>8.2f}x"
            f" {ratio['partial_cpu']:>13.2f}x"
        )
    print(f"(medians of {runs} processes per tree, each the median of 3 renders; load {os.getloadavg()[0]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-kernel", action="store_true")
    parser.add_argument("--restore-timeout", type=float, default=300, help="give up on one load after this many seconds")
    parser.add_argument("--baseline", type=Path, help="another version's tree to compare with (see above)")
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # a child of --baseline
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.measure is not None:
        result = measure(args.measure, args.endpoints, args.runs)
        print(json.dumps({k: v for k, v in result.items() if k not in ("view", "opts")}))
        return
    if args.baseline is not None:
        compare(args.baseline, sizes, args.endpoints, args.runs)
        return
    kernel = not args.no_kernel and netns.have_root()
    header = (
        f"{'services':>8} {'endpoints':>9} {'rules':>8} {'parse cpu':>9} {'render s':>9} {'cpu s':>6} {'peak MiB':>9}"
        f" {'partial ms':>10} {'nft load s':>11} {'legacy load s':>14} {'render/nft':>11} {'render/legacy':>14}"
    )
    print(header)
    print("-" * len(header))
    for size in sizes:
        m = measure(size, args.endpoints, args.runs)
        text = render(m["view"], m["opts"]).text if kernel else ""
        loads = {v: load_time(text, v, args.restore_timeout) if kernel else None for v in ("nft", "legacy")}
        cells = [fmt(loads[v], args.restore_timeout) if kernel else "-" for v in ("nft", "legacy")]
        ratios = [f"{m['render_wall'] / loads[v]:.3f}" if loads[v] else "-" for v in ("nft", "legacy")]
        print(
            f"{size:>8} {size * args.endpoints:>9} {m['rules']:>8} {m['parse_cpu']:>9.3f} {m['render_wall']:>9.3f}"
            f" {m['render_cpu']:>6.3f} {m['peak']:>9.1f} {m['partial_cpu'] * 1000:>10.1f}"
            f" {cells[0]:>11} {cells[1]:>14} {ratios[0]:>11} {ratios[1]:>14}"
        )
    print(f"(medians of {args.runs}; load average {os.getloadavg()[0]:.1f})")
    if not kernel:
        print("(no restore columns: --no-kernel, or not root; loads go into a throwaway network namespace)")


if __name__ == "__main__":
    main()
