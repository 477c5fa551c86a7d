"""Walk a packet through a ruleset the way the kernel does, with exact probabilities.

Hooks run in kernel order; at each hook the base chains (iptables tables or nft base chains) run
by priority. A random element (`statistic`, `numgen`) splits the walk into branches that carry
their probability, so the result is every outcome with its exact chance, not a sample.

The nat chains only see the first packet of a connection: a packet whose conntrack state is not
NEW skips them, and a connection gets its destination mapping once (PREROUTING or OUTPUT) and its
source mapping once (INPUT or POSTROUTING), as in nf_nat_inet_fn.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.model import (
    Addr,
    AddrRange,
    AddrType,
    Chain,
    CopyMark,
    CtState,
    IcmpType,
    Iface,
    Jump,
    Log,
    Mark,
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
    Noop,
    Notrack,
    NPayload,
    NSetLit,
    NSetMark,
    PhysDev,
    Port,
    Proto,
    Recent,
    Rule,
    Ruleset,
    SetMark,
    SetMatch,
    Statistic,
    Table,
    TcpFlags,
    UnknownTarget,
    Unsupported,
    Verdict,
    VMap,
)
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import Packet

ONE = Fraction(1)
_PORT_PROTOS = (6, 17, 132, 136, 33)
_INDEX_MIN_RULES = 32
_MAX_DEPTH = 100


class TraceError(RuntimeError):
    """The ruleset cannot be walked (a jump loop, too many branches)."""


@dataclass(slots=True)
class Hop:
    """One rule that acted on the packet (or a chain policy, with `rule="policy"`)."""

    table: str
    chain: str
    rule: int | str
    target: str
    text: str = ""
    line: int = 0
    hook: str = ""


@dataclass(slots=True)
class Outcome:
    probability: Fraction
    verdict: str  # ACCEPT, DROP, REJECT, QUEUE, UNKNOWN (sent to a chain the dump lacks)
    dnat: tuple[int, int | None] | None
    snat: int | None
    masquerade: bool
    out_iface: str | None
    local: bool  # delivered to a process on the node
    src: int
    sport: int
    dst: int
    dport: int
    path: list[Hop]
    notes: list[str]
    reject_with: str = ""
    v6: bool = False


@dataclass
class TraceResult:
    packet: Packet
    outcomes: list[Outcome]
    notes: list[str] = field(default_factory=list)


class _Br:
    """One branch of the walk: the packet as it is now, and how likely this branch is."""

    __slots__ = (
        "ct_state",
        "ctmark",
        "dnat",
        "dnat_done",
        "dport",
        "dst",
        "in_iface",
        "local",
        "mark",
        "masq",
        "notes",
        "numgen",
        "odport",
        "odst",
        "out_iface",
        "path",
        "phys_in",
        "prob",
        "proto",
        "recent",
        "reject_with",
        "snat",
        "snat_done",
        "sport",
        "src",
        "stage",
        "v6",
        "verdict",
        "via",
    )

    def copy(self) -> _Br:
        b = _Br.__new__(_Br)
        for s in _Br.__slots__:
            setattr(b, s, getattr(self, s))
        b.path = list(self.path)
        b.notes = list(self.notes)
        b.numgen = dict(self.numgen)
        return b


# --------------------------------------------------------------------------- matchers
def _m_addr(m: Addr, b: _Br, sim: Simulator) -> bool:
    ip = b.src if m.field == "src" else b.dst
    return (((ip & m.mask) == m.net) and (m.v6 == b.v6)) != m.neg


def _m_range(m: AddrRange, b: _Br, sim: Simulator) -> bool:
    ip = b.src if m.field == "src" else b.dst
    return (m.lo <= ip <= m.hi) != m.neg


def _m_iface(m: Iface, b: _Br, sim: Simulator) -> bool:
    name = b.in_iface if m.field == "in" else b.out_iface
    if name is None:
        hit = False
    elif m.prefix:
        hit = name.startswith(m.name)
    else:
        hit = name == m.name
    return hit != m.neg


def _m_proto(m: Proto, b: _Br, sim: Simulator) -> bool:
    return (b.proto == m.proto) != m.neg


def _m_port(m: Port, b: _Br, sim: Simulator) -> bool:
    if b.proto not in _PORT_PROTOS:
        return False
    if m.field == "any":
        hit = any(lo <= b.sport <= hi or lo <= b.dport <= hi for lo, hi in m.ranges)
    else:
        p = b.dport if m.field == "dport" else b.sport
        hit = any(lo <= p <= hi for lo, hi in m.ranges)
    return hit != m.neg


def _m_mark(m: Mark, b: _Br, sim: Simulator) -> bool:
    return (((b.ctmark if m.conn else b.mark) & m.mask) == m.value) != m.neg


def _m_addrtype(m: AddrType, b: _Br, sim: Simulator) -> bool:
    if m.src_types and ((sim.node.addr_type(b.src) in m.src_types) == m.src_neg):
        return False
    return not (m.dst_types and (sim.node.addr_type(b.dst) in m.dst_types) == m.dst_neg)


def _m_ctstate(m: CtState, b: _Br, sim: Simulator) -> bool:
    states = {b.ct_state}
    if b.dnat_done and b.dnat is not None:
        states.add("DNAT")
        states.add("STATUS_DNAT")
    if b.snat is not None or b.masq:
        states.add("SNAT")
        states.add("STATUS_SNAT")
    return bool(states & m.states) != m.neg


def _m_physdev(m: PhysDev, b: _Br, sim: Simulator) -> bool:
    bridged_in = b.phys_in is not None
    if m.is_in is not None and bridged_in == m.is_in_neg:
        return False
    if m.is_out is not None and (not m.is_out_neg):
        return False  # the tracer does not model bridge output ports
    if m.is_bridged is not None and bridged_in == m.is_bridged_neg:
        return False
    return not (m.phys_in is not None and (b.phys_in == m.phys_in) == m.phys_in_neg)


def _m_recent(m: Recent, b: _Br, sim: Simulator) -> bool:
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


def _m_set(m: SetMatch, b: _Br, sim: Simulator) -> bool:
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
        if note not in b.notes:
            b.notes.append(note)
        hit = False
    return hit != m.neg


def _m_tcpflags(m: TcpFlags, b: _Br, sim: Simulator) -> bool:
    if b.proto != 6:
        return False
    # the traced TCP packet opens its connection: SYN for NEW, ACK otherwise
    flags = {"SYN"} if b.ct_state == "NEW" else {"ACK"}
    return ((flags & m.mask) == m.comp) != m.neg


def _m_icmp(m: IcmpType, b: _Br, sim: Simulator) -> bool:
    if b.proto not in (1, 58):
        return False
    return (m.type is None or m.type == 8) != m.neg  # traced ICMP packets are echo requests


def _m_unsupported(m: Unsupported, b: _Br, sim: Simulator) -> bool:
    note = f"cannot evaluate `{m.what}`: assumed to match"
    if note not in b.notes:
        b.notes.append(note)
    return True


def _m_nft(m: NMatch, b: _Br, sim: Simulator) -> bool:
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


MATCHERS: dict[type, Any] = {
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
    NMatch: _m_nft,
}


def _has_numgen(x: Any) -> bool:
    if isinstance(x, NNumgen):
        return True
    if isinstance(x, (NMatch,)):
        return _has_numgen(x.left) or _has_numgen(x.right)
    if isinstance(x, (VMap, NLookup)):
        return _has_numgen(x.key)
    if isinstance(x, Nat):
        return _has_numgen(x.addr) or _has_numgen(x.port)
    if isinstance(x, NConcat):
        return any(_has_numgen(i) for i in x.items)
    if isinstance(x, NBinop):
        return _has_numgen(x.left) or _has_numgen(x.right)
    if isinstance(x, NSetMark):
        return _has_numgen(x.value)
    return False


def _numgens(x: Any, out: list[NNumgen]) -> list[NNumgen]:
    if isinstance(x, NNumgen):
        out.append(x)
    elif isinstance(x, NMatch):
        _numgens(x.left, out)
        _numgens(x.right, out)
    elif isinstance(x, (VMap, NLookup)):
        _numgens(x.key, out)
    elif isinstance(x, Nat):
        _numgens(x.addr, out)
        _numgens(x.port, out)
    elif isinstance(x, NConcat):
        for i in x.items:
            _numgens(i, out)
    elif isinstance(x, NBinop):
        _numgens(x.left, out)
        _numgens(x.right, out)
    elif isinstance(x, NSetMark):
        _numgens(x.value, out)
    return out


class _Compiled:
    """A rule split into its leading deterministic matches (checked in a tight loop) and the rest."""

    __slots__ = ("fast", "rest", "single_action")

    def __init__(self, rule: Rule) -> None:
        steps = rule.load()
        k = 0
        fast = []
        while k < len(steps):
            s = steps[k]
            fn = MATCHERS.get(type(s))
            if fn is None or type(s) in (Recent, Unsupported, SetMatch) or _has_numgen(s):
                break
            fast.append((fn, s))
            k += 1
        self.fast = tuple(fast)
        self.rest = tuple(steps[k:])
        r = self.rest
        self.single_action = (
            r[0] if len(r) == 1 and type(r[0]) not in MATCHERS and type(r[0]) is not Statistic
            and not _has_numgen(r[0]) else None
        )


class _ChainIndex:
    """For long chains: rule positions keyed by an exact `-d IP/32` the rule requires, plus the
    positions of rules that have no such requirement. A packet only needs to look at both lists."""

    __slots__ = ("by_dst", "others")

    def __init__(self, by_dst: dict[int, list[int]], others: list[int]) -> None:
        self.by_dst, self.others = by_dst, others


# Results of running a rule / a chain.
_NOMATCH, _NEXT = "nomatch", "next"


class Simulator:
    """Walks packets through one ruleset on one node. Reusable for many packets."""

    def __init__(self, ruleset: Ruleset, node: Node, *, max_branches: int = 100_000) -> None:
        self.rs, self.node = ruleset, node
        self.max_branches = max_branches
        self._hooks: dict[tuple[str, bool], list[tuple[Table, Chain]]] = {}
        self._index: dict[int, _ChainIndex | None] = {}
        self._ipt = ruleset.source.startswith("iptables")

    # ------------------------------------------------------------------ hooks
    def base_chains(self, hook: str, v6: bool) -> list[tuple[Table, Chain]]:
        key = (hook, v6)
        got = self._hooks.get(key)
        if got is None:
            fam_ok = {"ip6", "inet"} if v6 else {"ip", "inet"}
            got = []
            for t in self.rs.tables:
                if t.family not in fam_ok:
                    continue
                for ch in t.chains.values():
                    if ch.hook == hook:
                        got.append((t, ch))
            got.sort(key=lambda tc: tc[1].priority or 0)
            self._hooks[key] = got
        return got

    # ------------------------------------------------------------------ the walk
    def trace(self, pkt: Packet) -> TraceResult:
        b = _Br()
        b.proto, b.src, b.dst, b.sport, b.dport = pkt.proto, pkt.src, pkt.dst, pkt.sport, pkt.dport
        b.odst, b.odport = pkt.dst, pkt.dport
        b.v6, b.in_iface, b.out_iface, b.via = pkt.v6, pkt.in_iface, None, None
        b.mark, b.ctmark, b.ct_state = pkt.mark, 0, pkt.ct_state
        b.dnat, b.dnat_done, b.snat, b.snat_done, b.masq = None, False, None, False, False
        b.path, b.notes, b.numgen, b.prob = [], [], {}, ONE
        b.phys_in, b.local, b.verdict, b.reject_with = pkt.physdev_in, False, "", ""
        b.recent = {k: frozenset(v) for k, v in self.node.recent.items()}
        b.stage = "route_out" if pkt.from_host else "prerouting"
        if pkt.ct_state != "NEW":
            b.dnat_done = b.snat_done = True
            b.notes.append(
                f"conntrack state {pkt.ct_state}: nat chains are skipped (the connection keeps the "
                "mapping its first packet got, which a dump does not show)"
            )
        done: list[Outcome] = []
        work = [b]
        while work:
            br = work.pop()
            for nb in self._stage(br):
                if nb.stage == "done":
                    done.append(self._outcome(nb))
                else:
                    work.append(nb)
            if len(done) + len(work) > self.max_branches:
                raise TraceError(f"more than {self.max_branches} branches")
        done.sort(key=lambda o: (-o.probability, o.verdict, o.dst, o.dport))
        return TraceResult(pkt, _merge(done), list(self.rs.notes))

    def _stage(self, b: _Br) -> list[_Br]:
        st = b.stage
        if st == "route_out":
            r = self.node.route(b.dst)
            if r is None:
                return [self._end(b, "DROP", "no route to the destination (ENETUNREACH)")]
            b.out_iface, b.via = r
            b.stage = "output"
            return [b]
        if st == "prerouting" or st == "lo_prerouting":
            nxt = "route_in" if st == "prerouting" else "input"
            return self._hook("prerouting", b, nxt)
        if st == "route_in":
            if self.node.is_local(b.dst):
                b.stage = "input"
                b.local = True
                return [b]
            r = self.node.route(b.dst)
            if r is None:
                return [self._end(b, "DROP", "no route to the destination")]
            b.out_iface, b.via = r
            b.stage = "forward"
            return [b]
        if st == "input":
            b.local = True
            return self._hook("input", b, "delivered")
        if st == "forward":
            return self._hook("forward", b, "postrouting")
        if st == "output":
            return self._hook("output", b, "postrouting")
        if st == "postrouting":
            nxt = "lo_in" if b.out_iface == "lo" and b.in_iface is None else "sent"
            return self._hook("postrouting", b, nxt)
        if st == "lo_in":
            # a locally generated packet to a local address comes back in through lo
            b.in_iface, b.stage = "lo", "lo_prerouting"
            return [b]
        if st == "delivered":
            b.out_iface = None
            return [self._end(b, "ACCEPT")]
        if st == "sent":
            return [self._end(b, "ACCEPT")]
        raise AssertionError(st)

    def _end(self, b: _Br, verdict: str, note: str = "") -> _Br:
        b.stage, b.verdict = "done", verdict
        if note:
            b.notes.append(note)
        return b

    def _hook(self, hook: str, b: _Br, nxt: str) -> list[_Br]:
        live = [b]
        dead: list[_Br] = []
        dst_manip = hook in ("prerouting", "output")
        for table, chain in self.base_chains(hook, b.v6):
            is_nat = chain.type == "nat"
            after: list[_Br] = []
            for br in live:
                if is_nat and (
                    br.ct_state in ("UNTRACKED", "INVALID") or (br.dnat_done if dst_manip else br.snat_done)
                ):
                    after.append(br)
                    continue
                before = (br.dst, br.dport)
                for nb, v in self._run_base(table, chain, hook, br):
                    if is_nat:
                        if dst_manip:
                            nb.dnat_done = True
                        else:
                            nb.snat_done = True
                    if v != "ACCEPT":
                        self._finish(nb, v)
                        dead.append(nb)
                        continue
                    if is_nat and hook == "output" and (nb.dst, nb.dport) != before:
                        self._reroute(nb)  # ip_route_me_harder after a local DNAT
                    (dead if nb.stage == "done" else after).append(nb)
            live = after
        for br in live:
            br.stage = nxt
        return live + dead

    def _finish(self, b: _Br, v: str) -> None:
        b.stage, b.verdict = "done", v

    def _reroute(self, b: _Br) -> None:
        r = self.node.route(b.dst)
        if r is None:
            b.notes.append("no route to the translated destination")
            b.stage, b.verdict = "done", "DROP"
            return
        b.out_iface, b.via = r

    def _run_base(self, table: Table, chain: Chain, hook: str, b: _Br) -> list[tuple[_Br, str]]:
        out = []
        for nb, v in self._run_chain(table, chain, 0, b, 0, hook):
            if v == _NEXT or v == "RETURN":
                pol = chain.policy or "ACCEPT"
                if pol != "ACCEPT":
                    nb.path.append(Hop(table.name, chain.name, "policy", pol, f"policy {pol}", 0, hook))
                out.append((nb, pol))
            else:
                out.append((nb, v))
        return out

    def _candidates(self, chain: Chain, b: _Br) -> list[int] | None:
        key = id(chain)
        if key not in self._index:
            self._index[key] = _build_index(chain)
        idx = self._index[key]
        if idx is None:
            return None
        hit = idx.by_dst.get(b.dst)
        if not hit:
            return idx.others
        return sorted(hit + idx.others)

    def _run_chain(
        self, table: Table, chain: Chain, start: int, b: _Br, depth: int, hook: str
    ) -> list[tuple[_Br, str]]:
        """Rules of `chain` from `start`: [(branch, verdict)] where verdict is ACCEPT, DROP, REJECT,
        QUEUE, or _NEXT (fell off the end / RETURN: the caller continues)."""
        if depth > _MAX_DEPTH:
            raise TraceError(f"chain nesting deeper than {_MAX_DEPTH} at {chain.name}: a jump loop?")
        out: list[tuple[_Br, str]] = []
        rules = chain.rules
        n = len(rules)
        pending = [(start, b)]
        while pending:
            pos, br = pending.pop()
            cands = self._candidates(chain, br) if n >= _INDEX_MIN_RULES else None
            ci = bisect.bisect_left(cands, pos) if cands is not None else 0
            cur: _Br | None = br
            while cur is not None:
                if cands is not None:
                    if ci >= len(cands):
                        out.append((cur, _NEXT))
                        break
                    i = cands[ci]
                    ci += 1
                else:
                    if pos >= n:
                        out.append((cur, _NEXT))
                        break
                    i = pos
                    pos += 1
                rule = rules[i]
                comp = rule.compiled
                if comp is None:
                    comp = rule.compiled = _Compiled(rule)
                ok = True
                for fn, s in comp.fast:
                    if not fn(s, cur, self):
                        ok = False
                        break
                if not ok:
                    continue
                act = comp.single_action
                if act is not None:
                    res: list[tuple[_Br, Any]] = [(cur, act)]
                else:
                    cur.numgen = {}
                    res = self._eval_rest(comp.rest, 0, cur, False, [], table, hook)
                cont: _Br | None = None
                for nb, a in res:
                    if a is _NOMATCH:
                        if cont is None:
                            cont = nb
                        else:  # branches that all skipped the rule are the same packet: merge
                            cont.prob += nb.prob
                        continue
                    if a is _NEXT:
                        self._hop(nb, table, chain, i, rule, hook)
                        pending.append((i + 1, nb))
                        continue
                    for nb2, v in self._act(a, nb, table, chain, i, rule, depth, hook):
                        if v == _NEXT:
                            pending.append((i + 1, nb2))
                        elif v == "RETURN":
                            out.append((nb2, _NEXT))
                        else:
                            out.append((nb2, v))
                cur = cont
        return out

    def _hop(self, b: _Br, table: Table, chain: Chain, i: int, rule: Rule, hook: str) -> None:
        b.path.append(Hop(table.name, chain.name, i + 1, rule.target, rule.text, rule.line, hook))

    def _eval_rest(
        self, steps: tuple[Any, ...], k: int, b: _Br, executed: bool, out: list[tuple[_Br, Any]],
        table: Table, hook: str,
    ) -> list[tuple[_Br, Any]]:
        """Evaluate steps from k on; forks at random elements. Yields (branch, action) pairs where
        action is _NOMATCH, _NEXT (rule done, continue) or a terminal/jump action."""
        n = len(steps)
        while k < n:
            s = steps[k]
            t = type(s)
            if _has_numgen(s):
                gens = [g for g in _numgens(s, []) if id(g) not in b.numgen]
                if gens:
                    g = gens[0]
                    for v in range(g.mod):
                        nb = b.copy()
                        nb.prob = b.prob / g.mod
                        nb.numgen[id(g)] = v + g.offset
                        self._eval_rest(steps, k, nb, executed, out, table, hook)
                    return out
            if t is Statistic:
                p = s.probability if not s.neg else ONE - s.probability
                if p == 0:
                    out.append((b, _NOMATCH if not executed else _NEXT))
                    return out
                if p != 1:
                    miss = b.copy()
                    miss.prob = b.prob * (1 - p)
                    out.append((miss, _NOMATCH if not executed else _NEXT))
                    b.prob = b.prob * p
                k += 1
                continue
            fn = MATCHERS.get(t)
            if fn is not None:
                if not fn(s, b, self):
                    out.append((b, _NOMATCH if not executed else _NEXT))
                    return out
                k += 1
                continue
            # an action: the rule has matched
            if k == n - 1:
                out.append((b, s))
                return out
            res = self._apply_nonterminal(s, b)
            if res is not None:  # terminal in the middle of an nft rule
                out.append((b, s))
                return out
            executed = True
            k += 1
        out.append((b, _NEXT))
        return out

    def _apply_nonterminal(self, s: Any, b: _Br) -> bool | None:
        """Apply a statement that lets evaluation go on; None if it did, True if s is terminal."""
        t = type(s)
        if t is SetMark:
            if s.conn:
                b.ctmark = (b.ctmark & s.and_mask) ^ s.xor_value
            else:
                b.mark = (b.mark & s.and_mask) ^ s.xor_value
            return None
        if t is NSetMark:
            v = self.value(s.value, b)
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
        if t is UnknownTarget:
            note = f"target or chain {s.name} is not in the dump: assumed to continue"
            if note not in b.notes:
                b.notes.append(note)
            return None
        return True

    def _act(
        self, a: Any, b: _Br, table: Table, chain: Chain, i: int, rule: Rule, depth: int, hook: str
    ) -> list[tuple[_Br, str]]:
        t = type(a)
        if t is Jump or t is VMap:
            if t is VMap:
                target = self.lookup(a.map, self.value(a.key, b), b)
                if target is None:
                    return [(b, _NEXT)]  # no element: the rule does not match
                if isinstance(target, Verdict):
                    self._hop(b, table, chain, i, rule, hook)
                    return [(b, target.kind if target.kind != "RETURN" else "RETURN")]
                a = target
            self._hop(b, table, chain, i, rule, hook)
            sub = table.chains.get(a.chain)
            if sub is None:
                # a partial listing: what that chain does is not known, so neither is the fate
                b.notes.append(f"chain {a.chain} is not in the dump: where the packet goes from there is unknown")
                return [(b, "UNKNOWN")]
            res = self._run_chain(table, sub, 0, b, depth + 1, hook)
            if a.goto:
                # falling off a goto'd chain returns to our caller, not to us
                return [(nb, "RETURN" if v == _NEXT else v) for nb, v in res]
            return res
        if t is Verdict:
            self._hop(b, table, chain, i, rule, hook)
            if a.kind == "REJECT":
                b.reject_with = a.detail or "icmp-port-unreachable"
            return [(b, a.kind)]
        if t is Nat:
            self._hop(b, table, chain, i, rule, hook)
            return self._nat(a, b, hook)
        if self._apply_nonterminal(a, b) is None:
            self._hop(b, table, chain, i, rule, hook)
            return [(b, _NEXT)]
        raise TraceError(f"cannot apply {a!r}")

    def _nat(self, a: Nat, b: _Br, hook: str) -> list[tuple[_Br, str]]:
        kind = a.kind
        if kind in ("dnat", "redirect") and hook not in ("prerouting", "output"):
            b.notes.append(f"{kind} outside PREROUTING/OUTPUT has no effect")
            return [(b, "ACCEPT")]
        if kind in ("snat", "masquerade") and hook not in ("postrouting", "input"):
            b.notes.append(f"{kind} outside POSTROUTING/INPUT has no effect")
            return [(b, "ACCEPT")]
        addr = self.value(a.addr, b) if not isinstance(a.addr, int) and a.addr is not None else a.addr
        port = self.value(a.port, b) if not isinstance(a.port, int) and a.port is not None else a.port
        if isinstance(addr, tuple):  # nft `dnat to MAP` whose data is `addr . port`
            addr, port = addr[0], addr[1]
        if kind == "dnat":
            if addr is None and a.addr is not None:
                b.notes.append("dnat map has no element for this packet: dropped")
                return [(b, "DROP")]
            if addr is not None:
                b.dst = addr
            if port is not None and b.proto in _PORT_PROTOS:
                b.dport = port
            b.dnat = (b.dst, b.dport if b.proto in _PORT_PROTOS else None)
        elif kind == "redirect":
            if b.in_iface is None:
                b.dst = A.ip4_to_int("127.0.0.1")
            else:
                ip = self.node.iface_addr(b.in_iface, b.src)
                if ip is None:
                    b.notes.append(f"REDIRECT: {b.in_iface} has no address: dropped")
                    return [(b, "DROP")]
                b.dst = ip
            if port is not None and b.proto in _PORT_PROTOS:
                b.dport = port
            b.dnat = (b.dst, b.dport if b.proto in _PORT_PROTOS else None)
        elif kind == "snat":
            if addr is not None:
                b.src = addr
            if port is not None and b.proto in _PORT_PROTOS:
                b.sport = port
            b.snat = b.src
        else:  # masquerade
            toward = b.via if b.via is not None else b.dst
            ip = self.node.iface_addr(b.out_iface, toward)
            if ip is None:
                b.notes.append(f"MASQUERADE: output interface {b.out_iface} has no address: dropped")
                return [(b, "DROP")]
            b.src, b.masq, b.snat = ip, True, ip
            if port is not None and b.proto in _PORT_PROTOS:
                b.sport = port
        return [(b, "ACCEPT")]

    # ------------------------------------------------------------------ nft values
    def value(self, e: Any, b: _Br) -> Any:
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
                return None
            if e.proto in ("th", "tcp", "udp", "sctp", "udplite", "dccp"):
                if b.proto not in _PORT_PROTOS:
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
            if k in ("iifname", "iif"):
                return b.in_iface
            if k in ("oifname", "oif"):
                return b.out_iface
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
                return self.node.addr_type(ip).lower()
            if e.result in ("oif", "oifname"):
                r = self.node.route(ip)
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

    def _set_of(self, name: str, b: _Br) -> Any:
        for t in self.rs.tables:
            s = t.sets.get(name)
            if s is not None:
                return s
        note = f"set or map @{name} is not in the dump: taken as empty"
        if note not in b.notes:
            b.notes.append(note)
        return None

    def in_set(self, lit: NSetLit, v: Any, b: _Br) -> bool:
        if lit.name is not None:
            s = self._set_of(lit.name, b)
            if s is None:
                return False
            if v in s.elements:
                return True
            return any(_in_interval(v, lo, hi) for lo, hi in s.intervals)
        if v in lit.values:
            return True
        return any(_in_interval(v, lo, hi) for lo, hi in lit.intervals)

    def lookup(self, m: str | dict[Any, Any], key: Any, b: _Br) -> Any:
        if key is None:
            return None
        if isinstance(m, str):
            s = self._set_of(m, b)
            if s is None:
                return None
            hit = s.mapping.get(key)
            if hit is None:
                for lo, hi, data in s.interval_mapping:
                    if _in_interval(key, lo, hi):
                        return data
            return hit
        hit = m.get(key)
        if hit is None:
            for k, data in m.items():
                if isinstance(k, tuple) and len(k) == 3 and k[0] == "interval" and _in_interval(key, k[1], k[2]):
                    return data
        return hit

    def _outcome(self, b: _Br) -> Outcome:
        return Outcome(
            probability=b.prob,
            verdict=b.verdict,
            dnat=b.dnat,
            snat=b.snat if not b.masq else None,
            masquerade=b.masq,
            out_iface=b.out_iface if not b.local else None,
            local=b.local and b.verdict == "ACCEPT",
            src=b.src,
            sport=b.sport,
            dst=b.dst,
            dport=b.dport,
            path=b.path,
            notes=b.notes,
            reject_with=b.reject_with,
            v6=b.v6,
        )


def _in_interval(v: Any, lo: Any, hi: Any) -> bool:
    if isinstance(v, tuple):
        if not isinstance(lo, tuple) or len(lo) != len(v):
            return False
        return all(lo[i] <= v[i] <= hi[i] for i in range(len(v)))
    try:
        return bool(lo <= v <= hi)
    except TypeError:
        return False


def _build_index(chain: Chain) -> _ChainIndex | None:
    by_dst: dict[int, list[int]] = {}
    others: list[int] = []
    for i, r in enumerate(chain.rules):
        key = None
        for s in r.load():
            if type(s) is Addr and s.field == "dst" and not s.neg and s.mask == A.ALL4 and not s.v6:
                key = s.net
                break
            if type(s) not in MATCHERS:
                break
        if key is None:
            others.append(i)
        else:
            by_dst.setdefault(key, []).append(i)
    if len(others) * 2 > len(chain.rules):
        return None
    return _ChainIndex(by_dst, others)


def _merge(outs: list[Outcome]) -> list[Outcome]:
    """Outcomes with the same result and the same path are one outcome."""
    merged: dict[tuple[Any, ...], Outcome] = {}
    for o in outs:
        key = (o.verdict, o.dnat, o.snat, o.masquerade, o.out_iface, o.local, o.src, o.sport, o.dst,
               o.dport, tuple((h.table, h.chain, h.rule, h.hook) for h in o.path))
        if key in merged:
            merged[key].probability += o.probability
        else:
            merged[key] = o
    return sorted(merged.values(), key=lambda o: (-o.probability, o.verdict))


def trace(ruleset: Ruleset, node: Node, packet: Packet) -> TraceResult:
    """Every way `packet` can go through `ruleset` on `node`, with its exact probability."""
    return Simulator(ruleset, node).trace(packet)
