"""`nft -j list ruleset` JSON (libnftables schema 1), and nft text loaded through a throwaway
network namespace (`nft -f` there, then `nft -j list ruleset`), which needs root.

Literals are typed by what they are compared with: `"10.0.0.1"` against `ip daddr` is an address,
`"tcp"` against `meta l4proto` a protocol number, so that the simulator compares plain ints.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from fractions import Fraction
from typing import Any

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter import nft_xt
from kubeproxy.netfilter.ruleset import (
    Chain,
    Jump,
    Log,
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
    NSet,
    NSetLit,
    NSetMark,
    ParseError,
    Rule,
    Ruleset,
    Statistic,
    Table,
    UnknownTarget,
    Unsupported,
    Verdict,
    VMap,
)

_PRIO_NAMES = {"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}
_FAMILIES = ("ip", "ip6", "inet")


class _Bad(ValueError):
    pass


# --------------------------------------------------------------------------- typing
def type_of(e: Any) -> Any:
    t = type(e)
    if t is NPayload:
        if e.field in ("saddr", "daddr"):
            return "ipv6_addr" if e.proto == "ip6" else "ipv4_addr"
        if e.field in ("sport", "dport"):
            return "inet_service"
        if e.field in ("protocol", "nexthdr"):
            return "inet_proto"
        if e.proto in ("icmp", "icmpv6") and e.field == "type":
            return "string"  # by name (echo-request), as the walk reads it
        return "integer"
    if t is NMeta:
        return {"l4proto": "inet_proto", "iifname": "ifname", "oifname": "ifname", "iif": "ifname",
                "oif": "ifname", "mark": "mark", "nfproto": "string", "protocol": "string",
                "pkttype": "string"}.get(e.key, "integer")
    if t is NCt:
        if e.key in ("saddr", "daddr"):
            return "ipv4_addr"
        if e.key in ("proto-src", "proto-dst"):
            return "inet_service"
        return {"state": "ct_state", "status": "ct_state", "mark": "mark"}.get(e.key, "integer")
    if t is NFib:
        return "string" if e.result == "type" else "ifname"
    if t is NConcat:
        return tuple(type_of(i) for i in e.items)
    if t is NBinop:
        return type_of(e.left)
    return "integer"


def conv(v: Any, typ: Any) -> Any:
    """A JSON literal as the simulator's value for a key of type `typ`."""
    if isinstance(typ, tuple):
        if isinstance(v, dict) and "concat" in v:
            return tuple(conv(x, t) for x, t in zip(v["concat"], typ, strict=False))
        return conv(v, typ[0])
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        if typ in ("ipv4_addr", "ipv6_addr"):
            return A.parse_ip(v)[0]
        if typ == "inet_proto":
            return A.parse_proto(v)
        if typ == "inet_service":
            return A.parse_port(v)
        if typ in ("mark", "integer"):
            return int(v, 0)
        if typ == "ct_state":
            return frozenset([v.lower()])
        return v
    if isinstance(v, list):
        if typ == "ct_state":
            return frozenset(x.lower() for x in v)
        return frozenset(conv(x, typ) for x in v)
    if isinstance(v, dict) and "concat" in v:
        return tuple(conv(x, "integer") for x in v["concat"])
    raise _Bad(f"cannot read value {json.dumps(v)}")


def _interval(v: Any, typ: Any) -> tuple[Any, Any] | None:
    """A prefix or range literal as (lo, hi); None if `v` is a single value."""
    if isinstance(v, dict):
        if "prefix" in v:
            p = v["prefix"]
            net, mask, v6 = A.parse_cidr(f"{p['addr']}/{p['len']}")
            full = A.ALL6 if v6 else A.ALL4
            return net, net | (~mask & full)
        if "range" in v:
            lo, hi = v["range"]
            return conv(lo, typ), conv(hi, typ)
        if "concat" in v and isinstance(typ, tuple):
            los, his, any_iv = [], [], False
            for x, t in zip(v["concat"], typ, strict=False):
                iv = _interval(x, t)
                if iv is None:
                    c = conv(x, t)
                    los.append(c)
                    his.append(c)
                else:
                    any_iv = True
                    los.append(iv[0])
                    his.append(iv[1])
            return (tuple(los), tuple(his)) if any_iv else None
    return None


