"""What a rule's statements do to a branch: marks, notrack, log and the like (evaluation goes on)
and NAT (DNAT, REDIRECT, SNAT, MASQUERADE, with addresses and ports from nft maps)."""

from __future__ import annotations

from typing import Any

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ruleset import CopyMark, Log, Nat, Noop, Notrack, NSetMark, SetMark
from kubeproxy.netfilter.simulate.branch import PORT_PROTOS, Branch
from kubeproxy.netfilter.simulate.nft import NftEvaluator


def apply_statement(s: Any, b: Branch, sim: NftEvaluator) -> bool | None:
    """Apply a statement that lets evaluation go on; None if it did, True if s is terminal."""
    t = type(s)
    if t is SetMark:
        if s.conn:
            b.ctmark = (b.ctmark & s.and_mask) ^ s.xor_value
        else:
            b.mark = (b.mark & s.and_mask) ^ s.xor_value
        return None
    if t is NSetMark:
        v = sim.value(s.value, b)
        if isinstance(v, int):
            if s.conn:
                b.ctmark = v
            else:
                b.mark = v
        return None
    if t is CopyMark:
        if s.to_conn:
            b.ctmark = (b.ctmark & ~s.mask) | (b.mark & s.mask)
        else:
            b.mark = (b.mark & ~s.mask) | (b.ctmark & s.mask)
        return None
    if t in (Log, Noop):
        return None
    if t is Notrack:
        b.ct_state = "UNTRACKED"
        return None
    return True


def nat(a: Nat, b: Branch, hook: str, sim: NftEvaluator) -> list[tuple[Branch, str]]:
    """Apply a NAT statement: [(branch, ACCEPT)], or DROP when there is nothing to map to."""
    kind = a.kind
    if kind in ("dnat", "redirect") and hook not in ("prerouting", "output"):
        b.notes.append(f"{kind} outside PREROUTING/OUTPUT has no effect")
        return [(b, "ACCEPT")]
    if kind in ("snat", "masquerade") and hook not in ("postrouting", "input"):
        b.notes.append(f"{kind} outside POSTROUTING/INPUT has no effect")
        return [(b, "ACCEPT")]
    addr = sim.value(a.addr, b) if not isinstance(a.addr, int) and a.addr is not None else a.addr
    port = sim.value(a.port, b) if not isinstance(a.port, int) and a.port is not None else a.port
    if isinstance(addr, tuple):  # nft `dnat to MAP` whose data is `addr . port`
        addr, port = addr[0], addr[1]
    if kind == "dnat":
        if addr is None and a.addr is not None:
            b.notes.append("dnat map has no element for this packet: dropped")
            return [(b, "DROP")]
        if addr is not None:
            b.dst = addr
        if port is not None and b.proto in PORT_PROTOS:
            b.dport = port
        b.dnat = (b.dst, b.dport if b.proto in PORT_PROTOS else None)
    elif kind == "redirect":
        if b.in_iface is None:
            b.dst = 1 if b.v6 else A.ip4_to_int("127.0.0.1")
        else:
            ip = sim.node.iface_addr(b.in_iface, b.src, b.v6)
            if ip is None:
                b.notes.append(f"REDIRECT: {b.in_iface} has no address: dropped")
                return [(b, "DROP")]
            b.dst = ip
        if port is not None and b.proto in PORT_PROTOS:
            b.dport = port
        b.dnat = (b.dst, b.dport if b.proto in PORT_PROTOS else None)
    elif kind == "snat":
        if addr is not None:
            b.src = addr
        if port is not None and b.proto in PORT_PROTOS:
            b.sport = port
        b.snat = b.src
    else:  # masquerade
        toward = b.via if b.via is not None else b.dst
        ip = sim.node.masquerade_source(b.out_iface, toward, b.v6)
        if ip is None:
            b.notes.append(f"MASQUERADE: no {'IPv6' if b.v6 else 'IPv4'} global address on {b.out_iface} "
                           "or any other interface: dropped")
            return [(b, "DROP")]
        if b.out_iface is not None and not any(
                a.v6 == b.v6 and a.ip == ip for a in sim.node.interfaces.get(b.out_iface, [])):
            b.note(f"MASQUERADE: {b.out_iface} has no global address of its own: the kernel takes "
                   f"{A.fmt_ip(ip, b.v6)} from another interface")
        b.src, b.masq, b.snat = ip, True, ip
        if port is not None and b.proto in PORT_PROTOS:
            b.sport = port
    return [(b, "ACCEPT")]
