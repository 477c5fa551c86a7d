"""What the proxy was told, read back from its own rules: Services and EndpointSlices rebuilt from
an iptables- or nftables-mode dump, for `doctor --rules` without the objects.

Upstream's iptables proxier comments every per-Service rule with `namespace/name:port` and what
the rule is for (`cluster IP`, `external IP`, `loadbalancer IP`, `health check node port`, `has no
endpoints`), and its chains give the rest: a Service's KUBE-SVC chain jumps to one KUBE-SEP chain
per endpoint, whose DNAT names the endpoint's address and port; a KUBE-SVL chain holds only this
node's endpoints; a KUBE-EXT chain that ends in KUBE-SVL is externalTrafficPolicy: Local; a
`recent --rcheck --seconds N` is ClientIP affinity. The result is raw objects, read through the
same gate as manifests, so what cannot be told from the rules (labels, zones, terminating
endpoints) is simply absent and said so in the notes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.cluster.state import ClusterState, build_state
from kubeproxy.doctor.address_probe import OUTSIDE_SOURCE, OUTSIDE_SOURCE6, OUTSIDE_SPORT, PROTOS
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ipvs import IpvsState
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import Packet
from kubeproxy.netfilter.ruleset import Addr, Jump, Nat, Port, Proto, Rule, Ruleset, Table, UnknownTarget
from kubeproxy.netfilter.simulate import Simulator

# The node the rules were taken from: local endpoints (those of a KUBE-SVL chain) are placed on it.
RULES_NODE = "node-of-the-rules"

_PURPOSE = re.compile(
    r"^(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)(?::(?P<port>[-a-z0-9]+))?"
    r"(?: (?P<what>cluster IP|external IP|loadbalancer IP|health check node port|has no endpoints"
    r"|has no local endpoints))?(?: -> .*)?$")
_SECONDS = re.compile(r"--seconds (\d+)")
_PROTOCOLS = {6: "TCP", 17: "UDP", 132: "SCTP"}


@dataclass
class _PortRec:
    protocol: str = ""
    port: int = 0
    node_port: int = 0
    health_check_node_port: int = 0
    cluster_ips: list[str] = field(default_factory=list)
    external_ips: list[str] = field(default_factory=list)
    lb_ips: list[str] = field(default_factory=list)
    cluster_chains: set[str] = field(default_factory=set)
    external_chains: set[str] = field(default_factory=set)
    affinity: int = 0
    external_local: bool = False
    internal_local: bool = False
    endpoints: dict[str, tuple[int, bool]] = field(default_factory=dict)  # address -> (port, on this node)
    # Chains the port's rules lead to that the dump lacks (an excerpt): its endpoints are unknown.
    unknown: list[str] = field(default_factory=list)
    rejected: bool = False  # a "has no endpoints" rule says it has none


@dataclass
class Reconstructed:
    objects: list[dict[str, Any]]
    notes: list[str]
    services: int


def _text_ip(a: Addr) -> str | None:
    full = (1 << (128 if a.v6 else 32)) - 1
    if a.neg or a.mask != full:
        return None
    return A.fmt_ip(a.net, a.v6)


def _facts(rule: Rule) -> tuple[str | None, str, int]:
    """A rule's exact destination address, protocol and destination port (if it names them)."""
    dst, proto, dport = None, "", 0
    for s in rule.load():
        if isinstance(s, Addr) and s.field == "dst" and not s.neg:
            dst = _text_ip(s)
        elif isinstance(s, Proto) and not s.neg:
            proto = _PROTOCOLS.get(s.proto, "")
        elif isinstance(s, Port) and s.field == "dport" and not s.neg and len(s.ranges) == 1:
            lo, hi = s.ranges[0]
            dport = lo if lo == hi else 0
    return dst, proto, dport


def _jump(rule: Rule) -> str:
    """The chain the rule jumps to; a KUBE- target the dump never declares (an excerpt's cut)
    counts too, so that the port it leads to is known to lack its endpoints."""
    for s in rule.load():
        if isinstance(s, Jump):
            return s.chain
        if isinstance(s, UnknownTarget) and s.name.startswith("KUBE-"):
            return s.name
    return ""


