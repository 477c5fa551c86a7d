#!/usr/bin/env python3
"""IPVS mode at scale, in operations rather than seconds, side by side with iptables and nftables.

Usage: .venv/bin/python bench/ipvs.py [--sizes 1000,10000] [--endpoints 10] [--nodeport-every 10]

The host's kernel has no IPVS and the VM that has one runs under TCG (~40x slower, see
tests/vm), so times would say little: this counts what each mode sends to the kernel, from the
renderers and appliers' pure diff functions, for the same cluster (bench/render.py's services,
every --nodeport-every-th one a NodePort; the node has 3 addresses NodePorts listen on, as the VM's
node: its IP, 127.0.0.1 and a pod gateway). No root, no namespace. Columns, per mode:

  cold ops     the first sync. ipvs: ipvsadm lines (virtual + real servers) + ipset restore lines
               (creates + entries) + iptables-restore rules + kube-ipvs0 addresses; iptables: rules
               in the restore input; nftables: rules + set/map elements + chains + sets
  change ops   one endpoint of one service replaced. ipvs: ipvsadm + ipset lines the diff sends
               (the old real server has no connections: deleted, not quiesced); iptables:
               restore lines of the partial sync (the shared chains and the one service's; a
               no-op resync sends the shared chains, as upstream's partial sync);
               nftables: operations of the incremental plan
  no-op ops    a resync with nothing changed (ipvs: the diffs against the kernel's state)
  rules        iptables rules (nat + filter): ipvs's ruleset does not grow with services
  ipvs         virtual / real servers; sets: ipset entries
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubeproxy.backends.iptables.render import render as render_iptables  # noqa: E402
from kubeproxy.backends.ipvs.apply import diff_ipsets, diff_ipvs  # noqa: E402
from kubeproxy.backends.ipvs.render import IpvsOptions, IpvsRendered  # noqa: E402
from kubeproxy.backends.ipvs.render import render as render_ipvs  # noqa: E402
from kubeproxy.backends.nftables.diff import plan  # noqa: E402
from kubeproxy.backends.nftables.render import render as render_nft  # noqa: E402
from kubeproxy.cluster.addresses import ip_text, valid_ip  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.model.node_model import NodeView, ServicePortName, build_view  # noqa: E402
from kubeproxy.model.options import Family, NodeOptions, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402

NODE_ADDRESSES = ("192.168.0.2", "127.0.0.1", "10.244.0.1")


def _bench_cluster() -> Callable[[int, int], list[dict]]:
    spec = importlib.util.spec_from_file_location("bench_render", ROOT / "bench" / "render.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.cluster  # type: ignore[no-any-return]


def cluster(services: int, endpoints: int, nodeport_every: int) -> list[dict]:
    objs = _bench_cluster()(services, endpoints)
    for i, obj in enumerate(o for o in objs if o["kind"] == "Service"):
        if nodeport_every and i % nodeport_every == 0:
            obj["spec"]["type"] = "NodePort"
            obj["spec"]["ports"][0]["nodePort"] = 30000 + i % 2768
    return objs


def change_one(view: NodeView) -> tuple[NodeView, ServicePortName]:
    """One service's first endpoint replaced by a new pod (bench/nftables.py's change)."""
    spn = sorted(view.services)[len(view.services) // 2]
    eps = list(view.endpoints[spn])
    eps[0] = dataclasses.replace(eps[0], ip=ip_text(valid_ip("10.250.0.1")))
    endpoints = dict(view.endpoints)
    endpoints[spn] = sorted(eps, key=lambda e: e.address)
    return NodeView(view.services, endpoints), spn


def _rule_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("-A ") or line.startswith("-I "))


def ipvs_ops(old: IpvsRendered | None, new: IpvsRendered, opts: NodeOptions) -> int:
    """What IpvsProxier.sync sends to go from `old` (None: an empty kernel) to `new`."""
    have_services = dict(old.services) if old else {}
    have_sets = {k: set(v) for k, v in old.sets.items()} if old else {}
    ipvs = diff_ipvs(new.services, have_services, {}).lines
    sets = diff_ipsets(new.sets, have_sets, opts.family)
    iptables = 0 if old and old.iptables == new.iptables else _rule_lines(new.iptables)
    addresses = len(new.bind_addresses ^ (old.bind_addresses if old else frozenset()))
    return len(ipvs) + len(sets) + iptables + addresses


def measure(size: int, n_eps: int, nodeport_every: int) -> list[dict[str, str]]:
    state = build_state(cluster(size, n_eps, nodeport_every))[0]
    cfg = ProxyConfig(cluster_cidr=("10.0.0.0/8",))
    opts = node_options(cfg, family=Family.IPV4, hostname="node-0", node=None, nfacct_counters=())
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, opts.node_name)
    changed, spn = change_one(view)
    rows = []

    ipvs_opts = IpvsOptions(node_addresses=NODE_ADDRESSES)
    first = render_ipvs(view, opts, ipvs_opts)
    second = render_ipvs(changed, opts, ipvs_opts)
    reals = sum(len(r) for r in first.services.values())
    rows.append({
        "mode": "ipvs", "cold ops": str(ipvs_ops(None, first, opts)), "change ops": str(ipvs_ops(first, second, opts)),
        "no-op ops": str(ipvs_ops(second, second, opts)), "rules": str(_rule_lines(first.iptables)),
        "ipvs": f"{len(first.services)} / {reals}", "sets": str(sum(len(v) for v in first.sets.values())),
    })

    full = render_iptables(view, opts)
    partial = render_iptables(changed, opts, changed_services={spn.service}, existing_nat_chains=full.nat_chains,
                              stale_cleanup_due=False)
    noop = render_iptables(changed, opts, changed_services=set(), existing_nat_chains=partial.nat_chains,
                           stale_cleanup_due=False)
    rows.append({
        "mode": "iptables", "cold ops": str(_rule_lines(full.text)), "change ops": str(len(partial.text.splitlines())),
        "no-op ops": str(len(noop.text.splitlines())), "rules": str(full.nat_rules + full.filter_rules), "ipvs": "-", "sets": "-",
    })

    nft = render_nft(view, opts)
    nft2 = render_nft(changed, opts, previous=nft, changed_services={spn.service})
    nft3 = render_nft(changed, opts, previous=nft2, changed_services=set())
    rows.append({
        "mode": "nftables", "cold ops": str(nft.rule_count() + nft.element_count() + len(nft.chains) + len(nft.sets)),
        "change ops": str(plan(nft, nft2).operations), "no-op ops": str(plan(nft2, nft3).operations),
        "rules": str(nft.rule_count()), "ipvs": "-", "sets": str(nft.element_count()),
    })
    for row in rows:
        row["services"] = str(size)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--nodeport-every", type=int, default=10)
    args = ap.parse_args()
    cols = ["services", "mode", "cold ops", "change ops", "no-op ops", "rules", "ipvs", "sets"]
    rows = [r for size in map(int, args.sizes.split(",")) for r in measure(size, args.endpoints, args.nodeport_every)]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    print(f"{args.endpoints} endpoints per service, every {args.nodeport_every}th a NodePort, "
          f"{len(NODE_ADDRESSES)} node addresses")
    print("  ".join(c.rjust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(r[c].rjust(widths[c]) for c in cols))


if __name__ == "__main__":
    main()
