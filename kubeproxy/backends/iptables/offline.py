"""`kubeproxy render --proxy-mode iptables`: the iptables-restore input of a full sync.

A dual-stack node (kubeproxy.node_render.node_families) gets the ip6tables-restore input after the
IPv4 one, under a `# ip6tables-restore` line, as the live proxy feeds each to its own tool.
"""

from __future__ import annotations

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.contract import OfflineOptions, OfflineText
from kubeproxy.model.options import NFACCT_COUNTERS, Family
from kubeproxy.proxy.config import ProxyConfig


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    from kubeproxy.node_render import choose_node, node_families, render_iptables  # the shared loader imports this package

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
