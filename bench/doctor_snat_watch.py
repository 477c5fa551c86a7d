#!/usr/bin/env python3
"""The SNAT gauge's cost: one sample (list UDP conntrack entries, parse, count per endpoint) at N entries.

Usage: .venv/bin/python bench/doctor_snat_watch.py [--entries 100000] [--rounds 5]   (as root)

A throwaway namespace gets an uplink (one end of a veth pair inside it, 10.9.0.1/16, static
neighbours) and the rules of a masqueraded service: OUTPUT DNATs 10.96.0.53:53 to 4 "endpoints"
10.9.0.11-14:53 (statistic), POSTROUTING SNATs to the node's address. N UDP datagrams, one socket
each, from 4 local addresses (explicit ports, 60,000 per address) make N conntrack entries shaped
like the gauge's: reply tuple endpoint -> node address. The UDP timeout in the namespace is
raised to 600 s so that none expires during the run. Then, per round:

    list s    `conntrack -L -p udp` in the namespace (the kernel dump and the tool's printing)
    parse s   kubeproxy.backends.conntrack.flows.parse_flows of that text
    count s   kubeproxy.doctor.snat_gauge.sample (the per-endpoint count)
    fast s    kubeproxy.doctor.snat_gauge.sample_text: the same counts from the text, no Flow objects
    count-C s `conntrack -C` (the table's size only), for comparison
    netlink s kubeproxy.backends.conntrack.ctnetlink.dump of the whole table + snat_watch.sample_dump (what
              `kubeproxy run --snat-watch` does below --snat-watch-max-entries), in the namespace
    nl-20k s  the same dump cut at 20,000 entries and scaled (its cost is flat above that size);
              `err` is its worst endpoint's error against the exact count

Medians over --rounds. Nothing leaves the namespace; it is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubeproxy.backends.conntrack.flows import parse_flows
from kubeproxy.doctor import snat_gauge
from kubeproxy.lab import netns as L
from kubeproxy.model.node_model import ServicePortName

ENDPOINTS = [f"10.9.0.{11 + i}" for i in range(4)]
# Each flow its own (address, port): explicit ports, since ephemeral picks repeat (birthday).
SOURCES = [f"10.10.0.{i + 1}" for i in range(4)]
SENDER = """
import socket, sys
n, sources = int(sys.argv[1]), sys.argv[2:]
for i in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sources[i // 60000], 1024 + i % 60000))
    s.sendto(b"q", ("10.96.0.53", 53))
    s.close()
"""


def build(ns: L.NetNS, entries: int) -> None:
    # a veth pair inside the namespace stands in for an uplink (the machine has no dummy module)
    ns.run(["ip", "link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1"])
    ns.run(["ip", "addr", "add", "10.9.0.1/16", "dev", "dummy0"])
    ns.run(["ip", "link", "set", "dummy0", "up"])
    ns.run(["ip", "link", "set", "dummy1", "up"])
    ns.run(["ip", "route", "add", "10.96.0.0/16", "dev", "dummy0"])
    for ip in SOURCES:
        ns.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"])
    for i, ip in enumerate(ENDPOINTS):
        ns.run(["ip", "neigh", "add", ip, "lladdr", f"02:00:00:00:00:{i + 16:02x}", "dev", "dummy0"])
    rules = ["*nat", ":OUTPUT ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]"]
    for i, ip in enumerate(ENDPOINTS):
        left = len(ENDPOINTS) - i
        stat = f"-m statistic --mode random --probability {1 / left:.10f} " if left > 1 else ""
        rules.append(f"-A OUTPUT -d 10.96.0.53/32 -p udp --dport 53 {stat}-j DNAT --to-destination {ip}:53")
    # SNAT to the node's address, as kube-proxy's MASQUERADE does to outside clients' queries
    rules += ["-A POSTROUTING -d 10.9.0.0/16 -j SNAT --to-source 10.9.0.1", "COMMIT", ""]
    ns.run(["iptables-restore"], input="\n".join(rules))
    ns.run(["sysctl", "-qw", "net.netfilter.nf_conntrack_udp_timeout=600"])
    ns.run([sys.executable, "-c", SENDER, str(entries), *SOURCES], timeout=600)


NETLINK = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from kubeproxy.backends.conntrack import ctnetlink
from kubeproxy.proxy import snat_watch
from kubeproxy.model.node_model import ServicePortName
targets = {f"10.9.0.{11 + i}:53": [ServicePortName("bench", "dns", "dns", "UDP")] for i in range(4)}
out = {}
for label, limit in (("full", 10**9), ("cut", 20000)):
    t = time.perf_counter()
    d = ctnetlink.dump({"10.9.0.1"}, ("udp",), max_entries=limit, total=snat_watch.read_ct_count())
    g = snat_watch.sample_dump(d, targets, {"10.9.0.1"})
    out[label] = [time.perf_counter() - t, {x.endpoint: x.in_use for x in g}, d.entries]
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    targets = {f"{ip}:53": [ServicePortName("bench", "dns", "dns", "UDP")] for ip in ENDPOINTS}
    with L.netns("kpw") as ns:
        t0 = time.perf_counter()
        build(ns, args.entries)
        made = time.perf_counter() - t0
        rows: dict[str, list[float]] = {"list": [], "parse": [], "count": [], "fast": [], "count-C": [],
                                        "netlink": [], "nl-20k": [], "err": []}
        total = 0
        for _ in range(args.rounds):
            t = time.perf_counter()
            text = ns.run(["conntrack", "-L", "-p", "udp"], timeout=300).stdout
            rows["list"].append(time.perf_counter() - t)
            t = time.perf_counter()
            flows = parse_flows(text)
            rows["parse"].append(time.perf_counter() - t)
            t = time.perf_counter()
            gauges = snat_gauge.sample(flows, targets, {"10.9.0.1"})
            rows["count"].append(time.perf_counter() - t)
            t = time.perf_counter()
            fast = snat_gauge.sample_text(text, targets, {"10.9.0.1"})
            rows["fast"].append(time.perf_counter() - t)
            assert fast == gauges
            t = time.perf_counter()
            ns.run(["conntrack", "-C"])
            rows["count-C"].append(time.perf_counter() - t)
            total = sum(g.in_use for g in gauges)


            nl = json.loads(ns.run([sys.executable, "-c", NETLINK, str(Path(__file__).resolve().parents[1])],
                                   timeout=300).stdout)
            exact = {g.endpoint: g.in_use for g in gauges}
            assert nl["full"][1] == exact, (nl["full"][1], exact)
            rows["netlink"].append(nl["full"][0])
            rows["nl-20k"].append(nl["cut"][0])
            rows["err"].append(max(abs(nl["cut"][1][a] - c) / max(c, 1) for a, c in exact.items()))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"conntrack entries made: {len(flows):,} in {made:.1f} s; masqueraded per endpoint counted: {total:,}")
    print(f"{'entries':>8} {'list s':>8} {'parse s':>8} {'count s':>8} {'sample s':>9} {'fast s':>8} "
          f"{'fast sample s':>14} {'count-C s':>10} {'netlink s':>10} {'nl-20k s':>9} {'err':>6}")
    sample_s = med["list"] + med["parse"] + med["count"]
    print(f"{len(flows):>8,} {med['list']:>8.3f} {med['parse']:>8.3f} {med['count']:>8.3f} {sample_s:>9.3f} "
          f"{med['fast']:>8.3f} {med['list'] + med['fast']:>14.3f} {med['count-C']:>10.3f} {med['netlink']:>10.3f} "
          f"{med['nl-20k']:>9.3f} {med['err']:>6.1%}")
    for g in gauges:
        print(f"  {g.endpoint}: {g.in_use:,} ({g.utilisation:.1%})")


if __name__ == "__main__":
    main()
