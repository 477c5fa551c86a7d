"""The packet tracer's walk through IPVS: which hooks a packet to a virtual service meets, and
which real server the scheduler gives it (the dumps it walks are read by netfilter/ipvs.py,
whose docstring tells the kernel's path)."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from kubeproxy.netfilter.ipvs import IpvsState, RealServerState, VirtualService
from kubeproxy.netfilter.simulate.branch import Branch, Hop

if TYPE_CHECKING:
    from kubeproxy.netfilter.simulate.engine import Simulator

# The IPVS netfilter hooks' priorities (net/netfilter/ipvs/ip_vs_core.c).
LOCAL_IN_PRIORITY = 99  # ip_vs_remote_request4: NF_IP_PRI_NAT_SRC - 1
LOCAL_OUT_PRIORITY = -98  # ip_vs_local_request4: NF_IP_PRI_NAT_DST + 2

_EXACT = {"rr": "in turn", "wrr": "by weight"}
_HASHED = {"sh": "source address", "dh": "destination address", "mh": "source address (maglev)"}


def stage(sim: Simulator, b: Branch, ipvs: IpvsState) -> list[Branch]:
    """The walk's IPVS stages (called by the engine for `input`/`output` to a virtual service and
    for its own `ipvs_*` stages)."""
    st = b.stage
    if st == "input":
        b.local = True
        return sim._hook("input", b, "ipvs_in", hi=LOCAL_IN_PRIORITY)
    if st == "output":
        return sim._hook("output", b, "ipvs_out", hi=LOCAL_OUT_PRIORITY)
    if st in ("ipvs_in", "ipvs_out"):
        vs = ipvs.service_for(b)
        if vs is None:  # a chain before IPVS changed the destination: not IPVS's packet any more
            b.stage = "ipvs_local_in" if st == "ipvs_in" else "ipvs_local_out"
            return [b]
        return _schedule(sim, b, vs, "input" if st == "ipvs_in" else "output")
    if st == "ipvs_sent":  # ip_vs_nat_send_or_cont: NF_HOOK(LOCAL_OUT), then POSTROUTING
        return sim._hook("output", b, "postrouting")
    if st == "ipvs_local_in":  # a local real server: the rest of LOCAL_IN, then the socket
        return sim._hook("input", b, "delivered", lo=LOCAL_IN_PRIORITY)
    if st == "ipvs_local_out":
        return sim._hook("output", b, "postrouting", lo=LOCAL_OUT_PRIORITY)
    raise AssertionError(st)


def _shares(vs: VirtualService) -> tuple[list[tuple[RealServerState, Fraction]], str]:
    """The candidates for a new connection and their shares, with what the shares mean."""
    live = [rs for rs in vs.reals if rs.weight > 0]
    if not live:
        return [], ""
    if vs.scheduler == "wrr":
        total = sum(rs.weight for rs in live)
        return [(rs, Fraction(rs.weight, total)) for rs in live], "wrr: connections go to real servers by weight"
    if vs.scheduler == "fo":
        top = max(live, key=lambda rs: rs.weight)
        return [(top, Fraction(1))], "fo: the available real server with the highest weight takes every connection"
    share = Fraction(1, len(live))
    if vs.scheduler == "rr":
        return [(rs, share) for rs in live], "rr: connections go to the real servers in turn"
    if vs.scheduler in _HASHED:
        why = (f"{vs.scheduler}: the real server is fixed by a hash of the {_HASHED[vs.scheduler]}; "
               "which one is not in the dump, so each is an outcome")
    else:
        why = (f"{vs.scheduler}: the real server depends on live connection counts; each is an outcome "
               "with an equal share")
    return [(rs, share) for rs in live], why


def _schedule(sim: Simulator, b: Branch, vs: VirtualService, hook: str) -> list[Branch]:
    cands, why = _shares(vs)
    listed = ", ".join(rs.text() + ("" if rs.weight else " (weight 0)") for rs in vs.reals) or "none"
    text = f"IPVS virtual service {vs.label()} -> real servers {listed} ({vs.scheduler})"
    quiesced = [rs.text() for rs in vs.reals if rs.weight == 0]
    if not cands:
        b.path.append(Hop("ipvs", vs.label(), "-", "REJECT", text, 0, hook))
        b.notes.append("IPVS: no real server with weight > 0: the kernel answers ICMP port unreachable (ip_vs_leave)")
        b.stage, b.verdict, b.reject_with, b.local = "done", "REJECT", "icmp-port-unreachable", False
        return [b]
    out: list[Branch] = []
    for rs, share in cands:
        nb = b.copy() if len(cands) > 1 else b
        nb.prob = b.prob * share
        index = vs.reals.index(rs) + 1
        nb.path.append(Hop("ipvs", vs.label(), index, f"{rs.text()} ({rs.forward})", text, 0, hook))
        if len(cands) > 1:
            nb.note(why)
        if vs.persistent:
            nb.note(f"IPVS persistence {vs.persistent}s: a client's later connections go to the real server its "
                    "first one got")
        for q in quiesced:
            nb.note(f"IPVS: real server {q} has weight 0 (terminating): only its existing connections reach it")
        if b.ct_state != "NEW":
            nb.note("IPVS: a packet of an existing connection goes to the real server the connection got")
        if rs.forward != "Masq":
            # direct routing / tunnelling: the destination address stays the virtual one
            nb.note(f"IPVS forwarding {rs.forward}: the packet keeps its destination and is sent toward {rs.text()}")
            target = rs.address
        else:
            nb.dst, nb.dport = rs.address, rs.port
            nb.dnat = (rs.address, rs.port)
            target = rs.address
        nb.dnat_done = True  # IPVS updated the connection (ip_vs_update_conntrack): nat OUTPUT is skipped
        if sim.node.is_local(target, rs.v6):
            nb.stage = "ipvs_local_in" if hook == "input" else "ipvs_local_out"
            if hook == "output":
                r = sim.node.route(target, rs.v6)
                nb.out_iface, nb.via = r if r is not None else ("lo", None)
            out.append(nb)
            continue
        r = sim.node.route(target, rs.v6)
        if r is None:
            nb.notes.append(f"no route to real server {rs.text()}")
            nb.stage, nb.verdict, nb.local = "done", "DROP", False
            out.append(nb)
            continue
        nb.local = False
        nb.out_iface, nb.via = r
        nb.stage = "ipvs_sent"
        out.append(nb)
    return out
