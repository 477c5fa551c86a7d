"""From a Service to the rules that handle it: for each of its addresses, the rules, set and map
elements and IPVS virtual servers a new flow meets, in the order it meets them, and where it ends.

The walk is the tracer's (kubeproxy.netfilter.simulate), so the order is the kernel's and every
mode the tracer reads is covered the same way: iptables (and the userspace mode's redirects, which
end at its relay: the endpoints it balances over are the objects', as its proxier chooses them),
nftables, and IPVS with its ipsets. What the walk consults without naming it (the element of a
verdict map or a selector map that matched) is added from the sets: every element whose key is
the address, or whose comment names the Service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from kubeproxy.doctor.address_probe import OUTSIDE_SOURCE, OUTSIDE_SOURCE6, OUTSIDE_SPORT, PROTOS, Frontend, frontends, hostport
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import Family
from kubeproxy.model.topology import categorize
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ipvs import IpvsState
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import Packet
from kubeproxy.netfilter.ruleset import Jump, NSet, Ruleset, Verdict
from kubeproxy.netfilter.simulate import Hop, Simulator, TraceError

_PROTO_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}


@dataclass(frozen=True)
class Step:
    """One rule (or IPVS virtual server) that acted on the flow."""

    table: str
    chain: str
    text: str
    line: int = 0


@dataclass(frozen=True)
class SetElement:
    table: str
    set: str
    text: str


@dataclass(frozen=True)
class Destination:
    """Where a share of new flows ends: an endpoint `ip:port`, or a verdict."""

    where: str
    share: Fraction
    masqueraded: bool = False


@dataclass
class AddressPath:
    """What a new flow from outside to one of the Service's addresses meets."""

    frontend: Frontend
    steps: list[Step] = field(default_factory=list)
    elements: list[SetElement] = field(default_factory=list)
    destinations: list[Destination] = field(default_factory=list)
    error: str = ""
    relay: str = ""  # the userspace mode's: its listener, where the rules redirect the flow


@dataclass
class PortExplanation:
    name: ServicePortName
    family: Family
    paths: list[AddressPath]
    health_check_node_port: int = 0


@dataclass
class Explanation:
    service: str
    ports: list[PortExplanation]


def _step(h: Hop) -> Step:
    if h.table == "ipvs":
        return Step("ipvs", h.chain, f"virtual server {h.chain} -> {h.target}" if h.rule != "-" else h.text)
    text = h.text if h.rule != "policy" else f"policy {h.target}"
    return Step(h.table, h.chain, text, h.line)


def _fmt_value(v: Any, typ: str) -> str:
    if isinstance(v, Jump):
        return f"{'goto' if v.goto else 'jump'} {v.chain}"
    if isinstance(v, Verdict):
        return v.kind.lower()
    if isinstance(v, int) and typ in ("ipv4_addr", "ipv6_addr"):
        return A.fmt_ip(v, typ == "ipv6_addr")
    if isinstance(v, int) and typ == "inet_proto":
        return _PROTO_NAMES.get(v, str(v))
    return str(v)


def _fmt_tuple(v: Any, types: tuple[str, ...] | str | None) -> str:
    if not isinstance(v, tuple):
        t = types[0] if isinstance(types, tuple) and types else (types or "")
        return _fmt_value(v, str(t))
    ts = types if isinstance(types, tuple) else ()
    return " . ".join(_fmt_value(x, ts[i] if i < len(ts) else "") for i, x in enumerate(v))


def _element_text(s: NSet, key: Any) -> str:
    text = _fmt_tuple(key, s.key_type)
    comment = s.comments.get(key)
    if comment:
        text += f' comment "{comment}"'
    if s.is_map:
        text += " : " + _fmt_tuple(s.mapping.get(key), s.data_type)
    return text


def _elements(ruleset: Ruleset, fe: Frontend, proto: int, spn: str) -> list[SetElement]:
    """The nftables elements for this address: keyed by it (`ip . proto . port`, with or without
    a selector index; `proto . nodePort` for a NodePort) or commented with the Service's name."""
    ip = A.parse_ip(fe.ip)[0]
    wanted = {(proto, fe.port)} if fe.kind == "node port" else {(ip, proto, fe.port)}
    out: list[SetElement] = []
    for table in ruleset.tables:
        for s in table.sets.values():
            keys = s.mapping if s.is_map else s.elements
            for key in keys:
                if not isinstance(key, tuple):
                    continue
                hit = key in wanted or key[:-1] in wanted
                if not hit and s.comments.get(key) == spn and fe.kind == "cluster IP" and key and key[0] == ip:
                    hit = True
                if hit:
                    out.append(SetElement(table.name, s.name, _element_text(s, key)))
    return sorted(out, key=lambda e: (e.table, e.set, e.text))


