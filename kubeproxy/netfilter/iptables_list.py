"""`iptables [-t TABLE] -L [CHAIN] [-n] [-v]` listings, as people paste them into questions.

A listing carries fewer facts than iptables-save: matches are printed as prose (`tcp dpt:443`,
`statistic mode random probability 0.5`, `MARK or 0x4000`), chains may be missing, and the table
is only known from the command line the paste often includes (`iptables -t nat -L ...`). What is
printed is read; what cannot be read becomes an "assumed to match" note on the outcome.
"""

from __future__ import annotations

import re
from fractions import Fraction

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.iptables_save import base_chain, dump_family
from kubeproxy.netfilter.ruleset import (
    BUILTIN_CHAINS,
    Addr,
    AddrRange,
    AddrType,
    Chain,
    CtState,
    Iface,
    Jump,
    Log,
    Mark,
    Nat,
    Noop,
    ParseError,
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
    Unsupported,
    Verdict,
)

_CHAIN = re.compile(r"^Chain (\S+) \((?:policy (\w+)[^)]*|(\d+) references?)\)")
_CMD_TABLE = re.compile(r"iptables(?:-legacy|-nft)?\s.*?(?:-t|--table)\s*(\w+)")
_NAT_TARGETS = {"DNAT", "SNAT", "MASQUERADE", "REDIRECT"}
_SKIP = re.compile(r"^(#|\$|➜|\.{3,}|…)")
ALL4 = A.ALL4

_EXTRAS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"/\* (.*?) \*/"), "comment"),
    (re.compile(r"\b(tcp|udp|sctp) (?:(dpts?|spts?):(!)?(\S+)\s*)+"), "ports"),
    (re.compile(r"multiport (dports|sports|ports) (!\s?)?(\S+)"), "multiport"),
    (re.compile(r"ADDRTYPE match((?: (?:src|dst)-type (?:!\s?)?[A-Z,]+)+)(?: limit-(?:in|out))?"), "addrtype"),
    (re.compile(r"statistic mode random (!\s?)?probability ([\d.]+)"), "random"),
    (re.compile(r"statistic mode nth (!\s?)?every (\d+)(?: packet \d+)?"), "nth"),
    (re.compile(r"MARK (or|set|xset|and|xor) (0x[0-9a-fA-F]+)(?:/(0x[0-9a-fA-F]+))?"), "setmark"),
    (re.compile(r"(connmark|mark) match (!\s?)?(0x[0-9a-fA-F]+)(?:/(0x[0-9a-fA-F]+))?"), "mark"),
    (re.compile(r"\bto:(\S+)"), "to"),
    (re.compile(r"redir ports (\S+)"), "redir"),
    (re.compile(r"masq ports: (\S+)"), "masqports"),
    (re.compile(r"\b(ctstate|state) (!\s?)?([A-Z,]+)"), "ctstate"),
    (re.compile(r"PHYSDEV match ((?:(?:!\s?)?--physdev-is-(?:in|out|bridged)\s*)+)"), "physdev"),
    (re.compile(r"recent: (CHECK|UPDATE|SET|REMOVE).*?name: (\S+) side: (source|dest)(?: mask: \S+)?"), "recent"),
    (re.compile(r"(!\s?)?match-set (\S+) (\S+)"), "set"),
    (re.compile(r"reject-with (\S+)"), "reject"),
    (re.compile(r"(source|destination) IP range (!\s?)?(\S+)-(\S+)"), "iprange"),
    (re.compile(r"LOG flags \d+ level \S+(?: prefix \".*?\")?"), "log"),
    (re.compile(r"\b(random-fully|random|persistent)\b"), "noise"),
    (re.compile(r"\b(udp|tcp)\b"), "noise"),
]


def _addr_col(field: str, s: str) -> list[object]:
    neg = s.startswith("!")
    s = s.lstrip("!")
    if s in ("anywhere", "0.0.0.0/0", "::/0"):
        return [] if not neg else [Addr(field, 0, 0, False, True)]  # type: ignore[arg-type]
    if s == "localhost":
        s = "127.0.0.1"
    try:
        net, mask, v6 = A.parse_cidr(s)
    except ValueError:
        raise ValueError(f"{s!r} is a host name; paste `iptables -L -n` (numeric) output") from None
    return [Addr(field, net, mask, v6, neg)]  # type: ignore[arg-type]