def _add(values: list[str], value: str | None) -> None:
    if value is not None and value not in values:
        values.append(value)


def _read_purpose_rules(nat: Table | None, filt: Table | None, recs: dict[tuple[str, str, str], _PortRec]) -> None:
    for table in (t for t in (nat, filt) if t is not None):
        for chain in table.chains.values():
            for rule in chain.rules:
                m = _PURPOSE.match(rule.comment or "")
                if m is None:
                    continue
                rec = recs.setdefault((m["ns"], m["name"], m["port"] or ""), _PortRec())
                dst, proto, dport = _facts(rule)
                rec.protocol = rec.protocol or proto
                what, target = m["what"] or "", _jump(rule)
                if what == "cluster IP":
                    _add(rec.cluster_ips, dst)
                    rec.port = rec.port or dport
                    # KUBE-SERVICES jumps to the service chain; inside that chain, the masquerade
                    # mark rule bears the same comment (and in an excerpt it may be all there is).
                    for svc_chain in (target, chain.name):
                        if svc_chain.startswith(("KUBE-SVC-", "KUBE-SVL-")):
                            rec.cluster_chains.add(svc_chain)
                            rec.internal_local |= svc_chain.startswith("KUBE-SVL-")
                elif what in ("external IP", "loadbalancer IP"):
                    _add(rec.external_ips if what == "external IP" else rec.lb_ips, dst)
                    rec.port = rec.port or dport
                    if target.startswith(("KUBE-EXT-", "KUBE-SVC-", "KUBE-XLB-", "KUBE-FW-")):
                        rec.external_chains.add(target)
                elif what == "health check node port":
                    rec.health_check_node_port = dport
                elif what in ("has no endpoints", "has no local endpoints"):
                    rec.rejected = True
                    if dst is not None and table.name == "filter" and chain.name in ("KUBE-SERVICES",):
                        _add(rec.cluster_ips, dst)
                        rec.port = rec.port or dport
                    if dst is None and dport and chain.name in ("KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES"):
                        rec.node_port = rec.node_port or dport
                elif chain.name == "KUBE-NODEPORTS" and table is nat:
                    rec.node_port = rec.node_port or dport
                    if target:
                        rec.external_chains.add(target)


def _endpoint_chains(nat: Table, chain_name: str, seen: set[str], missing: set[str]) -> list[tuple[str, bool]]:
    """The KUBE-SEP chains a service chain leads to, with whether each is on this node (reached
    through a KUBE-SVL chain); KUBE-EXT/FW/XLB chains are followed. A service chain the table
    lacks goes to `missing`."""
    if chain_name in seen:
        return []
    if chain_name not in nat.chains or not nat.chains[chain_name].declared:
        missing.add(chain_name)
        return []
    seen.add(chain_name)
    out: list[tuple[str, bool]] = []
    local = chain_name.startswith(("KUBE-SVL-", "KUBE-XLB-"))
    for rule in nat.chains[chain_name].rules:
        target = _jump(rule)
        if target.startswith("KUBE-SEP-"):
            out.append((target, local))
        elif target.startswith(("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-XLB-")):
            out += _endpoint_chains(nat, target, seen, missing)
    return out


def _affinity(nat: Table, chains: set[str]) -> int:
    for name in sorted(chains):
        for rule in nat.chains[name].rules if name in nat.chains else []:
            m = _SECONDS.search(rule.text) if "--rcheck" in rule.text else None
            if m is not None:
                return int(m.group(1))
    return 0


def _external_local(nat: Table, chains: set[str]) -> bool:
    for name in chains:
        if name.startswith("KUBE-XLB-"):
            return True
        if name in nat.chains and any(_jump(r).startswith(("KUBE-SVL-", "KUBE-XLB-")) for r in nat.chains[name].rules):
            return True
    return False


