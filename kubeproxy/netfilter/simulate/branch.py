"""What a walk produces (outcomes, the hops on their path) and what it carries while it runs: one
`Branch` per way the packet can still go, with the probability of that way."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from kubeproxy.netfilter.packet import Packet

ONE = Fraction(1)
# Protocols whose packets have ports (TCP, UDP, SCTP, UDP-Lite, DCCP).
PORT_PROTOS = (6, 17, 132, 136, 33)


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


@dataclass(frozen=True, slots=True)
class Unknown:
    """A match or target the tracer cannot evaluate, met on the way, and what this outcome
    assumes of it (the trace has one outcome per assumption, so both are covered)."""

    table: str
    chain: str
    rule: int
    text: str
    line: int
    hook: str
    what: str
    assumed: str  # "matches", "does not match", "continues", "ends the walk"


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
    # unknown matches/targets on the path and what this outcome assumed of each: when not
    # empty, `probability` is the chance of this outcome given those assumptions
    unknown: list[Unknown] = field(default_factory=list)


@dataclass
class TraceResult:
    packet: Packet
    outcomes: list[Outcome]
    notes: list[str] = field(default_factory=list)

    def unknowns(self) -> list[tuple[str, str, int, str, str]]:
        """The unknown matches/targets the walk met, each once: (table, chain, rule, hook, what)."""
        seen: dict[tuple[str, str, int, str, str], None] = {}
        for o in self.outcomes:
            for u in o.unknown:
                seen.setdefault(u_key(u))
        return list(seen)

    def given(self, answers: dict[tuple[str, str, int, str, str], str]) -> list[Outcome]:
        """The outcomes possible when each unknown (a key of `unknowns()`) behaves as `answers`
        says ("matches", "does not match", "continues"/"returns", "ends the walk"); their chances
        sum to 1."""
        return [o for o in self.outcomes if all(answers.get(u_key(u)) == u.assumed for u in o.unknown)]


def u_key(u: Unknown) -> tuple[str, str, int, str, str]:
    return (u.table, u.chain, u.rule, u.hook, u.what)


class Branch:
    """One branch of the walk: the packet as it is now, and how likely this branch is.

    Slots, not a dataclass: the walk copies a branch at every random element, and `copy` is the
    hot path of a trace through a long service chain."""

    __slots__ = (
        "assume",
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
        "phys_out",
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

    assume: tuple[Unknown, ...]  # what this branch assumed of matches the tracer cannot evaluate
    ct_state: str  # NEW, ESTABLISHED, RELATED, INVALID, UNTRACKED
    ctmark: int
    dnat: tuple[int, int | None] | None  # the destination mapping the connection got
    dnat_done: bool
    dport: int
    dst: int
    in_iface: str | None
    local: bool
    mark: int
    masq: bool
    notes: list[str]
    numgen: dict[int, int]  # id(NNumgen) -> the value this branch drew
    odport: int  # the original destination (conntrack's original tuple)
    odst: int
    out_iface: str | None
    path: list[Hop]
    phys_in: str | None
    phys_out: str | None  # set only for a bridged packet (br_netfilter): the port it leaves by
    prob: Fraction
    proto: int
    recent: dict[str, frozenset[int]]
    reject_with: str
    snat: int | None
    snat_done: bool
    sport: int
    src: int
    stage: str  # where the walk goes next: prerouting, route_in, input, ..., done
    v6: bool
    verdict: str
    via: int | None  # the next hop's address, if routed through a gateway

    @classmethod
    def start(cls, pkt: Packet, recent: dict[str, frozenset[int]]) -> Branch:
        """The branch a packet starts as: nothing has matched or translated it yet."""
        b = cls.__new__(cls)
        b.proto, b.src, b.dst, b.sport, b.dport = pkt.proto, pkt.src, pkt.dst, pkt.sport, pkt.dport
        b.odst, b.odport = pkt.dst, pkt.dport
        b.v6, b.in_iface, b.out_iface, b.via = pkt.v6, pkt.in_iface, None, None
        b.mark, b.ctmark, b.ct_state = pkt.mark, 0, pkt.ct_state
        b.dnat, b.dnat_done, b.snat, b.snat_done, b.masq = None, False, None, False, False
        b.path, b.notes, b.numgen, b.prob = [], [], {}, ONE
        b.phys_in, b.local, b.verdict, b.reject_with = pkt.physdev_in, False, "", ""
        b.phys_out = pkt.physdev_out
        b.recent = recent
        b.assume = ()
        b.stage = "route_out" if pkt.from_host else "prerouting"
        return b

    def copy(self) -> Branch:
        b = Branch.__new__(Branch)
        for s in Branch.__slots__:
            setattr(b, s, getattr(self, s))
        b.path = list(self.path)
        b.notes = list(self.notes)
        b.numgen = dict(self.numgen)
        return b

    def note(self, text: str) -> None:
        """Add a note once: the same caveat met at every rule of a long chain is said once."""
        if text not in self.notes:
            self.notes.append(text)
