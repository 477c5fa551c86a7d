"""The IPVS rendering of a cluster state without a kernel: for `kubeproxy render --proxy-mode ipvs`.

Makes the same choice of node, IP family and options as the other modes (kubeproxy.render); the
NodePort addresses are the node's own (--node-ip and the Node object), since there are no
interfaces to read.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from kubeproxy.backends.base import OfflineOptions, OfflineText
from kubeproxy.backends.iptables.options import iptables_options, node_ips
from kubeproxy.backends.iptables.render import IptablesOptions
from kubeproxy.backends.ipvs.options import ipvs_options
from kubeproxy.backends.ipvs.render import IpvsOptions, IpvsRendered, render
from kubeproxy.cluster.state import ClusterState
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.model import NodeView, build_view, family_of
from kubeproxy.render import choose_node, primary_family


@dataclass(frozen=True)
class IpvsNodeRendering:
    view: NodeView
    options: IptablesOptions
    ipvs: IpvsOptions
    rendered: IpvsRendered


def render_ipvs(state: ClusterState, cfg: ProxyConfig) -> IpvsNodeRendering:
    """Raises ConfigError (from the options) like render_iptables."""
    hostname, node = choose_node(state, cfg)
    family = primary_family(cfg, node)
    opts = iptables_options(cfg, family=family, hostname=hostname, node=node, nfacct_counters=())
    addrs = tuple(ip for ip in node_ips(cfg, node) if family_of(ipaddress.ip_address(ip)) == family)
    ipvs = ipvs_options(cfg.ipvs, addrs)
    view = build_view(state.services.values(), state.slices.values(), family, opts.node_name)
    return IpvsNodeRendering(view, opts, ipvs, render(view, opts, ipvs))


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    """`kubeproxy render --proxy-mode ipvs`: ipset input, iptables-restore input, the IPVS table."""
    from kubeproxy.backends.ipvs.render import render_text as ipvs_text

    ipvs = render_ipvs(state, cfg)
    return OfflineText(ipvs_text(ipvs.rendered, ipvs.options))
