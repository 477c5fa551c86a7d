"""IPVS state for the packet tracer: what `ipvsadm-save -n` (or `ipvsadm -Ln`) and `ipset save` say.

On an IPVS node the service translation is not in the ruleset: iptables only matches ipsets
(`-m set --match-set KUBE-CLUSTER-IP dst,dst`), and the kernel's IPVS hooks pick a real server.
`load_into` reads the two dumps into the node model (set members and types, kube-ipvs0's
addresses as local) and returns the virtual services; the tracer's walk through IPVS (simulate/ipvs_walk.py) goes:

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
from typing import Protocol

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.node import Node


class Addressed(Protocol):
    """What a virtual service is looked up by: a packet's protocol number, destination and port."""

    proto: int
    dst: int
    dport: int

PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132}
_SAVE_PROTO = {"-t": "TCP", "--tcp-service": "TCP", "-u": "UDP", "--udp-service": "UDP", "--sctp-service": "SCTP"}
_FORWARD = {"-m": "Masq", "--masquerading": "Masq", "-g": "Route", "--gatewaying": "Route", "-i": "Tunnel",
            "--ipip": "Tunnel"}
# ipvsadm options that take a value (ipvsadm-save prints them after the service or real server).
_VALUE_OPTS = {"-s", "--scheduler", "-p", "--persistent", "-M", "--netmask", "-b", "--sched-flags", "--pe", "-w",
               "--weight", "-x", "--u-threshold", "-y", "--l-threshold", "-r", "--real-server", "--tun-type",
               "--tun-port", "--tun-nocsum", "--tun-csum", "--tun-remcsum"}


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

    def service_for(self, b: Addressed) -> VirtualService | None:
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
