"""The pure core: from a ruleset, the cluster objects and node facts to a report."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubeproxy.backends.ipvs.render import DUMMY_DEVICE
from kubeproxy.cluster.state import ClusterState
from kubeproxy.doctor.address_probe import OUR_NFT_TABLE, OUTSIDE_SOURCE, Probe, nodeport_ips, probe_all
from kubeproxy.doctor.conntrack import conntrack_findings
from kubeproxy.doctor.cost import cost_findings
from kubeproxy.doctor.facts import NodeFacts
from kubeproxy.doctor.findings import Finding, Report, ordered
from kubeproxy.doctor.foreign import bypass_findings, chain_findings, foreign_rule_findings, jump_findings
from kubeproxy.doctor.services import service_findings, unprogrammed_findings
from kubeproxy.doctor.snat import snat_findings
from kubeproxy.model.node_model import build_view
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ipvs import IpvsState
from kubeproxy.netfilter.node import IfAddr, Node, Route
from kubeproxy.netfilter.ruleset import Ruleset


@dataclass
class DoctorInput:
    ruleset: Ruleset
    state: ClusterState
    cfg: ProxyConfig = field(default_factory=ProxyConfig)
    node: Node = field(default_factory=Node)  # interfaces and routes, as `kubeproxy trace` takes them
    facts: NodeFacts = field(default_factory=NodeFacts)
    in_iface: str = ""  # where outside traffic arrives; default: the default route's interface
    source: str = ""  # where the rules came from, for the report
    ipvs: IpvsState | None = None  # an IPVS-mode node's virtual servers (its ipsets are in `node`)
    snat_other_flows: float = 0.0  # masqueraded new flows/s per Service besides the predicted load


def mode_of(ruleset: Ruleset) -> str:
    return "nftables" if ruleset.source == "nft-json" or ruleset.table(OUR_NFT_TABLE) is not None else "iptables"


def _node_ips(inp: DoctorInput, node_obj: object) -> list[str]:
    ips: list[str] = []
    if inp.cfg.node_ip:  # one address or a dual-stack pair (validated with the configuration)
        ips.extend(ip.strip() for ip in str(inp.cfg.node_ip).split(",") if ip.strip())
    for kind, ip in getattr(node_obj, "addresses", ()):
        if kind in ("InternalIP", "ExternalIP") and str(ip) not in ips:
            ips.append(str(ip))
    for name, addrs in inp.node.interfaces.items():
        # kube-ipvs0 holds an IPVS node's service addresses, not its own (upstream's proxier
        # takes the node's addresses from every interface but that one)
        if name not in ("lo", DUMMY_DEVICE):
            for a in addrs:
                text = A.fmt_ip(a.ip, a.v6)
                # IPv6 link-local addresses take no service traffic
                if text not in ips and not (a.v6 and text.lower().startswith("fe80:")):
                    ips.append(text)
    return ips


def _of_family(ruleset: Ruleset, family: Family) -> Ruleset:
    """The tables a packet of `family` meets: the tracer looks sets and maps up by table name,
    and both families' tables are called `kube-proxy`."""
    tables = [t for t in ruleset.tables if t.family in (family.nft, "inet")]
    return ruleset if len(tables) == len(ruleset.tables) else Ruleset(ruleset.source, tables, ruleset.notes)


def families_of(ruleset: Ruleset) -> list[Family]:
    """The families whose rules the dump holds: an ip6tables dump is IPv6, an nft ruleset may hold both."""
    fams = {t.family for t in ruleset.tables}
    out = [f for f in (Family.IPV4, Family.IPV6) if f.nft in fams or "inet" in fams]
    return out or [Family.IPV4]


def _complete_node(node: Node, node_ips: list[str]) -> tuple[Node, list[str]]:
    """A node with no interfaces given gets one (eth0 with the node's addresses, the default route)."""
    notes: list[str] = []
    if any(name != "lo" and addrs for name, addrs in node.interfaces.items()):
        for v6 in (False, True):
            if any(r.mask == 0 and r.v6 == v6 for r in node.routes):
                continue
            # Without one, a DNATed packet to a pod the routes do not name is "unroutable" and
            # its masquerade is never seen; a node always has some way out.
            iface = next((n for n, addrs in node.interfaces.items() if n != "lo" and any(a.v6 == v6 for a in addrs)), "")
            if iface:
                node.routes.append(Route(0, 0, iface, None, v6))
                notes.append(f"no {'IPv6 ' if v6 else ''}default route given: assumed one via {iface}")
        return node, notes
    node.interfaces.setdefault("lo", [IfAddr(A.ip4_to_int("127.0.0.1"), 8), IfAddr(1, 128, True)])
    node.interfaces["eth0"] = [IfAddr(A.parse_ip(ip)[0], 128 if ":" in ip else 32, ":" in ip) for ip in node_ips]
    for v6 in (False, True):
        if not any(r.mask == 0 and r.v6 == v6 for r in node.routes):
            node.routes.append(Route(0, 0, "eth0", None, v6))
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


