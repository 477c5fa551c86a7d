"""The iptables matches (`-s/-d`, `-i/-o`, `-p`, ports, marks, addrtype, conntrack, physdev,
recent, ipset, tcp flags, icmp) evaluated against a branch, and the table the walk looks them up in.

Each matcher answers whether the rule's step matches the branch; `recent --set/--remove` is the
one that also changes the branch (the lists are per branch, as each branch is its own packet)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.model import (
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
    if m.src_types and ((sim.node.addr_type(b.src) in m.src_types) == m.src_neg):
        return False
    return not (m.dst_types and (sim.node.addr_type(b.dst) in m.dst_types) == m.dst_neg)


def _m_ctstate(m: CtState, b: Branch, sim: Simulator) -> bool:
    states = {b.ct_state}
    if b.dnat_done and b.dnat is not None:
        states.add("DNAT")
        states.add("STATUS_DNAT")
    if b.snat is not None or b.masq:
        states.add("SNAT")
        states.add("STATUS_SNAT")
    return bool(states & m.states) != m.neg


def _m_physdev(m: PhysDev, b: Branch, sim: Simulator) -> bool:
    bridged_in = b.phys_in is not None
    if m.is_in is not None and bridged_in == m.is_in_neg:
        return False
    if m.is_out is not None and (not m.is_out_neg):
        return False  # the tracer does not model bridge output ports
    if m.is_bridged is not None and bridged_in == m.is_bridged_neg:
        return False
    return not (m.phys_in is not None and (b.phys_in == m.phys_in) == m.phys_in_neg)


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
    vals: list[int | str] = []
    for i, f in enumerate(m.flags):
        if i == 0:
            vals.append(b.src if f == "src" else b.dst)
        else:
            port = b.sport if f == "src" else b.dport
            vals.append(f"{A.PROTO_NAMES.get(b.proto, b.proto)}:{port}")
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
    note = f"cannot evaluate `{m.what}`: assumed to match"
    b.note(note)
    return True


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