def _extras(text: str) -> tuple[list[object], dict[str, str], str | None]:
    """Match descriptions of the last column -> (matches, target facts, comment)."""
    steps: list[object] = []
    facts: dict[str, str] = {}
    comment = None
    rest = text
    for rx, kind in _EXTRAS:
        for m in list(rx.finditer(rest)):
            g = m.groups()
            if kind == "comment":
                comment = g[0]
            elif kind == "ports":
                for pm in re.finditer(r"(dpts?|spts?):(!)?(\S+)", m.group(0)):
                    field = "dport" if pm.group(1).startswith("d") else "sport"
                    steps.append(Port(field, A.parse_port_ranges(pm.group(3)), bool(pm.group(2))))  # type: ignore[arg-type]
            elif kind == "multiport":
                field = {"dports": "dport", "sports": "sport", "ports": "any"}[g[0]]
                steps.append(Port(field, A.parse_port_ranges(g[2]), bool(g[1])))  # type: ignore[arg-type]
            elif kind == "addrtype":
                kw: dict[str, object] = {}
                for am in re.finditer(r"(src|dst)-type (!\s?)?([A-Z,]+)", g[0]):
                    kw[f"{am.group(1)}_types"] = frozenset(am.group(3).split(","))
                    kw[f"{am.group(1)}_neg"] = bool(am.group(2))
                steps.append(AddrType(**kw))  # type: ignore[arg-type]
            elif kind == "random":
                p = Fraction(round(float(g[1]) * 0x80000000), 0x80000000)
                steps.append(Statistic(p, "random", bool(g[0])))
            elif kind == "nth":
                steps.append(Statistic(Fraction(1, int(g[1])), "nth", bool(g[0])))
            elif kind == "setmark":
                facts["mark_op"], facts["mark_val"], facts["mark_mask"] = g[0], g[1], g[2] or ""
            elif kind == "mark":
                steps.append(Mark(int(g[2], 16), int(g[3], 16) if g[3] else ALL4, g[0] == "connmark", bool(g[1])))
            elif kind == "to":
                facts["to"] = g[0]
            elif kind in ("redir", "masqports"):
                facts["ports"] = g[0]
            elif kind == "ctstate":
                steps.append(CtState(frozenset(g[2].split(",")), bool(g[1])))
            elif kind == "physdev":
                pkw: dict[str, object] = {}
                for pm in re.finditer(r"(!\s?)?--physdev-is-(in|out|bridged)", g[0]):
                    pkw[f"is_{pm.group(2)}"] = True
                    pkw[f"is_{pm.group(2)}_neg"] = bool(pm.group(1))
                steps.append(PhysDev(**pkw))  # type: ignore[arg-type]
            elif kind == "recent":
                mode = {"CHECK": "rcheck", "UPDATE": "update", "SET": "set", "REMOVE": "remove"}[g[0]]
                steps.append(Recent(g[1], mode, "src" if g[2] == "source" else "dst"))  # type: ignore[arg-type]
            elif kind == "set":
                steps.append(SetMatch(g[1], tuple(g[2].split(",")), bool(g[0])))
            elif kind == "reject":
                facts["reject"] = g[0]
            elif kind == "iprange":
                steps.append(AddrRange("src" if g[0] == "source" else "dst", A.parse_ip(g[2])[0],
                                       A.parse_ip(g[3])[0], bool(g[1])))
            rest = rest.replace(m.group(0), " ", 1)
    left = rest.strip()
    if left:
        steps.append(Unsupported(f"listing says {left!r}"))
    return steps, facts, comment


def _target(name: str, facts: dict[str, str]) -> object:
    if name in ("ACCEPT", "DROP", "RETURN", "QUEUE"):
        return Verdict(name)  # type: ignore[arg-type]
    if name == "REJECT":
        return Verdict("REJECT", facts.get("reject", "icmp-port-unreachable"))
    if name in ("DNAT", "SNAT"):
        to = facts.get("to")
        if not to:
            raise ValueError(f"{name} without to:ADDRESS")
        host, _, port = to.partition(":")
        return Nat(name.lower(), A.parse_ip(host.split("-")[0])[0], int(port.split("-")[0]) if port else None)  # type: ignore[arg-type]
    if name in ("MASQUERADE", "REDIRECT"):
        ports = facts.get("ports")
        return Nat(name.lower(), None, int(ports.split("-")[0]) if ports else None)  # type: ignore[arg-type]
    if name in ("MARK", "CONNMARK") and "mark_op" in facts:
        op, v = facts["mark_op"], int(facts["mark_val"], 16)
        m = int(facts["mark_mask"], 16) if facts["mark_mask"] else ALL4
        conn = name == "CONNMARK"
        if op == "or":
            return SetMark(~v & ALL4, v, conn)
        if op == "and":
            return SetMark(v, 0, conn)
        if op == "xor":
            return SetMark(ALL4, v, conn)
        if op == "xset":
            return SetMark(~m & ALL4, v, conn)
        return SetMark(0, v, conn)  # set
    if name in ("LOG", "NFLOG"):
        return Log()
    if name in ("CHECKSUM", "TCPMSS", "CT", "TTL", "DSCP", "TOS", "CLASSIFY"):
        return Noop(name)
    return Jump(name)