def _port(name: str, rec: _PortRec) -> dict[str, Any]:
    out: dict[str, Any] = {"protocol": rec.protocol or "TCP", "port": rec.port}
    if name:
        out["name"] = name
    if rec.node_port:
        out["nodePort"] = rec.node_port
    return out


def _service(ns: str, name: str, ports: dict[str, _PortRec]) -> dict[str, Any]:
    recs = list(ports.values())
    cluster_ips = [ip for r in recs for ip in r.cluster_ips]
    cluster_ips = list(dict.fromkeys(cluster_ips))
    external = list(dict.fromkeys(ip for r in recs for ip in r.external_ips))
    lbs = list(dict.fromkeys(ip for r in recs for ip in r.lb_ips))
    node_ports = any(r.node_port for r in recs)
    spec: dict[str, Any] = {
        "type": "LoadBalancer" if lbs else "NodePort" if node_ports else "ClusterIP",
        "ports": [_port(pname, r) for pname, r in sorted(ports.items())],
    }
    if cluster_ips:
        spec["clusterIP"], spec["clusterIPs"] = cluster_ips[0], cluster_ips[:2]
        spec["ipFamilies"] = ["IPv6" if ":" in ip else "IPv4" for ip in cluster_ips[:2]]
        if len(cluster_ips) > 1:
            spec["ipFamilyPolicy"] = "PreferDualStack"
    if external:
        spec["externalIPs"] = external
    if any(r.external_local for r in recs) and (node_ports or lbs or external):
        spec["externalTrafficPolicy"] = "Local"
        hc = next((r.health_check_node_port for r in recs if r.health_check_node_port), 0)
        if hc:
            spec["healthCheckNodePort"] = hc
    if any(r.internal_local for r in recs):
        spec["internalTrafficPolicy"] = "Local"
    timeout = max((r.affinity for r in recs), default=0)
    if timeout:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": timeout}}
    svc: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": ns, "name": name},
                           "spec": spec}
    if lbs:
        svc["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in lbs]}}
    return svc


def _slices(ns: str, name: str, ports: dict[str, _PortRec], node_name: str) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, int], list[tuple[str, bool]]] = {}
    for pname, r in sorted(ports.items()):
        for address, (port, local) in r.endpoints.items():
            family = "IPv6" if ":" in address else "IPv4"
            groups.setdefault((family, pname, port), []).append((address, local))
    out = []
    for i, ((family, pname, port), eps) in enumerate(sorted(groups.items())):
        protocol = ports[pname].protocol or "TCP"
        port_entry: dict[str, Any] = {"protocol": protocol, "port": port}
        if pname:
            port_entry["name"] = pname
        out.append({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
            "metadata": {"namespace": ns, "name": f"{name}-from-rules-{i}", "labels": {"kubernetes.io/service-name": name}},
            "endpoints": [{"addresses": [a], "conditions": {"ready": True, "serving": True, "terminating": False},
                           **({"nodeName": node_name} if local else {})} for a, local in sorted(eps)],
            "ports": [port_entry],
        })
    return out


