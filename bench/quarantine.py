#!/usr/bin/env python3
"""What a quarantine costs: one Service whose rules the kernel refuses, among N, in a real kernel.

Usage: .venv/bin/python bench/quarantine.py [--sizes 1000,10000] [--modes iptables,nftables] [--variant legacy]

In a throwaway namespace (needs root), the live proxy's sync path (`FamilyLane.program`) with the
kernel tools wrapped so that they refuse any transaction mentioning one endpoint address (as a
kernel refusing one Service's rules would). Columns, in seconds:

  full           a full sync of N services × 10 endpoints, nothing refused (for scale)
  partial        the refused change arrives as a partial sync: it fails, the suspects (the
                 changed Services) are checked, the culprit is quarantined, the rest applied
  checks         how many `nft -c` / `iptables-restore --test` checks that took
  at start       the proxy starts with the refused Service present: the full sync fails, every
                 Service is a suspect, bisection finds the one
  checks         checks that took (at most 2 + 2·log2 N)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from render import cluster  # noqa: E402  (bench/render.py's generator)

from kubeproxy.cluster.addresses import AddressText  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.model.changes import Changes  # noqa: E402
from kubeproxy.model.node_model import NodeView, build_view  # noqa: E402
from kubeproxy.model.options import Family, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402
from kubeproxy.proxy.live_loop import LiveProxy  # noqa: E402

REFUSED = "10.253.253.253"
CFG = ProxyConfig(cluster_cidr=("10.0.0.0/8",), hostname_override="node-0", min_sync_period=0.0, sync_period=3600.0,
                  healthz_bind_address="", metrics_bind_address="")  # fmt: skip


def refusing(run: Any) -> Any:
    def wrapped(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if REFUSED in (kw.get("input") or "") and (argv[0] == "nft" or "-restore" in argv[0]):
            return subprocess.CompletedProcess(argv, 1, "", "refused (injected)")
        return run(argv, **kw)

    return wrapped


def views(objs: list[dict]) -> tuple[NodeView, NodeView, tuple[str, str]]:
    state, _ = build_state(objs)
    good = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-0")
    victim = next(iter(state.slices.values()))
    bad_slice = dataclasses.replace(
        victim, endpoints=(dataclasses.replace(victim.endpoints[0], address=AddressText(REFUSED)),)
    )
    slices = [bad_slice if s is victim else s for s in state.slices.values()]
    bad = build_view(state.services.values(), slices, Family.IPV4, "node-0")
    return good, bad, (victim.namespace, victim.service_name)


def proxy_in(ns: netns.NetNS, mode: str, variant: str) -> tuple[LiveProxy, list[int]]:
    proxy = LiveProxy(dataclasses.replace(CFG, mode=mode), "node-0", run_cmd=refusing(ns), iptables_variant=variant)
    backend = proxy.lanes[0].backend
    backend.prepare()
    checks = [0]
    real = backend.check

    def counted(view: NodeView, opts: Any) -> str | None:
        checks[0] += 1
        return real(view, opts)

    backend.check = counted  # type: ignore[method-assign]
    return proxy, checks


def row(mode: str, size: int, variant: str) -> str:
    good, bad, key = views(cluster(size, 10))
    opts = node_options(CFG, family=Family.IPV4, hostname="node-0", node=None, nfacct_counters=())
    with netns.netns("kpq") as ns:
        proxy, checks = proxy_in(ns, mode, variant)
        started = time.perf_counter()
        proxy.lanes[0].program(good, opts, Changes(full=True), primary=True)
        full = time.perf_counter() - started
        started = time.perf_counter()
        proxy.lanes[0].program(bad, opts, Changes(full=False, services=frozenset({key})), primary=True)
        partial, partial_checks = time.perf_counter() - started, checks[0]
        assert proxy.lanes[0].quarantine.names() == [f"{key[0]}/{key[1]}"], proxy.lanes[0].quarantine.names()
    with netns.netns("kpq") as ns:
        proxy, checks = proxy_in(ns, mode, variant)
        started = time.perf_counter()
        proxy.lanes[0].program(bad, opts, Changes(full=True), primary=True)
        at_start = time.perf_counter() - started
        assert proxy.lanes[0].quarantine.names() == [f"{key[0]}/{key[1]}"], proxy.lanes[0].quarantine.names()
    return f"{mode:>8} {size:>8} | {full:>7.2f} | {partial:>8.2f} {partial_checks:>6} | {at_start:>8.2f} {checks[0]:>6}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--modes", default="iptables,nftables")
    parser.add_argument("--variant", default="legacy")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the quarantine's warnings, once per case, are expected here
    if not netns.have_root():
        sys.exit("bench/quarantine.py needs root: it programs a throwaway network namespace")
    print(f"{'mode':>8} {'services':>8} | {'full s':>7} | {'partial s':>8} {'checks':>6} | {'start s':>8} {'checks':>6}")
    for size in (int(s) for s in args.sizes.split(",")):
        for mode in args.modes.split(","):
            print(row(mode, size, args.variant), flush=True)


if __name__ == "__main__":
    main()