def parse(text: str, family: str | None = None) -> Ruleset:
    """Parse one or more pasted `iptables -L` (or `ip6tables -L`) listings; `family` ("ip" or
    "ip6") when known, else read from the addresses the listing shows."""
    rs = Ruleset(source="iptables-list")
    family = family or dump_family(text)
    cmd_table: str | None = None
    blocks: list[tuple[str | None, Chain]] = []
    chain: Chain | None = None
    verbose = numbered = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = _CMD_TABLE.search(line)
        if m and not line.startswith("Chain "):
            cmd_table, chain = m.group(1), None
            continue
        if "iptables" in line and " -L" in line:
            cmd_table, chain = (cmd_table if "-t" in line else "filter"), None
            continue
        if not line:
            chain = None
            continue
        m = _CHAIN.match(line)
        if m:
            chain = Chain(name=m.group(1), policy=m.group(2))
            blocks.append((cmd_table, chain))
            continue
        if chain is None or _SKIP.match(line):
            continue  # prose around the paste
        toks = line.split()
        if toks[0] in ("target", "pkts", "num"):
            # `--line-numbers` adds a leading `num` column, `-v` the counters and interfaces
            numbered = toks[0] == "num"
            verbose = toks[1 if numbered else 0] == "pkts"
            continue
        if numbered and toks[0].isdigit():
            line = line[len(toks[0]):].strip()
            toks = toks[1:]
        try:
            if len(toks) < (6 if verbose else 4) and chain.rules:
                # a long row wrapped by the paste: the fragment belongs to the row above
                prev = chain.rules.pop()
                joined = f"{prev.text} {line}"
                chain.rules.append(_row(joined.split(), joined, prev.line, verbose))
                continue
            chain.rules.append(_row(toks, line, lineno, verbose))
        except (ValueError, IndexError) as e:
            raise ParseError(lineno, line, str(e) if isinstance(e, ValueError) else "too few columns") from None
    if not blocks:
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        raise ParseError(1, first.strip(), "no `Chain NAME (...)` header: not an `iptables -L` listing")
    nat_signal = any(
        r.target in _NAT_TARGETS or r.target == "KUBE-MARK-MASQ" for _, c in blocks for r in c.rules
    ) or any(c.name in ("PREROUTING", "POSTROUTING") for _, c in blocks)
    for tname, ch in blocks:
        name = tname or ("nat" if nat_signal else "filter")
        t = rs.table(name)
        if t is None:
            t = Table(name=name, family=family)
            rs.tables.append(t)
        if ch.name in BUILTIN_CHAINS.get(name, ()):
            base = base_chain(name, ch.name, ch.policy)
            base.rules = ch.rules
            ch = base
        t.chains[ch.name] = ch  # a chain listed twice: the later listing wins
    missing: set[str] = set()
    for t in rs.tables:
        for ch in t.chains.values():
            for r in ch.rules:
                last = r.steps[-1] if r.steps else None
                if isinstance(last, Jump) and last.chain not in t.chains:
                    missing.add(last.chain)  # the walk stops there with verdict UNKNOWN
    if missing:
        rs.notes.append(f"chains used but not in the listing: {', '.join(sorted(missing))}; "
                        "the trace covers both: the chain decides the packet's fate (UNKNOWN), or it returns")
    if not any(t.name == (tn or "") for t in rs.tables for tn, _ in blocks):
        rs.notes.append("the table was guessed from the rules (no `iptables -t TABLE -L` line)")
    return rs


def _row(toks: list[str], line: str, lineno: int, verbose: bool) -> Rule:
    i = 2 if verbose else 0
    target = toks[i]
    # a rule without a target prints an empty first column: the protocol comes first
    if toks[i + 1] in ("--", "-f", "!f") and (target.lstrip("!") in A.PROTOCOLS or target.lstrip("!").isdigit()):
        target = ""
        i -= 1
    prot, opt = toks[i + 1], toks[i + 2]
    if opt not in ("--", "-f", "!f"):
        raise ValueError(f"expected the opt column (--) after protocol {prot!r}, got {opt!r}")
    j = i + 3
    steps: list[object] = []
    if verbose:
        for field, col in (("in", toks[j]), ("out", toks[j + 1])):
            if col != "*":
                neg = col.startswith("!")
                name = col.lstrip("!")
                steps.append(Iface(field, name.rstrip("+"), name.endswith("+"), neg))  # type: ignore[arg-type]
        j += 2
    steps += _addr_col("src", toks[j]) + _addr_col("dst", toks[j + 1])
    pneg = prot.startswith("!")
    p = A.parse_proto(prot.lstrip("!"))
    if p or pneg:
        steps.insert(0, Proto(p, pneg))
    # the extra column starts after the destination column
    pos = 0
    for t in toks[: j + 2]:
        pos = line.index(t, pos) + len(t)
    extra, facts, comment = _extras(line[pos:])
    steps += extra
    if target:
        steps.append(_target(target, facts))
    return Rule(steps, line, lineno, target or "(no target)", comment)
