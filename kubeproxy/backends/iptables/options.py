"""Turn configuration plus what we know of the node into IptablesOptions for one IP family."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Sequence

from kubeproxy.backends.iptables.render import NFACCT_COUNTERS, IptablesOptions
from kubeproxy.cluster.fields import IPNetwork
from kubeproxy.cluster.objects import Node
from kubeproxy.proxy.config import ConfigError, LocalDetector, ProxyConfig
from kubeproxy.proxy.model import IPV4, family_of


def node_name(cfg: ProxyConfig, default_hostname: str) -> str:
    return (cfg.hostname_override or default_hostname).strip().lower()


def node_ips(cfg: ProxyConfig, node: Node | None) -> list[str]:
    """--node-ip first, then the Node object's addresses (InternalIP before ExternalIP)."""
    ips = [cfg.node_ip] if cfg.node_ip else []
    if node is not None:
        ips.extend(str(ip) for ip in node.ips() if str(ip) not in ips)
    return ips


def local_detector(cfg: ProxyConfig, node: Node | None, family: str) -> LocalDetector:
    mode = cfg.detect_local_mode
    if not mode:
        # Upstream's default: ClusterCIDR when a cluster CIDR is given, else no detector.
        mode = "ClusterCIDR" if cfg.cluster_cidr else ""
    if mode == "ClusterCIDR":
        cidrs = tuple(c for c in cfg.cluster_cidr if family_of(ipaddress.ip_network(c, strict=False)) == family)
        return LocalDetector(mode, cidrs) if cidrs else LocalDetector()
    if mode == "NodeCIDR":
        if node is None or not node.pod_cidrs:
            raise ConfigError("--detect-local-mode=NodeCIDR needs the Node object with spec.podCIDR(s)")
        cidrs = tuple(str(c) for c in node.pod_cidrs if family_of(c) == family)
        return LocalDetector(mode, cidrs) if cidrs else LocalDetector()
    if mode == "BridgeInterface":
        return LocalDetector(mode, (), cfg.bridge_interface)
    if mode == "InterfaceNamePrefix":
        return LocalDetector(mode, (), cfg.interface_name_prefix)
    return LocalDetector()


def iptables_options(
    cfg: ProxyConfig,
    *,
    family: str,
    hostname: str,
    node: Node | None,
    nfacct_counters: Collection[str] = NFACCT_COUNTERS,
    conntrack_tcp_liberal: bool = False,
    local_ips: Sequence[str] = (),
) -> IptablesOptions:
    ips = [ip for ip in node_ips(cfg, node) if family_of(ipaddress.ip_address(ip)) == family]
    cidrs: list[IPNetwork] = []
    match_all = False
    for raw in cfg.nodeport_addresses:
        if raw == "primary":
            cidrs.extend(ipaddress.ip_network(ip) for ip in ips[:1])
            continue
        net = ipaddress.ip_network(raw, strict=False)
        if family_of(net) != family:
            continue
        if net.prefixlen == 0:
            match_all = True
        cidrs.append(net)
    match_all = match_all or not cidrs
    contains_loopback = match_all or any(ipaddress.ip_address("127.0.0.1") in c for c in cidrs)
    candidates = list(dict.fromkeys([*local_ips, *ips, *(["127.0.0.1"] if family == IPV4 else ["::1"])]))
    nodeport_ips = () if match_all else tuple(
        ip for ip in candidates if any(ipaddress.ip_address(ip) in c for c in cidrs)
    )
    return IptablesOptions(
        node_name=node_name(cfg, hostname),
        node_ip=ips[0] if ips else "",
        node_labels=dict(node.labels) if node else {},
        family=family,
        masquerade_all=cfg.masquerade_all,
        masquerade_mark=cfg.masquerade_mark(),
        local_detector=local_detector(cfg, node, family),
        localhost_nodeports=cfg.localhost_nodeports and family == IPV4 and contains_loopback,
        nodeport_ips=nodeport_ips,
        nodeport_match_all=match_all,
        random_fully=cfg.random_fully,
        nfacct_counters=tuple(nfacct_counters),
        conntrack_tcp_liberal=conntrack_tcp_liberal,
        prefer_same_node=cfg.feature_gates.get("PreferSameTrafficDistribution", True),
    )