def _elem_val(x: Any) -> Any:
    if isinstance(x, dict) and "elem" in x:
        return x["elem"]["val"]
    return x


def _verdict(d: Any) -> Any:
    if isinstance(d, str):
        d = {d: None}
    if not isinstance(d, dict):
        raise _Bad(f"not a verdict: {json.dumps(d)}")
    if "goto" in d:
        return Jump(d["goto"]["target"], goto=True)
    if "jump" in d:
        return Jump(d["jump"]["target"])
    for k in ("accept", "drop", "return", "queue"):
        if k in d:
            return Verdict(k.upper())  # type: ignore[arg-type]
    if "continue" in d:
        return Noop("continue")
    raise _Bad(f"not a verdict: {json.dumps(d)}")


def _data(v: Any, typ: Any) -> Any:
    if typ == "verdict":
        return _verdict(v)
    if typ is None:  # anonymous map: guess from the literal
        if isinstance(v, dict) and "concat" in v:
            return tuple(_data(x, None) for x in v["concat"])
        if isinstance(v, dict):
            return _verdict(v)
        if isinstance(v, str) and re.fullmatch(r"[\d.]+|[0-9a-fA-F:]+:[0-9a-fA-F:.]*", v):
            return A.parse_ip(v)[0]
        return v
    return conv(v, typ)


def _comments(elems: list[Any], key_t: Any, is_map: bool) -> dict[Any, str]:
    """Element comments by key (the proxy's name the Service an element is for)."""
    out: dict[Any, str] = {}
    for el in elems:
        head = el[0] if is_map else el
        if isinstance(head, dict) and isinstance(head.get("elem"), dict) and head["elem"].get("comment"):
            key = head["elem"]["val"]
            if _interval(key, key_t) is None:
                out[conv(key, key_t)] = str(head["elem"]["comment"])
    return out


def _fill(container: dict[Any, Any] | NSetLit | NSet, elems: list[Any], key_t: Any, data_t: Any,
          is_map: bool) -> Any:
    values: set[Any] = set()
    intervals: list[tuple[Any, Any]] = []
    mapping: dict[Any, Any] = {}
    imapping: list[tuple[Any, Any, Any]] = []
    for el in elems:
        if is_map:
            k, d = el
            k = _elem_val(k)
            data = _data(d, data_t)
            iv = _interval(k, key_t)
            if iv is None:
                mapping[conv(k, key_t)] = data
            else:
                imapping.append((iv[0], iv[1], data))
        else:
            el = _elem_val(el)
            iv = _interval(el, key_t)
            if iv is None:
                c = conv(el, key_t)
                if isinstance(c, frozenset):
                    values |= c
                else:
                    values.add(c)
            else:
                intervals.append(iv)
    return values, intervals, mapping, imapping