def from_iptables(ruleset: Ruleset, node_name: str = RULES_NODE) -> Reconstructed:
    """The Services and EndpointSlices an iptables-mode proxy's rules were made from (both
    families when the dump holds both), and a Node for the endpoints its KUBE-SVL chains name."""
    recs: dict[tuple[str, str, str], _PortRec] = {}
    notes: list[str] = []
    nats = [t for t in ruleset.tables if t.name == "nat"]
    for nat in nats:
        filt = next((t for t in ruleset.tables if t.name == "filter" and t.family == nat.family), None)
        _read_purpose_rules(nat, filt, recs)
    for (ns, name, pname), rec in sorted(recs.items()):
        missing_in_each: list[set[str]] = []  # a chain of one family is absent from the other's table
        for nat in nats:
            rec.affinity = rec.affinity or _affinity(nat, rec.cluster_chains)
            rec.external_local |= _external_local(nat, rec.external_chains)
            seen: set[str] = set()
            missing_in_each.append(set())
            for sep, local in [e for c in sorted(rec.cluster_chains | rec.external_chains)
                               for e in _endpoint_chains(nat, c, seen, missing_in_each[-1])]:
                dnat = next((s for r in nat.chains[sep].rules for s in r.load() if isinstance(s, Nat) and s.kind == "dnat"),
                            None) if sep in nat.chains else None
                if dnat is None or not isinstance(dnat.addr, int):
                    notes.append(f"{sep} (endpoint of {ns}/{name}{':' + pname if pname else ''}) has no DNAT rule: "
                                 "its endpoint is unknown")
                    rec.unknown.append(sep)
                    continue
                address = A.fmt_ip(dnat.addr, dnat.v6 or nat.family == "ip6")
                port = dnat.port if isinstance(dnat.port, int) else rec.port
                was_local = rec.endpoints.get(address, (0, False))[1]
                rec.endpoints[address] = (port, local or was_local)
        rec.unknown += sorted(set.intersection(*missing_in_each) if missing_in_each else set())
        chains = sorted(rec.cluster_chains | rec.external_chains)
        if not rec.endpoints and not rec.unknown and not rec.rejected:
            # The proxy writes a service chain only with endpoints behind it, and a reject rule
            # without: neither means the dump was cut.
            rec.unknown.append(f"{', '.join(chains)}'s endpoint rules" if chains else "the rule that leads to its endpoints")
    return _objects(recs, notes, node_name)


def _objects(recs: dict[tuple[str, str, str], _PortRec], notes: list[str], node_name: str) -> Reconstructed:
    by_service: dict[tuple[str, str], dict[str, _PortRec]] = {}
    for (ns, name, pname), rec in recs.items():
        if rec.unknown:
            # A finding on part of its endpoints (none, a share, a bound) would be the dump's cut,
            # not the cluster's: the port is left out and said so.
            notes.append(f"{ns}/{name}{':' + pname if pname else ''}: left out, the dump lacks "
                         f"{', '.join(rec.unknown)} (an excerpt?), so its endpoints are unknown")
        elif rec.port or rec.cluster_ips:
            by_service.setdefault((ns, name), {})[pname] = rec
    objects: list[dict[str, Any]] = []
    for (ns, name), ports in sorted(by_service.items()):
        objects.append(_service(ns, name, ports))
        objects += _slices(ns, name, ports, node_name)
    if by_service:
        objects.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}, "status": {}})
        notes.insert(0, f"no --manifests or --kubeconfig: {len(by_service)} Service(s) and their endpoints read back "
                        "from the proxy's own rules (only ready endpoints are in the rules; labels, zones and "
                        "terminating endpoints are not)")
    return Reconstructed(objects, list(dict.fromkeys(notes)), len(by_service))


# nftables mode: a chain named for a service port (upstream's `service-HASH-ns/name/tcp/http`,
# `external-...`, ours for affinity) or an element comment `ns/name:port` (ours; upstream's on
# no-endpoint elements) says whose an element is.
_NFT_CHAIN = re.compile(r"^[a-z]+-[A-Z0-9]{8}-(?P<ns>[^/]+)/(?P<name>[^/]+)/(?P<proto>tcp|udp|sctp)/(?P<port>[^/_]*)$")
_NFT_PROTOCOLS = {"tcp": "TCP", "udp": "UDP", "sctp": "SCTP"}


def _nft_owner(comment: str | None, verdict: Any) -> tuple[str, str, str] | None:
    m = _PURPOSE.match(comment or "")
    if m is not None and not m["what"]:
        return m["ns"], m["name"], m["port"] or ""
    target = verdict.chain if isinstance(verdict, Jump) else ""
    c = _NFT_CHAIN.match(target)
    return (c["ns"], c["name"], c["port"]) if c is not None else None


