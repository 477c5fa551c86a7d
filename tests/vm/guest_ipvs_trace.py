"""`kubeproxy trace --ipvs` asked against a real IPVS kernel (in the VM guest, as root).

tests/vm/guest_ipvs.py calls `trace_check` in its `node` namespace while the echo pods behind
10.96.20.20:90 both serve: it reads the node's dumps (iptables-save, ipset save, ipvsadm-save -n,
interfaces and routes, the same files `kubeproxy trace --rules --ipset-file --ipvs` takes, so a
failure replays offline), traces a NEW TCP packet the node sends to the virtual service (nat
OUTPUT KUBE-SERVICES, IPVS at LOCAL_OUT, filter OUTPUT, KUBE-POSTROUTING), then opens connections
and asks each echo pod its name. It passes when every real server the kernel used is one the
trace lists, the trace lists exactly the table's real servers of weight > 0, and with rr every
one of them was reached.
"""

from __future__ import annotations

import socket
import subprocess

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


def trace_check(vip_port: str, pods: dict[str, str], connections: int = 6) -> dict[str, object]:
    """The report; `pods` maps each echo pod's name (its answer) to its IP."""
    vip, _, port_s = vip_port.rpartition(":")
    node = Node.from_live()
    state = load_into(node, _out(["ipvsadm-save", "-n"]), _out(["ipset", "save"]))
    ruleset = detect.parse(_out(["iptables-save"]), "auto")
    # the source address the kernel picks toward the VIP (kube-ipvs0 holds it: often the VIP itself)
    words = _out(["ip", "-o", "-4", "route", "get", vip]).split()
    node_ip = words[words.index("src") + 1]
    result = trace(ruleset, node, make_packet("tcp", node_ip, vip_port, None, "NEW", 0, None, None), ipvs=state)
    traced = {o.dst for o in result.outcomes if o.verdict == "ACCEPT"}
    traced_ips = sorted(A.fmt_ip(ip) for ip in traced)
    vs = state.services.get((6, A.parse_ip(vip)[0], int(port_s))) if state is not None else None
    table = sorted(A.fmt_ip(rs.address) for rs in vs.reals if rs.weight > 0) if vs is not None else []
    reached = sorted({pods.get(_ask(vip, int(port_s)), "?") for _ in range(connections)})
    ok = set(reached) <= set(traced_ips) and set(traced_ips) == set(table)
    if vs is not None and vs.scheduler == "rr" and connections >= len(table):
        ok = ok and set(reached) == set(table)
    return {"traced": traced_ips, "ipvs_table": table, "reached": reached, "ok": ok}