# --------------------------------------------------------------------------- expressions
def expr(e: Any) -> Any:
    if isinstance(e, dict):
        if "payload" in e:
            p = e["payload"]
            if "protocol" not in p:
                raise _Bad("raw payload expressions are not supported")
            return NPayload(p["protocol"], p["field"])
        if "meta" in e:
            return NMeta(e["meta"]["key"])
        if "ct" in e:
            return NCt(e["ct"]["key"], e["ct"].get("dir"))
        if "fib" in e:
            f = e["fib"]
            return NFib(tuple(f.get("flags", [])), f["result"])
        if "numgen" in e:
            n = e["numgen"]
            if n.get("mode", "random") != "random":
                # inc (round robin) over a connection's first packet: each value equally often
                pass
            return NNumgen(int(n["mod"]), int(n.get("offset", 0)), n.get("mode", "random"))
        if "concat" in e:
            return NConcat(tuple(expr(i) for i in e["concat"]))
        if "map" in e:
            m = e["map"]
            key = expr(m["key"])
            data = m["data"]
            if isinstance(data, str) and data.startswith("@"):
                return NLookup(key, data[1:])
            if isinstance(data, dict) and "set" in data:
                _, _, mapping, imapping = _fill({}, data["set"], type_of(key), None, True)
                for lo, hi, d in imapping:
                    mapping[("interval", lo, hi)] = d
                return NLookup(key, mapping)
            raise _Bad(f"map data {json.dumps(data)}")
        for op in ("&", "|", "^", "<<", ">>"):
            if op in e:
                left, right = e[op]
                return NBinop(op, expr(left), expr(right))
        if "symhash" in e or "jhash" in e:
            h = e.get("jhash") or e.get("symhash") or {}  # neither: the KeyError below is the parse error
            return NNumgen(int(h["mod"]), int(h.get("offset", 0)), "hash")
        raise _Bad(f"unsupported expression {json.dumps(e)[:120]}")
    return NConst(e)


def _rhs(r: Any, left: Any) -> Any:
    typ = type_of(left)
    if isinstance(r, str) and r.startswith("@"):
        return NSetLit(r[1:])
    if isinstance(r, dict) and "set" in r:
        values, intervals, _, _ = _fill({}, r["set"], typ, None, False)
        return NSetLit(None, frozenset(values), tuple(intervals))
    iv = _interval(r, typ)
    if iv is not None:
        return ("range", iv[0], iv[1])
    if isinstance(r, dict) and "concat" not in r:
        return expr(r)
    return NConst(conv(r, typ))


def _match(m: dict[str, Any]) -> NMatch | Statistic | Unsupported:
    left = expr(m["left"])
    op = m.get("op", "==")
    right = _rhs(m["right"], left)
    if op == "in" and isinstance(right, NConst) and not isinstance(right.value, frozenset):
        # `ct status dnat` / `tcp flags syn`: flag tests; for us membership of one value
        right = NConst(frozenset([right.value]))
    chance = _random_chance(left, op, right)
    if chance is not None:
        return Statistic(chance)
    why = _untraceable(left)
    if why is not None:
        return Unsupported(f"{_fmt_match(m)} ({why})")
    return NMatch(op, left, right, _fmt_match(m))


# What the walk (simulate/nft.py) computes for a packet; any other key would read as "no value"
# and quietly fail the match, where the kernel may match: such a match forks as unknown instead.
_PAYLOAD_FIELDS = {
    "ip": {"saddr", "daddr", "protocol", "version"},
    "ip6": {"saddr", "daddr", "nexthdr", "version"},
    "icmp": {"type"},
    "icmpv6": {"type"},
}
_PORT_HEADERS = ("th", "tcp", "udp", "sctp", "udplite", "dccp")
_META_KEYS = {"l4proto", "iifname", "iif", "oifname", "oif", "mark", "nfproto", "protocol", "pkttype"}
_CT_KEYS = {"state", "status", "mark", "daddr", "saddr", "proto-dst", "proto-src"}
_FIB_RESULTS = {"type", "oif", "oifname"}


def _untraceable(e: Any) -> str | None:
    """The part of an expression the walk cannot compute, named; None when it can."""
    t = type(e)
    if t is NPayload:
        fields = {"dport", "sport"} if e.proto in _PORT_HEADERS else _PAYLOAD_FIELDS.get(e.proto, set())
        return None if e.field in fields else f"{e.proto} {e.field} is not traced"
    if t is NMeta:
        return None if e.key in _META_KEYS else f"meta {e.key} is not traced"
    if t is NCt:
        if e.key not in _CT_KEYS:
            return f"ct {e.key} is not traced"
        return "reply-direction tuples are not traced" if e.dir == "reply" else None
    if t is NFib:
        return None if e.result in _FIB_RESULTS else f"fib {e.result} is not traced"
    if t is NBinop:
        return _untraceable(e.left) or _untraceable(e.right)
    if t is NConcat:
        return next((w for w in map(_untraceable, e.items) if w is not None), None)
    if t is NLookup:
        return _untraceable(e.key)
    return None


