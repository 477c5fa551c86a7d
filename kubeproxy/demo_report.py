"""The demo's human output: what each service becomes on this node, then the rules themselves."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from kubeproxy.backends.iptables import names
from kubeproxy.backends.iptables.offline import NodeRendering
from kubeproxy.cluster.manifest_load import Loaded
from kubeproxy.lab.tables import FittingTable
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.model.topology import categorize


def show(loaded: Loaded, result: NodeRendering, cfg: ProxyConfig, console: Console | None = None) -> None:
    # Piped output (CI logs, `| less`) gets a width that fits rule text rather than 80 columns.
    console = console or Console(width=None if Console().is_terminal else 150)
    opts, view = result.options, result.view
    console.rule(f"[bold]kubeproxy demo[/]: node {opts.node_name} ({opts.node_ip or 'no IP'}), {opts.family}")
    for warning in loaded.warnings:
        console.print(f"[yellow]warning[/] {warning}")

    table = FittingTable(
        "What each service port becomes on this node",
        ("service port", "addresses", "endpoints (local*)", "entry chain", "outside traffic"),
    )
    for name in sorted(view.services):
        svc = view.services[name]
        spn, proto = str(name), svc.protocol.lower()
        eps = view.endpoints.get(name, [])
        cat = categorize(eps, svc, opts.node_name, opts.node_labels, prefer_same_node=opts.prefer_same_node)
        addresses = [f"{svc.cluster_ip}:{svc.port}/{svc.protocol}"]
        addresses += [f"ext {ip}" for ip in svc.external_ips] + [f"lb {ip}" for ip in svc.load_balancer_vips]
        if svc.node_port:
            addresses.append(f"nodePort {svc.node_port}")
        used = cat.local if svc.internal_policy_local else cat.cluster
        endpoints = "\n".join(e.address + ("*" if e.is_local else "") for e in used) or "[red]none[/]"
        if not cat.has_any:
            chain, outside = "REJECT (filter)", "refused at once"
        else:
            chain = names.local_chain(spn, proto) if svc.internal_policy_local else names.service_chain(spn, proto)
            if not svc.externally_accessible:
                outside = "-"
            elif svc.external_policy_local:
                outside = "client IP kept (Local policy)" if cat.local else "[red]dropped: no local endpoint[/]"
            else:
                outside = "[yellow]masqueraded to the node IP[/] (Cluster policy)"
        table.add_row(spn, "\n".join(addresses), endpoints, chain, outside)
    console.print(table)

    console.rule("iptables-restore input (what upstream kube-proxy would write)")
    for line in result.rendered.text.splitlines():
        console.print(_highlight(line), soft_wrap=True)
    r = result.rendered
    console.print(
        f"\n{len(view.services)} service ports, {view.total_endpoints} endpoints → "
        f"{r.filter_rules} filter rules, {r.nat_rules} nat rules, {len(r.nat_chains)} service/endpoint chains."
    )
    console.print("Try: .venv/bin/kubeproxy render --manifests kubeproxy/examples/demo.yaml --cluster-cidr 10.244.0.0/16")


def _highlight(line: str) -> Text:
    text = Text(line)
    if line.startswith(("*", "COMMIT")):
        text.stylize("bold magenta")
    elif line.startswith(":"):
        text.stylize("cyan")
    else:
        for word, style in (("REJECT", "bold red"), ("DROP", "bold red"), ("DNAT", "bold green"), ("KUBE-MARK-MASQ", "yellow")):
            text.highlight_words([word], style)
    return text
