"""What every backend needs to know about this node, for one IP family.

`Family` is the one way to name an IP family: its value is the Kubernetes spelling
(`"IPv4"`, as in `ipFamilies` and EndpointSlice `addressType`), and it knows the spellings the
kernel tools use. `NodeOptions` is built from the configuration and the Node object by
`node_options`; the renderers of every mode read it and nothing else about the node.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubeproxy.cluster.addresses import valid_cidr
from kubeproxy.cluster.fields import IPAddress, IPNetwork
from kubeproxy.cluster.objects import Node
from kubeproxy.model.features import gate_enabled
from kubeproxy.model.proxy_config import (
    NODEPORT_ALL,
    NODEPORT_LOCALHOST,
    NODEPORT_PRIMARY,
    ConfigError,
    LocalDetector,
    ProxyConfig,
    parse_node_ips,
)


@dataclass(frozen=True)
class NodePortTraits:
    """What a mode does with NodePorts unless configured otherwise (each mode's record in
    backends/registry.py holds its own; the default is iptables' and ipvs')."""

    default_addresses: tuple[str, ...] = ()  # an unset nodePortAddresses means these; () every local address
    # The feature gate under which NodePorts on loopback get a listener (TCP) and rejects.
    localhost_gate: str = ""


class Family(StrEnum):
    IPV4 = "IPv4"
    IPV6 = "IPv6"

    @classmethod
    def of(cls, ip: IPAddress | IPNetwork) -> Family:
        return cls.IPV4 if ip.version == 4 else cls.IPV6

    @property
    def ipv6(self) -> bool:
        return self is Family.IPV6

    @property
    def nft(self) -> str:
        """The nftables family of our table: `ip kube-proxy` or `ip6 kube-proxy`."""
        return "ip6" if self.ipv6 else "ip"

    @property
    def loopback(self) -> str:
        return "::1" if self.ipv6 else "127.0.0.1"

    @property
    def any_address(self) -> str:
        return "::" if self.ipv6 else "0.0.0.0"


# nfacct counters upstream attaches to two rules, when the kernel has them.
NFACCT_CT_INVALID = "ct_state_invalid_dropped_pkts"
NFACCT_LOCALHOST_NODEPORT = "localhost_nps_accepted_pkts"
NFACCT_COUNTERS = (NFACCT_CT_INVALID, NFACCT_LOCALHOST_NODEPORT)


@dataclass(frozen=True)
class NodeOptions:
    """Everything about the node and configuration that changes the rules, in every mode."""

    node_name: str = ""
    node_ip: str = ""
    node_labels: Mapping[str, str] = field(default_factory=dict)
    family: Family = Family.IPV4
    masquerade_all: bool = False
    masquerade_mark: str = "0x00004000"
    local_detector: LocalDetector = field(default_factory=LocalDetector)
    localhost_nodeports: bool = True
    # Empty: NodePorts on every local address. Otherwise the node's addresses that match
    # --nodeport-addresses, resolved by the caller (the renderers do not read interfaces):
    # its interfaces' addresses in the live proxy, the Node's addresses and loopback in `render`.
    nodeport_ips: tuple[str, ...] = ()
    nodeport_match_all: bool = True
    random_fully: bool = True  # upstream (v1.37) masquerades with --random-fully always
    nfacct_counters: Collection[str] = NFACCT_COUNTERS
    conntrack_tcp_liberal: bool = False
    prefer_same_node: bool = True
    # This family's ranges of the cluster's ServiceCIDR objects (nftables mode drops
    # addresses in them that no Service holds).
    service_cidrs: tuple[str, ...] = ()
    # nftables mode with KubeProxyNFTablesLocalhostNodePorts: whether a userspace listener on
    # this family's loopback address serves TCP NodePorts (nodePortAddresses names loopback
    # explicitly), and the NodePort protocols whose loopback traffic is rejected and counted.
    localhost_nodeport_proxy: bool = False
    localhost_nodeport_rejects: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Accept the Kubernetes spelling ("IPv6") from callers that have a plain string.
        object.__setattr__(self, "family", Family(self.family))

    @property
    def localhost_nodeports_enabled(self) -> bool:
        # route_localnet, which localhost NodePorts rely on, exists for IPv4 only.
        return self.localhost_nodeports and not self.family.ipv6


def node_name(cfg: ProxyConfig, default_hostname: str) -> str:
    return (cfg.hostname_override or default_hostname).strip().lower()


def configured_node_ips(cfg: ProxyConfig) -> tuple[tuple[str, ...], str]:
    """The node IPs the configuration names, and the setting that names them: --node-ip (ours:
    one address or a dual-stack pair, the primary first), else bindAddress unless it is the
    unspecified address (upstream's override of the node's primary IP)."""
    if cfg.node_ip:
        return parse_node_ips(cfg.node_ip), "bindAddress" if cfg.node_ip == cfg.bind_address else "--node-ip"
    try:
        bind = ipaddress.ip_address(cfg.bind_address)
    except ValueError:
        return (), ""
    return ((), "") if bind.is_unspecified else ((str(bind),), "bindAddress")


def node_ips(cfg: ProxyConfig, node: Node | None) -> list[str]:
    """This node's IPs, the primary first: the configured ones (see `configured_node_ips`), then
    the Node object's addresses (InternalIP before ExternalIP). `run` and `render` both use this."""
    ips = list(configured_node_ips(cfg)[0])
    if node is not None:
        ips.extend(str(ip) for ip in node.ips() if str(ip) not in ips)
    return ips