def _random_chance(left: Any, op: str, right: Any) -> Fraction | None:
    """`meta random [& 2^k-1] OP N`, as nft prints iptables' `-m statistic --mode random`: the
    chance that a packet matches, or None when the match is something else."""
    mask = (1 << 32) - 1
    if isinstance(left, NBinop) and left.op == "&" and isinstance(left.right, NConst):
        mask, left = left.right.value, left.left
        if not isinstance(mask, int) or mask < 0 or (mask + 1) & mask:
            return None  # a mask that is not 2^k-1 keeps its values apart: left to the unknown fork
    if not (isinstance(left, NMeta) and left.key == "random"):
        return None
    n = right.value if isinstance(right, NConst) else right
    if not isinstance(n, int) or isinstance(n, bool):
        return None
    size = mask + 1

    def below(k: int) -> int:  # how many values in [0, size) are < k
        return min(max(k, 0), size)

    counts = {
        "<": below(n), "<=": below(n + 1), ">": size - below(n + 1), ">=": size - below(n),
        "==": below(n + 1) - below(n), "!=": size - (below(n + 1) - below(n)),
    }
    return Fraction(counts[op], size) if op in counts else None


def _nat(kind: str, d: Any) -> Nat:
    d = d or {}
    addr = d.get("addr")
    port = d.get("port")
    fam = d.get("family", "ip")
    a: Any = None
    if addr is not None:
        a = A.parse_ip(addr)[0] if isinstance(addr, str) else expr(addr)
    p: Any = None
    p_hi = None
    if port is not None:
        if isinstance(port, int):
            p = port
        elif isinstance(port, dict) and "range" in port:
            p, p_hi = int(port["range"][0]), int(port["range"][1])
        else:
            p = expr(port)
    return Nat(kind, a, p, p_hi, fam == "ip6")  # type: ignore[arg-type]


def statement(s: dict[str, Any]) -> Any:
    (k, v), = s.items()
    if k == "match":
        return _match(v)
    if k in ("accept", "drop", "return", "queue"):
        return Verdict(k.upper())  # type: ignore[arg-type]
    if k == "continue":
        return Noop("continue")
    if k == "reject":
        v = v or {}
        detail = v.get("expr") or ("tcp reset" if v.get("type") == "tcp reset" else "port-unreachable")
        return Verdict("REJECT", str(detail))
    if k in ("jump", "goto"):
        return Jump(v["target"], goto=k == "goto")
    if k == "vmap":
        key = expr(v["key"])
        data = v["data"]
        if isinstance(data, str) and data.startswith("@"):
            return VMap(key, data[1:])
        _, _, mapping, imapping = _fill({}, data["set"], type_of(key), "verdict", True)
        for lo, hi, d in imapping:
            mapping[("interval", lo, hi)] = d
        return VMap(key, mapping)
    if k == "mangle":
        key = expr(v["key"])
        val = expr(v["value"])
        if isinstance(key, NMeta) and key.key == "mark":
            return NSetMark(False, val.value if isinstance(val, NConst) else val)
        if isinstance(key, NCt) and key.key == "mark":
            return NSetMark(True, val.value if isinstance(val, NConst) else val)
        return UnknownTarget(f"{_fmt(v['key'])} set {_fmt(v['value'])}")
    if k in ("dnat", "snat", "masquerade", "redirect"):
        return _nat(k, v)
    if k in ("counter", "limit", "quota", "meter", "set", "ct helper", "ct timeout", "ct expectation",
             "synproxy", "secmark", "tproxy", "dup", "fwd", "flow"):
        if k in ("tproxy", "dup", "fwd", "flow"):
            return UnknownTarget(k)
        return Noop(k)
    if k == "log":
        return Log((v or {}).get("prefix", ""))
    if k == "notrack":
        return Notrack()
    if k == "xt":
        name = v.get("name", "?")
        if v.get("type") != "target" and name == "comment":
            return Noop("comment")  # whatever its text, it matches every packet
        if v.get("type") == "target":
            return UnknownTarget(f"xt target {name} (translated from iptables; use iptables-save instead)")
        return Unsupported(f"xt match {name} (translated from iptables; use iptables-save instead)")
    raise _Bad(f"unsupported statement {k!r}")


