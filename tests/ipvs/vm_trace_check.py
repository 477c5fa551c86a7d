"""Checks `kubeproxy trace --ipvs` against a real IPVS kernel (the VM guest, as root).

Run it where kube-proxy's IPVS state is live, e.g. in the guest right after tests/vm/guest_ipvs.py
has synced (its `node` namespace, echo pods answering their name), as
`ip netns exec node python -m tests.ipvs.vm_trace_check --vip 10.96.20.20:90 --pod pod=10.244.1.10
--pod pod2=10.244.2.10`. It reads the node's dumps (iptables-save, ipset save, ipvsadm-save -n,
interfaces and routes), traces a NEW TCP packet sent by the node to the virtual service, then
opens connections to it and asks each echo pod its name. It passes when every real server the
kernel used is one the trace lists, the trace lists no real server that is not in the table, and
with the rr scheduler every listed real server was reached. Prints a JSON report; exit status 1
on a mismatch. See vm_trace_check.md.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter import detect
from kubeproxy.netfilter.ipvs import load_into
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import trace


def _out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _ask(vip: str, port: int) -> str:
    with socket.create_connection((vip, port), timeout=10) as conn:
        conn.sendall(b"who\n")
        return conn.recv(100).decode().strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vip", required=True, help="ADDRESS:PORT of a TCP virtual service")
    ap.add_argument("--pod", action="append", default=[], help="NAME=IP of an echo pod (repeatable)")
    ap.add_argument("--connections", type=int, default=6)
    args = ap.parse_args()
    vip, _, port_s = args.vip.rpartition(":")
    pods = dict(p.split("=", 1) for p in args.pod)
    node = Node.from_live()
    state = load_into(node, _out(["ipvsadm-save", "-n"]), _out(["ipset", "save"]))
    ruleset = detect.parse(_out(["iptables-save"]), "auto")
    # the source address the kernel picks toward the VIP (kube-ipvs0 holds it: often the VIP itself)
    words = _out(["ip", "-o", "-4", "route", "get", vip]).split()
    node_ip = words[words.index("src") + 1]
    result = trace(ruleset, node, make_packet("tcp", node_ip, args.vip, None, "NEW", 0, None, None), ipvs=state)
    traced = {o.dst for o in result.outcomes if o.verdict == "ACCEPT"}
    traced_ips = sorted(A.fmt_ip(ip) for ip in traced)
    vs = state.services.get((6, A.parse_ip(vip)[0], int(port_s))) if state is not None else None
    table = sorted(A.fmt_ip(rs.address) for rs in vs.reals if rs.weight > 0) if vs is not None else []
    reached = sorted({pods.get(_ask(vip, int(port_s)), "?") for _ in range(args.connections)})
    ok = set(reached) <= set(traced_ips) and set(traced_ips) == set(table)
    if vs is not None and vs.scheduler == "rr" and args.connections >= len(table):
        ok = ok and set(reached) == set(table)
    print(json.dumps({"traced": traced_ips, "ipvs_table": table, "reached": reached, "ok": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
