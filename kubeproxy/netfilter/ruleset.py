"""One ruleset model for iptables and nftables dumps.

iptables rules become a list of matches followed by one target; nftables rules become the same
list of steps in their own order (statements may sit between matches). The simulator walks both
the same way. Addresses are kept as integers with their prefix mask so that matching is cheap.

The model is plain data: parsers build it, `simulate` interprets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

# Kernel priorities of the iptables tables per hook (include/uapi/linux/netfilter_ipv4.h).
IPT_PRIORITY: dict[str, int] = {"raw": -300, "mangle": -150, "nat": -100, "filter": 0, "security": 50}
# nat's source-manipulating hooks run late (NF_IP_PRI_NAT_SRC).
IPT_NAT_SRC_PRIORITY = 100
BUILTIN_CHAINS: dict[str, tuple[str, ...]] = {
    "raw": ("PREROUTING", "OUTPUT"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
}
HOOKS = ("prerouting", "input", "forward", "output", "postrouting")


class ParseError(ValueError):
    """A dump could not be read; the message is `line N: <text>: <reason>`.

    nft JSON is usually one line, so its errors count objects of the `nftables` list instead."""

    def __init__(self, line: int, text: str, reason: str, unit: str = "line") -> None:
        self.line, self.text, self.reason = line, text, reason
        shown = text if len(text) <= 200 else text[:197] + "..."
        super().__init__(f"{unit} {line}: {shown}: {reason}")


# --------------------------------------------------------------------------- matches
@dataclass(slots=True)
class Addr:
    """-s/-d: `(addr & mask) == net`."""

    field: Literal["src", "dst"]
    net: int
    mask: int
    v6: bool = False
    neg: bool = False


@dataclass(slots=True)
class AddrRange:
    """-m iprange --src-range/--dst-range."""

    field: Literal["src", "dst"]
    lo: int
    hi: int
    neg: bool = False


@dataclass(slots=True)
class Iface:
    """-i/-o; a trailing `+` in iptables is a prefix wildcard."""

    field: Literal["in", "out"]
    name: str
    prefix: bool = False
    neg: bool = False


@dataclass(slots=True)
class Proto:
    proto: int
    neg: bool = False


@dataclass(slots=True)
class Port:
    """--sport/--dport (tcp, udp, sctp) and multiport: inclusive ranges."""

    field: Literal["sport", "dport", "any"]
    ranges: tuple[tuple[int, int], ...]
    neg: bool = False


@dataclass(slots=True)
class Mark:
    """-m mark / -m connmark: `(mark & mask) == value`."""

    value: int
    mask: int = 0xFFFFFFFF
    conn: bool = False
    neg: bool = False


@dataclass(slots=True)
class AddrType:
    """-m addrtype: the kernel's route type of the address (LOCAL, UNICAST, ...)."""

    src_types: frozenset[str] = frozenset()
    dst_types: frozenset[str] = frozenset()
    src_neg: bool = False
    dst_neg: bool = False
    limit_in: bool = False
    limit_out: bool = False


@dataclass(slots=True)
class Statistic:
    """-m statistic: the chance that a packet matches. `nth` is deterministic per packet counter,
    which a single traced packet does not know, so it counts as one in `every`."""

    probability: Fraction
    mode: Literal["random", "nth"] = "random"
    neg: bool = False


@dataclass(slots=True)
class Recent:
    """-m recent: is the packet's source (or destination) in list `name`?"""

    name: str
    mode: Literal["rcheck", "update", "set", "remove"]
    side: Literal["src", "dst"] = "src"
    neg: bool = False


@dataclass(slots=True)
class CtState:
    """-m state / -m conntrack --ctstate; also nft `ct state`. States are upper case."""

    states: frozenset[str]
    neg: bool = False


@dataclass(slots=True)
class PhysDev:
    """-m physdev: the bridge ports a packet crossed (`--physdev-in/--physdev-out` on the packet;
    a routed packet that never crossed a bridge port has none). Names may end in `+`."""

    is_in: bool | None = None
    is_in_neg: bool = False
    is_out: bool | None = None
    is_out_neg: bool = False
    is_bridged: bool | None = None
    is_bridged_neg: bool = False
    phys_in: str | None = None
    phys_in_neg: bool = False
    phys_out: str | None = None
    phys_out_neg: bool = False


