"""The nftables rendering of a cluster state without a kernel: for `kubeproxy render --proxy-mode nftables`.

Makes the same choice of node, IP families and options as the iptables mode (kubeproxy.model.node_choice):
a dual-stack node gets both tables, `ip kube-proxy` and `ip6 kube-proxy`, in one `nft -f` input.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeproxy.backends.nftables import NODEPORTS
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.contract import OfflineOptions, OfflineText
from kubeproxy.model.node_choice import choose_node, node_families, primary_family
from kubeproxy.model.node_model import NodeView, build_view
from kubeproxy.model.options import Family, NodeOptions, node_options
from kubeproxy.model.proxy_config import ProxyConfig


@dataclass(frozen=True)
class NftNodeRendering:
    view: NodeView
    options: NodeOptions
    rendering: NftRendering


def render_nftables(
    state: ClusterState, cfg: ProxyConfig, *, service_cidrs: tuple[str, ...] = (), family: Family | None = None
) -> NftNodeRendering:
    """One family's table (default: the primary family's). Raises ConfigError (from the options)
    like render_iptables. The service CIDRs are the state's ServiceCIDR objects' and `service_cidrs`."""
    hostname, node = choose_node(state, cfg)
    family = family or primary_family(cfg, node)
    cidrs = tuple(dict.fromkeys((*state.service_cidr_list(), *service_cidrs)))
    opts = node_options(cfg, family=family, hostname=hostname, node=node, nfacct_counters=(), service_cidrs=cidrs,
                        nodeports=NODEPORTS)
    view = build_view(state.services.values(), state.slices.values(), family, opts.node_name)
    return NftNodeRendering(view, opts, render(view, opts))


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    """`kubeproxy render --proxy-mode nftables`: the `nft -f` input of the `kube-proxy` table(s)."""
    texts: list[str] = []
    warnings: list[str] = []
    for family in node_families(cfg, choose_node(state, cfg)[1]):
        rendering = render_nftables(state, cfg, family=family).rendering
        texts.append(rendering.text())
        warnings.extend(w for w in rendering.warnings if w not in warnings)
    return OfflineText("".join(texts), tuple(warnings))
