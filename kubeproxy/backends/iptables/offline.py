"""`kubeproxy render --proxy-mode iptables`: the iptables-restore input of a full sync."""

from __future__ import annotations

from kubeproxy.backends.base import OfflineOptions, OfflineText
from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.render import NFACCT_COUNTERS
from kubeproxy.cluster.state import ClusterState
from kubeproxy.proxy.config import ProxyConfig


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    from kubeproxy.render import render_iptables  # the shared loader imports this package

    result = render_iptables(
        state,
        cfg,
        nfacct_counters=NFACCT_COUNTERS if options.nfacct else (),
        conntrack_tcp_liberal=options.conntrack_tcp_liberal,
    )
    text = result.rendered.text
    return OfflineText(with_jumps(text) if options.with_jumps else text)