@dataclass(slots=True)
class SetMatch:
    """-m set --match-set NAME src,dst: membership in an ipset whose contents are given."""

    name: str
    flags: tuple[str, ...]
    neg: bool = False


@dataclass(slots=True)
class TcpFlags:
    """--tcp-flags MASK COMP / --syn: a traced TCP packet is the first one (SYN only)."""

    mask: frozenset[str]
    comp: frozenset[str]
    neg: bool = False


@dataclass(slots=True)
class IcmpType:
    type: int | None
    neg: bool = False


@dataclass(slots=True)
class Unsupported:
    """A match the tracer cannot evaluate; it is assumed to match and the outcome says so."""

    what: str


# nftables expressions (left- and right-hand sides of matches, keys of maps)
@dataclass(slots=True)
class NPayload:
    proto: str  # ip, ip6, tcp, udp, th, ...
    field: str  # saddr, daddr, sport, dport, protocol, ...


@dataclass(slots=True)
class NMeta:
    key: str  # l4proto, iifname, oifname, mark, nfproto, ...


@dataclass(slots=True)
class NCt:
    key: str  # state, status, mark, original daddr ...
    dir: str | None = None


@dataclass(slots=True)
class NFib:
    flags: tuple[str, ...]
    result: str  # type, oif, oifname


@dataclass(slots=True)
class NNumgen:
    mod: int
    offset: int = 0
    mode: str = "random"


@dataclass(slots=True)
class NConcat:
    items: tuple[Any, ...]


@dataclass(slots=True)
class NBinop:
    op: str  # & | ^ << >>
    left: Any
    right: Any


@dataclass(slots=True)
class NLookup:
    """`key map @name` / `key map { ... }`: a value taken from a map."""

    key: Any
    map: str | dict[Any, Any]


@dataclass(slots=True)
class NConst:
    value: Any


@dataclass(slots=True)
class NSetLit:
    """A right-hand side of membership: `@name` or an inline set of values, prefixes, ranges."""

    name: str | None
    values: frozenset[Any] = frozenset()
    intervals: tuple[tuple[Any, Any], ...] = ()


@dataclass(slots=True)
class NMatch:
    """nft `match`: `left OP right`; right is a constant, an NSetLit, or a range `(lo, hi)`."""

    op: str  # == != < > <= >= in
    left: Any
    right: Any
    text: str = ""


Match = (
    Addr
    | AddrRange
    | Iface
    | Proto
    | Port
    | Mark
    | AddrType
    | Statistic
    | Recent
    | CtState
    | PhysDev
    | SetMatch
    | TcpFlags
    | IcmpType
    | Unsupported
    | NMatch
)


# --------------------------------------------------------------------------- actions
@dataclass(slots=True)
class Verdict:
    """ACCEPT, DROP, REJECT, RETURN, QUEUE (terminal) with the reject type as detail.

    UNKNOWN and UNTRACED come from the tracer, never from a dump: a chain it cannot follow, and
    a way it did not follow because its branch budget ran out."""

    kind: Literal["ACCEPT", "DROP", "REJECT", "RETURN", "QUEUE", "UNKNOWN", "UNTRACED"]
    detail: str = ""


@dataclass(slots=True)
class Jump:
    chain: str
    goto: bool = False


@dataclass(slots=True)
class SetMark:
    """mark = (mark & and_mask) ^ xor_value: every MARK/CONNMARK flavour reduces to this."""

    and_mask: int
    xor_value: int
    conn: bool = False


@dataclass(slots=True)
class CopyMark:
    """CONNMARK --save-mark / --restore-mark."""

    to_conn: bool
    mask: int = 0xFFFFFFFF


@dataclass(slots=True)
class NSetMark:
    """nft `meta mark set EXPR` / `ct mark set EXPR`."""

    conn: bool
    value: Any


