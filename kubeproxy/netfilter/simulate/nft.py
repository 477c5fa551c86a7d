"""The nftables side of the walk: the value an nft expression (payload, meta, ct, fib, concat,
binop, numgen, map lookup) has for a branch, set membership, map lookups, and `NMatch`."""

from __future__ import annotations

from typing import Any

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.ruleset import (
    Nat,
    NBinop,
    NConcat,
    NConst,
    NCt,
    NFib,
    NLookup,
    NMatch,
    NMeta,
    NNumgen,
    NPayload,
    NSet,
    NSetLit,
    NSetMark,
    Ruleset,
    VMap,
)
from kubeproxy.netfilter.simulate.branch import PORT_PROTOS, Branch


class NftEvaluator:
    """Evaluates nft expressions against a branch, with the sets and maps of one ruleset."""

    def __init__(self, ruleset: Ruleset, node: Node) -> None:
        self.rs, self.node = ruleset, node

    def value(self, e: Any, b: Branch) -> Any:
        t = type(e)
        if t is NPayload:
            f = e.field
            if e.proto in ("ip", "ip6"):
                if (e.proto == "ip6") != b.v6:
                    return None
                if f == "saddr":
                    return b.src
                if f == "daddr":
                    return b.dst
                if f in ("protocol", "nexthdr"):
                    return b.proto
                if f == "version":
                    return 6 if b.v6 else 4
                return None
            if e.proto in ("th", "tcp", "udp", "sctp", "udplite", "dccp"):
                if b.proto not in PORT_PROTOS:
                    return None
                if e.proto != "th" and A.PROTOCOLS.get(e.proto) != b.proto:
                    return None
                if f == "dport":
                    return b.dport
                if f == "sport":
                    return b.sport
                return None
            if e.proto in ("icmp", "icmpv6") and f == "type":
                return "echo-request" if b.proto in (1, 58) else None
            return None
        if t is NMeta:
            k = e.key
            if k == "l4proto":
                return b.proto
            # no device is the empty name to the kernel (a packet the node sends has no input
            # interface; none has an output one before routing), so `iifname != "x"` matches it
            if k in ("iifname", "iif"):
                return b.in_iface or ""
            if k in ("oifname", "oif"):
                return b.out_iface or ""
            if k == "mark":
                return b.mark
            if k == "nfproto":
                return "ipv6" if b.v6 else "ipv4"
            if k == "protocol":
                return "ip6" if b.v6 else "ip"
            if k == "pkttype":
                return "unicast"
            return None
        if t is NCt:
            k = e.key
            if k == "state":
                return frozenset([b.ct_state.lower()])
            if k == "status":
                s = set()
                if b.dnat is not None:
                    s.add("dnat")
                if b.snat is not None or b.masq:
                    s.add("snat")
                return frozenset(s)
            if k == "mark":
                return b.ctmark
            if k in ("daddr", "saddr", "proto-dst", "proto-src"):
                if e.dir == "reply":
                    return None  # reply-direction tuples are not traced
                return {"daddr": b.odst, "saddr": b.src, "proto-dst": b.odport, "proto-src": b.sport}[k]
            return None
        if t is NFib:
            ip = b.dst if "daddr" in e.flags else b.src
            if e.result == "type":
                return self.node.addr_type(ip, b.v6).lower()
            if e.result in ("oif", "oifname"):
                r = self.node.route(ip, b.v6)
                return r[0] if r else None
            return None
        if t is NConcat:
            vals = tuple(self.value(i, b) for i in e.items)
            return None if any(v is None for v in vals) else vals
        if t is NBinop:
            lv, rv = self.value(e.left, b), self.value(e.right, b)
            if not isinstance(lv, int) or not isinstance(rv, int):
                return None
            return {"&": lv & rv, "|": lv | rv, "^": lv ^ rv, "<<": lv << rv, ">>": lv >> rv}[e.op]
        if t is NNumgen:
            return b.numgen.get(id(e), e.offset)
        if t is NLookup:
            return self.lookup(e.map, self.value(e.key, b), b)
        if t is NConst:
            return e.value
        if isinstance(e, (int, str)):
            return e
        return None

    def _set_of(self, name: str, b: Branch) -> NSet | None:
        for t in self.rs.tables:
            s = t.sets.get(name)
            if s is not None:
                return s
        b.note(f"set or map @{name} is not in the dump: taken as empty")
        return None

    def in_set(self, lit: NSetLit, v: Any, b: Branch) -> bool:
        if lit.name is not None:
            s = self._set_of(lit.name, b)
            if s is None:
                return False
            if v in s.elements:
                return True
            return any(in_interval(v, lo, hi) for lo, hi in s.intervals)
        if v in lit.values:
            return True
        return any(in_interval(v, lo, hi) for lo, hi in lit.intervals)

    def lookup(self, m: str | dict[Any, Any], key: Any, b: Branch) -> Any:
        if key is None:
            return None
        if isinstance(m, str):
            s = self._set_of(m, b)
            if s is None:
                return None
            hit = s.mapping.get(key)
            if hit is None:
                for lo, hi, data in s.interval_mapping:
                    if in_interval(key, lo, hi):
                        return data
            return hit
        hit = m.get(key)
        if hit is None:
            for k, data in m.items():
                if isinstance(k, tuple) and len(k) == 3 and k[0] == "interval" and in_interval(key, k[1], k[2]):
                    return data
        return hit


