"""The walk: hooks in kernel order, base chains by priority, rules in order, branching at random
elements (`statistic`, `numgen`); nat chains only for a connection's first packet, as in
nf_nat_inet_fn. Rules are compiled on first use and long chains indexed by destination."""

from __future__ import annotations

import bisect
import heapq
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import Packet
from kubeproxy.netfilter.ruleset import (
    Addr,
    Chain,
    Jump,
    Nat,
    Recent,
    Rule,
    Ruleset,
    SetMatch,
    Statistic,
    Table,
    UnknownTarget,
    Unsupported,
    Verdict,
    VMap,
)
from kubeproxy.netfilter.simulate import actions
from kubeproxy.netfilter.simulate.branch import ONE, Branch, Hop, Outcome, TraceError, TraceResult, Unknown
from kubeproxy.netfilter.simulate.matchers import MATCHERS
from kubeproxy.netfilter.simulate.nft import NftEvaluator, has_numgen, numgens

if TYPE_CHECKING:  # kubeproxy.netfilter.ipvs builds on this package's branches
    from kubeproxy.netfilter.ipvs import IpvsState

_INDEX_MIN_RULES = 32
_MAX_DEPTH = 100
# Forks one trace may make (random elements, unknown matches): a real service chain forks once per
# endpoint; rules that fork without ending the walk multiply, and past this the remaining ways
# end as UNTRACED outcomes (their share is reported) instead of the walk running for ever.
MAX_BRANCHES = 20_000
_UNTRACED = Verdict("UNTRACED")


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
            if fn is None or type(s) in (Recent, Unsupported, SetMatch) or has_numgen(s):
                break
            fast.append((fn, s))
            k += 1
        self.fast = tuple(fast)
        self.rest = tuple(steps[k:])
        r = self.rest
        self.single_action = (
            r[0]
            if len(r) == 1 and type(r[0]) not in MATCHERS and type(r[0]) not in (Statistic, UnknownTarget)
            and not has_numgen(r[0])
            else None
        )


class _ChainIndex:
    """For long chains: rule positions keyed by an exact `-d IP/32` the rule requires, plus the
    positions of rules that have no such requirement. A packet only needs to look at both lists."""

    __slots__ = ("by_dst", "others")

    def __init__(self, by_dst: dict[int, list[int]], others: list[int]) -> None:
        self.by_dst, self.others = by_dst, others


# Results of running a rule / a chain.
_NOMATCH, _NEXT = "nomatch", "next"


