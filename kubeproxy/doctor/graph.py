"""`kubeproxy graph`: the proxy's chains as a DOT graph, as seed 001 draws them by hand.

iptables: KUBE-SERVICES (and KUBE-NODEPORTS) -> KUBE-SVC/EXT/FW/SVL -> KUBE-SEP with the share of
new flows each jump gets (the statistic rules read in order), the KUBE-MARK-MASQ jumps (dashed,
orange) and each endpoint's DNAT. nftables: the same through our maps (`service-ips`,
`service-nodeports`, the numgen vmaps), from `nft -j list ruleset`. Pure: text in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ruleset import Jump, Nat, NNumgen, Rule, Ruleset, Statistic, Table, VMap

ROOTS_IPT = ("PREROUTING", "OUTPUT", "KUBE-SERVICES", "KUBE-NODEPORTS", "POSTROUTING", "KUBE-POSTROUTING")
# Only these are filtered by the Service's comment; the others are shared by every Service.
FILTERED = ("KUBE-SERVICES", "KUBE-NODEPORTS", "services")
ROOTS_NFT = ("nat-prerouting", "nat-output", "services", "nat-postrouting")
MASQ_CHAINS = ("KUBE-MARK-MASQ", "mark-for-masquerade")
_COMMENT = re.compile(r'-m comment --comment (?:"[^"]*"|\S+)\s*')
_NOISE = re.compile(r"-m (?:tcp|udp|sctp)\s+|-A \S+\s*|-[jg] \S+.*$")


class GraphError(ValueError):
    pass


@dataclass
class Edge:
    src: str
    dst: str
    label: str = ""
    masq: bool = False


@dataclass
class Graph:
    nodes: dict[str, str] = field(default_factory=dict)  # name -> label
    edges: list[Edge] = field(default_factory=list)

    def dot(self, title: str) -> str:
        out = [f"digraph {_q(title)} {{", "  rankdir=LR;", '  node [shape=box, fontname="monospace", fontsize=10];',
               '  edge [fontname="monospace", fontsize=9];']
        for name, label in self.nodes.items():
            style = ""
            if name in MASQ_CHAINS:
                style = ', style=filled, fillcolor="#ffd8a8"'
            elif name.startswith(("KUBE-SEP-", "endpoint-")):
                style = ', style=filled, fillcolor="#d3f9d8"'
            elif name.startswith(("KUBE-SVC-", "KUBE-SVL-", "service-")):
                style = ', style=filled, fillcolor="#d0ebff"'
            elif name.startswith(("KUBE-EXT-", "KUBE-FW-", "external-", "firewall-")):
                style = ', style=filled, fillcolor="#fff3bf"'
            out.append(f"  {_q(name)} [label={_q(label)}{style}];")
        for e in self.edges:
            attrs = [f"label={_q(e.label)}"] if e.label else []
            if e.masq:
                attrs += ["style=dashed", 'color="#e8590c"']
            out.append(f"  {_q(e.src)} -> {_q(e.dst)}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
        out.append("}")
        return "\n".join(out) + "\n"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _cond(rule: Rule) -> str:
    text = _COMMENT.sub("", rule.text)
    text = _NOISE.sub("", text).strip()
    return text[:80]


def _comment_matches(rule: Rule, service: str | None) -> bool:
    if service is None:
        return True
    c = rule.comment or ""
    m = re.search(r'--comment (?:"([^"]*)"|(\S+))', rule.text)
    c = c or (m.group(1) or m.group(2) if m else "")
    return c == service or c.startswith((service + ":", service + " "))


def _fmt_pct(p: Fraction) -> str:
    return f"{float(p):.1%}".replace(".0%", "%")


def _targets(rule: Rule, table: Table) -> list[tuple[str, str]]:
    """(chain, label) for every jump a rule can make, through verdict maps too."""
    out: list[tuple[str, str]] = []
    for step in rule.load():
        if isinstance(step, Jump):
            out.append((step.chain, ""))
        elif isinstance(step, VMap):
            mapping = step.map if isinstance(step.map, dict) else (table.sets[step.map].mapping if step.map in table.sets else {})
            numgen = step.key if isinstance(step.key, NNumgen) else None
            for key, verdict in mapping.items():
                if isinstance(verdict, Jump):
                    label = _fmt_pct(Fraction(1, numgen.mod)) if numgen else _fmt_key(key)
                    out.append((verdict.chain, label))
    return out


def _fmt_key(key: object) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    shown = []
    for p in parts:
        if isinstance(p, int) and p > 65535:
            shown.append(A.fmt_ip(p))
        elif isinstance(p, int) and p in (6, 17, 132) and len(parts) > 1 and p is parts[-2]:
            shown.append({6: "tcp", 17: "udp", 132: "sctp"}[p])
        else:
            shown.append(str(p))
    return " . ".join(shown)


def _endpoint_label(name: str, rules: Iterable[Rule]) -> str:
    for r in rules:
        for step in r.load():
            if isinstance(step, Nat) and step.kind == "dnat" and isinstance(step.addr, int):
                port = f":{step.port}" if isinstance(step.port, int) else ""
                return f"{name}\nDNAT {A.fmt_ip(step.addr)}{port}"
    return name


def build(ruleset: Ruleset, service: str | None = None) -> Graph:
    """The graph of the whole node, or of one Service (`namespace/name`)."""
    nft = ruleset.table("kube-proxy")
    if nft is not None:
        return _walk(nft, ROOTS_NFT, service, nft_names=True)
    nat = ruleset.table("nat")
    if nat is None or "KUBE-SERVICES" not in nat.chains:
        raise GraphError("no kube-proxy rules in this dump (no nat KUBE-SERVICES chain and no kube-proxy nft table)")
    return _walk(nat, ROOTS_IPT, service, nft_names=False)


def _walk(table: Table, roots: tuple[str, ...], service: str | None, *, nft_names: bool) -> Graph:
    g = Graph()
    todo = [r for r in roots if r in table.chains]
    seen: set[str] = set()
    svc_prefix = None
    if service is not None and nft_names:
        svc_prefix = "/" + service.replace("/", "/") + "/"  # nft chain names: service-HASH-ns/name/proto/port
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        chain = table.chains.get(name)
        if chain is None:
            g.nodes[name] = f"{name}\n(not in the dump)"
            continue
        g.nodes[name] = _endpoint_label(name, chain.rules) if name.startswith(("KUBE-SEP-", "endpoint-")) else name
        remaining = Fraction(1)
        for rule in chain.rules:
            top = name in FILTERED
            if top and not nft_names and not _comment_matches(rule, service) and rule.target not in FILTERED:
                continue
            stat = next((s for s in rule.load() if isinstance(s, Statistic) and s.mode == "random"), None)
            nat = next((s for s in rule.load() if isinstance(s, Nat) and s.kind in ("masquerade", "snat")), None)
            if nat is not None and not (service is not None and name in ("POSTROUTING",)):
                g.nodes.setdefault(nat.kind.upper(), nat.kind.upper() + ("\n(fully random)" if "random" in rule.text else ""))
                g.edges.append(Edge(name, nat.kind.upper(), _cond(rule) if not nft_names else rule.text[:80], True))
            for dst, label in _targets(rule, table):
                if top and svc_prefix is not None and dst not in roots and svc_prefix not in "/" + dst.split("-", 2)[-1] + "/":
                    continue
                if dst in ("PREROUTING", "OUTPUT", "POSTROUTING"):
                    continue
                if service is not None and name in ("PREROUTING", "OUTPUT", "POSTROUTING") and not dst.startswith("KUBE-"):
                    continue  # others' jumps from the built-in chains: kept in the whole-node graph only
                masq = dst in MASQ_CHAINS
                if not label:
                    cond = _cond(rule) if not nft_names else rule.text[:80].rsplit(" jump", 1)[0].rsplit(" goto", 1)[0]
                    if name.startswith(("KUBE-SVC-", "KUBE-SVL-")) and not masq and "recent" not in rule.text:
                        share = remaining * (stat.probability if stat else 1)
                        remaining -= share
                        label = _fmt_pct(share)
                    else:
                        label = cond
                g.edges.append(Edge(name, dst, label, masq))
                todo.append(dst)
    per_service = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-", "service-", "external-", "endpoint-")
    if service is not None and not any(e.dst.startswith(per_service) for e in g.edges):
        raise GraphError(f"no rules for Service {service} in this dump")
    # Drop root chains that lead nowhere for this service (keeps a one-service graph small).
    used = {e.src for e in g.edges} | {e.dst for e in g.edges}
    g.nodes = {n: label for n, label in g.nodes.items() if n in used}
    return g