def from_nftables(ruleset: Ruleset, node: Node, in_iface: str, node_name: str = RULES_NODE) -> Reconstructed:
    """The Services of an nftables-mode proxy's `kube-proxy` tables: their addresses and ports
    from the elements that name them, their endpoints from where a new flow to each address is
    DNATed (the tracer), those reached from outside only when the policy is Local taken as local."""
    recs: dict[tuple[str, str, str], _PortRec] = {}
    for table in ruleset.tables:
        if table.name != "kube-proxy":
            continue
        v6 = table.family == "ip6"
        cluster_ips = table.sets.get("cluster-ips")
        for set_name in ("service-ips", "no-endpoint-services", "service-nodeports", "no-endpoint-nodeports"):
            nset = table.sets.get(set_name)
            if nset is None:
                continue
            for key, verdict in nset.mapping.items():
                owner = _nft_owner(nset.comments.get(key), verdict)
                if owner is None or not isinstance(key, tuple):
                    continue
                rec = recs.setdefault(owner, _PortRec())
                if len(key) == 3:
                    ip, proto, port = key
                    rec.protocol, rec.port = _PROTOCOLS.get(proto, ""), port
                    text = A.fmt_ip(ip, v6)
                    if cluster_ips is not None and ip in cluster_ips.elements:
                        _add(rec.cluster_ips, text)
                    else:
                        _add(rec.external_ips, text)
                elif len(key) == 2:
                    proto, rec.node_port = key
                    rec.protocol = _PROTOCOLS.get(proto, "")
    sim = Simulator(ruleset, node)
    src4, _ = A.parse_ip(OUTSIDE_SOURCE)
    src6, _ = A.parse_ip(OUTSIDE_SOURCE6)
    for rec in recs.values():
        proto = PROTOS.get(rec.protocol or "TCP", 6)
        reached: dict[bool, set[tuple[str, int]]] = {False: set(), True: set()}
        for external, ips in ((False, rec.cluster_ips), (True, rec.external_ips)):
            for ip in ips:
                v6 = ":" in ip
                pkt = Packet(proto, src6 if v6 else src4, A.parse_ip(ip)[0], OUTSIDE_SPORT, rec.port, in_iface, v6=v6)
                for o in sim.trace(pkt).outcomes:
                    if o.dnat is not None:
                        reached[external].add((A.fmt_ip(o.dnat[0], v6), o.dnat[1] or rec.port))
        local_only = bool(reached[True]) and bool(reached[False]) and reached[True] < reached[False]
        rec.external_local = local_only
        for address, port in reached[False] | reached[True]:
            rec.endpoints[address] = (port, local_only and (address, port) in reached[True])
    return _objects(recs, [], node_name)


def state_from_rules(ruleset: Ruleset, mode: str, node_name: str = "", node: Node | None = None,
                     in_iface: str = "eth0", ipvs: IpvsState | None = None) -> tuple[ClusterState, list[str]]:
    """The cluster state the rules (and in IPVS mode the virtual servers and the ipsets already
    loaded into `node`) show, through the same gate as manifests, and what was said."""
    if mode not in ("iptables", "nftables") and not (mode == "ipvs" and ipvs is not None):
        return ClusterState(), [f"no --manifests or --kubeconfig: reading the Services back from {mode} rules is not "
                                "supported: service findings (SNAT capacity, foreign DNAT, endpoints) need the objects"]
    if ipvs is not None:
        from kubeproxy.doctor.reconstruct_ipvs import from_ipvs  # it builds on this module's records

        found = from_ipvs(ipvs, node or Node(), node_name or RULES_NODE)
    elif mode == "nftables":
        found = from_nftables(ruleset, node or Node(), in_iface, node_name or RULES_NODE)
    else:
        found = from_iptables(ruleset, node_name or RULES_NODE)
    if not found.services:
        lead = ("no Service of the proxy's rules could be read back whole" if found.notes
                else "no Service rules of the proxy in the dump")
        return ClusterState(), [f"no --manifests or --kubeconfig, and {lead}: service findings (SNAT capacity, "
                                "foreign DNAT, endpoints) need the objects", *found.notes]
    state, warnings = build_state(found.objects)
    return state, found.notes + [f"rules: {w}" for w in warnings]
