#!/usr/bin/env python3
"""What the nftables elements' comments cost a cold table: the same rendering with and without them.

Usage: .venv/bin/python bench/nftables_comments.py [--services 10000] [--endpoints 10] [--runs 5]

bench/render.py's services (one port, 10 endpoints each) are rendered once; each run writes the
cold table's `nft -f` text (diff.create_plan, as the applier's first sync) of the rendering as
it is ("on": the Service's `ns/name:port` on its service-ips element and on the first element of
its selector block) and of a copy whose elements lost their comments ("off"), and loads each into
a fresh network namespace with one `nft -f` (needs root). The two alternate within each run, so
both see the same neighbours on a shared machine. CPU seconds (user + sys) are less disturbed by
neighbours than wall seconds; the table gives both, medians of --runs.

  text       ours: the cold table's nft text from the rendering (CPU)
  nft load   the kernel tool: `nft -f` of that text, parse + commit (its own CPU, and wall)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from render import cluster  # noqa: E402  (bench/render.py's generator)

from kubeproxy.backends.nftables.diff import chunks, create_plan  # noqa: E402
from kubeproxy.backends.nftables.render import render  # noqa: E402
from kubeproxy.backends.nftables.rendered_table import NftRendering  # noqa: E402
from kubeproxy.backends.nftables.table_objects import Element, ElementMap, pack  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.model.node_model import build_view  # noqa: E402
from kubeproxy.model.options import Family, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402


def without_comments(rendering: NftRendering) -> NftRendering:
    def bare(d: Mapping[str, Element]) -> ElementMap:
        assert isinstance(d, ElementMap)
        return ElementMap({k: p if isinstance(p, str) else pack(p.value, None) for k, p in d.raw.items()})

    return dataclasses.replace(rendering, elements={name: bare(d) for name, d in rendering.elements.items()})


def cold_text(rendering: NftRendering) -> tuple[str, float]:
    start = time.process_time()
    text = "".join(t for t, _ in chunks(create_plan(rendering).units, rendering.table, 10**9))
    return text, time.process_time() - start


def nft_load(text: str) -> tuple[float, float]:
    """`nft -f` of `text` in a fresh namespace: (its CPU seconds, wall seconds)."""
    with netns.netns("kp-cmt") as ns, tempfile.NamedTemporaryFile("w", suffix=".nft") as f:
        f.write(text)
        f.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(ns.argv(["nft", "-f", f.name]), stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"nft -f failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    state = build_state(cluster(args.services, args.endpoints))[0]
    opts = node_options(ProxyConfig(cluster_cidr=("10.0.0.0/8",)), family=Family.IPV4, hostname="node-0", node=None,
                        nfacct_counters=())  # fmt: skip
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-0")
    on = render(view, opts)
    renderings = {"on": on, "off": without_comments(on)}
    rows: dict[str, list[tuple[float, float, float, int]]] = {k: [] for k in renderings}
    load_start = os.getloadavg()[0]
    for _ in range(args.runs):
        for name, rendering in renderings.items():
            text, text_cpu = cold_text(rendering)
            nft_cpu, nft_wall = nft_load(text)
            rows[name].append((text_cpu, nft_cpu, nft_wall, text.count(" comment ")))
    print(f"{args.services} services x {args.endpoints} endpoints; median of {args.runs} runs; "
          f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end, on {os.cpu_count()} cores")  # fmt: skip
    print(f"{'comments':8} {'in the text':>17} | {'text cpu s':>10} | {'nft cpu s':>9} {'nft wall s':>10}")
    print("-" * 66)
    for name, got in rows.items():
        text_cpu, nft_cpu, nft_wall = (statistics.median(r[i] for r in got) for i in range(3))
        print(f"{name:8} {got[0][3]:>17,} | {text_cpu:>10.3f} | {nft_cpu:>9.3f} {nft_wall:>10.3f}")
    med = {name: [statistics.median(r[i] for r in got) for i in range(3)] for name, got in rows.items()}
    print(f"{'on/off':8} {'':>17} | {med['on'][0] / med['off'][0]:>10.2f} | {med['on'][1] / med['off'][1]:>9.2f} "
          f"{med['on'][2] / med['off'][2]:>10.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
