#!/usr/bin/env python3
"""nftables mode at scale: cold sync, one-endpoint change, no-op resync, side by side with a rule
set of upstream's nftables shape (loaded with nft -f) and our iptables mode (iptables-restore).

Usage: .venv/bin/python bench/nftables.py [--sizes 1000,10000] [--endpoints 10] [--timeout 120]
       .venv/bin/python bench/nftables.py --shapes 1000,2000,4000   # endpoint-selection designs only

Everything loads into network namespaces created for the run (needs root); each measurement is
bounded by --timeout (a cell shows ">T" when it was cut off). Columns:

  cold s      ours: render + create the table (chunked nft -f runs); upstream: nft -f of its full
              rule set; iptables: render + iptables-restore (legacy; the nft variant takes minutes)
  change ms   one endpoint of one service replaced, median of --changes runs. ours: incremental
              render + diff + nft -f; upstream: nft -f of the transaction its partial sync sends
              (the service chain rewritten with a new numgen vmap, its endpoint chains, the old
              endpoint chain flushed); iptables: partial render + restore (the shared chains are
              always rewritten)
  ops         kernel operations (commands + elements) our applier sent
  no-op ms    a resync with nothing changed. ours: render + diff (+ nft, if anything were sent);
              upstream: the two listings (chains, sets) its sync runs every time; iptables: a
              partial restore of the shared chains
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib.util
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubeproxy.backends.iptables.apply import restore  # noqa: E402
from kubeproxy.backends.iptables.render import render as render_iptables  # noqa: E402
from kubeproxy.backends.nftables import naming  # noqa: E402
from kubeproxy.backends.nftables.apply import NftApplier  # noqa: E402
from kubeproxy.backends.nftables.render import render  # noqa: E402
from kubeproxy.cluster.addresses import AddressText  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortName, build_view  # noqa: E402
from kubeproxy.model.options import Family, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402
from kubeproxy.model.topology import categorize  # noqa: E402


def _bench_cluster() -> Callable[[int, int], list[dict]]:
    spec = importlib.util.spec_from_file_location("bench_render", ROOT / "bench" / "render.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.cluster  # the same services and endpoints as bench/render.py


class Timeout(Exception):
    pass


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    try:
        fn()
    except subprocess.TimeoutExpired as exc:
        raise Timeout from exc
    return time.perf_counter() - start


def cell(fn: Callable[[], float], scale: float, timeout: float, digits: int) -> str:
    try:
        return f"{fn() * scale:.{digits}f}"
    except Timeout:
        return f">{timeout * scale:.0f}"


# ------------------------------------------------------------------------------------------
# upstream's shape, for the same services


def upstream_service(spn: ServicePortName, cluster_ip: str, eps: list[EndpointInfo]) -> list[str]:
    t = "ip kube-proxy"
    svc = naming.cluster_chain(spn)
    chains = [naming.endpoint_chain(spn, e.ip, e.port) for e in eps]
    lines = []
    for e, c in zip(eps, chains, strict=True):
        lines += [f"add chain {t} {c}", f"flush chain {t} {c}",
                  f"add rule {t} {c} ip saddr {e.ip} jump mark-for-masquerade",
                  f"add rule {t} {c} meta l4proto tcp dnat to {e.ip}:{e.port}"]  # fmt: skip
    lines += [f"add chain {t} {svc}", f"flush chain {t} {svc}"]
    lines.append(f"add rule {t} {svc} ip daddr {cluster_ip} tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade")
    vmap = " , ".join(f"{i} : goto {c}" for i, c in enumerate(chains))
    lines.append(f"add rule {t} {svc} numgen random mod {len(chains)} vmap {{ {vmap} }}")
    return lines


def upstream_text(view: NodeView, node: str) -> str:
    t = "ip kube-proxy"
    lines = [
        f"add table {t}",
        f"add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}",
        f"add set {t} cluster-ips {{ type ipv4_addr ; }}",
        f"add chain {t} mark-for-masquerade",
        f"add rule {t} mark-for-masquerade mark set mark or 0x4000",
        f"add chain {t} masquerading",
        f"add rule {t} masquerading mark and 0x4000 == 0 return",
        f"add rule {t} masquerading mark set mark xor 0x4000",
        f"add rule {t} masquerading masquerade fully-random",
        f"add chain {t} services",
        f"add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; }}",
        f"add chain {t} nat-postrouting {{ type nat hook postrouting priority 100 ; }}",
        f"add rule {t} nat-prerouting jump services",
        f"add rule {t} nat-postrouting jump masquerading",
        f"add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips",
    ]
    elements = []
    for spn in sorted(view.services):
        svc = view.services[spn]
        eps = categorize(view.endpoints.get(spn, []), svc, node, {}).cluster
        lines += upstream_service(spn, str(svc.cluster_ip), eps)
        elements.append(f"{svc.cluster_ip} . tcp . 80 : goto {naming.cluster_chain(spn)}")
        lines.append(f"add element {t} cluster-ips {{ {svc.cluster_ip} }}")
    for i in range(0, len(elements), 1000):
        lines.append(f"add element {t} service-ips {{ {', '.join(elements[i : i + 1000])} }}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------


def change_one(view: NodeView, k: int) -> tuple[NodeView, ServicePortName, EndpointInfo, EndpointInfo]:
    """The k-th service's first endpoint replaced by a new pod."""
    names = sorted(view.services)
    spn = names[(k * 7919) % len(names)]
    eps = list(view.endpoints[spn])
    old = eps[0]
    eps[0] = dataclasses.replace(old, ip=AddressText(f"10.250.{k // 250}.{k % 250 + 1}"))
    endpoints = dict(view.endpoints)
    endpoints[spn] = sorted(eps, key=lambda e: e.address)
    return NodeView(view.services, endpoints), spn, old, eps[0]


