"""Which Node this proxy is and which IP families it proxies, from the configuration and the
cluster's Nodes: the one choice the live proxy, `kubeproxy render` and every mode's offline
renderer make alike."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from kubeproxy.cluster.objects import Node
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.options import Family, node_ips
from kubeproxy.model.proxy_config import ProxyConfig


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
