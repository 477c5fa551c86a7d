"""Benchmark the tracer on a kube-proxy-style dump of 10k services (about 300k rules).

    .venv/bin/python bench/trace.py [--services 10000] [--packets 200] [--seed 1]

Prints parse time and per-packet trace time (median, p99). Goals: parse < 2 s, trace < 20 ms.
The dump is generated in upstream's shape (KUBE-SERVICES -> KUBE-SVC-* with statistic ->
KUBE-SEP-* with DNAT), with 1 to 19 endpoints per service (10 on average).

    .venv/bin/python bench/trace.py --forking [--rules 16,20,40]

Chains of random rules that do not end the walk (`-m statistic --mode random` with a MARK, nft
`numgen random mod 2 == 0` with a mark or a counter), each traced by `kubeproxy trace` in its
own process: wall time and peak RSS. Goal: 40 such rules in <= 5 s and <= 300 MiB. "same" rules
all set one mark (the ways rejoin and merge); "distinct" ones each set their own bit (2^N states:
the branch budget ends the walk). nft text needs root (it is loaded into a throwaway netns).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubeproxy.netfilter import iptables_save
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import Simulator


def _chain(prefix: str, key: str) -> str:
    return prefix + base64.b32encode(hashlib.sha256(key.encode()).digest()).decode()[:16]


def generate(services: int, seed: int) -> tuple[str, list[tuple[str, int]]]:
    rnd = random.Random(seed)
    decl = [":KUBE-SERVICES - [0:0]", ":KUBE-MARK-MASQ - [0:0]", ":KUBE-POSTROUTING - [0:0]",
            ":KUBE-NODEPORTS - [0:0]"]
    svc_rules: list[str] = []
    body: list[str] = []
    vips: list[tuple[str, int]] = []
    for i in range(services):
        vip = f"172.30.{i // 250}.{i % 250 + 1}"
        port = 80 + (i % 3)
        proto = "tcp" if i % 4 else "udp"
        name = f"ns{i % 50}/svc-{i}:p{port}"
        svc = _chain("KUBE-SVC-", name + proto)
        decl.append(f":{svc} - [0:0]")
        vips.append((vip, port if proto == "tcp" else -port))
        svc_rules.append(f'-A KUBE-SERVICES -m comment --comment "{name} cluster IP" -m {proto} -p {proto} '
                         f"-d {vip}/32 --dport {port} -j {svc}")
        body.append(f'-A {svc} -m comment --comment "{name} cluster IP" -m {proto} -p {proto} -d {vip}/32 '
                    f"--dport {port} ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ")
        n = rnd.randint(1, 19)
        for k in range(n):
            ep = f"10.{(i >> 8) & 255}.{i & 255}.{k + 1}"
            sep = _chain("KUBE-SEP-", f"{name}{proto}{ep}")
            decl.append(f":{sep} - [0:0]")
            stat = "" if k == n - 1 else f" -m statistic --mode random --probability {1 / (n - k):.11f}"
            body.append(f'-A {svc} -m comment --comment "{name} -> {ep}:8080"{stat} -j {sep}')
            body.append(f'-A {sep} -m comment --comment {name} -s {ep}/32 -j KUBE-MARK-MASQ')
            body.append(f"-A {sep} -m comment --comment {name} -m {proto} -p {proto} "
                        f"-j DNAT --to-destination {ep}:8080")
    svc_rules.append('-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must '
                     'be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS')
    text = "\n".join([
        "*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
        ":POSTROUTING ACCEPT [0:0]", *decl,
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
        "-j MASQUERADE --random-fully",
        *svc_rules, *body, "COMMIT",
        "*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", "COMMIT", "",
    ])
    return text, vips


def forking_iptables(rules: int, distinct: bool) -> str:
    """A mangle PREROUTING of `rules` non-terminal random rules, each setting a mark bit."""
    lines = ["*mangle", ":PREROUTING ACCEPT [0:0]"]
    for k in range(rules):
        bit = 1 << (k % 32) if distinct else 1
        lines.append(f"-A PREROUTING -m statistic --mode random --probability 0.50000000000 "
                     f"-j MARK --set-xmark 0x{bit:x}/0x{bit:x}")
    return "\n".join([*lines, "COMMIT", ""])


def forking_nft_json(rules: int, distinct: bool) -> str:
    """The same as nft JSON: `numgen random mod 2 == 0` and a mark set (or, for "same", a counter)."""
    objs: list[dict[str, object]] = [
        {"metainfo": {"json_schema_version": 1}},
        {"table": {"family": "ip", "name": "t"}},
        {"chain": {"family": "ip", "table": "t", "name": "pre", "type": "filter", "hook": "prerouting", "prio": 0,
                   "policy": "accept"}},
    ]
    for k in range(rules):
        action: dict[str, object] = (
            {"mangle": {"key": {"meta": {"key": "mark"}}, "value": {"|": [{"meta": {"key": "mark"}}, 1 << (k % 32)]}}}
            if distinct else {"counter": {"packets": 0, "bytes": 0}}
        )
        match = {"match": {"op": "==", "left": {"numgen": {"mode": "random", "mod": 2, "offset": 0}}, "right": 0}}
        objs.append({"rule": {"family": "ip", "table": "t", "chain": "pre", "expr": [match, action]}})
    return json.dumps({"nftables": objs})


def forking_nft_text(rules: int, distinct: bool) -> str:
    body = [f"numgen random mod 2 == 0 meta mark set meta mark | 0x{1 << (k % 32):x}" if distinct
            else "numgen random mod 2 == 0 counter" for k in range(rules)]
    return ("table ip t {\n chain pre {\n  type filter hook prerouting priority 0; policy accept;\n  "
            + "\n  ".join(body) + "\n }\n}\n")


def _traced(dump: str, fmt: str) -> tuple[float, float, int, str]:
    """`kubeproxy trace` of one packet through `dump`: (wall s, peak RSS MiB, exit status, last outcome line)."""
    with tempfile.NamedTemporaryFile("w", suffix=".dump", delete=False) as f:
        f.write(dump)
    cli = str(Path(sys.executable).parent / "kubeproxy")
    argv = [cli, "trace", "--rules", f.name, "--format", fmt, "--proto", "tcp", "--src", "192.168.0.7:40000",
            "--dst", "192.168.0.10:80", "--in-iface", "eth0", "--iface", "eth0=192.168.0.10/24"]
    try:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS, not the largest so far
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
    finally:
        os.unlink(f.name)
    lines = out.splitlines()
    outcomes = sum(1 for line in lines if line.startswith("Outcome "))
    budget = next((line.strip() for line in lines if line.startswith("note: the branch budget")), "")
    summary = f"{outcomes} outcomes" + (f"; {budget.removeprefix('note: ')[:70]}" if budget else "")
    return wall, usage.ru_maxrss / 1024, proc.returncode, summary


def forking(sizes: list[int]) -> None:
    makers = [("iptables-save", "iptables-save", forking_iptables), ("nft-json", "nft-json", forking_nft_json)]
    if os.geteuid() == 0:
        makers.append(("nft text", "nft", forking_nft_text))
    print(f"{'format':<15}{'rules':>6}  {'marks':<9}{'wall s':>8}{'peak MiB':>10}  result")
    for label, fmt, make in makers:
        for distinct in (False, True):
            for n in sizes:
                wall, rss, status, summary = _traced(make(n, distinct), fmt)
                marks = "distinct" if distinct else "same"
                print(f"{label:<15}{n:>6}  {marks:<9}{wall:>8.2f}{rss:>10.0f}  exit {status}: {summary[:90]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--packets", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--forking", action="store_true", help="trace chains of non-terminal random rules instead")
    ap.add_argument("--rules", default="16,20,40", help="with --forking: the chain lengths")
    args = ap.parse_args()
    if args.forking:
        forking([int(n) for n in args.rules.split(",")])
        return
    text, vips = generate(args.services, args.seed)
    t0 = time.perf_counter()
    rs = iptables_save.parse(text, lazy=True)
    parse_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    iptables_save.parse(text, lazy=False)
    full_s = time.perf_counter() - t0
    rules = rs.rule_count()
    node = Node.from_flags(ifaces=["eth0=192.168.0.10/24", "cni0=10.0.0.1/8"], routes=["default=eth0@192.168.0.1"])
    sim = Simulator(rs, node)
    rnd = random.Random(args.seed)
    times = []
    outcomes = 0
    for _ in range(args.packets):
        vip, port = rnd.choice(vips)
        proto = "tcp" if port > 0 else "udp"
        pkt = make_packet(proto, "192.168.0.77:40000", f"{vip}:{abs(port)}", in_iface="eth0")
        t1 = time.perf_counter()
        res = sim.trace(pkt)
        times.append(time.perf_counter() - t1)
        outcomes += len(res.outcomes)
        assert abs(sum(o.probability for o in res.outcomes) - 1) == 0
    times.sort()
    med = statistics.median(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"{'dump':<28}{args.services} services, {rules} rules, {len(text) / 1e6:.1f} MB")
    print(f"{'parse (rule bodies lazy)':<28}{parse_s:.2f} s   (goal < 2 s)")
    print(f"{'parse (every rule body)':<28}{full_s:.2f} s")
    print(f"{'trace median':<28}{med * 1e3:.2f} ms  (goal < 20 ms)")
    print(f"{'trace p99':<28}{p99 * 1e3:.2f} ms")
    print(f"{'trace first (cold)':<28}{max(times) * 1e3:.2f} ms (max)")
    print(f"{'outcomes per packet':<28}{outcomes / args.packets:.1f}")


if __name__ == "__main__":
    main()