def measure(size: int, n_eps: int, changes: int, timeout: float) -> dict[str, str]:
    objs = _bench_cluster()(size, n_eps)
    state = build_state(objs)[0]
    cfg = ProxyConfig(cluster_cidr=("10.0.0.0/8",))
    opts = node_options(cfg, family=Family.IPV4, hostname="node-0", node=None, nfacct_counters=())
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, opts.node_name)
    row: dict[str, str] = {"services": str(size), "endpoints": str(view.total_endpoints)}

    # ours
    with netns.netns("kpbn") as ns:
        applier = NftApplier("ip", ns, timeout=timeout)
        holder: dict[str, Any] = {}

        def cold() -> None:
            r = render(view, opts)
            holder["r"] = r
            holder["res"] = applier.apply(r)

        row["ours cold s"] = cell(lambda: timed(cold), 1, timeout, 2)
        r = holder.get("r")
        if "res" in holder:
            res = holder["res"]
            row["ours cold ops"] = f"{res.operations} in {res.invocations} nft"  # type: ignore[attr-defined]
            row["render s"] = f"{timed(lambda: render(view, opts)):.2f}"
            times, ops = [], []
            v = view
            for k in range(changes):
                v, spn, _, _ = change_one(v, k)
                t0 = time.perf_counter()
                r = render(v, opts, previous=r, changed_services={spn.service})  # type: ignore[arg-type]
                result = applier.apply(r)
                times.append(time.perf_counter() - t0)
                ops.append(result.operations)
            row["ours change ms"] = f"{statistics.median(times) * 1000:.1f}"
            row["ours change ops"] = f"{statistics.median(ops):.0f}"
            t0 = time.perf_counter()
            r = render(v, opts, previous=r, changed_services=set())
            result = applier.apply(r)
            row["ours no-op ms"] = f"{(time.perf_counter() - t0) * 1000:.1f}"
            row["ours no-op ops"] = f"{result.operations} ({result.invocations} nft)"

    # upstream's shape
    text = upstream_text(view, opts.node_name)
    with netns.netns("kpbu") as ns:
        loaded = False

        def load() -> None:
            nonlocal loaded
            ns.run(["nft", "-f", "-"], input=text, timeout=timeout)
            loaded = True

        row["upstream cold s"] = cell(lambda: timed(load), 1, timeout, 2)
        if loaded:
            times = []
            v = view
            for k in range(changes):
                v, spn, old, _new = change_one(v, k)
                svc = v.services[spn]
                eps = categorize(v.endpoints[spn], svc, opts.node_name, {}).cluster
                tx = "\n".join(upstream_service(spn, str(svc.cluster_ip), eps)) + "\n"
                tx += f"flush chain ip kube-proxy {naming.endpoint_chain(spn, old.ip, old.port)}\n"
                try:
                    times.append(timed(functools.partial(ns.run, ["nft", "-f", "-"], input=tx, timeout=timeout)))
                except Timeout:
                    times.append(float("inf"))
            row["upstream change ms"] = f"{statistics.median(times) * 1000:.1f}"

            def listings() -> None:
                ns.run(["nft", "-j", "list", "chains", "ip"], timeout=timeout)
                ns.run(["nft", "-j", "list", "sets", "ip"], timeout=timeout)

            row["upstream no-op ms"] = cell(lambda: timed(listings), 1000, timeout, 1)
        else:
            row["upstream change ms"] = row["upstream no-op ms"] = "-"

    # our iptables mode (legacy restore)
    with netns.netns("kpbi") as ns:
        ok = False

        def ipt_cold() -> None:
            nonlocal ok
            restore(render_iptables(view, opts).text, ns, variant="legacy", timeout=timeout)
            ok = True

        row["iptables cold s"] = cell(lambda: timed(ipt_cold), 1, timeout, 2)
        if ok:
            times = []
            v = view
            for k in range(changes):
                v, spn, _, _ = change_one(v, k)
                text = render_iptables(v, opts, changed_services={spn.service}).text
                times.append(timed(functools.partial(restore, text, ns, variant="legacy", timeout=timeout)))
            row["iptables change ms"] = f"{statistics.median(times) * 1000:.1f}"
            row["iptables no-op ms"] = cell(lambda: timed(lambda: restore(
                render_iptables(v, opts, changed_services=set()).text, ns, variant="legacy", timeout=timeout)),
                1000, timeout, 1)  # fmt: skip
        else:
            row["iptables change ms"] = row["iptables no-op ms"] = "-"
    return row


