"""The iptables matches (`-s/-d`, `-i/-o`, `-p`, ports, marks, addrtype, conntrack, physdev,
recent, ipset, tcp flags, icmp) evaluated against a branch, and the table the walk looks them up in.

Each matcher answers whether the rule's step matches the branch; `recent --set/--remove` is the
one that also changes the branch (the lists are per branch, as each branch is its own packet)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ruleset import (
    Addr,
    AddrRange,
    AddrType,
    CtState,
    IcmpType,
    Iface,
    Mark,
    NMatch,
    PhysDev,
    Port,
    Proto,
    Recent,
    SetMatch,
    TcpFlags,
    Unsupported,
)
from kubeproxy.netfilter.simulate import nft
from kubeproxy.netfilter.simulate.branch import PORT_PROTOS, Branch

if TYPE_CHECKING:
    from kubeproxy.netfilter.simulate.engine import Simulator

# A step of a rule, the branch, the walk (for the node's addresses, ipsets and nft values).
Matcher = Callable[[Any, Branch, "Simulator"], bool]


def _m_addr(m: Addr, b: Branch, sim: Simulator) -> bool:
    ip = b.src if m.field == "src" else b.dst
    return (((ip & m.mask) == m.net) and (m.v6 == b.v6)) != m.neg


def _m_range(m: AddrRange, b: Branch, sim: Simulator) -> bool:
    ip = b.src if m.field == "src" else b.dst
    return (m.lo <= ip <= m.hi) != m.neg


def _m_iface(m: Iface, b: Branch, sim: Simulator) -> bool:
    name = b.in_iface if m.field == "in" else b.out_iface
    if name is None:
        hit = False
    elif m.prefix:
        hit = name.startswith(m.name)
    else:
        hit = name == m.name
    return hit != m.neg


def _m_proto(m: Proto, b: Branch, sim: Simulator) -> bool:
    return (b.proto == m.proto) != m.neg


def _m_port(m: Port, b: Branch, sim: Simulator) -> bool:
    if b.proto not in PORT_PROTOS:
        return False
    if m.field == "any":
        hit = any(lo <= b.sport <= hi or lo <= b.dport <= hi for lo, hi in m.ranges)
    else:
        p = b.dport if m.field == "dport" else b.sport
        hit = any(lo <= p <= hi for lo, hi in m.ranges)
    return hit != m.neg


def _m_mark(m: Mark, b: Branch, sim: Simulator) -> bool:
    return (((b.ctmark if m.conn else b.mark) & m.mask) == m.value) != m.neg


def _m_addrtype(m: AddrType, b: Branch, sim: Simulator) -> bool:
    if m.src_types and ((sim.node.addr_type(b.src, b.v6) in m.src_types) == m.src_neg):
        return False
    return not (m.dst_types and (sim.node.addr_type(b.dst, b.v6) in m.dst_types) == m.dst_neg)


def _m_ctstate(m: CtState, b: Branch, sim: Simulator) -> bool:
    states = {b.ct_state}
    if b.dnat_done and b.dnat is not None:
        states.add("DNAT")
        states.add("STATUS_DNAT")
    if b.snat is not None or b.masq:
        states.add("SNAT")
        states.add("STATUS_SNAT")
    return bool(states & m.states) != m.neg


def _ifname_match(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("+") else name == pattern


def _m_physdev(m: PhysDev, b: Branch, sim: Simulator) -> bool:
    """As xt_physdev: a packet without bridge information (it never crossed a bridge port) matches
    an option only when the option is inverted; a bridged one is judged by its in and out ports
    (routed after arriving through a port: an in port, no out port)."""
    indev, outdev = b.phys_in, b.phys_out
    if indev is None and outdev is None:
        return not any(
            given is not None and not neg
            for given, neg in ((m.is_bridged, m.is_bridged_neg), (m.is_in, m.is_in_neg), (m.is_out, m.is_out_neg),
                               (m.phys_in, m.phys_in_neg), (m.phys_out, m.phys_out_neg))
        )
    if m.is_bridged is not None and (outdev is not None) == m.is_bridged_neg:
        return False
    if m.is_in is not None and (indev is not None) == m.is_in_neg:
        return False
    if m.is_out is not None and (outdev is not None) == m.is_out_neg:
        return False
    if m.phys_in is not None and indev is not None and _ifname_match(indev, m.phys_in) == m.phys_in_neg:
        return False
    if m.phys_out is None:
        return True
    if outdev is None:
        return False  # the kernel: an out-port test fails, inverted or not, without an out port
    return _ifname_match(outdev, m.phys_out) != m.phys_out_neg


def _m_recent(m: Recent, b: Branch, sim: Simulator) -> bool:
    ip = b.src if m.side == "src" else b.dst
    lists = b.recent
    if m.mode == "set":
        if ip not in lists.get(m.name, ()):
            b.recent = {**lists, m.name: lists.get(m.name, frozenset()) | {ip}}
        return not m.neg
    if m.mode == "remove":
        hit = ip in lists.get(m.name, ())
        if hit:
            b.recent = {**lists, m.name: lists[m.name] - {ip}}
        return hit != m.neg
    return (ip in lists.get(m.name, ())) != m.neg


def _m_set(m: SetMatch, b: Branch, sim: Simulator) -> bool:
    # The set's type (from an `ipset save` dump) says what each dimension is: `hash:ip,port,ip`
    # is address, proto:port, address; `bitmap:port` is a bare port. Without it: an address,
    # then proto:port.
    set_type = sim.node.ipset_types.get(m.name, "")
    kinds = set_type.partition(":")[2].split(",") if set_type else []
    vals: list[int | str] = []
    for i, f in enumerate(m.flags):
        kind = kinds[i] if i < len(kinds) else ("ip" if i == 0 else "port")
        if kind in ("ip", "net"):
            vals.append(b.src if f == "src" else b.dst)
        else:
            port = b.sport if f == "src" else b.dport
            vals.append(str(port) if set_type.startswith("bitmap:") else f"{A.PROTO_NAMES.get(b.proto, b.proto)}:{port}")
    hit = sim.node.in_ipset(m.name, vals)
    if hit is None:
        note = f"contents of ipset {m.name} not given (--ipset {m.name}=MEMBER): taken as empty"
        b.note(note)
        hit = False
    return hit != m.neg


def _m_tcpflags(m: TcpFlags, b: Branch, sim: Simulator) -> bool:
    if b.proto != 6:
        return False
    # the traced TCP packet opens its connection: SYN for NEW, ACK otherwise
    flags = {"SYN"} if b.ct_state == "NEW" else {"ACK"}
    return ((flags & m.mask) == m.comp) != m.neg


def _m_icmp(m: IcmpType, b: Branch, sim: Simulator) -> bool:
    if b.proto not in (1, 58):
        return False
    return (m.type is None or m.type == 8) != m.neg  # traced ICMP packets are echo requests


def _m_unsupported(m: Unsupported, b: Branch, sim: Simulator) -> bool:
    # the walk forks at an unsupported match before asking here (engine._eval_rest: one branch
    # per answer); this entry only marks the step as a match, not an action
    raise AssertionError(f"unsupported match `{m.what}` reached the matcher table")


# The step types a rule can test, each with its matcher; a step not in here is an action.
MATCHERS: dict[type, Matcher] = {
    Addr: _m_addr,
    AddrRange: _m_range,
    Iface: _m_iface,
    Proto: _m_proto,
    Port: _m_port,
    Mark: _m_mark,
    AddrType: _m_addrtype,
    CtState: _m_ctstate,
    PhysDev: _m_physdev,
    Recent: _m_recent,
    SetMatch: _m_set,
    TcpFlags: _m_tcpflags,
    IcmpType: _m_icmp,
    Unsupported: _m_unsupported,
    NMatch: nft.match,
}
