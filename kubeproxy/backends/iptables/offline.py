"""`kubeproxy render --proxy-mode iptables`: the iptables-restore input of a full sync.

A dual-stack node (kubeproxy.model.node_choice.node_families) gets the ip6tables-restore input after the
IPv4 one, under a `# ip6tables-restore` line, as the live proxy feeds each to its own tool.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.render import Rendered, render
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.contract import OfflineOptions, OfflineText
from kubeproxy.model.node_choice import choose_node, node_families, primary_family
from kubeproxy.model.node_model import NodeView, build_view
from kubeproxy.model.options import NFACCT_COUNTERS, Family, NodeOptions, node_options
from kubeproxy.model.proxy_config import ProxyConfig


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    families = node_families(cfg, choose_node(state, cfg)[1])
    sections: list[str] = []
    for family in families:
        result = render_iptables(
            state,
            cfg,
            nfacct_counters=NFACCT_COUNTERS if options.nfacct else (),
            conntrack_tcp_liberal=options.conntrack_tcp_liberal,
            family=family,
        )
        text = with_jumps(result.rendered.text) if options.with_jumps else result.rendered.text
        if len(families) > 1:
            tool = "ip6tables-restore" if family == Family.IPV6 else "iptables-restore"
            text = f"# {tool} ({family})\n{text}"
        sections.append(text)
    return OfflineText("".join(sections))


@dataclass(frozen=True)
class NodeRendering:
    view: NodeView
    options: NodeOptions
    rendered: Rendered


def render_iptables(
    state: ClusterState,
    cfg: ProxyConfig,
    *,
    nfacct_counters: Collection[str] = NFACCT_COUNTERS,
    conntrack_tcp_liberal: bool = False,
    family: Family | None = None,
) -> NodeRendering:
    """One family's rules (default: the node's primary family; see `node_families` for all)."""
    hostname, node = choose_node(state, cfg)
    family = family or primary_family(cfg, node)
    opts = node_options(
        cfg,
        family=family,
        hostname=hostname,
        node=node,
        nfacct_counters=nfacct_counters,
        conntrack_tcp_liberal=conntrack_tcp_liberal,
    )
    view = build_view(state.services.values(), state.slices.values(), family, opts.node_name)
    return NodeRendering(view, opts, render(view, opts))