COLUMNS = [
    "services", "endpoints", "render s", "ours cold s", "ours cold ops", "ours change ms", "ours change ops",
    "ours no-op ms", "ours no-op ops", "upstream cold s", "upstream change ms", "upstream no-op ms",
    "iptables cold s", "iptables change ms", "iptables no-op ms",
]  # fmt: skip


# ------------------------------------------------------------------------------------------
# endpoint-selection designs (why render.py does what it does)


def shape_text(shape: str, n: int, neps: int = 10) -> str:
    """Only the endpoint-selection part of a table, in one of the designs we measured."""
    t = "ip kube-proxy"
    o = [f"add table {t}", f"add chain {t} mark-for-masquerade", f"add rule {t} mark-for-masquerade mark set mark or 0x4000"]
    if shape == "ours":
        o.append(f"add map {t} cluster-endpoints-{neps} {{ typeof ip daddr . meta l4proto . th dport . numgen random mod 1"
                 " : ip daddr . th dport ; }")  # fmt: skip
        o.append(f"add chain {t} cluster-endpoints-{neps}")
        o.append(f"add rule {t} cluster-endpoints-{neps} dnat ip to ip daddr . meta l4proto . th dport . numgen random mod {neps}"
                 f" map @cluster-endpoints-{neps}")  # fmt: skip
    elems: list[str] = []
    for s in range(n):
        spn = ServicePortName(f"ns{s}", f"svc{s}", "p80", "TCP")
        ip = f"172.30.{s // 250}.{s % 250 + 1}"
        eips = [f"10.{(s * neps + e) // 65536 % 256}.{(s * neps + e) // 256 % 256}.{(s * neps + e) % 256}" for e in range(neps)]
        if shape == "ours":
            # (the hairpin set holds this node's endpoints only: left out, as the others' endpoint chains are kept)
            elems += [f"{ip} . tcp . 80 . {e} : {eip} . 80" for e, eip in enumerate(eips)]
            continue
        svc = naming.cluster_chain(spn)
        o.append(f"add chain {t} {svc}")
        chains = [naming.endpoint_chain(spn, AddressText(eip), 80) for eip in eips]
        for c, eip in zip(chains, eips, strict=True):
            o += [f"add chain {t} {c}", f"add rule {t} {c} ip saddr {eip} jump mark-for-masquerade",
                  f"add rule {t} {c} meta l4proto tcp dnat to {eip}:80"]  # fmt: skip
        if shape == "upstream":
            vm = " , ".join(f"{i} : goto {c}" for i, c in enumerate(chains))
            o.append(f"add rule {t} {svc} numgen random mod {neps} vmap {{ {vm} }}")
        elif shape == "named-maps":
            m = f"endpoints-{naming.service_base(spn)}"
            o.append(f"add map {t} {m} {{ typeof numgen random mod 1 : verdict ; }}")
            o.append(f"add element {t} {m} {{ {', '.join(f'{i} : goto {c}' for i, c in enumerate(chains))} }}")
            o.append(f"add rule {t} {svc} numgen random mod {neps} vmap @{m}")
        elif shape == "chained-jumps":
            for i, c in enumerate(chains[:-1]):
                o.append(f"add rule {t} {svc} numgen random mod {neps - i} 0 goto {c}")
            o.append(f"add rule {t} {svc} goto {chains[-1]}")
    for i in range(0, len(elems), 1000):
        o.append(f"add element {t} cluster-endpoints-{neps} {{ {', '.join(elems[i : i + 1000])} }}")
    return "\n".join(o) + "\n"