def match(m: NMatch, b: Branch, sim: NftEvaluator) -> bool:
    left = sim.value(m.left, b)
    if left is None:
        return False
    right = m.right
    op = m.op
    if isinstance(right, NSetLit):
        # flags (ct state) are tested against a set of flags: any in common
        hit = bool(left & right.values) if isinstance(left, frozenset) else sim.in_set(right, left, b)
        return hit if op in ("==", "in") else not hit
    if isinstance(right, tuple) and len(right) == 3 and right[0] == "range":
        hit = right[1] <= left <= right[2]
        return hit if op in ("==", "in") else not hit
    if isinstance(right, NConst):
        right = right.value
    elif not isinstance(right, (int, str, tuple, frozenset)):
        right = sim.value(right, b)
    if isinstance(left, frozenset):
        rset = right if isinstance(right, frozenset) else frozenset([right])
        hit = bool(left & rset)
        return hit if op in ("==", "in") else not hit
    if op == "==" or op == "in":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    try:
        if op == "<":
            return bool(left < right)
        if op == ">":
            return bool(left > right)
        if op == "<=":
            return bool(left <= right)
        if op == ">=":
            return bool(left >= right)
    except TypeError:
        return False
    return False


def has_numgen(x: Any) -> bool:
    if isinstance(x, NNumgen):
        return True
    if isinstance(x, (NMatch,)):
        return has_numgen(x.left) or has_numgen(x.right)
    if isinstance(x, (VMap, NLookup)):
        return has_numgen(x.key)
    if isinstance(x, Nat):
        return has_numgen(x.addr) or has_numgen(x.port)
    if isinstance(x, NConcat):
        return any(has_numgen(i) for i in x.items)
    if isinstance(x, NBinop):
        return has_numgen(x.left) or has_numgen(x.right)
    if isinstance(x, NSetMark):
        return has_numgen(x.value)
    return False


def numgens(x: Any, out: list[NNumgen]) -> list[NNumgen]:
    if isinstance(x, NNumgen):
        out.append(x)
    elif isinstance(x, NMatch):
        numgens(x.left, out)
        numgens(x.right, out)
    elif isinstance(x, (VMap, NLookup)):
        numgens(x.key, out)
    elif isinstance(x, Nat):
        numgens(x.addr, out)
        numgens(x.port, out)
    elif isinstance(x, NConcat):
        for i in x.items:
            numgens(i, out)
    elif isinstance(x, NBinop):
        numgens(x.left, out)
        numgens(x.right, out)
    elif isinstance(x, NSetMark):
        numgens(x.value, out)
    return out


def in_interval(v: Any, lo: Any, hi: Any) -> bool:
    if isinstance(v, tuple):
        if not isinstance(lo, tuple) or len(lo) != len(v):
            return False
        return all(lo[i] <= v[i] <= hi[i] for i in range(len(v)))
    try:
        return bool(lo <= v <= hi)
    except TypeError:
        return False