class Simulator(NftEvaluator):
    """Walks packets through one ruleset on one node. Reusable for many packets.

    An `NftEvaluator` as well: matchers and actions ask it for the value of nft expressions."""

    def __init__(self, ruleset: Ruleset, node: Node, *, max_branches: int = MAX_BRANCHES, ipvs: IpvsState | None = None) -> None:
        super().__init__(ruleset, node)
        self.max_branches = max_branches
        self._forks = 0  # branches made by forking in the current trace
        self.ipvs = ipvs  # an IPVS node's virtual services (kubeproxy/netfilter/ipvs.py walks them)
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
        b = Branch.start(pkt, {k: frozenset(v) for k, v in self.node.recent.items()})
        if pkt.ct_state != "NEW":
            b.dnat_done = b.snat_done = True
            b.notes.append(
                f"conntrack state {pkt.ct_state}: nat chains are skipped (the connection keeps the "
                "mapping its first packet got, which a dump does not show)"
            )
        self._forks = 0
        done: list[Outcome] = []
        work = [b]
        # the pending branches by state: a new one equal to a pending one joins it (as _merged
        # does) without the whole list being compared again at every step
        pending = {_state(b): b}
        while work:
            br = work.pop()
            key = _state(br)
            if pending.get(key) is br:
                del pending[key]
            for nb in self._stage(br):
                if nb.stage == "done":
                    done.append(self._outcome(nb))
                    continue
                key = _state(nb)
                other = pending.get(key)
                if other is None:
                    pending[key] = nb
                    work.append(nb)
                else:
                    _join(other, nb)
        done.sort(key=lambda o: (-o.probability, o.verdict, o.dst, o.dport))
        notes = list(self.rs.notes)
        untraced = sum((o.probability for o in done if o.verdict == "UNTRACED"), Fraction(0))
        if untraced:
            notes.append(f"the branch budget ({self.max_branches:,} forks) ran out: {float(untraced) * 100:.4g}% of "
                         "the packet's ways were not followed to the end (outcomes UNTRACED)")
        return TraceResult(pkt, _merge(done), notes)

    def _fork(self, b: Branch) -> Branch | None:
        """A copy of `b` to follow another way, or None once this trace has made `max_branches` of them."""
        if self._forks >= self.max_branches:
            return None
        self._forks += 1
        return b.copy()

    def _untraced(self, b: Branch) -> tuple[Branch, Verdict]:
        b.note(f"the tracer's branch budget ({self.max_branches:,} forks) ran out at this rule: this way is not "
               "followed further")
        return b, _UNTRACED

    def _stage(self, b: Branch) -> list[Branch]:
        st = b.stage
        if st == "route_out":
            return self._route(b, "output", "no route to the destination (ENETUNREACH)")
        if st == "prerouting" or st == "lo_prerouting":
            nxt = "route_in" if st == "prerouting" else "input"
            if st == "prerouting" and b.phys_out is not None:
                nxt = "bridge"
            return self._hook("prerouting", b, nxt)
        if st == "bridge":
            # br_netfilter: a bridged packet goes PREROUTING -> FORWARD -> POSTROUTING with the
            # bridge as in and out device; a DNAT to an address routed elsewhere makes the
            # kernel route it instead (br_nf_pre_routing_finish)
            if (b.dst, b.dport) != (b.odst, b.odport):
                r = self.node.route(b.dst, b.v6)
                if r is None or r[0] != b.in_iface:
                    b.phys_out = None
                    b.notes.append("DNAT sent the bridged packet elsewhere: the kernel routes it")
                    b.stage = "route_in"
                    return [b]
            b.out_iface, b.via = b.in_iface, None
            b.stage = "forward"
            return [b]
        if st == "route_in":
            if self.node.is_local(b.dst, b.v6):
                b.stage = "input"
                b.local = True
                return [b]
            return self._route(b, "forward", "no route to the destination")
        if self.ipvs is not None and (st.startswith("ipvs") or (st in ("input", "output") and self.ipvs.service_for(b))):
            from kubeproxy.netfilter.simulate.ipvs_walk import stage as ipvs_stage

            return ipvs_stage(self, b, self.ipvs)
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

    def _route(self, b: Branch, nxt: str, unreachable: str) -> list[Branch]:
        """Route `b` to its destination and go on to stage `nxt`; without a route it is dropped,
        `unreachable` saying why (a local sender is told ENETUNREACH, a forwarded packet is not)."""
        r = self.node.route(b.dst, b.v6)
        if r is None:
            return [self._end(b, "DROP", unreachable)]
        b.out_iface, b.via = r
        b.stage = nxt
        return [b]

    def _end(self, b: Branch, verdict: str, note: str = "") -> Branch:
        b.stage, b.verdict = "done", verdict
        if note:
            b.notes.append(note)
        return b

    def _hook(self, hook: str, b: Branch, nxt: str, lo: int | None = None, hi: int | None = None) -> list[Branch]:
        """Run the hook's base chains (those with lo <= priority < hi: IPVS sits between them)."""
        live = [b]
        dead: list[Branch] = []
        dst_manip = hook in ("prerouting", "output")
        for table, chain in self.base_chains(hook, b.v6):
            prio = chain.priority or 0
            if (lo is not None and prio < lo) or (hi is not None and prio >= hi):
                continue
            is_nat = chain.type == "nat"
            after: list[Branch] = []
            for br in live:
                if is_nat and (br.ct_state in ("UNTRACKED", "INVALID") or (br.dnat_done if dst_manip else br.snat_done)):
                    after.append(br)
                    continue
                before = (br.dst, br.dport)
                for nb, v in self._run_base(table, chain, hook, br):
                    # the next nat chain of the hook (another table's) is consulted until one
                    # binds the connection (nf_nat_inet_fn): one that only accepts binds nothing
                    if is_nat and dst_manip and nb.dnat is not None:
                        nb.dnat_done = True
                    elif is_nat and not dst_manip and nb.snat is not None:
                        nb.snat_done = True
                    if v != "ACCEPT":
                        self._finish(nb, v)
                        dead.append(nb)
                        continue
                    if is_nat and hook == "output" and (nb.dst, nb.dport) != before:
                        self._reroute(nb)  # ip_route_me_harder after a local DNAT
                    (dead if nb.stage == "done" else after).append(nb)
            live = _merged(after)
        for br in live:
            br.stage = nxt
        return live + dead

    def _finish(self, b: Branch, v: str) -> None:
        b.stage, b.verdict = "done", v

    def _reroute(self, b: Branch) -> None:
        r = self.node.route(b.dst, b.v6)
        if r is None:
            b.notes.append("no route to the translated destination")
            b.stage, b.verdict = "done", "DROP"
            return
        b.out_iface, b.via = r

    def _run_base(self, table: Table, chain: Chain, hook: str, b: Branch) -> list[tuple[Branch, str]]:
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

    def _candidates(self, chain: Chain, b: Branch) -> list[int] | None:
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

    def _run_chain(self, table: Table, chain: Chain, start: int, b: Branch, depth: int, hook: str) -> list[tuple[Branch, str]]:
        """Rules of `chain` from `start`: [(branch, verdict)] where verdict is ACCEPT, DROP, REJECT,
        QUEUE, or _NEXT (fell off the end / RETURN: the caller continues)."""
        if depth > _MAX_DEPTH:
            raise TraceError(f"chain nesting deeper than {_MAX_DEPTH} at {chain.name}: a jump loop?")
        out: list[tuple[Branch, str]] = []
        rules = chain.rules
        n = len(rules)
        pending = _Pending(start, b)
        while pending:
            pos, br = pending.pop()
            cands = self._candidates(chain, br) if n >= _INDEX_MIN_RULES else None
            ci = bisect.bisect_left(cands, pos) if cands is not None else 0
            cur: Branch | None = br
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
                    res: list[tuple[Branch, Any]] = [(cur, act)]
                else:
                    cur.numgen = {}
                    res = self._eval_rest(comp.rest, 0, cur, False, [], table, hook, (chain, i, rule))
                cont: Branch | None = None
                for nb, a in res:
                    if a is _NOMATCH:
                        if cont is None:
                            cont = nb
                        elif cont.assume == nb.assume:
                            # branches that all skipped the rule are the same packet: merge
                            cont.prob += nb.prob
                        else:  # the same packet under other assumptions about an unknown match
                            pending.push(i + 1, nb)
                        continue
                    if a is _NEXT:
                        self._hop(nb, table, chain, i, rule, hook)
                        pending.push(i + 1, nb)
                        continue
                    for nb2, v in self._act(a, nb, table, chain, i, rule, depth, hook):
                        if v == _NEXT:
                            pending.push(i + 1, nb2)
                        elif v == "RETURN":
                            out.append((nb2, _NEXT))
                        else:
                            out.append((nb2, v))
                cur = cont
                if cur is not None and pending:
                    # other ways wait in this chain: go on in rule order with them, to meet and merge
                    pending.push(i + 1, cur)
                    cur = None
        return out

    def _hop(self, b: Branch, table: Table, chain: Chain, i: int, rule: Rule, hook: str) -> None:
        b.path.append(Hop(table.name, chain.name, i + 1, rule.target, rule.text, rule.line, hook))

    def _eval_rest(
        self,
        steps: tuple[Any, ...],
        k: int,
        b: Branch,
        executed: bool,
        out: list[tuple[Branch, Any]],
        table: Table,
        hook: str,
        where: tuple[Chain, int, Rule],
    ) -> list[tuple[Branch, Any]]:
        """Evaluate steps from k on; forks at random elements, and at a match the tracer cannot
        evaluate (one branch assumes it matched, one that it did not). Yields (branch, action)
        pairs where action is _NOMATCH, _NEXT (rule done, continue) or a terminal/jump action."""
        n = len(steps)
        while k < n:
            s = steps[k]
            t = type(s)
            if t is Unsupported:
                miss = self._fork(b)
                if miss is None:
                    out.append(self._untraced(b))
                    return out
                miss.assume = (*b.assume, _assumption(table, where, hook, s.what, False))
                out.append((miss, _NOMATCH if not executed else _NEXT))
                b.assume = (*b.assume, _assumption(table, where, hook, s.what, True))
                k += 1
                continue
            if has_numgen(s):
                gens = [g for g in numgens(s, []) if id(g) not in b.numgen]
                if gens:
                    g = gens[0]
                    if self._forks + g.mod - 1 > self.max_branches:  # the branch itself takes one value
                        out.append(self._untraced(b))
                        return out
                    self._forks += g.mod - 1
                    for v in range(g.mod):
                        nb = b.copy()
                        nb.prob = b.prob / g.mod
                        nb.numgen[id(g)] = v + g.offset
                        self._eval_rest(steps, k, nb, executed, out, table, hook, where)
                    return out
            if t is Statistic:
                p = s.probability if not s.neg else ONE - s.probability
                if p == 0:
                    out.append((b, _NOMATCH if not executed else _NEXT))
                    return out
                if p != 1:
                    miss = self._fork(b)
                    if miss is None:
                        out.append(self._untraced(b))
                        return out
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
            if t is UnknownTarget:
                # what it does is not known: it may end the packet's walk here, or let it go on
                stop = self._fork(b)
                if stop is None:
                    out.append(self._untraced(b))
                    return out
                stop.assume = (*b.assume, _assumption(table, where, hook, f"target {s.name}", True, "ends the walk"))
                stop.notes.append(f"target or chain {s.name} is not in the dump: where the packet goes from there is unknown")
                out.append((stop, Verdict("UNKNOWN")))
                b.assume = (*b.assume, _assumption(table, where, hook, f"target {s.name}", True, "continues"))
                executed = True
                k += 1
                continue
            if k == n - 1:
                out.append((b, s))
                return out
            res = actions.apply_statement(s, b, self)
            if res is not None:  # terminal in the middle of an nft rule
                out.append((b, s))
                return out
            executed = True
            k += 1
        out.append((b, _NEXT))
        return out

    def _act(
        self, a: Any, b: Branch, table: Table, chain: Chain, i: int, rule: Rule, depth: int, hook: str
    ) -> list[tuple[Branch, str]]:
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
                # a partial listing: what that chain does is not known; it may decide the
                # packet's fate or return, and the outcomes cover both
                stop = self._fork(b)
                if stop is None:
                    return [(self._untraced(b)[0], "UNTRACED")]
                stop.assume = (*b.assume, _assumption(table, (chain, i, rule), hook, f"chain {a.chain}", True,
                                                       "ends the walk"))
                stop.notes.append(f"chain {a.chain} is not in the dump: where the packet goes from there is unknown")
                b.assume = (*b.assume, _assumption(table, (chain, i, rule), hook, f"chain {a.chain}", True,
                                                    "returns"))
                return [(stop, "UNKNOWN"), (b, "RETURN" if a.goto else _NEXT)]
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
            return actions.nat(a, b, hook, self)
        if actions.apply_statement(a, b, self) is None:
            self._hop(b, table, chain, i, rule, hook)
            return [(b, _NEXT)]
        raise TraceError(f"cannot apply {a!r}")

    def _outcome(self, b: Branch) -> Outcome:
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
            unknown=list(b.assume),
        )


