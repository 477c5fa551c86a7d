"""`kubeproxy render --proxy-mode userspace`: the redirect rules a full sync would load.

The proxy ports are chosen when the proxy binds its listeners; offline they are numbered in
service order from the start of `--proxy-port-range` (or from EXAMPLE_FIRST_PORT), and a
warning says so.
"""

from __future__ import annotations

import ipaddress

from kubeproxy.backends.userspace import render as R
from kubeproxy.backends.userspace.ports import parse_port_range
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.contract import OfflineOptions, OfflineText
from kubeproxy.model.node_model import build_view
from kubeproxy.model.options import Family, node_options
from kubeproxy.model.proxy_config import ProxyConfig

EXAMPLE_FIRST_PORT = 36000


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    """One family's rules, or on a dual-stack node (kubeproxy.model.node_choice.node_families) both, each
    under a `# iptables-restore (IPv4)` / `# ip6tables-restore (IPv6)` line as the iptables mode."""
    from kubeproxy.model.node_choice import choose_node, node_families

    families = node_families(cfg, choose_node(state, cfg)[1])
    texts: list[str] = []
    warnings: list[str] = []
    for family in families:
        part = _render_family(state, cfg, options, family)
        text = part.text
        if len(families) > 1:
            text = f"# {'ip6tables-restore' if family.ipv6 else 'iptables-restore'} ({family})\n{text}"
        texts.append(text)
        warnings.extend(w for w in part.warnings if w not in warnings)
    return OfflineText("".join(texts), tuple(warnings))


def _render_family(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions, family: Family) -> OfflineText:
    from kubeproxy.model.node_choice import choose_node

    hostname, node = choose_node(state, cfg)
    opts = node_options(cfg, family=family, hostname=hostname, node=node, nfacct_counters=())
    view = build_view(state.services.values(), state.slices.values(), family, opts.node_name)
    first = parse_port_range(cfg.port_range).base or EXAMPLE_FIRST_PORT
    names = sorted(name for name, svc in view.services.items() if svc.protocol in R.PROTOCOLS)
    bind = ipaddress.ip_address(cfg.bind_address)
    listen_ip = str(bind) if not bind.is_unspecified and Family.of(bind) == family else ""
    rendered = R.render(view, opts, {name: first + i for i, name in enumerate(names)}, listen_ip)
    text = R.with_jumps(rendered.text) if options.with_jumps else rendered.text
    note = f"proxy ports are chosen when the proxy binds its listeners; shown here numbered from {first}"
    skipped = sorted(str(n) for n, svc in view.services.items() if svc.protocol not in R.PROTOCOLS)
    extra = (f"the userspace mode relays TCP and UDP only; not proxied: {', '.join(skipped)}",) if skipped else ()
    return OfflineText(text, (note, *rendered.warnings, *extra))
