"""Ask the ruleset what it does to each service address: trace the first packet of a new flow.

Every question doctor asks about the rules goes through the tracer (kubeproxy.netfilter.simulate),
so a foreign rule, a missing jump or a hand-edited chain counts exactly as the kernel would count
it, and both dump formats are read the same way. A frontend is one address a client can use:
the ClusterIP, each external IP and load-balancer IP, and the NodePort on each node address.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kubeproxy.model.node_model import NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import Family
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ipvs import IpvsState
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import Packet
from kubeproxy.netfilter.ruleset import ParseError, Ruleset
from kubeproxy.netfilter.simulate import Hop, Outcome, Simulator, TraceError

# A client outside the cluster and the node (TEST-NET-2, and IPv6's documentation prefix): what
# external traffic looks like.
OUTSIDE_SOURCE = "198.51.100.7"
OUTSIDE_SOURCE6 = "2001:db8:5::7"
OUTSIDE_SPORT = 40000
PROTOS = {"TCP": 6, "UDP": 17, "SCTP": 132}
OUR_NFT_TABLE = "kube-proxy"
_TO_PORTS = re.compile(r"(?:--to-ports|to :)\s*(\d+)(?:-(\d+))?")


@dataclass(frozen=True)
class Frontend:
    kind: str  # "cluster IP", "external IP", "load balancer IP", "node port"
    ip: str
    port: int

    @property
    def external(self) -> bool:
        return self.kind != "cluster IP"

    @property
    def v6(self) -> bool:
        return ":" in self.ip

    @property
    def address(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.v6 else f"{self.ip}:{self.port}"

    def __str__(self) -> str:
        return f"{self.address} ({self.kind})"


@dataclass
class Probe:
    """What the rules do to a new flow from OUTSIDE_SOURCE to one frontend."""

    name: ServicePortName
    frontend: Frontend
    outcomes: list[Outcome] = field(default_factory=list)
    error: str = ""


def hostport(ip: int, port: int, v6: bool) -> str:
    """`10.0.0.1:53`, `[fd00::1]:53`: as EndpointInfo.address spells an endpoint."""
    return f"[{A.fmt_ip(ip, True)}]:{port}" if v6 else f"{A.fmt_ip(ip)}:{port}"


def ours(hop: Hop) -> bool:
    """A rule the proxy owns: a KUBE- chain in iptables, our table in nftables."""
    return hop.chain.startswith("KUBE-") or hop.table == OUR_NFT_TABLE


def is_dnat(hop: Hop) -> bool:
    return hop.target == "DNAT" or hop.target.startswith("dnat")


def is_masquerade(hop: Hop) -> bool:
    return hop.target in ("MASQUERADE", "SNAT") or hop.target.startswith(("masquerade", "snat"))


def is_drop(hop: Hop) -> bool:
    return hop.target in ("DROP", "REJECT") or hop.target.startswith(("drop", "reject"))


def masquerade_ports(hop: Hop) -> tuple[int, int] | None:
    """The port range a MASQUERADE/SNAT rule maps to, if it names one (`--to-ports`, `to :A-B`)."""
    m = _TO_PORTS.search(hop.text)
    if not m:
        return None
    lo = int(m.group(1))
    return lo, int(m.group(2) or lo)


def random_fully(hop: Hop) -> bool:
    return "--random-fully" in hop.text or "fully-random" in hop.text


def frontends(svc: ServicePortInfo, node_ips: list[str], family: Family = Family.IPV4) -> list[Frontend]:
    """The service's addresses of `family` (a view holds one family's; the node's are filtered)."""
    out = [Frontend("cluster IP", str(svc.cluster_ip), svc.port)]
    out += [Frontend("external IP", str(ip), svc.port) for ip in svc.external_ips]
    out += [Frontend("load balancer IP", str(ip), svc.port) for ip in svc.load_balancer_vips]
    if svc.node_port:
        out += [Frontend("node port", ip, svc.node_port) for ip in node_ips]
    return [f for f in out if f.v6 == family.ipv6]


def nodeport_ips(ruleset: Ruleset, node_ips: list[str], ipvs: IpvsState | None = None) -> list[str]:
    """The node addresses NodePorts answer on: in nftables mode those of the proxy's
    `nodeport-ips` set (nodePortAddresses; upstream's default there is the primary address); in
    IPVS mode those with a virtual server of their own (the proxy makes one per NodePort on each
    address nodePortAddresses selects, and none on the others); in iptables mode every node
    address (its rules match any local address)."""
    listed: set[tuple[bool, int]] = set()
    for table in ruleset.tables:
        s = table.sets.get("nodeport-ips") if table.name == OUR_NFT_TABLE else None
        if s is not None:
            listed |= {(table.family == "ip6", e) for e in s.elements if isinstance(e, int)}
    if ipvs is not None:
        listed |= {(vs.v6, vs.address) for vs in ipvs.services.values()}
    elif not listed:
        return node_ips
    return [ip for ip in node_ips if (":" in ip, A.parse_ip(ip)[0]) in listed]


def probe_all(ruleset: Ruleset, node: Node, view: NodeView, node_ips: list[str], in_iface: str,
              family: Family = Family.IPV4, ipvs: IpvsState | None = None) -> list[Probe]:
    sim = Simulator(ruleset, node, ipvs=ipvs)
    probes: list[Probe] = []
    src, _ = A.parse_ip(OUTSIDE_SOURCE6 if family.ipv6 else OUTSIDE_SOURCE)
    for name, svc in sorted(view.services.items()):
        proto = PROTOS.get(svc.protocol)
        if proto is None:
            continue
        for fe in frontends(svc, node_ips, family):
            p = Probe(name, fe)
            try:
                pkt = Packet(proto, src, A.parse_ip(fe.ip)[0], OUTSIDE_SPORT, fe.port, in_iface, v6=family.ipv6)
                p.outcomes = sim.trace(pkt).outcomes
            except (TraceError, ParseError, ValueError) as exc:
                p.error = str(exc)
            probes.append(p)
    return probes
