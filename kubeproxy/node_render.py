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

from kubeproxy.backends.iptables.render import Rendered, render
from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.errors import ManifestError
from kubeproxy.cluster.manifests import manifest_files, parse_objects, read_text
from kubeproxy.cluster.objects import Node
from kubeproxy.cluster.state import ClusterState
from kubeproxy.cluster.validation import ParseOptions
from kubeproxy.model.node_model import NodeView, build_view
from kubeproxy.model.options import NFACCT_COUNTERS, Family, NodeOptions, node_ips, node_options
from kubeproxy.proxy.config import ProxyConfig


@dataclass
class Loaded:
    state: ClusterState
    warnings: list[str] = field(default_factory=list)
    objects: int = 0


def load(paths: Iterable[str | Path], options: ParseOptions | None = None) -> Loaded:
    """Objects from files and folders, checked with `options`. A broken file is reported and skipped, not fatal."""
    warnings: list[str] = []
    object_warnings: list[str] = []
    try:
        files = manifest_files(paths)
    except ManifestError as exc:
        return Loaded(ClusterState(), [f"error: {exc}"])
    state = ClusterState(options=options or ParseOptions())
    count = 0
    # Each object goes into the state as it is read, and its raw dicts die then (by reference
    # count): the raw dicts of a whole file and the typed objects are never all alive at once.
    # The cyclic collector is paused meanwhile: it would walk the state's objects again and again.
    with paused_gc(freeze=True):  # the state outlives the block: see cluster.bulk
        for path in files:
            try:
                for obj in parse_objects(read_text(path), str(path)):
                    count += 1
                    if warning := state.apply(obj):
                        object_warnings.append(warning)
            except ManifestError as exc:
                warnings.append(f"error: {exc}")
    return Loaded(state, warnings + object_warnings, count)


@dataclass(frozen=True)
class NodeChoice:
    """Which Node this proxy is, how that was decided, and what is worth a warning."""

    name: str
    node: Node | None
    how: str
    warnings: tuple[str, ...] = ()


def node_choice(state: ClusterState, cfg: ProxyConfig, hostname: str | None = None) -> NodeChoice:
    """This node: --hostname-override, else the only Node given, else the machine's hostname.

    Upstream uses the override or the hostname; the only-Node rule is ours, for manifests of one
    node. Never silent: a name that matches no Node, or a hostname picked among several Nodes,
    is a warning (without its Node object no endpoint is local, and every eTP=Local NodePort
    or LoadBalancer drops on this node).
    """
    known = sorted(state.nodes)
    listing = ", ".join(known[:5]) + (f" and {len(known) - 5} more" if len(known) > 5 else "")
    if cfg.hostname_override:
        name = cfg.hostname_override.strip().lower()
        node = state.nodes.get(name)
        warnings = () if node is not None or not known else (
            f"Node {name!r} (--hostname-override) is not among the Nodes given ({listing}): no endpoint is local "
            "to this node, so eTP=Local NodePorts and LoadBalancers drop here",
        )
        return NodeChoice(name, node, "--hostname-override", warnings)
    if len(known) == 1:
        node = next(iter(state.nodes.values()))
        return NodeChoice(node.name, node, "the only Node in the input")
    name = (hostname or socket.gethostname()).lower()
    node = state.nodes.get(name)
    if len(known) > 1:
        found = "which is one of them" if node is not None else "which is none of them: no endpoint is local, " \
            "so eTP=Local NodePorts and LoadBalancers drop here"
        return NodeChoice(name, node, "this machine's hostname", (
            f"{len(known)} Nodes given ({listing}) and no --hostname-override: using this machine's hostname "
            f"{name!r}, {found}; set --hostname-override to the node to render for",
        ))
    return NodeChoice(name, node, "this machine's hostname")


def choose_node(state: ClusterState, cfg: ProxyConfig) -> tuple[str, Node | None]:
    """This node's name and Node object (see `node_choice`)."""
    choice = node_choice(state, cfg)
    return choice.name, choice.node


def primary_family(cfg: ProxyConfig, node: Node | None) -> Family:
    ips = node_ips(cfg, node)
    return Family.of(ipaddress.ip_address(ips[0])) if ips else Family.IPV4


def node_families(cfg: ProxyConfig, node: Node | None) -> tuple[Family, ...]:
    """The families this node proxies, the primary first: the other one too when the node has
    an address of it (--node-ip, the Node's addresses) or --cluster-cidr lists a CIDR of it.

    Upstream goes dual-stack whenever the kernel supports both families; we also ask for a sign
    that the cluster uses the second one, so that a single-stack node's rules stay as they were.
    """
    primary = primary_family(cfg, node)
    seen = {Family.of(ipaddress.ip_address(ip)) for ip in node_ips(cfg, node)}
    seen.update(Family.of(ipaddress.ip_network(cidr, strict=False)) for cidr in cfg.cluster_cidr)
    second = Family.IPV4 if primary.ipv6 else Family.IPV6
    return (primary, second) if second in seen else (primary,)


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
