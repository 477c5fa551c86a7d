"""dnsperf as an outside yardstick: the DNS lab's ceiling straight to the pod and through the proxy.

    .venv/bin/python bench/dns_lab.py [--scenarios snat,dnat,local] [--seconds 10] [--clients 20]
        [--load-rate 20000] [--load-seconds 5] [--udp-timeout 1]

For each scenario the lab's world is built (kubeproxy.lab.dns.world: BIND 9 in a pod, `kubeproxy
run` on the node, the seed's DNS Service) and, from the client namespace, each target gets
(conntrack flushed before each run):

    dnsperf        `dnsperf -c CLIENTS -q 200 -l SECONDS`: closed loop, as fast as answers come; its
                   CLIENTS sockets keep their source ports, so it needs CLIENTS conntrack entries
    dns load       `kubeproxy dns load --rate LOAD_RATE`: open loop, a fresh source port per query,
                   as real resolvers; answered/s and lost are what it saw; `pod rcvbuf drops` are
                   the queries the pod's kernel dropped meanwhile because BIND's socket buffer was
                   full (when the sender falls behind it sends what is due in bursts)

Targets: `pod` is BIND's own address, routed by the node (conntrack, no NAT); `proxy` is the
Service's external IP through the node's rules for the scenario (masqueraded for snat).

The node's UDP conntrack timeout is set to --udp-timeout (1 s by default) so that a fresh-port
load measures the machine's ceiling, not the SNAT port limit (64,512 ports ÷ the timeout), which
is what `kubeproxy lab dns` measures. dnsperf is untouched by that limit either way: it reuses
its sockets. Both tools share the machine's cores with BIND and the kernel, so the numbers are
what this machine can do, not what BIND can.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from kubeproxy.lab.dns.bind import ANSWER_NAME
from kubeproxy.lab.dns.scenarios import SCENARIOS
from kubeproxy.lab.dns.world import EXTERNAL_IP, DnsWorld

_DNSPERF_FIELDS = {
    "sent": r"Queries sent:\s+(\d+)",
    "completed": r"Queries completed:\s+(\d+)",
    "lost": r"Queries lost:\s+(\d+)",
    "qps": r"Queries per second:\s+([\d.]+)",
    "latency": r"Average Latency \(s\):\s+([\d.]+)",
}


def dnsperf(world: DnsWorld, target: str, seconds: float, clients: int, queries: Path) -> dict[str, float]:
    argv = ["dnsperf", "-s", target, "-d", str(queries), "-l", f"{seconds:g}", "-c", str(clients), "-q", "200"]
    proc = world.client.run(argv, check=False, timeout=seconds + 60)
    found: dict[str, float] = {}
    for key, pattern in _DNSPERF_FIELDS.items():
        m = re.search(pattern, proc.stdout)
        if m is None:
            raise SystemExit(f"dnsperf {target}: no {key!r} in its output (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        found[key] = float(m.group(1))
    return found


def rcvbuf_errors(world: DnsWorld) -> int:
    """UDP datagrams the pod's kernel dropped because BIND's socket buffer was full (/proc/net/snmp)."""
    snmp = world.servers[0].ns.run(["cat", "/proc/net/snmp"]).stdout
    lines = [line.split() for line in snmp.splitlines() if line.startswith("Udp:")]
    header, values = lines[0], lines[1]
    return int(values[header.index("RcvbufErrors")])


def dns_load(world: DnsWorld, target: str, rate: float, seconds: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "kubeproxy.lab.dns", "load", "--server", target, "--name", ANSWER_NAME,
            "--rate", f"{rate:g}", "--duration", f"{seconds:g}s", "--json", "-"]  # fmt: skip
    proc = world.client.run(argv, check=False, timeout=seconds + 120)
    if proc.returncode != 0:
        raise SystemExit(f"dns load {target}: exit {proc.returncode}: {proc.stderr.strip()}")
    totals: dict[str, Any] = json.loads(proc.stdout)["totals"]
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="snat,dnat,local")
    parser.add_argument("--seconds", type=float, default=10.0, help="dnsperf run length per target")
    parser.add_argument("--clients", type=int, default=20, help="dnsperf -c")
    parser.add_argument("--load-rate", type=float, default=20000.0)
    parser.add_argument("--load-seconds", type=float, default=5.0)
    parser.add_argument("--udp-timeout", type=int, default=1)
    args = parser.parse_args()
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")

    rows = []
    with tempfile.TemporaryDirectory(prefix="kp-dnsperf-") as tmp:
        queries = Path(tmp) / "queries.txt"
        queries.write_text(f"{ANSWER_NAME} A\n")
        for name in names:
            with DnsWorld.build(SCENARIOS[name], udp_timeout=args.udp_timeout) as world:
                for label, target in (("pod", world.pod_ips[0]), ("proxy", EXTERNAL_IP)):
                    world.flush_conntrack()
                    perf = dnsperf(world, target, args.seconds, args.clients, queries)
                    world.flush_conntrack()
                    before = rcvbuf_errors(world)
                    load = dns_load(world, target, args.load_rate, args.load_seconds)
                    load["rcvbuf_errors"] = rcvbuf_errors(world) - before
                    rows.append((name, label, target, perf, load))
                    print(f"# {name} {label}: dnsperf {perf['qps']:.0f}/s, dns load {load['answered_rate']:g}/s", file=sys.stderr)

    print(f"dnsperf -c {args.clients} -q 200 for {args.seconds:g} s; kubeproxy dns load at {args.load_rate:g}/s for "
          f"{args.load_seconds:g} s (fresh port per query); node UDP conntrack timeout {args.udp_timeout} s")  # fmt: skip
    header = (f"{'scenario':<9} {'target':<6} {'address':<14} {'dnsperf q/s':>11} {'lost':>6} {'avg ms':>7}"
              f" {'load sent/s':>11} {'answered/s':>10} {'lost':>7} {'p99 ms':>7} {'pod rcvbuf drops':>16}")  # fmt: skip
    print(header)
    for name, label, target, perf, load in rows:
        p99 = (load.get("latency_ms") or {}).get("p99", "-")
        print(
            f"{name:<9} {label:<6} {target:<14} {perf['qps']:>11.0f} {perf['lost']:>6.0f} {perf['latency'] * 1e3:>7.2f}"
            f" {load['achieved_rate']:>11.0f} {load['answered_rate']:>10.0f} {load['lost']:>7} {p99:>7}"
            f" {load['rcvbuf_errors']:>16}"
        )


if __name__ == "__main__":
    main()