def node_ip_by_family(cfg: ProxyConfig, node: Node | None) -> dict[Family, str]:
    """Upstream's node IP of each family: the first of that family among `node_ips`."""
    out: dict[Family, str] = {}
    for ip in node_ips(cfg, node):
        out.setdefault(Family.of(ipaddress.ip_address(ip)), ip)
    return out


def nodeport_addresses(cfg: ProxyConfig, traits: NodePortTraits = NodePortTraits()) -> tuple[str, ...]:
    """--nodeport-addresses with the mode's default (`traits`): `primary` in nftables mode;
    every local address (nothing listed) in iptables and ipvs modes."""
    return cfg.nodeport_addresses or traits.default_addresses


def expand_nodeport_keywords(addresses: Sequence[str], node_ip: Mapping[Family, str]) -> list[str]:
    """The keywords replaced by the CIDRs they stand for, in place, as upstream expands them:
    `primary` the node IP of each family (a family without one, or with a loopback one, adds
    nothing), `localhost` both loopback CIDRs, `all` both zero CIDRs."""
    out: list[str] = []
    for entry in addresses:
        if entry == NODEPORT_PRIMARY:
            for family, bits in ((Family.IPV4, 32), (Family.IPV6, 128)):
                ip = node_ip.get(family)
                if ip and not ipaddress.ip_address(ip).is_loopback:
                    out.append(f"{ip}/{bits}")
        elif entry == NODEPORT_LOCALHOST:
            out.extend(("127.0.0.0/8", "::1/128"))
        elif entry == NODEPORT_ALL:
            out.extend(("0.0.0.0/0", "::/0"))
        else:
            out.append(entry)
    return out


def effective_nodeport_cidrs(
    cfg: ProxyConfig, node: Node | None, traits: NodePortTraits = NodePortTraits()
) -> list[str]:
    """What upstream's proxier gets as nodePortAddresses: the mode's default, keywords expanded.
    Empty means NodePorts on every local address."""
    return expand_nodeport_keywords(nodeport_addresses(cfg, traits), node_ip_by_family(cfg, node))


def nodeport_cidrs(
    cfg: ProxyConfig, node: Node | None, family: Family, traits: NodePortTraits = NodePortTraits()
) -> list[IPNetwork]:
    """This family's CIDRs of upstream's NodePortAddresses (keywords expanded)."""
    cidrs = (valid_cidr(c) for c in effective_nodeport_cidrs(cfg, node, traits))
    return [net for net in cidrs if Family.of(net) == family]


def nodeport_matches_all(cidrs: Sequence[IPNetwork]) -> bool:
    """Whether NodePorts take every local address of the family: no CIDR, or a zero CIDR."""
    return not cidrs or any(net.prefixlen == 0 for net in cidrs)