def _path(sim: Simulator, ruleset: Ruleset, svc: ServicePortInfo, fe: Frontend, in_iface: str,
          relayed: list[EndpointInfo]) -> AddressPath:
    """`relayed`: the endpoints the userspace relay balances this port over, which the rules do
    not show (they only redirect to the relay's listener)."""
    path = AddressPath(fe)
    proto = PROTOS.get(svc.protocol)
    if proto is None:
        path.error = f"protocol {svc.protocol} is not traced"
        return path
    src = A.parse_ip(OUTSIDE_SOURCE6 if fe.v6 else OUTSIDE_SOURCE)[0]
    try:
        res = sim.trace(Packet(proto, src, A.parse_ip(fe.ip)[0], OUTSIDE_SPORT, fe.port, in_iface, v6=fe.v6))
    except (TraceError, ValueError) as exc:
        path.error = str(exc)
        return path
    seen: dict[Step, None] = {}
    shares: dict[tuple[str, bool], Fraction] = {}
    for o in res.outcomes:
        for h in o.path:
            seen.setdefault(_step(h), None)
        if o.dnat is not None and any(h.target == "REDIRECT" for h in o.path):
            # Only the userspace mode redirects a Service's flows: to its relay, which opens a
            # new connection to each endpoint in turn (round robin).
            port = o.dnat[1] if o.dnat[1] is not None else fe.port
            path.relay = f"{hostport(o.dnat[0], port, o.v6)}, round robin over {len(relayed)} endpoint(s)"
            for ep in relayed:
                key = (hostport(A.parse_ip(ep.ip)[0], ep.port, o.v6), False)
                shares[key] = shares.get(key, Fraction(0)) + o.probability / len(relayed)
            if not relayed:
                key = ("not relayed (no endpoints)", False)
                shares[key] = shares.get(key, Fraction(0)) + o.probability
            continue
        if o.dnat is not None:
            port = o.dnat[1] if o.dnat[1] is not None else fe.port
            where = hostport(o.dnat[0], port, o.v6)
        elif o.verdict in ("DROP", "REJECT", "UNKNOWN", "UNTRACED"):
            where = o.verdict.lower() + (f" ({o.reject_with})" if o.reject_with else "")
        else:
            where = "not translated (" + ("delivered to the node" if o.local else o.verdict.lower()) + ")"
        key = (where, o.masquerade)
        shares[key] = shares.get(key, Fraction(0)) + o.probability
    path.steps = list(seen)
    path.elements = _elements(ruleset, fe, proto, str(svc.name))
    path.destinations = [Destination(w, p, m) for (w, m), p in sorted(shares.items(), key=lambda x: (-x[1], x[0]))]
    return path


def explain(ruleset: Ruleset, node: Node, views: dict[Family, NodeView], namespace: str, name: str,
            port: str | None, nodeport_ips: list[str], in_iface: str, ipvs: IpvsState | None = None,
            node_name: str = "") -> Explanation:
    """Every address of the Service's ports (of every family in `views`; its NodePort on each of
    `nodeport_ips`), walked as a new flow from outside the cluster (OUTSIDE_SOURCE) arriving on
    `in_iface`."""
    sim = Simulator(ruleset, node, ipvs=ipvs)
    ports: list[PortExplanation] = []
    for family, view in views.items():
        for spn, svc in sorted(view.services.items()):
            if (spn.namespace, spn.name) != (namespace, name):
                continue
            if port is not None and port not in (spn.port, str(svc.port)):
                continue
            cat = categorize(view.endpoints.get(spn, []), svc, node_name, {})
            relayed = cat.local if svc.internal_policy_local else cat.cluster  # as the userspace proxier's tables
            paths = [_path(sim, ruleset, svc, fe, in_iface, relayed) for fe in frontends(svc, nodeport_ips, family)]
            ports.append(PortExplanation(spn, family, paths, svc.health_check_node_port or 0))
    return Explanation(f"{namespace}/{name}", ports)
