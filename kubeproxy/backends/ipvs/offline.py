"""The IPVS rendering of a cluster state without a kernel: for `kubeproxy render --proxy-mode ipvs`.

Makes the same choice of node, IP families and options as the other modes (kubeproxy.model.node_choice); the
NodePort addresses are the node's own (--node-ip and the Node object), since there are no
interfaces to read. A dual-stack node gets the IPv4 part, then the IPv6 one (KUBE-6-... sets,
ip6tables-restore input, IPv6 virtual servers), each under its own header.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from kubeproxy.backends.ipvs.config_section import ipvs_options
from kubeproxy.backends.ipvs.render import IpvsOptions, IpvsRendered, render
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.contract import OfflineOptions, OfflineText
from kubeproxy.model.node_choice import choose_node, node_families, primary_family
from kubeproxy.model.node_model import NodeView, build_view
from kubeproxy.model.options import Family, NodeOptions, node_ips, node_options
from kubeproxy.model.proxy_config import ProxyConfig


@dataclass(frozen=True)
class IpvsNodeRendering:
    view: NodeView
    options: NodeOptions
    ipvs: IpvsOptions
    rendered: IpvsRendered


def render_ipvs(state: ClusterState, cfg: ProxyConfig, family: Family | None = None) -> IpvsNodeRendering:
    """One family's rendering (default: the primary family's). Raises ConfigError (from the
    options) like render_iptables."""
    hostname, node = choose_node(state, cfg)
    family = family or primary_family(cfg, node)
    opts = node_options(cfg, family=family, hostname=hostname, node=node, nfacct_counters=())
    addrs = tuple(ip for ip in node_ips(cfg, node) if Family.of(ipaddress.ip_address(ip)) == family)
    ipvs = ipvs_options(cfg.ipvs, addrs)
    view = build_view(state.services.values(), state.slices.values(), family, opts.node_name)
    return IpvsNodeRendering(view, opts, ipvs, render(view, opts, ipvs))


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    """`kubeproxy render --proxy-mode ipvs`: ipset input, iptables-restore input, the IPVS table."""
    from kubeproxy.backends.ipvs.render import render_text as ipvs_text

    families = node_families(cfg, choose_node(state, cfg)[1])
    if len(families) == 1:
        ipvs = render_ipvs(state, cfg)
        return OfflineText(ipvs_text(ipvs.rendered, ipvs.options))
    parts = []
    for family in families:
        ipvs = render_ipvs(state, cfg, family)
        parts.append(f"# ===== {family} =====\n" + ipvs_text(ipvs.rendered, ipvs.options))
    return OfflineText("".join(parts))