# --------------------------------------------------------------------------- text
def _fmt(e: Any) -> str:
    if isinstance(e, dict):
        if "payload" in e:
            return f"{e['payload'].get('protocol', 'raw')} {e['payload'].get('field', '')}".strip()
        if "meta" in e:
            return f"meta {e['meta']['key']}"
        if "ct" in e:
            return f"ct {e['ct']['key']}"
        if "fib" in e:
            return f"fib {' . '.join(e['fib'].get('flags', []))} {e['fib']['result']}"
        if "numgen" in e:
            return f"numgen {e['numgen'].get('mode', 'random')} mod {e['numgen']['mod']}"
        if "concat" in e:
            return " . ".join(_fmt(i) for i in e["concat"])
        if "prefix" in e:
            return f"{e['prefix']['addr']}/{e['prefix']['len']}"
        if "range" in e:
            return f"{_fmt(e['range'][0])}-{_fmt(e['range'][1])}"
        if "set" in e:
            items = e["set"] if isinstance(e["set"], list) else [e["set"]]
            return "{ " + ", ".join(
                f"{_fmt(i[0])} : {_fmt(i[1])}" if isinstance(i, list) else _fmt(i) for i in items
            ) + " }"
        if "map" in e:
            return f"{_fmt(e['map']['key'])} map {_fmt(e['map']['data'])}"
        for op in ("&", "|", "^"):
            if op in e:
                r = e[op][1]
                return f"{_fmt(e[op][0])} {op} {hex(r) if isinstance(r, int) else _fmt(r)}"
        if "goto" in e:
            return f"goto {e['goto']['target']}"
        if "jump" in e:
            return f"jump {e['jump']['target']}"
        if "elem" in e:
            return _fmt(e["elem"]["val"])
        if len(e) == 1:
            k = next(iter(e))
            return k if e[k] is None else f"{k} {_fmt(e[k])}"
        return json.dumps(e)
    if isinstance(e, list):
        return ",".join(_fmt(i) for i in e)
    return str(e)


def _fmt_match(m: dict[str, Any]) -> str:
    op = m.get("op", "==")
    plain = op in ("==", "in") and not any(k in m["left"] for k in ("&", "|", "^"))
    sep = " " if plain else f" {op} "
    return f"{_fmt(m['left'])}{sep}{_fmt(m['right'])}"


def _fmt_stmt(s: dict[str, Any]) -> str:
    (k, v), = s.items()
    if k == "match":
        return _fmt_match(v)
    if k == "vmap":
        return f"{_fmt(v['key'])} vmap {_fmt(v['data'])}"
    if k in ("jump", "goto"):
        return f"{k} {v['target']}"
    if k == "mangle":
        return f"{_fmt(v['key'])} set {_fmt(v['value'])}"
    if k in ("dnat", "snat"):
        v = v or {}
        to = _fmt(v.get("addr", "")) + (f":{_fmt(v['port'])}" if "port" in v else "")
        return f"{k} to {to}"
    if k == "counter":
        return "counter"
    if v is None or v == {}:
        return k
    if k == "reject":
        return "reject" + (f" with {v.get('type', '')} {v.get('expr', '')}".rstrip() if v else "")
    if k == "masquerade":
        return "masquerade" + (f" {v['flags']}" if isinstance(v, dict) and "flags" in v else "")
    if k == "xt":
        return f"xt {v.get('type', '')} {v.get('name', '')}"
    return f"{k} {_fmt(v)}"