def local_detector(cfg: ProxyConfig, node: Node | None, family: Family) -> LocalDetector:
    mode = cfg.detect_local_mode
    if not mode:
        # Upstream's default: ClusterCIDR when a cluster CIDR is given, else no detector.
        mode = "ClusterCIDR" if cfg.cluster_cidr else ""
    if mode == "ClusterCIDR":
        cidrs = tuple(c for c in cfg.cluster_cidr if Family.of(ipaddress.ip_network(c, strict=False)) == family)
        return LocalDetector(mode, cidrs) if cidrs else LocalDetector()
    if mode == "NodeCIDR":
        if node is None or not node.pod_cidrs:
            raise ConfigError("--detect-local-mode=NodeCIDR needs the Node object with spec.podCIDR(s)")
        cidrs = tuple(str(c) for c in node.pod_cidrs if Family.of(c) == family)
        return LocalDetector(mode, cidrs) if cidrs else LocalDetector()
    if mode == "BridgeInterface":
        return LocalDetector(mode, (), cfg.bridge_interface)
    if mode == "InterfaceNamePrefix":
        return LocalDetector(mode, (), cfg.interface_name_prefix)
    return LocalDetector()


def node_options(
    cfg: ProxyConfig,
    *,
    family: Family,
    hostname: str,
    node: Node | None,
    nfacct_counters: Collection[str] = NFACCT_COUNTERS,
    conntrack_tcp_liberal: bool = False,
    interface_ips: Sequence[str] | None = None,
    service_cidrs: Sequence[str] = (),
    nodeports: NodePortTraits = NodePortTraits(),
) -> NodeOptions:
    """`interface_ips`: the addresses of the node's interfaces, which nodePortAddresses CIDRs
    select from (the live proxy reads them at each sync, as upstream); None where there are no
    interfaces to read (`render`): the node's IPs and loopback stand for them."""
    family = Family(family)
    ips = [ip for ip in node_ips(cfg, node) if Family.of(ipaddress.ip_address(ip)) == family]
    cidrs = nodeport_cidrs(cfg, node, family, nodeports)
    match_all = nodeport_matches_all(cidrs)
    ipv4_loopback = ipaddress.ip_address("127.0.0.0")
    contains_loopback = match_all or any(
        net.version == 4 and (net.network_address.is_loopback or ipv4_loopback in net) for net in cidrs
    )
    candidates = list(dict.fromkeys([*ips, family.loopback] if interface_ips is None else interface_ips))
    nodeport_ips = () if match_all else tuple(
        ip for ip in candidates if any(ipaddress.ip_address(ip) in c for c in cidrs)
    )
    return NodeOptions(
        node_name=node_name(cfg, hostname),
        node_ip=ips[0] if ips else "",
        node_labels=dict(node.labels) if node else {},
        family=family,
        masquerade_all=cfg.masquerade_all,
        masquerade_mark=cfg.masquerade_mark(),
        local_detector=local_detector(cfg, node, family),
        localhost_nodeports=cfg.localhost_nodeports and family == Family.IPV4 and contains_loopback,
        nodeport_ips=nodeport_ips,
        nodeport_match_all=match_all,
        random_fully=cfg.random_fully,
        nfacct_counters=tuple(nfacct_counters),
        conntrack_tcp_liberal=conntrack_tcp_liberal,
        prefer_same_node=gate_enabled(cfg.feature_gates, "PreferSameTrafficDistribution"),
        service_cidrs=tuple(c for c in service_cidrs if Family.of(ipaddress.ip_network(c, strict=False)) == family),
        **_localhost_nodeports(cfg, cidrs, nodeports.localhost_gate),
    )


# Upstream's metrics.LocalhostNodePortRejectableProtocols and ...RejectedProtocols (v1.37).
LOCALHOST_NODEPORT_REJECTABLE = ("TCP", "UDP", "SCTP")
LOCALHOST_NODEPORT_REJECTED_WITH_PROXY = ("UDP", "SCTP")


def _localhost_nodeports(cfg: ProxyConfig, cidrs: Sequence[IPNetwork], gate: str) -> dict[str, Any]:
    """As upstream's nftables proxier: with the gate on, a loopback CIDR named in this family's
    nodePortAddresses (127.0.0.0/8, ::1/128; not a catch-all that happens to hold loopback)
    starts the TCP listener and rejects the other protocols; without one, all are rejected."""
    if not gate or not gate_enabled(cfg.feature_gates, gate):
        return {}
    proxy = any(net.network_address.is_loopback for net in cidrs)
    rejects = LOCALHOST_NODEPORT_REJECTED_WITH_PROXY if proxy else LOCALHOST_NODEPORT_REJECTABLE
    return {"localhost_nodeport_proxy": proxy, "localhost_nodeport_rejects": rejects}
