#!/usr/bin/env python3
"""Where `iptables-nft-restore`'s time goes with our rules, next to iptables-legacy-restore.

Usage: .venv/bin/python bench/iptables_nft.py [--sizes 1000,5000,10000] [--endpoints 10]
                                              [--chunk 500] [--timeout 120]

For each size (services x endpoints, bench/render.py's objects), in throwaway network namespaces
(needs root), with user and system CPU of the tool next to the wall clock (the machine is shared:
CPU time is what the tool itself costs):

  one-shot      the full ruleset in one restore (what a cold sync sends), bounded by --timeout
  no comments   the same without `-m comment` (is it the comments?)  [smallest size only]
  chunked       the same rules loaded --chunk services at a time, each restore a partial sync
                that adds the next services (KUBE-SERVICES rewritten whole each time, as a live
                proxy does when services appear)
  partial       one service's endpoint moved, as our partial sync sends it: its own chains plus
                the shared chains (KUBE-SERVICES, KUBE-NODEPORTS, filter) rewritten whole, as
                upstream does; median of 3
  own only      the same change without the shared chains (which the change leaves as they are)
  partial now   the same change as the proxier sends it now: shared chains whose text the last
                restore wrote unchanged are left out (backends/iptables/last_restore.py); median of 3
  empty         `*nat COMMIT` with --noflush: the fixed cost of one restore at this size
  legacy        iptables-legacy-restore of the one-shot text and of the partial one, for scale
                (legacy replaces the whole table on every restore, whatever it is given)
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from render import cluster  # noqa: E402  (bench/render.py's generator)

from kubeproxy.backends.iptables.last_restore import AppliedChains  # noqa: E402
from kubeproxy.backends.iptables.names import is_service_chain  # noqa: E402
from kubeproxy.backends.iptables.render import render  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.model.node_model import NodeView, build_view  # noqa: E402
from kubeproxy.model.options import Family, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402

_COMMENT = re.compile(r' -m comment --comment (?:"[^"]*"|\S+)')


@dataclass(frozen=True)
class Cost:
    wall: float
    user: float
    sys: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.wall + other.wall, self.user + other.user, self.sys + other.sys)

    def __str__(self) -> str:
        return f"{self.wall:7.2f} ({self.user:.2f}u {self.sys:.2f}s)"


class TimedOut(Exception):
    pass


def restore(ns: netns.NetNS, text: str, variant: str, timeout: float) -> Cost:
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    try:
        proc = ns.run([f"iptables-{variant}-restore", "-w", "--noflush", "--counters"], input=text, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise TimedOut from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"iptables-{variant}-restore failed: {proc.stderr[:500]}")
    return Cost(time.perf_counter() - start, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)


def own_chains_only(text: str) -> str:
    """A partial restore without the shared chains: only the service chains it writes."""
    keep = []
    for line in text.splitlines():
        chain = line[1:].split()[0] if line.startswith(":") else line.split()[1] if line.startswith("-A ") else None
        if chain is None or is_service_chain(chain):
            keep.append(line)
    return "\n".join(keep) + "\n"


def skipping(full: str, partial: str) -> str:
    """`partial` as the proxier sends it after a successful full restore of `full`."""
    applied = AppliedChains()
    applied.applied(applied.filter(full, full=True), full=True)
    return applied.filter(partial, full=False).text


def subset(view: NodeView, keep: set[tuple[str, str]]) -> NodeView:
    return NodeView({k: v for k, v in view.services.items() if k.service in keep},
                    {k: v for k, v in view.endpoints.items() if k.service in keep})  # fmt: skip


def row(size: int, args: argparse.Namespace, first: bool) -> None:
    opts = node_options(ProxyConfig(cluster_cidr=("10.0.0.0/8",)), family=Family.IPV4, hostname="node-0", node=None,
                        nfacct_counters=())  # fmt: skip
    state = build_state(cluster(size, args.endpoints))[0]
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-0")
    full = render(view, opts).text
    keys = list(dict.fromkeys(name.service for name in sorted(view.services)))
    changes = [keys[(k * 7919) % len(keys)] for k in range(3)]
    cell = {"size": f"{size:,}", "lines": f"{full.count(chr(10)):,}", "chains": f"{full.count(chr(10) + ':'):,}"}

    def bounded(fn) -> str:  # type: ignore[no-untyped-def]
        try:
            return str(fn())
        except TimedOut:
            return f"> {args.timeout:.0f}"

    with netns.netns("kpipn") as ns:
        cell["one-shot"] = bounded(lambda: restore(ns, full, "nft", args.timeout))
    if first:
        with netns.netns("kpipn") as ns:
            cell["no comments"] = bounded(lambda: restore(ns, _COMMENT.sub("", full), "nft", args.timeout))
    with netns.netns("kpipn") as ns:
        total = Cost(0, 0, 0)
        for i in range(0, len(keys), args.chunk):
            part = subset(view, set(keys[: i + args.chunk]))
            text = render(part, opts, changed_services=set(keys[i : i + args.chunk])).text if i else render(part, opts).text
            total += restore(ns, text, "nft", args.timeout * 10)
        cell["chunked"] = str(total)
        partials = [restore(ns, render(view, opts, changed_services={k}).text, "nft", args.timeout) for k in changes]
        cell["partial"] = str(sorted(partials, key=lambda c: c.wall)[1])
        owns = [restore(ns, own_chains_only(render(view, opts, changed_services={k}).text), "nft", args.timeout) for k in changes]
        cell["own only"] = str(sorted(owns, key=lambda c: c.wall)[1])
        nows = [restore(ns, skipping(full, render(view, opts, changed_services={k}).text), "nft", args.timeout) for k in changes]
        cell["partial now"] = str(sorted(nows, key=lambda c: c.wall)[1])
        cell["empty"] = str(restore(ns, "*nat\nCOMMIT\n", "nft", args.timeout))
    with netns.netns("kpipl") as ns:
        cell["legacy one-shot"] = bounded(lambda: restore(ns, full, "legacy", args.timeout))
        legacy = [restore(ns, render(view, opts, changed_services={k}).text, "legacy", args.timeout) for k in changes]
        cell["legacy partial"] = str(sorted(legacy, key=lambda c: c.wall)[1])
        legacy = [restore(ns, skipping(full, render(view, opts, changed_services={k}).text), "legacy", args.timeout)
                  for k in changes]  # fmt: skip
        cell["legacy partial now"] = str(sorted(legacy, key=lambda c: c.wall)[1])
    for key, value in cell.items():
        print(f"  {key:<19} {value}")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=500, help="services per restore in the chunked load")
    parser.add_argument("--timeout", type=float, default=120, help="bound of one restore (the chunked load: 10x)")
    args = parser.parse_args()
    if not netns.have_root():
        sys.exit("bench/iptables_nft.py needs root: it loads rules into throwaway network namespaces")
    print(f"{subprocess.run(['iptables-nft', '--version'], capture_output=True, text=True).stdout.strip()}; "
          f"kernel {os.uname().release}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          "seconds: wall (user, system CPU of the tool)")  # fmt: skip
    for i, size in enumerate(int(s) for s in args.sizes.split(",")):
        print(f"{size:,} services x {args.endpoints} endpoints")
        row(size, args, first=i == 0)
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