class _Pending:
    """Branches waiting at a rule position of one chain, taken in rule order. A branch pushed where an
    equal one (the same packet, marks, translations and assumptions) already waits joins it: the two
    ways rejoined, and only their probabilities add up (the path kept is the first one's, with a
    note). Taken in rule order, every way that reaches a position has arrived before it is taken."""

    __slots__ = ("_heap", "_seq", "_waiting")

    def __init__(self, pos: int, b: Branch) -> None:
        self._heap: list[tuple[int, int, Branch]] = [(pos, 0, b)]
        self._seq = 1
        self._waiting: dict[tuple[Any, ...], Branch] = {}

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, pos: int, b: Branch) -> None:
        key = (pos, *_state(b))
        other = self._waiting.get(key)
        if other is not None:
            _join(other, b)
            return
        self._waiting[key] = b
        heapq.heappush(self._heap, (pos, self._seq, b))
        self._seq += 1

    def pop(self) -> tuple[int, Branch]:
        pos, _, b = heapq.heappop(self._heap)
        key = (pos, *_state(b))
        if self._waiting.get(key) is b:
            del self._waiting[key]
        return pos, b


def _state(b: Branch) -> tuple[Any, ...]:
    """Everything about a branch that decides where it goes from here (not its path, notes or chance)."""
    return (b.stage, b.src, b.sport, b.dst, b.dport, b.odst, b.odport, b.proto, b.v6, b.mark, b.ctmark, b.ct_state,
            b.dnat, b.dnat_done, b.snat, b.snat_done, b.masq, b.in_iface, b.out_iface, b.via, b.phys_in, b.phys_out,
            b.local, b.verdict, b.reject_with, b.assume, tuple(sorted(b.recent.items())))  # fmt: skip