def _short_target(s: dict[str, Any]) -> str:
    (k, v), = s.items()
    if k in ("jump", "goto"):
        return f"{k} {v['target']}"
    if k == "vmap":
        d = v["data"]
        return f"vmap {d}" if isinstance(d, str) else "vmap"
    if k in ("dnat", "snat", "masquerade", "redirect", "mangle", "match"):
        return _fmt_stmt(s) if k != "match" else ""
    return k


# --------------------------------------------------------------------------- document
def parse(text: str) -> Ruleset:
    """Parse `nft -j list ruleset` output."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        line = text.splitlines()[e.lineno - 1] if text.splitlines() else ""
        raise ParseError(e.lineno, line.strip()[:120], f"not JSON: {e.msg}") from None
    except RecursionError:  # the decoder's own bound on nesting, far below what a ruleset needs
        raise ParseError(1, text.strip()[:120], "JSON nested too deeply to be `nft -j list ruleset` output") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nftables"), list):
        raise ParseError(1, text.strip()[:120], 'not `nft -j list ruleset` output (no "nftables" list)')
    try:
        return parse_objects(doc["nftables"])
    except RecursionError:
        # The decoder bounds nesting (~1,000 levels); the walk of expressions takes a few frames per
        # level, so input nested within that bound may still exceed the stack: refused the same way.
        # (A walk to measure the depth first would cost a third of the decode on a big dump.)
        raise ParseError(1, text.strip()[:120], "JSON nested too deeply to be `nft -j list ruleset` output") from None


def parse_objects(objs: list[Any]) -> Ruleset:
    rs = Ruleset(source="nft")
    tables: dict[tuple[str, str], Table] = {}
    skipped: set[str] = set()
    xt = False

    def table_of(fam: str, name: str) -> Table | None:
        if fam not in _FAMILIES:
            skipped.add(f"{fam} {name}")
            return None
        t = tables.get((fam, name))
        if t is None:
            t = tables[(fam, name)] = Table(name=name, family=fam)
            rs.tables.append(t)
        return t

    pending_rules: list[tuple[int, dict[str, Any]]] = []
    for n, obj in enumerate(objs, 1):
        if not isinstance(obj, dict) or len(obj) != 1:
            raise ParseError(n, json.dumps(obj)[:120], "expected one object per list item", unit="object")
        (kind, body), = obj.items()
        try:
            if kind in ("metainfo", "flowtable", "counter", "quota", "ct helper", "limit", "secmark",
                        "synproxy", "ct timeout", "ct expectation"):
                continue
            if kind == "table":
                table_of(body["family"], body["name"])
            elif kind == "chain":
                t = table_of(body["family"], body["table"])
                if t is None:
                    continue
                ch = t.chains.get(body["name"]) or Chain(name=body["name"])
                t.chains[ch.name] = ch
                if "hook" in body:
                    ch.hook = body["hook"]
                    prio = body.get("prio", 0)
                    ch.priority = _PRIO_NAMES.get(prio, 0) if isinstance(prio, str) else int(prio)
                    ch.policy = str(body.get("policy", "accept")).upper()
                    ch.type = body.get("type", "filter")
            elif kind in ("set", "map"):
                t = table_of(body["family"], body["table"])
                if t is None:
                    continue
                key_t = body["type"]
                key_t = tuple(key_t) if isinstance(key_t, list) else key_t
                data_t = body.get("map") if kind == "map" else None
                # nft 1.0.6 prints a concatenated data type as one string ("ipv4_addr . inet_service"),
                # where it prints a concatenated key type as a list.
                if isinstance(data_t, str) and " . " in data_t:
                    data_t = data_t.split(" . ")
                if isinstance(data_t, list):
                    data_t = tuple(data_t)
                s = NSet(body["name"], key_t if isinstance(key_t, tuple) else (key_t,), kind == "map", data_t)
                values, intervals, mapping, imapping = _fill(s, body.get("elem", []), key_t, data_t, kind == "map")
                s.elements, s.intervals, s.mapping, s.interval_mapping = values, intervals, mapping, imapping
                s.comments = _comments(body.get("elem", []), key_t, kind == "map")
                t.sets[s.name] = s
            elif kind == "rule":
                pending_rules.append((n, body))
            elif kind == "element":
                pass
            else:
                raise _Bad(f"unknown object {kind!r}")
        except ParseError:
            raise
        except (_Bad, ValueError, KeyError, TypeError) as e:
            raise ParseError(n, json.dumps(obj)[:160], _reason(e), unit="object") from None
    for n, body in pending_rules:
        try:
            t = table_of(body["family"], body["table"])
            if t is None:
                continue
            found = t.chains.get(body["chain"])
            if found is None:
                found = t.chains[body["chain"]] = Chain(name=body["chain"], declared=False)
            ch = found
            exprs = body.get("expr", [])
            steps = [statement(s) for s in exprs]
            xt = xt or any("xt" in s for s in exprs)
            text = " ".join(_fmt_stmt(s) for s in exprs if "counter" not in s)
            target = next((_short_target(s) for s in reversed(exprs) if "counter" not in s), "")
            if body.get("comment"):
                text += f' comment "{body["comment"]}"'
            ch.rules.append(Rule(steps, text, 0, target or "(match only)", body.get("comment")))
        except (_Bad, ValueError, KeyError, TypeError) as e:
            raise ParseError(n, json.dumps({"rule": body})[:160], _reason(e), unit="object") from None
    if skipped:
        rs.notes.append(f"tables of families the tracer does not walk were skipped: {', '.join(sorted(skipped))}")
    if xt:
        rs.notes.append("some rules are iptables-nft translations (xt expressions) whose arguments nft -j "
                        "does not show; trace the iptables-save output of that host instead")
    return rs


def _reason(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    return str(e)


# --------------------------------------------------------------------------- nft text
_NFT_ERR = re.compile(r"^[^:\n]*:(\d+):[\d-]+: Error: (.*)$", re.M)


def parse_text(text: str) -> Ruleset:
    """nft text: loaded with `nft -f` into a throwaway network namespace, read back as JSON.
    Needs root (and never touches the host's own ruleset)."""
    if os.geteuid() != 0:
        raise ParseError(1, "", "reading nft text needs root (it is loaded into a throwaway network "
                         "namespace); give `nft -j list ruleset` output instead")
    name = f"kp-nftparse-{os.getpid()}-{secrets.token_hex(3)}"
    loadable, xt = nft_xt.strip(text)
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        load = subprocess.run(["ip", "netns", "exec", name, "nft", "-f", "-"], input=loadable,
                              capture_output=True, text=True, timeout=60)
        if load.returncode != 0:
            m = _NFT_ERR.search(load.stderr)
            lines = text.splitlines()
            if m:
                ln = int(m.group(1))
                raise ParseError(ln, lines[ln - 1].strip() if 0 < ln <= len(lines) else "", m.group(2))
            raise ParseError(1, lines[0].strip() if lines else "", load.stderr.strip() or "nft -f failed")
        out = subprocess.run(["ip", "netns", "exec", name, "nft", "-j", "list", "ruleset"],
                             capture_output=True, text=True, timeout=60, check=True)
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    rs = parse(out.stdout)
    rs.source = "nft"
    nft_xt.restore(rs, xt)
    return rs