@dataclass
class NodeContext:
    """The node the rules are judged on: its name, labels, addresses, interfaces and routes (what
    was not given, assumed and said in `notes`), and where outside traffic arrives."""

    name: str
    how: str
    labels: dict[str, str]
    node_ips: list[str]
    node: Node
    in_iface: str
    notes: list[str]
    warnings: tuple[str, ...]


def node_context(inp: DoctorInput) -> NodeContext:
    from kubeproxy.model.node_choice import node_choice

    choice = node_choice(inp.state, inp.cfg, hostname=inp.cfg.hostname_override or "")
    labels = dict(choice.node.labels) if choice.node is not None else {}
    node_ips = _node_ips(inp, choice.node)
    node, notes = _complete_node(inp.node, node_ips)
    return NodeContext(choice.name, choice.how, labels, node_ips, node, _in_iface(node, inp.in_iface), notes,
                       tuple(choice.warnings))


def diagnose(inp: DoctorInput) -> Report:
    ctx = node_context(inp)
    node_name, labels, node_ips, node, notes, in_iface = ctx.name, ctx.labels, ctx.node_ips, ctx.node, ctx.notes, ctx.in_iface
    inp.facts.node_ips |= set(node_ips)
    mode = "ipvs" if inp.ipvs is not None else mode_of(inp.ruleset)
    findings: list[Finding] = []
    probes: list[Probe] = []
    families = families_of(inp.ruleset)
    for family in families:
        view = build_view(inp.state.services.values(), inp.state.slices.values(), family, node_name)
        fam_probes = probe_all(_of_family(inp.ruleset, family), node, view, nodeport_ips(inp.ruleset, node_ips, inp.ipvs),
                               in_iface, family, inp.ipvs)
        probes += fam_probes
        found = snat_findings(fam_probes, view, inp.facts, mode, family, inp.snat_other_flows)
        found += foreign_rule_findings(fam_probes, view)
        if family == families[0]:
            found += chain_findings(inp.ruleset, view if inp.state.services else None)
        found += unprogrammed_findings(fam_probes, view, node_name, labels, inp.ruleset)
        found += service_findings(view, node_name, labels)
        # A dual-stack Service with the same problem in both families is said once.
        seen = {(f.kind, f.subject, f.title) for f in findings}
        findings += [f for f in found if (f.kind, f.subject, f.title) not in seen]
    findings += jump_findings(inp.ruleset)
    if not inp.state.services:
        findings += bypass_findings(inp.ruleset)
    findings += conntrack_findings(inp.facts)
    findings += cost_findings(inp.ruleset)
    notes += [f"{p.name} {p.frontend}: not traced: {p.error}" for p in probes if p.error]
    notes += list(ctx.warnings)
    if inp.facts.assumed:
        notes.append("kernel defaults assumed for " + ", ".join(sorted(inp.facts.assumed)))
    if inp.facts.flows is None:
        notes.append("conntrack entries not read: current SNAT use unknown (use --live)")
    inputs = {
        "rules": {"source": inp.source, "format": inp.ruleset.source, "mode": mode, "rules": inp.ruleset.rule_count()},
        "node": {"name": node_name, "how": ctx.how, "addresses": node_ips, "outside_traffic_iface": in_iface,
                 "outside_source": OUTSIDE_SOURCE},
        "families": [f.value for f in families],
        "services": len(inp.state.services),
        "frontends_traced": len(probes),
        "sysctls": {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(inp.facts.sysctls.items())},
        "conntrack_stats": dict(sorted(inp.facts.stats.items())),
        "conntrack_entries": None if inp.facts.flows is None else len(inp.facts.flows),
    }
    return Report(ordered(findings), inputs, notes)
