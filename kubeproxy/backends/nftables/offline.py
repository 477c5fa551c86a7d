"""The nftables rendering of a cluster state without a kernel: for `kubeproxy render --proxy-mode nftables`.

Makes the same choice of node, IP family and options as the iptables mode (kubeproxy.render).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeproxy.backends.base import OfflineOptions, OfflineText
from kubeproxy.backends.iptables.options import iptables_options
from kubeproxy.backends.iptables.render import IptablesOptions
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendering import NftRendering
from kubeproxy.cluster.state import ClusterState
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.model import NodeView, build_view
from kubeproxy.render import choose_node, primary_family


@dataclass(frozen=True)
class NftNodeRendering:
    view: NodeView
    options: IptablesOptions
    rendering: NftRendering


def render_nftables(state: ClusterState, cfg: ProxyConfig, *, service_cidrs: tuple[str, ...] = ()) -> NftNodeRendering:
    """Raises ConfigError (from the options) like render_iptables."""
    hostname, node = choose_node(state, cfg)
    family = primary_family(cfg, node)
    opts = iptables_options(cfg, family=family, hostname=hostname, node=node, nfacct_counters=())
    view = build_view(state.services.values(), state.slices.values(), family, opts.node_name)
    return NftNodeRendering(view, opts, render(view, opts, service_cidrs=service_cidrs))


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    """`kubeproxy render --proxy-mode nftables`: the `nft -f` input of the `kube-proxy` table."""
    rendering = render_nftables(state, cfg).rendering
    return OfflineText(rendering.text(), tuple(rendering.warnings))
