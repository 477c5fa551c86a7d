"""From cluster objects to the rules one node would program, without touching the kernel.

Shared by `kubeproxy render`, the demo and the tests, so that all of them make the same
choice of node, IP family and options as the live proxy will.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.backends.iptables.options import iptables_options, node_ips
from kubeproxy.backends.iptables.render import NFACCT_COUNTERS, IptablesOptions, Rendered, render
from kubeproxy.cluster.errors import ManifestError
from kubeproxy.cluster.manifests import manifest_files, parse_documents, read_text
from kubeproxy.cluster.objects import Node
from kubeproxy.cluster.state import ClusterState, build_state
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.model import IPV4, NodeView, build_view, family_of


@dataclass
class Loaded:
    state: ClusterState
    warnings: list[str] = field(default_factory=list)
    objects: int = 0


def load(paths: Iterable[str | Path]) -> Loaded:
    """Objects from files and folders. A broken file is reported and skipped, not fatal."""
    raws = []
    warnings: list[str] = []
    try:
        files = manifest_files(paths)
    except ManifestError as exc:
        return Loaded(ClusterState(), [f"error: {exc}"])
    for path in files:
        try:
            raws.extend(parse_documents(read_text(path), str(path)))
        except ManifestError as exc:
            warnings.append(f"error: {exc}")
    state, object_warnings = build_state(r.obj for r in raws)
    return Loaded(state, warnings + object_warnings, len(raws))


def choose_node(state: ClusterState, cfg: ProxyConfig) -> tuple[str, Node | None]:
    """This node's name and Node object: --hostname-override, else the only Node given, else our hostname."""
    if cfg.hostname_override:
        name = cfg.hostname_override.strip().lower()
        return name, state.nodes.get(name)
    if len(state.nodes) == 1:
        node = next(iter(state.nodes.values()))
        return node.name, node
    name = socket.gethostname().lower()
    return name, state.nodes.get(name)


def primary_family(cfg: ProxyConfig, node: Node | None) -> str:
    ips = node_ips(cfg, node)
    return family_of(ipaddress.ip_address(ips[0])) if ips else IPV4


@dataclass(frozen=True)
class NodeRendering:
    view: NodeView
    options: IptablesOptions
    rendered: Rendered


def render_iptables(
    state: ClusterState,
    cfg: ProxyConfig,
    *,
    nfacct_counters: Collection[str] = NFACCT_COUNTERS,
    conntrack_tcp_liberal: bool = False,
) -> NodeRendering:
    hostname, node = choose_node(state, cfg)
    family = primary_family(cfg, node)
    opts = iptables_options(
        cfg,
        family=family,
        hostname=hostname,
        node=node,
        nfacct_counters=nfacct_counters,
        conntrack_tcp_liberal=conntrack_tcp_liberal,
    )
    view = build_view(state.services.values(), state.slices.values(), family, opts.node_name)
    return NodeRendering(view, opts, render(view, opts))
