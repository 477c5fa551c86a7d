"""IPVS state for the packet tracer: what `ipvsadm-save -n` (or `ipvsadm -Ln`) and `ipset save` say.

On an IPVS node the service translation is not in the ruleset: iptables only matches ipsets
(`-m set --match-set KUBE-CLUSTER-IP dst,dst`), and the kernel's IPVS hooks pick a real server.
`load_into` reads the two dumps into the node model (set members and types, kube-ipvs0's
addresses as local) and returns the virtual services; `stage` is the walk's part for IPVS:

- a packet from outside reaches LOCAL_IN; the iptables chains below IPVS's hook priority run
  (filter INPUT: KUBE-IPVS-FILTER, KUBE-PROXY-FIREWALL, ...), then ip_vs_remote_request4
  (NF_IP_PRI_NAT_SRC - 1 = 99) DNATs it to a real server and sends it with NF_HOOK(LOCAL_OUT)
  then POSTROUTING (ip_vs_nat_send_or_cont), where KUBE-POSTROUTING masquerades marked packets;
- a packet sent by the node meets ip_vs_local_request4 in LOCAL_OUT (NF_IP_PRI_NAT_DST + 2 =
  -98), after nat OUTPUT (KUBE-SERVICES) and before filter OUTPUT, and is sent the same way;
- a real server that is a local address is delivered locally: the walk continues with the
  chains after IPVS's hook (ip_vs_nat_xmit returns NF_ACCEPT for a local destination);
- no real server with weight > 0: the kernel answers ICMP port unreachable (ip_vs_leave).

Which real server a new connection gets depends on the scheduler: `rr` and `wrr` are exact over
a run of connections (equal, or by weight); the hashing schedulers (`sh`, `dh`, `mh`) fix the
choice per address, and the connection-count ones (`lc`, `wlc`, `sed`, `nq`, ...) depend on live
counts: for those every candidate is an outcome, with equal shares and a note saying so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.simulate.branch import Branch, Hop

if TYPE_CHECKING:
    from kubeproxy.netfilter.simulate.engine import Simulator

# The IPVS netfilter hooks' priorities (net/netfilter/ipvs/ip_vs_core.c).
LOCAL_IN_PRIORITY = 99  # ip_vs_remote_request4: NF_IP_PRI_NAT_SRC - 1
LOCAL_OUT_PRIORITY = -98  # ip_vs_local_request4: NF_IP_PRI_NAT_DST + 2

PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132}
_SAVE_PROTO = {"-t": "TCP", "--tcp-service": "TCP", "-u": "UDP", "--udp-service": "UDP", "--sctp-service": "SCTP"}
_FORWARD = {"-m": "Masq", "--masquerading": "Masq", "-g": "Route", "--gatewaying": "Route", "-i": "Tunnel",
            "--ipip": "Tunnel"}
# ipvsadm options that take a value (ipvsadm-save prints them after the service or real server).
_VALUE_OPTS = {"-s", "--scheduler", "-p", "--persistent", "-M", "--netmask", "-b", "--sched-flags", "--pe", "-w",
               "--weight", "-x", "--u-threshold", "-y", "--l-threshold", "-r", "--real-server", "--tun-type",
               "--tun-port", "--tun-nocsum", "--tun-csum", "--tun-remcsum"}
_EXACT = {"rr": "in turn", "wrr": "by weight"}
_HASHED = {"sh": "source address", "dh": "destination address", "mh": "source address (maglev)"}


class IpvsParseError(ValueError):
    """A line of an `ipvsadm` or `ipset save` dump could not be read (says which)."""


@dataclass(frozen=True, slots=True)
class RealServerState:
    address: int
    port: int
    v6: bool
    weight: int = 1
    forward: str = "Masq"  # Masq, Route, Tunnel: as `ipvsadm -Ln` prints it
    active: int = 0
    inactive: int = 0

    def text(self) -> str:
        return _hostport(self.address, self.port, self.v6)


@dataclass(frozen=True, slots=True)
class VirtualService:
    protocol: str  # TCP, UDP, SCTP
    address: int
    port: int
    v6: bool
    scheduler: str = "wlc"
    persistent: int = 0  # seconds; 0: none
    reals: tuple[RealServerState, ...] = ()

    def label(self) -> str:
        return f"{_hostport(self.address, self.port, self.v6)}/{self.protocol}"


@dataclass
class IpvsState:
    """The virtual services of one node, by (protocol number, address, port)."""

    services: dict[tuple[int, int, int], VirtualService] = field(default_factory=dict)

    def service_for(self, b: Branch) -> VirtualService | None:
        return self.services.get((b.proto, b.dst, b.dport))

    def add(self, vs: VirtualService) -> None:
        self.services[(PROTOCOLS[vs.protocol], vs.address, vs.port)] = vs


def _hostport(ip: int, port: int, v6: bool) -> str:
    host = A.fmt_ip(ip, v6)
    return f"[{host}]:{port}" if v6 else f"{host}:{port}"


def _split_hostport(text: str, where: str) -> tuple[int, int, bool]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise IpvsParseError(f"{where}: {text!r} is not ADDRESS:PORT")
    try:
        ip, v6 = A.parse_ip(host.strip("[]"))
    except ValueError as e:
        raise IpvsParseError(f"{where}: {text!r}: {e}") from None
    return ip, int(port), v6


def _options(words: list[str], where: str) -> tuple[dict[str, str], set[str]]:
    values: dict[str, str] = {}
    flags: set[str] = set()
    k = 0
    while k < len(words):
        w = words[k]
        if w in _VALUE_OPTS:
            if k + 1 >= len(words):
                raise IpvsParseError(f"{where}: {w} needs a value")
            values[w], k = words[k + 1], k + 2
        else:
            flags.add(w)
            k += 1
    return values, flags


def _int(text: str, where: str, what: str) -> int:
    if not text.isdigit():
        raise IpvsParseError(f"{where}: {what} {text!r} is not a number")
    return int(text)


def parse_ipvs(text: str) -> IpvsState:
    """`ipvsadm-save -n` or `ipvsadm -Ln` output (told apart by their lines) into virtual services."""
    lines = text.splitlines()
    if any(ln.split()[:1] in (["-A"], ["-a"]) for ln in lines):
        return _parse_save(lines)
    return _parse_list(lines)


def _parse_save(lines: list[str]) -> IpvsState:
    services: dict[tuple[str, int, int], VirtualService] = {}
    order: list[tuple[str, int, int]] = []
    for n, raw in enumerate(lines, 1):
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"--ipvs line {n}"
        if words[0] not in ("-A", "-a") or len(words) < 3:
            raise IpvsParseError(f"{where}: expected `-A|-a -t|-u|--sctp-service ADDRESS:PORT ...`, got {raw.strip()!r}")
        if words[1] in ("-f", "--fwmark-service"):
            continue  # firewall-mark services: kube-proxy makes none, and a packet's mark picks them
        proto = _SAVE_PROTO.get(words[1])
        if proto is None:
            raise IpvsParseError(f"{where}: unknown service option {words[1]!r}")
        ip, port, v6 = _split_hostport(words[2], where)
        values, flags = _options(words[3:], where)
        key = (proto, ip, port)
        if words[0] == "-A":
            persistent = 0
            if "-p" in values or "--persistent" in values:
                persistent = _int(values.get("-p", values.get("--persistent", "")), where, "persistence")
            elif "-p" in flags or "--persistent" in flags:
                persistent = 300  # ipvsadm's default persistence timeout
            services[key] = VirtualService(proto, ip, port, v6, values.get("-s", values.get("--scheduler", "wlc")),
                                           persistent)
            order.append(key)
            continue
        vs = services.get(key)
        if vs is None:
            raise IpvsParseError(f"{where}: real server for {words[2]} before its `-A` line")
        rs_text = values.get("-r", values.get("--real-server"))
        if rs_text is None:
            raise IpvsParseError(f"{where}: `-a` without -r ADDRESS:PORT")
        rip, rport, rv6 = _split_hostport(rs_text, where)
        forward = next((_FORWARD[f] for f in flags if f in _FORWARD), "Route")  # ipvsadm's default is -g
        weight = _int(values.get("-w", values.get("--weight", "1")), where, "weight")
        services[key] = VirtualService(vs.protocol, vs.address, vs.port, vs.v6, vs.scheduler, vs.persistent,
                                       (*vs.reals, RealServerState(rip, rport, rv6, weight, forward)))
    state = IpvsState()
    for key in order:
        state.add(services[key])
    return state


def _parse_list(lines: list[str]) -> IpvsState:
    state = IpvsState()
    current: VirtualService | None = None
    for n, raw in enumerate(lines, 1):
        words = raw.split()
        where = f"--ipvs line {n}"
        if not words or words[0] in ("IP", "Prot") or words[:2] == ["->", "RemoteAddress:Port"]:
            continue
        if words[0] in PROTOCOLS:
            if len(words) < 3:
                raise IpvsParseError(f"{where}: expected `PROTO ADDRESS:PORT SCHEDULER`, got {raw.strip()!r}")
            ip, port, v6 = _split_hostport(words[1], where)
            persistent = 0
            if "persistent" in words:
                k = words.index("persistent")
                persistent = _int(words[k + 1] if k + 1 < len(words) else "", where, "persistence")
            current = VirtualService(words[0], ip, port, v6, words[2], persistent)
            state.add(current)
            continue
        if words[0] == "FWM":
            current = None  # firewall-mark services: not ours; their real servers are skipped too
            continue
        if words[0] == "->":
            if current is None:
                if any(w in PROTOCOLS for w in lines[0].split()):
                    raise IpvsParseError(f"{where}: real server before any virtual service")
                continue
            if len(words) < 6:
                raise IpvsParseError(f"{where}: expected `-> ADDRESS:PORT FORWARD WEIGHT ACTIVE INACTIVE`")
            rip, rport, rv6 = _split_hostport(words[1], where)
            rs = RealServerState(rip, rport, rv6, _int(words[3], where, "weight"), words[2],
                                 _int(words[4], where, "ActiveConn"), _int(words[5], where, "InActConn"))
            current = VirtualService(current.protocol, current.address, current.port, current.v6, current.scheduler,
                                     current.persistent, (*current.reals, rs))
            state.add(current)
            continue
        raise IpvsParseError(f"{where}: not an `ipvsadm -Ln` or `ipvsadm-save -n` line: {raw.strip()!r}")
    return state


@dataclass
class IpsetDump:
    members: dict[str, list[str]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)


def parse_ipset_save(text: str) -> IpsetDump:
    """`ipset save` (or `ipset list` is not accepted: save's create/add lines only)."""
    dump = IpsetDump()
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"--ipset-file line {n}"
        if words[0] == "create" and len(words) >= 3:
            dump.types[words[1]] = words[2]
            dump.members.setdefault(words[1], [])
        elif words[0] == "add" and len(words) >= 3:
            if words[1] not in dump.types:
                raise IpvsParseError(f"{where}: `add {words[1]}` before `create {words[1]}`")
            dump.members[words[1]].append(words[2])
        else:
            raise IpvsParseError(f"{where}: expected `create NAME TYPE ...` or `add NAME MEMBER`, got {raw.strip()!r}")
    return dump


def load_into(node: Node, ipvs_text: str | None, ipset_text: str | None) -> IpvsState | None:
    """Put the dumps' facts into `node` (set members and types; kube-ipvs0's addresses are local)
    and return the IPVS state (None without --ipvs)."""
    dump = parse_ipset_save(ipset_text) if ipset_text is not None else IpsetDump()
    for name, members in dump.members.items():
        node.ipsets.setdefault(name, []).extend(members)
    node.ipset_types.update(dump.types)
    if ipvs_text is None:
        return None
    state = parse_ipvs(ipvs_text)
    # kube-proxy binds every ClusterIP, external IP and LB address to kube-ipvs0 and lists them in
    # KUBE-IPVS-IPS; without that set, every virtual address counts as bound (NodePorts are on
    # the node's own addresses, which are local anyway).
    bound: Iterable[int]
    if "KUBE-IPVS-IPS" in dump.members:
        bound = (A.parse_ip(m.split(",")[0])[0] for m in dump.members["KUBE-IPVS-IPS"])
    else:
        bound = (vs.address for vs in state.services.values())
    node.local_ips |= set(bound)
    return state


# ---------------------------------------------------------------------------- the walk

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
