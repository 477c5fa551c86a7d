"""The pure core: from a ruleset, the cluster objects and node facts to a report."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubeproxy.cluster.state import ClusterState
from kubeproxy.doctor.conntrack import conntrack_findings
from kubeproxy.doctor.cost import cost_findings
from kubeproxy.doctor.facts import NodeFacts
from kubeproxy.doctor.findings import Finding, Report, ordered
from kubeproxy.doctor.foreign import chain_findings, foreign_rule_findings, jump_findings
from kubeproxy.doctor.probe import OUR_NFT_TABLE, OUTSIDE_SOURCE, probe_all
from kubeproxy.doctor.services import service_findings, unprogrammed_findings
from kubeproxy.doctor.snat import snat_findings
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.model import Ruleset
from kubeproxy.netfilter.node import IfAddr, Node, Route
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.model import IPV4, build_view


@dataclass
class DoctorInput:
    ruleset: Ruleset
    state: ClusterState
    cfg: ProxyConfig = field(default_factory=ProxyConfig)
    node: Node = field(default_factory=Node)  # interfaces and routes, as `kubeproxy trace` takes them
    facts: NodeFacts = field(default_factory=NodeFacts)
    in_iface: str = ""  # where outside traffic arrives; default: the default route's interface
    source: str = ""  # where the rules came from, for the report


def mode_of(ruleset: Ruleset) -> str:
    return "nftables" if ruleset.source == "nft-json" or ruleset.table(OUR_NFT_TABLE) is not None else "iptables"


def _node_ips(inp: DoctorInput, node_obj: object) -> list[str]:
    ips: list[str] = []
    if inp.cfg.node_ip:
        ips.append(str(inp.cfg.node_ip))
    for kind, ip in getattr(node_obj, "addresses", ()):
        if kind in ("InternalIP", "ExternalIP") and str(ip) not in ips:
            ips.append(str(ip))
    for name, addrs in inp.node.interfaces.items():
        if name != "lo":
            ips += [A.fmt_ip(a.ip) for a in addrs if not a.v6 and A.fmt_ip(a.ip) not in ips]
    return ips


def _complete_node(node: Node, node_ips: list[str]) -> tuple[Node, list[str]]:
    """A node with no interfaces given gets one (eth0 with the node's addresses, the default route)."""
    notes: list[str] = []
    if any(name != "lo" and addrs for name, addrs in node.interfaces.items()):
        if not any(r.mask == 0 for r in node.routes):
            # Without one, a DNATed packet to a pod the routes do not name is "unroutable" and
            # its masquerade is never seen; a node always has some way out.
            iface = next(n for n, addrs in node.interfaces.items() if n != "lo" and addrs)
            node.routes.append(Route(0, 0, iface))
            notes.append(f"no default route given: assumed one via {iface}")
        return node, notes
    node.interfaces.setdefault("lo", [IfAddr(A.ip4_to_int("127.0.0.1"), 8)])
    node.interfaces["eth0"] = [IfAddr(A.ip4_to_int(ip), 32) for ip in node_ips if ":" not in ip]
    if not any(r.mask == 0 for r in node.routes):
        node.routes.append(Route(0, 0, "eth0"))
    notes.append("no --iface given: assumed one interface eth0 with the node's addresses and the default route "
                 "(rules that match interfaces may be judged wrongly; give --iface/--route or --live)")
    return node, notes


def _in_iface(node: Node, given: str) -> str:
    if given:
        return given
    for r in node.routes:
        if r.mask == 0:
            return r.iface
    return next((n for n, a in node.interfaces.items() if n != "lo" and a), "eth0")


def diagnose(inp: DoctorInput) -> Report:
    from kubeproxy import render as offline

    choice = offline.node_choice(inp.state, inp.cfg, hostname=inp.cfg.hostname_override or "")
    node_name = choice.name
    labels = dict(choice.node.labels) if choice.node is not None else {}
    node_ips = _node_ips(inp, choice.node)
    node, notes = _complete_node(inp.node, node_ips)
    inp.facts.node_ips |= set(node_ips)
    in_iface = _in_iface(node, inp.in_iface)
    mode = mode_of(inp.ruleset)
    view = build_view(inp.state.services.values(), inp.state.slices.values(), IPV4, node_name)

    probes = probe_all(inp.ruleset, node, view, node_ips, in_iface)
    findings: list[Finding] = []
    findings += snat_findings(probes, view, inp.facts, mode)
    findings += foreign_rule_findings(probes, view)
    findings += jump_findings(inp.ruleset)
    findings += chain_findings(inp.ruleset, view if inp.state.services else None)
    findings += unprogrammed_findings(probes, view, node_name, labels, inp.ruleset)
    findings += service_findings(view, node_name, labels)
    findings += conntrack_findings(inp.facts)
    findings += cost_findings(inp.ruleset)
    notes += [f"{p.name} {p.frontend}: not traced: {p.error}" for p in probes if p.error]
    notes += list(choice.warnings)
    if inp.facts.assumed:
        notes.append("kernel defaults assumed for " + ", ".join(sorted(inp.facts.assumed)))
    if inp.facts.flows is None:
        notes.append("conntrack entries not read: current SNAT use unknown (use --live)")
    inputs = {
        "rules": {"source": inp.source, "format": inp.ruleset.source, "mode": mode, "rules": inp.ruleset.rule_count()},
        "node": {"name": node_name, "how": choice.how, "addresses": node_ips, "outside_traffic_iface": in_iface,
                 "outside_source": OUTSIDE_SOURCE},
        "services": len(view.services),
        "frontends_traced": len(probes),
        "sysctls": {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(inp.facts.sysctls.items())},
        "conntrack_stats": dict(sorted(inp.facts.stats.items())),
        "conntrack_entries": None if inp.facts.flows is None else len(inp.facts.flows),
    }
    return Report(ordered(findings), inputs, notes)