@dataclass(slots=True)
class Nat:
    """DNAT/SNAT/MASQUERADE/REDIRECT; all are terminal (the nat chain accepts).

    For nft the address and port may be expressions (map lookups on numgen)."""

    kind: Literal["dnat", "snat", "masquerade", "redirect"]
    addr: Any = None  # int, or an nft expression
    port: Any = None  # int, or an nft expression; None keeps the port
    port_hi: int | None = None
    v6: bool = False


@dataclass(slots=True)
class VMap:
    """nft `KEY vmap @name|{...}`: the verdict comes from a map."""

    key: Any
    map: str | dict[Any, Any]


@dataclass(slots=True)
class Log:
    prefix: str = ""


@dataclass(slots=True)
class Notrack:
    pass


@dataclass(slots=True)
class Noop:
    """A target or statement without effect on where the packet goes (counter, TCPMSS...)."""

    what: str = ""


@dataclass(slots=True)
class UnknownTarget:
    """A target the tracer does not know (or a jump to a chain the dump does not hold):
    treated as continuing with the next rule, and the outcome says so."""

    name: str


Action = (
    Verdict | Jump | SetMark | CopyMark | NSetMark | Nat | VMap | Log | Notrack | Noop | UnknownTarget
)


# --------------------------------------------------------------------------- containers
@dataclass(slots=True)
class Rule:
    """One rule: steps evaluated in order (matches filter, actions act).

    `text` is the rule as the dump wrote it; `line` its line number there (0 if unknown);
    `target` a short name for paths (`KUBE-SVC-...`, `DNAT`, `jump services`).

    Parsers may leave `steps` None and set `loader`: big dumps (300k rules) are read in two
    steps, structure first, rule bodies when first needed (`load()`), or all at once by
    `Ruleset.validate()`. A bad rule body raises ParseError with its line either way."""

    steps: list[Any] | None
    text: str
    line: int = 0
    target: str = ""
    comment: str | None = None
    # The simulator keeps its precompiled form of the rule here (built on first use).
    compiled: Any = field(default=None, repr=False, compare=False)
    loader: Any = field(default=None, repr=False, compare=False)

    def load(self) -> list[Any]:
        if self.steps is None:
            self.loader(self)
        return self.steps  # type: ignore[return-value]


@dataclass(slots=True)
class Chain:
    name: str
    rules: list[Rule] = field(default_factory=list)
    # base chains only:
    hook: str | None = None  # prerouting, input, forward, output, postrouting
    priority: int | None = None
    policy: str | None = None  # ACCEPT / DROP
    type: str = "filter"  # filter, nat, route
    declared: bool = True  # False when only referenced (partial `iptables -L` pastes)


@dataclass(slots=True)
class NSet:
    """An nftables set or map; `elements` for sets, `mapping` for maps (key -> data)."""

    name: str
    key_type: tuple[str, ...]
    is_map: bool = False
    data_type: str | tuple[str, ...] | None = None  # a tuple for a concatenation
    elements: set[Any] = field(default_factory=set)
    intervals: list[tuple[Any, Any]] = field(default_factory=list)
    mapping: dict[Any, Any] = field(default_factory=dict)
    interval_mapping: list[tuple[Any, Any, Any]] = field(default_factory=list)
    comments: dict[Any, str] = field(default_factory=dict)  # element comments, by key


@dataclass(slots=True)
class Table:
    name: str
    family: str = "ip"  # ip, ip6, inet (nft); iptables dumps use "ip"
    chains: dict[str, Chain] = field(default_factory=dict)
    sets: dict[str, NSet] = field(default_factory=dict)


@dataclass(slots=True)
class Ruleset:
    """What a dump says. `source` is the format it was read from (iptables-save, iptables-list,
    nft-json); `notes` are facts the parser could not keep (e.g. chains referenced but absent)."""

    source: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self, name: str, family: str | None = None) -> Table | None:
        for t in self.tables:
            if t.name == name and (family is None or t.family == family):
                return t
        return None

    def validate(self) -> None:
        """Parse every rule body now (raises the first ParseError)."""
        for t in self.tables:
            for c in t.chains.values():
                for r in c.rules:
                    r.load()

    def rule_count(self) -> int:
        return sum(len(c.rules) for t in self.tables for c in t.chains.values())
