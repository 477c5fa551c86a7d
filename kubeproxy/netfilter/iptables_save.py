"""`iptables-save` output (iptables 1.4 to 1.8, legacy and nf_tables, with or without `-c`).

Accepts hand-edited files too: chain declarations may follow the rules that use them, as in
dumps people reorder by hand; a `-A` for an undeclared chain declares it (iptables-restore would
refuse, but a reader of a pasted dump wants the trace, not a lecture).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Literal

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ruleset import (
    BUILTIN_CHAINS,
    IPT_NAT_SRC_PRIORITY,
    IPT_PRIORITY,
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
    Noop,
    Notrack,
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
    TcpFlags,
    UnknownTarget,
    Unsupported,
    Verdict,
)

_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')
_COUNTERS = re.compile(r"^\[\d+:\d+\]\s*")
ALL4 = A.ALL4

# Options that take no argument, per module; everything else takes exactly the tokens up to
# the next option (iptables-save never writes an argument that starts with `-`).
_Opt = tuple[str, list[str], bool]

HOOK_OF_BUILTIN = {
    "PREROUTING": "prerouting",
    "INPUT": "input",
    "FORWARD": "forward",
    "OUTPUT": "output",
    "POSTROUTING": "postrouting",
}
TERMINAL = {"ACCEPT", "DROP", "RETURN", "QUEUE", "NFQUEUE"}


def tokenize(line: str) -> list[str]:
    """Split a rule line; double-quoted strings (comments) are one token, `\\"` escapes a quote."""
    if '"' not in line:
        return line.split()
    out: list[str] = []
    rest = line
    while True:
        before, quote, after = rest.partition('"')
        out.extend(before.split())
        if not quote:
            return out
        j = after.find('"')
        while j > 0 and after[j - 1] == "\\":
            j = after.find('"', j + 1)
        if j < 0:
            raise ValueError("unterminated quote")
        out.append(after[:j].replace('\\"', '"'))
        rest = after[j + 1 :]


def base_chain(table: str, name: str, policy: str | None) -> Chain:
    hook = HOOK_OF_BUILTIN[name]
    prio = IPT_PRIORITY.get(table, 0)
    if table == "nat" and hook in ("input", "postrouting"):
        prio = IPT_NAT_SRC_PRIORITY
    return Chain(
        name=name,
        hook=hook,
        priority=prio,
        policy=policy or "ACCEPT",
        type="nat" if table == "nat" else ("route" if table == "mangle" and hook == "output" else "filter"),
    )


def ensure_chain(table: Table, name: str) -> Chain:
    ch = table.chains.get(name)
    if ch is None:
        if name in BUILTIN_CHAINS.get(table.name, ()) or (
            name in HOOK_OF_BUILTIN and table.name not in BUILTIN_CHAINS
        ):
            ch = base_chain(table.name, name, None)
        else:
            ch = Chain(name=name)
        table.chains[name] = ch
    return ch


# --------------------------------------------------------------------------- matches
def _neg_cidr(field: str, arg: str, neg: bool, cache: dict[Any, Any]) -> list[Addr]:
    out = []
    # `-s a,b` is expanded by iptables into several rules; a hand-written dump may still carry it.
    for part in arg.split(","):
        hit = cache.get(part)
        if hit is None:
            hit = cache[part] = A.parse_cidr(part)
        net, mask, v6 = hit
        if mask == 0 and not neg:
            continue  # 0.0.0.0/0 matches everything
        out.append(Addr(field, net, mask, v6, neg))  # type: ignore[arg-type]
    return out


def _mark_arg(arg: str) -> tuple[int, int]:
    v, _, m = arg.partition("/")
    return int(v, 0), (int(m, 0) if m else 0xFFFFFFFF)


_MULTIPORT_FIELDS: dict[str, Literal["sport", "dport", "any"]] = {
    "--dports": "dport", "--destination-ports": "dport", "--sports": "sport", "--source-ports": "sport", "--ports": "any",
}  # fmt: skip


def _module_match(module: str, opts: list[_Opt], proto: int | None) -> list[object]:
    """Turn one `-m MODULE --opt arg ...` group into typed matches."""
    out: list[object] = []
    if module in ("tcp", "udp", "sctp", "udplite", "dccp"):
        for opt, args, neg in opts:
            if opt in ("--dport", "--destination-port", "--sport", "--source-port"):
                field = "dport" if opt in ("--dport", "--destination-port") else "sport"
                out.append(Port(field, A.parse_port_ranges(args[0]), neg))  # type: ignore[arg-type]
            elif opt == "--syn":
                out.append(TcpFlags(frozenset({"SYN", "RST", "ACK", "FIN"}), frozenset({"SYN"}), neg))
            elif opt == "--tcp-flags":
                out.append(
                    TcpFlags(frozenset(args[0].upper().split(",")), frozenset(args[1].upper().split(",")), neg)
                )
            elif opt in ("--tcp-option",):
                out.append(Unsupported(f"tcp {opt} {' '.join(args)}"))
            else:
                raise ValueError(f"unknown {module} option {opt}")
        return out
    if module == "multiport":
        for opt, args, neg in opts:
            ports = _MULTIPORT_FIELDS.get(opt)
            if ports is None:
                raise ValueError(f"unknown multiport option {opt}")
            out.append(Port(ports, A.parse_port_ranges(args[0]), neg))
        return out
    if module == "comment":
        return out
    if module in ("mark", "connmark"):
        for opt, args, neg in opts:
            if opt != "--mark":
                raise ValueError(f"unknown {module} option {opt}")
            v, m = _mark_arg(args[0])
            out.append(Mark(v, m, module == "connmark", neg))
        return out
    if module == "addrtype":
        src: frozenset[str] = frozenset()
        dst: frozenset[str] = frozenset()
        sneg = dneg = lin = lout = False
        for opt, args, neg in opts:
            if opt == "--src-type":
                src, sneg = frozenset(args[0].upper().split(",")), neg
            elif opt == "--dst-type":
                dst, dneg = frozenset(args[0].upper().split(",")), neg
            elif opt == "--limit-iface-in":
                lin = True
            elif opt == "--limit-iface-out":
                lout = True
            else:
                raise ValueError(f"unknown addrtype option {opt}")
        return [AddrType(src, dst, sneg, dneg, lin, lout)]
    if module == "statistic":
        d = {opt: (args, neg) for opt, args, neg in opts}
        mode = d.get("--mode", (["random"], False))[0][0]
        neg = any(n for _, _, n in opts)
        if mode == "random":
            p = float(d["--probability"][0][0])
            # The kernel compares a 31-bit random number with round(p * 2^31) (xt_statistic).
            return [Statistic(Fraction(round(p * 0x80000000), 0x80000000), "random", neg)]
        if mode == "nth":
            every = int(d["--every"][0][0])
            return [Statistic(Fraction(1, every), "nth", neg)]
        raise ValueError(f"unknown statistic mode {mode}")
    if module in ("state", "conntrack"):
        for opt, args, neg in opts:
            if opt in ("--state", "--ctstate"):
                out.append(CtState(frozenset(s.upper() for s in args[0].split(",")), neg))
            elif opt == "--ctstatus":
                out.append(CtState(frozenset("STATUS_" + s.upper() for s in args[0].split(",")), neg))
            else:
                out.append(Unsupported(f"conntrack {opt} {' '.join(args)}"))
        return out
    if module == "recent":
        name, mode, side, neg_all = "DEFAULT", "rcheck", "src", False
        for opt, args, neg in opts:
            if opt == "--name":
                name = args[0]
            elif opt in ("--rcheck", "--update", "--set", "--remove"):
                mode, neg_all = opt[2:], neg
            elif opt == "--rdest":
                side = "dst"
            elif opt in ("--rsource", "--seconds", "--reap", "--hitcount", "--rttl", "--mask"):
                pass  # time windows: given affinity entries are taken as fresh
            else:
                raise ValueError(f"unknown recent option {opt}")
        return [Recent(name, mode, side, neg_all)]  # type: ignore[arg-type]
    if module == "physdev":
        kw: dict[str, object] = {}
        for opt, args, neg in opts:
            if opt == "--physdev-is-in":
                kw.update(is_in=True, is_in_neg=neg)
            elif opt == "--physdev-is-out":
                kw.update(is_out=True, is_out_neg=neg)
            elif opt == "--physdev-is-bridged":
                kw.update(is_bridged=True, is_bridged_neg=neg)
            elif opt == "--physdev-in":
                kw.update(phys_in=args[0], phys_in_neg=neg)
            elif opt == "--physdev-out":
                kw.update(phys_out=args[0], phys_out_neg=neg)
            else:
                out.append(Unsupported(f"physdev {opt} {' '.join(args)}"))
        return [PhysDev(**kw), *out]  # type: ignore[arg-type]
    if module == "set":
        for opt, args, neg in opts:
            if opt == "--match-set":
                out.append(SetMatch(args[0], tuple(args[1].split(",")), neg))
            elif opt in ("--return-nomatch", "--update-counters", "--update-subcounters",
                         "! --update-counters", "--packets-eq", "--bytes-eq"):
                pass
            else:
                raise ValueError(f"unknown set option {opt}")
        return out
    if module == "iprange":
        for opt, args, neg in opts:
            lo, _, hi = args[0].partition("-")
            field = "src" if opt == "--src-range" else "dst"
            out.append(AddrRange(field, A.parse_ip(lo)[0], A.parse_ip(hi or lo)[0], neg))  # type: ignore[arg-type]
        return out
    if module in ("icmp", "icmp6"):
        for _opt, args, neg in opts:
            t = args[0].split("/")[0]
            out.append(IcmpType(int(t) if t.isdigit() else _ICMP_TYPES.get(t), neg))
        return out
    if module in ("limit", "hashlimit", "pkttype", "length", "ttl", "tos", "dscp", "hl", "u32",
                  "socket", "owner", "cgroup", "rpfilter", "devgroup", "time", "quota", "connlimit",
                  "helper", "policy", "bpf", "rt", "frag", "ipv6header", "ah", "esp", "mh", "string",
                  "realm", "cpu", "nfacct", "ecn", "connbytes", "connlabel", "mac"):
        if module in ("limit", "hashlimit", "nfacct", "quota"):
            return []  # rate limits, accounting: a single traced packet passes them all
        return [Unsupported(f"-m {module} " + " ".join(f"{'! ' if n else ''}{o} {' '.join(a)}".strip()
                                                      for o, a, n in opts))]
    raise ValueError(f"unknown match module {module!r}")


_ICMP_TYPES = {"echo-reply": 0, "destination-unreachable": 3, "echo-request": 8, "time-exceeded": 11,
               "any": None, "port-unreachable": 3, "fragmentation-needed": 3, "redirect": 5}


# --------------------------------------------------------------------------- targets
def _nat_target(kind: str, opts: dict[str, list[str]]) -> Nat:
    if kind in ("dnat", "snat"):
        arg = (opts.get("--to-destination") or opts.get("--to-source") or opts.get("--to") or [""])[0]
        if not arg:
            raise ValueError(f"{kind.upper()} without --to-destination/--to-source")
        arg = arg.split(" ")[0]
        if arg.startswith("["):  # [fd00::1]:80
            host, _, rest = arg[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        elif arg.count(":") > 1:
            host, port = arg, ""
        else:
            host, _, port = arg.partition(":")
        host = host.split("-")[0]  # address ranges: the first address stands for the range
        ip, v6 = A.parse_ip(host) if host else (None, False)
        p_lo = p_hi = None
        if port:
            lo, _, hi = port.partition("-")
            p_lo = int(lo)
            p_hi = int(hi) if hi else None
        return Nat(kind, ip, p_lo, p_hi, v6)  # type: ignore[arg-type]
    ports = (opts.get("--to-ports") or [""])[0]
    p_lo = p_hi = None
    if ports:
        lo, _, hi = ports.partition("-")
        p_lo, p_hi = int(lo), (int(hi) if hi else None)
    return Nat(kind, None, p_lo, p_hi)  # type: ignore[arg-type]


def _mark_target(name: str, opts: dict[str, list[str]]) -> object:
    conn = name == "CONNMARK"
    if "--set-xmark" in opts or "--set-mark" in opts:
        raw = (opts.get("--set-xmark") or opts["--set-mark"])[0]
        v, m = _mark_arg(raw)
        if "--set-xmark" in opts:
            return SetMark(~m & ALL4, v, conn)
        # --set-mark V/M: zero the mask bits, then OR the value in (libxt_MARK turns it into xset)
        return SetMark(~(m | v) & ALL4 if m != ALL4 else 0, v, conn)
    if "--or-mark" in opts:
        v = int(opts["--or-mark"][0], 0)
        return SetMark(~v & ALL4, v, conn)
    if "--and-mark" in opts:
        return SetMark(int(opts["--and-mark"][0], 0), 0, conn)
    if "--xor-mark" in opts:
        return SetMark(ALL4, int(opts["--xor-mark"][0], 0), conn)
    if conn and "--save-mark" in opts:
        return CopyMark(True, int((opts.get("--mask") or opts.get("--nfmask") or ["0xffffffff"])[0], 0))
    if conn and "--restore-mark" in opts:
        return CopyMark(False, int((opts.get("--mask") or opts.get("--ctmask") or ["0xffffffff"])[0], 0))
    raise ValueError(f"{name} without a mark operation")


def build_target(name: str, opts: list[_Opt], goto: bool, chains: set[str] | None) -> object:
    d = {o: a for o, a, _ in opts}
    if name in ("ACCEPT", "DROP", "RETURN", "QUEUE"):
        return Verdict(name)  # type: ignore[arg-type]
    if name == "NFQUEUE":
        return Verdict("QUEUE", " ".join(f"{o} {' '.join(a)}" for o, a, _ in opts))
    if name == "REJECT":
        return Verdict("REJECT", (d.get("--reject-with") or ["icmp-port-unreachable"])[0])
    if name in ("DNAT", "SNAT", "MASQUERADE", "REDIRECT"):
        return _nat_target(name.lower(), d)
    if name in ("MARK", "CONNMARK"):
        return _mark_target(name, d)
    if name in ("LOG", "NFLOG", "ULOG", "TRACE", "AUDIT"):
        return Log(" ".join(d.get("--log-prefix") or d.get("--nflog-prefix") or [""]))
    if name == "NOTRACK" or (name == "CT" and "--notrack" in d):
        return Notrack()
    if name in ("CHECKSUM", "TCPMSS", "TTL", "HL", "DSCP", "TOS", "CLASSIFY", "CT", "SECMARK",
                "CONNSECMARK", "ECN", "IDLETIMER", "LED", "TEE", "SET", "TCPOPTSTRIP", "RATEEST"):
        return Noop(name)
    return Jump(name, goto)


# --------------------------------------------------------------------------- rules
def parse_rule(
    toks: list[str], start: int, cache: dict[Any, Any]
) -> tuple[list[object], str, str | None]:
    """Options after `-A CHAIN` -> (steps, target name, comment). Raises ValueError.

    This loop runs once per rule of dumps with 300k rules: the common options (addresses, ports,
    comments, protocols) are handled inline and their match objects shared through `cache`."""
    steps: list[object] = []
    n = len(toks)
    i = start
    neg = False
    proto: int | None = None
    comment: str | None = None
    module: str | None = None
    mopts: list[_Opt] = []
    while i < n:
        t = toks[i]
        if t == "!":
            neg = True
            i += 1
            continue
        opt = _LONG_CORE.get(t)
        if opt is not None:
            if module is not None:
                if mopts or module not in _NO_OPTS_OK:
                    steps.extend(_module_match(module, mopts, proto))
                    mopts = []
                module = None
            if opt == "-m":
                module = toks[i + 1]
                i += 2
                neg = False
                continue
            if opt == "-j" or opt == "-g":
                key: tuple[str | bool, ...] = (opt, *toks[i + 1 :])
                tgt = cache.get(key)
                if tgt is None:
                    tgt = cache[key] = _target(toks, i, opt == "-g")
                steps.append(tgt)
                return steps, toks[i + 1], comment
            if opt == "-f":
                steps.append(Unsupported(("! " if neg else "") + "-f (fragments)"))
                neg = False
                i += 1
                continue
            arg = toks[i + 1]
            if opt == "-c":
                i += 3
                neg = False
                continue
            key = (opt, arg, neg)
            got = cache.get(key)
            if got is None:
                if opt == "-s" or opt == "-d":
                    got = _neg_cidr("src" if opt == "-s" else "dst", arg, neg, cache)
                elif opt == "-p":
                    p = A.parse_proto(arg)
                    got = [Proto(p, neg)] if (p != 0 or neg) else []
                else:  # -i / -o
                    got = [Iface("in" if opt == "-i" else "out", arg.rstrip("+"), arg.endswith("+"), neg)]
                cache[key] = got
            if opt == "-p":
                proto = A.parse_proto(arg)
            steps.extend(got)
            i += 2
            neg = False
            continue
        if t[:2] == "--":
            if module is None:
                # `-p tcp --dport 80` loads the protocol's module implicitly
                module = A.PROTO_NAMES.get(proto or 0, "")
                if module not in ("tcp", "udp", "sctp", "icmp"):
                    raise ValueError(f"option {t} outside any match module")
            if module == "comment" and t == "--comment":
                comment = toks[i + 1]
                i += 2
                continue
            if (t == "--dport" or t == "--sport") and module in ("tcp", "udp", "sctp"):
                key = (t, toks[i + 1], neg)
                got = cache.get(key)
                if got is None:
                    got = cache[key] = Port("dport" if t == "--dport" else "sport",
                                            A.parse_port_ranges(toks[i + 1]), neg)
                steps.append(got)
                i += 2
                neg = False
                continue
            j = i + 1
            while j < n:
                x = toks[j]
                if x[:2] == "--" or x == "!" or (len(x) == 2 and x[0] == "-" and x[1].isalpha()):
                    break
                j += 1
            mopts.append((t, toks[i + 1 : j], neg))
            neg = False
            i = j
            continue
        raise ValueError(f"unexpected token {t!r}")
    if module is not None and (mopts or module not in _NO_OPTS_OK):
        steps.extend(_module_match(module, mopts, proto))
    return steps, "", comment


def _target(toks: list[str], i: int, goto: bool) -> object:
    n = len(toks)
    target = toks[i + 1]
    i += 2
    topts: list[_Opt] = []
    while i < n:
        t2 = toks[i]
        tneg = False
        if t2 == "!":
            tneg, i = True, i + 1
            t2 = toks[i]
        j = i + 1
        while j < n and not toks[j].startswith("--") and toks[j] != "!":
            j += 1
        topts.append((t2, toks[i + 1 : j], tneg))
        i = j
    return build_target(target, topts, goto, None)


_NO_OPTS_OK = frozenset({"comment", "tcp", "udp", "sctp", "udplite", "dccp", "icmp"})
_LONG_CORE = {
    "--source": "-s", "--src": "-s", "--destination": "-d", "--dst": "-d", "--protocol": "-p",
    "--in-interface": "-i", "--out-interface": "-o", "--jump": "-j", "--goto": "-g", "--match": "-m",
    "--fragment": "-f", "-s": "-s", "-d": "-d", "-p": "-p", "-i": "-i", "-o": "-o", "-j": "-j",
    "-g": "-g", "-m": "-m", "-f": "-f", "-c": "-c",
}


def _is_core(t: str) -> bool:
    return len(t) == 2 and t[0] == "-" and t[1].isalpha()


# --------------------------------------------------------------------------- file
# An IPv6 address as ip6tables prints it in a rule: at least two colons among hex digits
# (`fd00::1`, `[fd00::1]:80`, `2001:db8::/64`); an IPv4 `IP:PORT` has one colon.
_V6_TOKEN = re.compile(r"(?:^|[\s\[])[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:[0-9A-Fa-f:.]*(?:/\d+)?(?:\]|\s|$)", re.M)

_MAC = re.compile(r"(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}")


def dump_family(text: str) -> str:
    """"ip6" for an ip6tables dump, else "ip": the header `ip6tables-save` says so, or else the
    addresses the rules carry do (a dump without a header nor addresses reads as IPv4)."""
    head = text[:2000]
    if "ip6tables" in head:
        return "ip6"
    if "iptables-save" in head or "iptables-legacy-save" in head or "iptables-nft-save" in head:
        return "ip"
    for m in _V6_TOKEN.finditer(text, 0, 2_000_000):
        tok = m.group(0).strip(" \t\n[]")
        if _MAC.fullmatch(tok) or tok.replace(":", "").replace(".", "").isdigit():
            continue  # a MAC address (`-m mac`), or a port pair
        if tok.count(":") >= 2:
            return "ip6"
    return "ip"


def parse(text: str, lazy: bool = False, family: str | None = None) -> Ruleset:
    """Parse iptables-save (or ip6tables-save) output into a Ruleset; `family` ("ip" or "ip6")
    when known, else read from the dump (`dump_family`).

    With `lazy`, rule bodies are parsed when the tracer first reaches them (a 300k-rule dump
    loads in a fraction of the time); `Ruleset.validate()` parses the rest."""
    rs = Ruleset(source="iptables-save")
    fam = family or dump_family(text)
    table: Table | None = None
    cache: dict[Any, Any] = {}
    loader: Callable[[Rule], None] | None = None
    lineno = 0
    for raw in text.splitlines():
        lineno += 1
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        try:
            c = line[0]
            if c == "[":  # iptables-save -c: [packets:bytes] -A ...
                line = _COUNTERS.sub("", line)
                c = line[0] if line else ""
            if c == "*":
                name = line[1:].strip()
                table = rs.table(name)
                if table is None:
                    table = Table(name=name, family=fam)
                    rs.tables.append(table)
                loader = functools.partial(_load, table=table, cache=cache)
                continue
            if table is None:
                if not rs.tables and line[:3] in ("-A ", "-P ", "-N "):
                    # `iptables -S` output: no table header, the filter table
                    table = Table(name="filter", family=fam)
                    rs.tables.append(table)
                    loader = functools.partial(_load, table=table, cache=cache)
                else:
                    raise ValueError("rule or chain outside a table (missing `*filter`-style header)")
            if c == ":":
                parts = line[1:].split()
                if not parts:
                    raise ValueError("chain declaration without a name")
                ch = ensure_chain(table, parts[0])
                policy = parts[1] if len(parts) > 1 else "-"
                if policy != "-" and ch.hook is not None:
                    if policy not in ("ACCEPT", "DROP"):
                        raise ValueError(f"bad chain policy {policy!r}")
                    ch.policy = policy
                continue
            if line == "COMMIT":
                table = None
                continue
            if c == "-" and line[:3] == "-A ":
                parts = line.split(None, 2)
                if len(parts) < 2:
                    raise ValueError("rule without a chain name")
                ch = table.chains.get(parts[1]) or ensure_chain(table, parts[1])
                ch.rules.append(Rule(None, line, lineno, "", None, None, loader))
                continue
            if line.startswith(("--append ", "-I ", "--insert ")):
                toks = tokenize(line)
                if len(toks) < 2:
                    raise ValueError("rule without a chain name")
                ch = ensure_chain(table, toks[1])
                pos = None
                if toks[0] in ("-I", "--insert"):
                    pos = 0
                    if len(toks) > 2 and toks[2].isdigit():
                        pos = int(toks[2]) - 1
                rule = Rule(None, line, lineno, "", None, None, loader)
                if pos is None:
                    ch.rules.append(rule)
                else:
                    ch.rules.insert(pos, rule)
                continue
            if line.startswith(("-N ", "-P ", "-F", "-X", "-Z")):
                _command(table, line)
                continue
            raise ValueError("not an iptables-save line")
        except ParseError:
            raise
        except (ValueError, IndexError, KeyError) as e:
            reason = str(e) if not isinstance(e, (IndexError, KeyError)) else "option is missing its argument"
            raise ParseError(lineno, raw.strip(), reason) from None
    if not lazy:
        rs.validate()
    return rs


def _command(table: Table, line: str) -> None:
    """`-N`, `-P` lines that hand-written restore files use."""
    toks = line.split()
    if toks[0] == "-N" and len(toks) > 1:
        ensure_chain(table, toks[1])
    elif toks[0] == "-P" and len(toks) > 2:
        ensure_chain(table, toks[1]).policy = toks[2]


def _load(rule: Rule, table: Table, cache: dict[Any, Any]) -> None:
    """Parse one rule body; jumps to names that are neither chains nor known targets become
    UnknownTarget (partial dumps)."""
    try:
        toks = tokenize(rule.text)
        start = 2
        if toks[0] in ("-I", "--insert") and len(toks) > 2 and toks[2].isdigit():
            start = 3
        steps, target, comment = parse_rule(toks, start, cache)
    except (ValueError, IndexError, KeyError) as e:
        reason = str(e) if not isinstance(e, (IndexError, KeyError)) else "option is missing its argument"
        raise ParseError(rule.line, rule.text, reason) from None
    last = steps[-1] if steps else None
    if isinstance(last, Jump) and last.chain not in table.chains:
        steps[-1] = UnknownTarget(last.chain)
    rule.steps, rule.target, rule.comment = steps, target, comment