def _join(into: Branch, b: Branch) -> None:
    into.prob += b.prob
    into.note("ways that rejoined the same packet state are merged (their chances added); the path shown is one of them")


def _merged(branches: list[Branch]) -> list[Branch]:
    """`branches` with equal states joined (see _Pending)."""
    if len(branches) < 2:
        return branches
    seen: dict[tuple[Any, ...], Branch] = {}
    out: list[Branch] = []
    for b in branches:
        key = _state(b)
        other = seen.get(key)
        if other is None:
            seen[key] = b
            out.append(b)
        else:
            _join(other, b)
    return out


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
        if o.verdict == "UNTRACED":
            # ways the budget stopped differ in what they did before: they are one outcome per
            # rule where they stopped, or the output would be as big as the walk that was cut
            last = o.path[-1] if o.path else None
            key: tuple[Any, ...] = ("UNTRACED", last and (last.table, last.chain, last.rule, last.hook))
            if key in merged:
                merged[key].probability += o.probability
            else:
                merged[key] = o
            continue
        key = (
            o.verdict,
            o.dnat,
            o.snat,
            o.masquerade,
            o.out_iface,
            o.local,
            o.src,
            o.sport,
            o.dst,
            o.dport,
            tuple((h.table, h.chain, h.rule, h.hook) for h in o.path),
            tuple((u.line, u.chain, u.rule, u.what, u.assumed) for u in o.unknown),
        )
        if key in merged:
            merged[key].probability += o.probability
        else:
            merged[key] = o
    return sorted(merged.values(), key=lambda o: (-o.probability, o.verdict))


def _assumption(table: Table, where: tuple[Chain, int, Rule], hook: str, what: str, matched: bool,
                assumed: str = "") -> Unknown:
    chain, i, rule = where
    return Unknown(table.name, chain.name, i + 1, rule.text, rule.line, hook, what,
                   assumed or ("matches" if matched else "does not match"))


def trace(ruleset: Ruleset, node: Node, packet: Packet, ipvs: IpvsState | None = None) -> TraceResult:
    """Every way `packet` can go through `ruleset` on `node` (and its IPVS table), with its exact probability."""
    return Simulator(ruleset, node, ipvs=ipvs).trace(packet)