def shapes(sizes: list[int], timeout: float) -> None:
    # Ours first: deleting a namespace that held a huge table goes on in the kernel for a while
    # after `ip netns delete` returns, and slows whatever is measured next.
    names = ["ours", "chained-jumps", "named-maps", "upstream"]
    print(f"{'services':>8} " + " ".join(f"{n + ' s':>16}" for n in names))
    for size in sizes:
        cells = []
        for shape in names:
            text = shape_text(shape, size)
            with netns.netns("kpbs") as ns:
                load = functools.partial(ns.run, ["nft", "-f", "-"], input=text, timeout=timeout)
                cells.append(cell(functools.partial(timed, load), 1, timeout, 2))
        print(f"{size:>8} " + " ".join(f"{c:>16}" for c in cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=7, help="one-endpoint changes to take the median of")
    parser.add_argument("--timeout", type=float, default=120, help="give up on one measurement after this many seconds")
    parser.add_argument("--shapes", default="", help="sizes for the endpoint-selection designs table instead")
    args = parser.parse_args()
    if not netns.have_root():
        sys.exit("bench/nftables.py loads rules into network namespaces: run it as root")
    if args.shapes:
        shapes([int(s) for s in args.shapes.split(",")], args.timeout)
        return
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows.append(measure(size, args.endpoints, args.changes, args.timeout))
        print(f"measured {size} services", file=sys.stderr, flush=True)
    widths = {c: max(len(c), *(len(r.get(c, "-")) for r in rows)) for c in COLUMNS}
    print("  ".join(f"{c:>{widths[c]}}" for c in COLUMNS))
    for r in rows:
        print("  ".join(f"{r.get(c, '-'):>{widths[c]}}" for c in COLUMNS))


if __name__ == "__main__":
    main()
