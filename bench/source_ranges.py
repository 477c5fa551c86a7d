#!/usr/bin/env python3
"""loadBalancerSourceRanges at scale: one LoadBalancer Service with N source ranges, loaded with nft.

Usage: .venv/bin/python bench/source_ranges.py [--sizes 1000,5000,20000,80000] [--timeout 60]

Side by side in one run, each in a fresh network namespace (needs root), each bounded by
--timeout (">T" when cut off):

  shared concat   a single interval set `address . proto . port . source`
                  for every Service (nft's concatenated-interval backend: each insert grows with
                  the set, so the load is quadratic)
  ours            our nftables mode now: the Service's own `firewall-…` chain and an interval set
                  of plain source addresses (render + nft -f of the whole table)
"""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubeproxy.backends.nftables.render import render  # noqa: E402
from kubeproxy.lab import netns as L  # noqa: E402
from tests.backends.nftables.helpers import NODE, endpoint, options, port, service, slice_, view  # noqa: E402


def ranges(n: int) -> list[str]:
    # Disjoint /31s: nothing for either design to merge.
    return [str(ipaddress.ip_network((0x0B000000 + 4 * i, 31))) for i in range(n)]


def shared_concat_text(n: int) -> str:
    lines = [
        "add table ip kp",
        "add set ip kp firewall-allow { type ipv4_addr . inet_proto . inet_service . ipv4_addr ; flags interval ; }",
    ]
    rs = ranges(n)
    for i in range(0, n, 1000):
        batch = ", ".join(f"198.51.100.9 . tcp . 80 . {r}" for r in rs[i : i + 1000])
        lines.append("add element ip kp firewall-allow { " + batch + " }")
    return "\n".join(lines) + "\n"


def ours_text(n: int) -> str:
    objs = [
        service("ns", "lb", "172.30.0.1", port("p", 80, nodePort=30080), type="LoadBalancer",
                loadBalancerSourceRanges=ranges(n), status={"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}}),
        slice_("ns", "lb", [endpoint("10.180.0.1", NODE)], ("p", 80, "TCP")),
    ]  # fmt: skip
    return render(view(objs), options()).text()


def load(text: str, timeout: float) -> str:
    with L.netns("kpsr") as ns:
        started = time.perf_counter()
        try:
            ns.run(["nft", "-f", "-"], input=text, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f">{timeout:g}"
        return f"{time.perf_counter() - started:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,20000,80000")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()
    print(f"{'ranges':>7} {'shared concat s':>16} {'ours s':>7} {'ours render s':>14}")
    for n in (int(s) for s in args.sizes.split(",")):
        started = time.perf_counter()
        ours = ours_text(n)
        rendered = time.perf_counter() - started
        old, new = load(shared_concat_text(n), args.timeout), load(ours, args.timeout)
        print(f"{n:>7} {old:>16} {new:>7} {rendered:>14.2f}", flush=True)


if __name__ == "__main__":
    main()
